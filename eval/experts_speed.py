"""Forward time of one 32-token block: grouped vs per-expert-loop residency vs offloaded, round-robin.

Loads the ``small`` preset (random weights, made on first use in the user's cache folder shared with
``make bench``: ``~/.cache/oled-hf/small`` or ``$XDG_CACHE_HOME/oled-hf/small``, never inside the
repository; it is 387 MB) fully resident twice (grouped experts and the
per-expert loop reference) and offloaded per ``--cache-size`` and ``--policy`` (CPU compute off),
then times one block forward of each configuration in turn, ``--runs`` rounds, and prints the
median and spread (max - min) per configuration, the median of the per-round ratios to grouped
residency, and the offload runtime's policy + bookkeeping time as a share of the forward. Logits
are checked bit-identical to grouped residency.

    .venv/bin/python eval/experts_speed.py [--model DIR] [--runs 7] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling script, also when loaded by path
from bench_generate import cache_dir, load_small  # noqa: E402  (one cache folder and one maker for the preset)


def default_model() -> Path:
    """The small preset in the user's cache, the very checkpoint ``make bench`` (bench_generate.py) uses."""
    return cache_dir() / "small"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None,
                    help="checkpoint folder (default: ~/.cache/oled-hf/small, the small preset, made on first use)")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache-size", type=int, nargs="+", default=[26, 64], help="slots per MoE layer (64 = all)")
    ap.add_argument("--policy", nargs="+", default=["oled", "lru"])
    return ap


def main() -> None:
    from oled_hf.modeling import OledLLaDA2ForDiffusionLM
    from oled_hf.modeling.experts import LOOP_EXECUTOR

    from oled_hf import OffloadConfig
    from oled_hf.offload.system import spelling, system_of_legacy

    args = build_parser().parse_args()
    torch.set_num_threads(args.threads)
    path = args.model or default_model()
    configs = {"resident, grouped": load_small(path)}  # makes the preset there on first use
    loop = OledLLaDA2ForDiffusionLM.from_pretrained(path).eval()
    for block in loop.moe_blocks():
        block.experts_executor = LOOP_EXECUTOR
    configs["resident, per-expert loop"] = loop
    for size in args.cache_size:
        for policy in args.policy:
            oc = OffloadConfig(cache_size=size, system=spelling(system_of_legacy(policy)), cpu_compute="off")
            model = OledLLaDA2ForDiffusionLM.from_pretrained(path, offload_config=oc).eval()
            configs[f"{policy} @ {size} slots"] = model
    ids = torch.randint(0, configs["resident, grouped"].config.vocab_size - 8, (1, 32),
                        generator=torch.Generator().manual_seed(0))
    times = {name: [] for name in configs}
    policy_share = {name: [] for name in configs}
    names = list(configs)
    with torch.no_grad():
        reference = configs["resident, grouped"](ids).logits
        for name, model in configs.items():  # warm-up (bank build, cache fill), bit-identity check
            assert torch.equal(model(ids).logits, reference), name
        for r in range(args.runs):
            for i in range(len(names)):
                name = names[(i + r) % len(names)]
                model = configs[name]
                rt = getattr(model, "_offload_runtime", None)
                if rt is not None:
                    rt.reset_stats()
                start = time.perf_counter()
                model(ids)
                if rt is not None:  # plans of layers that ran without a routing sync belong to this forward
                    rt.controller.flush()
                elapsed = time.perf_counter() - start
                times[name].append(elapsed)
                if rt is not None:
                    policy_share[name].append(float(rt.timing["policy"].sum()) / elapsed)
    base = times["resident, grouped"]
    print(f"{path}: one 32-token block forward, {args.runs} rounds round-robin, {torch.get_num_threads()} thread(s)")
    print(f"{'config':28} {'median ms':>9} {'spread':>8} {'x grouped':>9} {'policy %':>8}")
    for name in names:
        ratio = statistics.median(a / b for a, b in zip(times[name], base))
        share = f"{100 * statistics.median(policy_share[name]):8.2f}" if policy_share[name] else f"{'-':>8}"
        t = times[name]
        print(f"{name:28} {1e3 * statistics.median(t):9.2f} {1e3 * (max(t) - min(t)):8.2f} {ratio:9.3f} {share}")


if __name__ == "__main__":
    main()
