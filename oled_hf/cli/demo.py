"""``oled-moe demo``: build the tiny checkpoint if needed and run the model on a prompt."""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="make ./tiny if missing, then run the model on a prompt")
    p.add_argument("--model", default="tiny", help="checkpoint folder (created with make-tiny if missing)")
    p.add_argument("--prompt", default="What is 12+34?")
    p.set_defaults(func=demo)


def demo(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import oled_hf  # noqa: F401  (registers the Auto classes)

    from ..checkpoints.factory import make_checkpoint

    path = Path(args.model)
    if not (path / "config.json").is_file():
        make_checkpoint(path, preset="tiny", seed=0)
        print(f"made tiny checkpoint at {path}")
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    ids = tok.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    start = time.perf_counter()
    with torch.no_grad():
        out = model(ids, block_length=8, output_router_logits=True)
    elapsed = time.perf_counter() - start
    top = out.logits[0, -1].topk(5)
    print(f"model: {type(model).__name__}, {model.num_parameters() / 1e6:.2f}M parameters")
    print(f"prompt: {tok.decode(ids[0])!r} ({ids.shape[1]} tokens)")
    print(f"forward: {elapsed * 1000:.1f} ms; next-position top-5: {tok.convert_ids_to_tokens(top.indices)}")
    ids0 = out.router_logits[0][1][0, -1].tolist()
    print(f"layer-1 experts of the last token: {ids0}")
    return 0
