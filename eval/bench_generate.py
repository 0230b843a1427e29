"""Block-diffusion decoding speed on CPU, resident: cached vs uncached, block lengths 16 and 32.

Prints, for the ``small`` preset (random weights, made on first use in the user's cache folder,
``~/.cache/oled-hf/small`` or ``$XDG_CACHE_HOME/oled-hf/small``, never inside the repository):
the forward time of one 32-token block, then per block length the time per output token (TPOT), tokens per forward,
iterations per block, and the speed-up of prefix-cached over uncached decoding.

    .venv/bin/python eval/bench_generate.py [--model DIR] [--new-tokens 256] [--threads N] [--quiet]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from oled_hf.progress import add_quiet_argument, progress


def cache_dir() -> Path:
    """Where generated benchmark checkpoints go: the user's cache, not the repository (the small one is 387 MB)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "oled-hf"


def load_small(path: Path, made=print):
    from oled_hf.modeling import OledLLaDA2ForDiffusionLM

    from oled_hf.checkpoints.factory import make_checkpoint

    if not (path / "config.json").is_file():
        make_checkpoint(path, preset="small", seed=0)
        made(f"made the small preset checkpoint (random weights) at {path}")
    return OledLLaDA2ForDiffusionLM.from_pretrained(path).eval()


def forward_time(model, block: int = 32, repeats: int = 10) -> float:
    ids = torch.randint(0, model.config.vocab_size - 8, (1, block))
    with torch.no_grad():
        model(ids)
        start = time.perf_counter()
        for _ in range(repeats):
            model(ids)
    return (time.perf_counter() - start) / repeats


def run(model, prompt, new_tokens, block_length, use_cache, threshold):
    start = time.perf_counter()
    out = model.generate(prompt, max_new_tokens=new_tokens, block_length=block_length, threshold=threshold,
                         use_cache=use_cache, return_dict_in_generate=True)
    elapsed = time.perf_counter() - start
    generated = out.sequences.shape[1] - prompt.shape[1]
    return out, elapsed / generated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None,
                        help="checkpoint folder (default: ~/.cache/oled-hf/small, the small preset, made on first use)")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=40)
    parser.add_argument("--threshold", type=float, default=0.95)
    parser.add_argument("--threads", type=int, default=None)
    add_quiet_argument(parser)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    path = Path(args.model) if args.model else cache_dir() / "small"
    model = load_small(path)
    print(f"small preset ({path}): {model.num_parameters() / 1e6:.1f}M parameters, "
          f"torch threads {torch.get_num_threads()}")
    print(f"forward of one 32-token block (no cache): {forward_time(model) * 1000:.1f} ms")
    prompt = torch.randint(0, model.config.vocab_size - 8, (1, args.prompt_tokens),
                           generator=torch.Generator().manual_seed(0))
    header = f"{'block':>5} {'cache':>6} {'TPOT ms':>8} {'tok/fwd':>8} {'iter/blk':>9} {'forwards':>8} {'speed-up':>8}"
    print(header)
    bar = progress(total=4, desc="decoding", unit="run", quiet=args.quiet)
    for block_length in (16, 32):
        results = {}
        for use_cache in (True, False):
            out, tpot = run(model, prompt, args.new_tokens, block_length, use_cache, args.threshold)
            results[use_cache] = (out, tpot)
            bar.update()
        assert torch.equal(results[True][0].sequences, results[False][0].sequences), "cached != uncached tokens"
        for use_cache in (True, False):
            out, tpot = results[use_cache]
            speedup = results[False][1] / results[True][1] if use_cache else 1.0
            print(f"{block_length:>5} {str(use_cache):>6} {tpot * 1000:>8.2f} {float(out.tokens_per_forward[0]):>8.2f} "
                  f"{float(out.iterations[0]) / float(out.blocks[0]):>9.2f} {out.forwards:>8} {speedup:>7.2f}x")


if __name__ == "__main__":
    main()
