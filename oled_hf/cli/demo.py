"""``oled-moe demo``: generate with experts offloaded (~40% cache) and show it matches full residency."""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

from ..offload.config import KNOWN_POLICIES
from .common import cpu_compute_note, default_model_path, resolve_model

DEFAULT_PROMPTS = ["What is 123+456?", "Tell me about the sea."]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="generate with offloaded experts and compare with full residency")
    p.add_argument("--model", default=None,
                   help="checkpoint folder with config.json (default: the shipped long-answer toy, "
                        "oled_hf/toy/long/checkpoint)")
    p.add_argument("--prompt", action="append",
                   help="prompt (repeatable; default: held-out questions for the toy, sample prompts otherwise)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="most new tokens per answer (default: the checkpoint's generation_config)")
    p.add_argument("--block-length", type=int, default=None,
                   help="diffusion block length (default: the checkpoint's generation_config)")
    p.add_argument("--threshold", type=float, default=None,
                   help="confidence threshold to commit a token (default: the checkpoint's generation_config)")
    p.add_argument("--cache-ratio", type=float, default=0.4, help="fraction of routed-expert bytes on the device")
    p.add_argument("--policy", default="oled", choices=KNOWN_POLICIES, help="expert-cache retention policy")
    p.set_defaults(func=demo)


def _check_sum(prompt: str, answer: str) -> str:
    """For the toy models' task prompts (addition; the long-answer tasks), say whether the answer is right."""
    from ..toy.long.tasks import answer_for

    m = re.fullmatch(r"What is (\d+)\+(\d+)\?", prompt.strip())
    expected = str(int(m.group(1)) + int(m.group(2))) if m else answer_for(prompt)
    if expected is None:
        return ""
    return "  (correct)" if answer.strip() == expected else "  (wrong)"


class BlockPrinter:
    """A ``generate`` streamer that prints each finished block as it lands, blocks separated by ``|``."""

    def __init__(self, tokenizer):
        self.tokenizer, self.prompt_seen, self.blocks = tokenizer, False, 0

    def put(self, value) -> None:
        if not self.prompt_seen:  # generate hands the prompt first
            self.prompt_seen = True
            return
        text = self.tokenizer.decode(value.reshape(-1), skip_special_tokens=True)
        print(("|" if self.blocks else "") + text, end="", flush=True)
        self.blocks += 1

    def end(self) -> None:
        print(flush=True)


def default_demo_model() -> Path | None:
    """The long-answer toy (answers over several blocks, the workload offloading is for), if installed."""
    try:
        from ..toy.long import LONG_CHECKPOINT
    except ImportError:
        return default_model_path()
    return Path(LONG_CHECKPOINT)


def default_prompts(path: Path) -> list[str]:
    """Held-out questions when ``path`` is one of the shipped toys, else general sample prompts."""
    toy, long = default_model_path(), default_demo_model()
    if long is not None and path.resolve() == long.resolve():
        from ..toy.long import demo_prompts as long_prompts

        return long_prompts()
    if toy is not None and path.resolve() == toy.resolve():
        from ..toy import demo_prompts

        return demo_prompts()
    return DEFAULT_PROMPTS


def demo(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    import oled_hf

    from ..checkpoints.tokenizer import load_tokenizer

    # never created here: a folder the user named is only read
    path = resolve_model(args.model if args.model is not None else default_demo_model())
    prompts = args.prompt or default_prompts(path)
    tok = load_tokenizer(path)
    config = oled_hf.OffloadConfig(cache_ratio=args.cache_ratio, policy=args.policy)
    resident = AutoModelForCausalLM.from_pretrained(path).eval()
    load_tokenizer(path, model=resident)  # checks the pair once the model's vocabulary is known
    offloaded = AutoModelForCausalLM.from_pretrained(path, offload_config=config).eval()
    stats = offloaded.offload_stats()
    print(f"model: {path} ({type(offloaded).__name__}, {offloaded.num_parameters() / 1e6:.2f}M parameters)")
    print(f"offloading: policy {args.policy}, {stats['total_slots']} expert slots "
          f"({stats['slots_per_layer']:.1f} per MoE layer, {args.cache_ratio:.0%} of routed-expert bytes), "
          f"{stats['pool_bytes'] / 2**20:.2f} MiB on {stats['device']}, store {stats['host_bytes'] / 2**20:.2f} MiB; "
          f"{cpu_compute_note(stats)}")
    gen = dict(return_dict_in_generate=True)
    if args.max_new_tokens is not None:
        gen["max_new_tokens"] = args.max_new_tokens
    gen.update({k: v for k, v in dict(block_length=args.block_length, threshold=args.threshold).items() if v})
    warm = tok("warm up", return_tensors="pt")
    for model in (resident, offloaded):  # first calls pay one-off costs; keep them out of the timing
        model.generate(**warm, max_new_tokens=4, block_length=4)
    offloaded.reset_offload_stats()
    times = {"resident": 0.0, "offloaded": 0.0}
    tokens, same = 0, True
    for prompt in prompts:
        inputs = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                         return_tensors="pt", return_dict=True)
        outs = {}
        print(f"\nuser: {prompt}\nstreaming (offloaded, blocks separated by |): ", end="")
        for name, model in (("offloaded", offloaded), ("resident", resident)):
            start = time.perf_counter()
            outs[name] = model.generate(**inputs, **gen, streamer=BlockPrinter(tok) if name == "offloaded" else None)
            times[name] += time.perf_counter() - start
        out = outs["offloaded"]
        same &= torch.equal(out.sequences, outs["resident"].sequences)
        tokens += out.sequences.shape[1] - inputs["input_ids"].shape[1]
        answer = tok.decode(out.sequences[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        print(f"assistant: {answer!r}{_check_sum(prompt, answer)}")
        print(f"  {int(out.iterations[0])} iterations over {int(out.blocks[0])} blocks, "
              f"{float(out.tokens_per_forward[0]):.2f} tokens per forward")
    total = offloaded.offload_stats()["total"]
    print("\n                     resident   offloaded")
    per_token = {name: 1e3 * seconds / tokens for name, seconds in times.items()}
    print(f"time per token       {per_token['resident']:7.2f} ms  {per_token['offloaded']:7.2f} ms")
    print(f"expert hit rate           -     {total['hit_rate']:7.3f}")
    print(f"bytes copied              -     {total['bytes_copied'] / 2**20:7.2f} MiB")
    print(f"CPU expert-tokens         -     {total['cpu_expert_tokens']:7d}")
    print(f"evictions                 -     {total['evictions']:7d}")
    print(f"same tokens as resident: {'yes' if same else 'NO'}")
    return 0 if same else 1
