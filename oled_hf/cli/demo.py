"""``oled-moe demo``: build the tiny checkpoint if needed, then generate and show how decoding went."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

DEFAULT_PROMPTS = ["What is 12+34?", "Tell me about the sea."]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="make ./tiny if missing, then generate from it and print iteration counts")
    p.add_argument("--model", default="tiny", help="checkpoint folder (created with make-tiny if missing)")
    p.add_argument("--prompt", action="append", help="prompt (repeatable); default: two sample prompts")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--block-length", type=int, default=8)
    p.add_argument("--threshold", type=float, default=0.9)
    p.set_defaults(func=demo)


def demo(args: argparse.Namespace) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import oled_hf  # noqa: F401  (registers the Auto classes)

    from ..checkpoints.factory import make_checkpoint

    path = Path(args.model)
    if not (path / "config.json").is_file():
        make_checkpoint(path, preset="tiny", seed=0)
        print(f"made a random-weight tiny checkpoint at {path}")
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    print(f"model: {type(model).__name__}, {model.num_parameters() / 1e6:.2f}M parameters, from {path}")
    for prompt in args.prompt or DEFAULT_PROMPTS:
        inputs = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                         return_tensors="pt", return_dict=True)
        start = time.perf_counter()
        out = model.generate(**inputs, max_new_tokens=args.max_new_tokens, block_length=args.block_length,
                             threshold=args.threshold, return_dict_in_generate=True)
        elapsed = time.perf_counter() - start
        answer = tok.decode(out.sequences[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        print(f"\nuser: {prompt}\nassistant: {answer!r}")
        print(f"  {int(out.iterations[0])} iterations over {int(out.blocks[0])} blocks "
              f"({float(out.tokens_per_forward[0]):.2f} tokens per forward, {out.forwards} forwards, "
              f"{elapsed * 1000:.0f} ms)")
    return 0
