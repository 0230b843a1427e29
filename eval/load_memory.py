"""Peak host memory of loading a checkpoint with offloading, against the checkpoint's size.

Each measurement runs in a fresh process: RSS after importing torch/transformers is the baseline;
peak RSS (ru_maxrss) after ``from_pretrained`` minus that baseline is what loading cost.

    .venv/bin/python eval/load_memory.py --model checkpoints_out/small [--cache-ratio 0.4]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="checkpoints_out/small")
    p.add_argument("--cache-ratio", type=float, default=0.4)
    args = p.parse_args()
    size_mb = sum(f.stat().st_size for f in Path(args.model).glob("*.safetensors")) / 2**20
    print(f"checkpoint: {args.model}, {size_mb:.1f} MiB of safetensors")
    for mode, store in (("resident", "auto"), ("offload", "pinned"), ("offload", "mmap")):
        m = measure(mode, args.model, args.cache_ratio, store)
        cost = m["peak_mb"] - m["baseline_mb"]
        print(f"{mode:>8} store={store:<6}  peak over baseline {cost:8.1f} MiB = {cost / size_mb:.2f}x checkpoint; "
              f"resident after load {m['after_mb'] - m['baseline_mb']:8.1f} MiB")


if __name__ == "__main__":
    main()
