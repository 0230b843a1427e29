"""Does accelerate's ``max_memory={"cpu": CAP}`` hold while loading without ``offload_config``?

Loads a checkpoint the Transformers way, ``device_map="auto", max_memory={"cpu": CAP},
offload_folder=TMP`` (accelerate places what fits the cap on the CPU and offloads the rest to disk),
generates a few tokens, and prints one JSON line: load seconds, the process's anonymous memory before
loading and its peak (``RssAnon`` of ``/proc/self/status``, sampled every 20 ms from a thread: the
host memory the weights held in RAM take; mapped shard pages are file-backed and not counted), the
bytes read from disk during the load (``read_bytes`` of ``/proc/self/io``; pages already in the
page cache are not read again) and the devices accelerate used.

    .venv/bin/python eval/accelerate_max_memory.py DIR --cap 12GiB
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path


def status_bytes(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` in bytes (0 where absent)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def disk_read_bytes() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("read_bytes:")).split(":")[1])


class PeakAnon:
    """The largest ``RssAnon`` seen while the block runs (a sampling thread)."""

    def __init__(self, every_s: float = 0.02) -> None:
        self.every_s, self.peak, self._stop = every_s, 0, threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, status_bytes("RssAnon"))
            time.sleep(self.every_s)

    def __enter__(self) -> PeakAnon:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, status_bytes("RssAnon"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint", help="checkpoint folder (e.g. oled-moe make-tiny DIR --preset mini)")
    p.add_argument("--cap", default="12GiB", help="max_memory's cpu entry (default: 12GiB)")
    p.add_argument("--new-tokens", type=int, default=8, help="tokens generated after the load (default: 8)")
    args = p.parse_args()
    if not (Path(args.checkpoint) / "config.json").is_file():
        p.error(f"{args.checkpoint}: no config.json, not a checkpoint folder")

    import torch
    from transformers import AutoModelForCausalLM

    import oled_hf  # noqa: F401  (registers the Auto classes)

    gib = float(1 << 30)
    before_anon, before_read = status_bytes("RssAnon"), disk_read_bytes()
    with PeakAnon() as peak, tempfile.TemporaryDirectory(prefix="offload-") as folder:
        start = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(args.checkpoint, device_map="auto",
                                                     max_memory={"cpu": args.cap}, offload_folder=folder)
        load_s = time.perf_counter() - start
        read = disk_read_bytes() - before_read
        model.generate(torch.tensor([[5, 17, 42, 99]]), max_new_tokens=args.new_tokens, block_length=8, steps=2)
    print(json.dumps({"cap": args.cap, "load_s": round(load_s, 1), "anon_before_gib": round(before_anon / gib, 2),
                      "peak_anon_gib": round(peak.peak / gib, 2), "disk_read_gib": round(read / gib, 2),
                      "devices": sorted({str(v) for v in model.hf_device_map.values()})}))


if __name__ == "__main__":
    main()
