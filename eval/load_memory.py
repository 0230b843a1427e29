"""Peak host memory of loading a checkpoint with offloading, against the checkpoint's size.

Each measurement runs in a fresh process: RSS after importing torch/transformers is the baseline;
peak RSS (ru_maxrss) after ``from_pretrained`` minus that baseline is what loading cost.

    .venv/bin/python eval/load_memory.py [--model DIR] [--cache-ratio 0.4]

Without ``--model`` it measures the ``small`` preset (random weights, 387 MB) in the user's cache
folder shared with ``make bench`` and ``eval/experts_speed.py`` (``~/.cache/oled-hf/small`` or
``$XDG_CACHE_HOME/oled-hf/small``), made there on first use, never inside the repository.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling script, also when loaded by path
from bench_generate import cache_dir  # noqa: E402  (one cache folder for the benchmark checkpoints)

CHILD = r"""
import json, resource, sys
import torch, transformers, oled_hf
def rss_mb():
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmRSS'):
                return int(line.split()[1]) / 1024
base = rss_mb()
peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
from oled_hf.modeling import OledLLaDA2ForDiffusionLM
mode, path, ratio, store = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
kw = {} if mode == 'resident' else {'offload_config': oled_hf.OffloadConfig(cache_ratio=ratio, store=store)}
model = OledLLaDA2ForDiffusionLM.from_pretrained(path, **kw)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({'baseline_mb': base, 'peak_mb': max(peak, peak_before), 'after_mb': rss_mb()}))
"""


def measure(mode: str, path: str, ratio: float, store: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, path, str(ratio), store], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def default_model() -> Path:
    """The small preset in the user's cache, the very checkpoint ``make bench`` (bench_generate.py) uses."""
    return cache_dir() / "small"


def checkpoint_size_mb(path: Path) -> float:
    """MiB of ``path``'s safetensors shards, or a ValueError naming the folder when it has none."""
    size = sum(f.stat().st_size for f in path.glob("*.safetensors")) / 2**20
    if not size:
        raise ValueError(f"--model {path}: no *.safetensors files in that folder")
    return size


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None,
                   help="checkpoint folder (default: ~/.cache/oled-hf/small, the small preset, made on first use)")
    p.add_argument("--cache-ratio", type=float, default=0.4)
    args = p.parse_args(argv)
    path = args.model or default_model()
    if args.model is None and not (path / "config.json").is_file():
        from oled_hf.checkpoints.factory import make_checkpoint

        make_checkpoint(path, preset="small", seed=0)
        print(f"made the small preset checkpoint (random weights) at {path}")
    try:
        size_mb = checkpoint_size_mb(path)
    except ValueError as err:
        p.error(str(err))  # one line, exit status 2, before any measurement
    print(f"checkpoint: {path}, {size_mb:.1f} MiB of safetensors")
    for mode, store in (("resident", "auto"), ("offload", "pinned"), ("offload", "mmap")):
        m = measure(mode, str(path), args.cache_ratio, store)
        cost = m["peak_mb"] - m["baseline_mb"]
        print(f"{mode:>8} store={store:<6}  peak over baseline {cost:8.1f} MiB = {cost / size_mb:.2f}x checkpoint; "
              f"resident after load {m['after_mb'] - m['baseline_mb']:8.1f} MiB")


if __name__ == "__main__":
    main()
