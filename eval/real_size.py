"""LLaDA2.0-mini at its real size on this machine: write, load, generate, per cache ratio and system.

    .venv/bin/python eval/real_size.py --dir /scratch/mini --out real_size.md --png real_size.png

Writes the real-size folder first if ``--dir`` has none (``make_checkpoint(preset="mini")``: ~32 GB of
random bf16 weights, streamed; the write's time, bytes and peak RSS are measured in a subprocess). Then
every configuration (``--ratios`` x ``--systems``, plus the resident load where ``--resident``) runs in a
fresh subprocess, in round-robin order over ``--reps`` rounds (each round rotated by one), so the page
cache and the machine's noise fall on every configuration alike. Each one loads the folder with
``OffloadConfig(cache_ratio=R, system=S)`` (``store="auto"``: on a host smaller than the model that is
the memory-mapped store, so the cache tier is RAM and the store is the disk), generates ``--new-tokens``
tokens of a fixed prompt (one block of ``--block-length``, ``--steps`` denoising steps), and reports load
time, time per generated token, the cache's hit rate, peak RSS (``ru_maxrss``; the anonymous and
file-backed parts at the end, ``/proc/self/status``: file-backed pages are the mapped shards, page cache
the kernel can drop) and bytes read from disk per token (``/proc/self/io`` ``read_bytes``).

``--store pinned`` loads the experts into one pinned host buffer instead (a ``--layers`` variant that
fits in RAM): each row then gives the ratio of its peak RSS to the bytes it must hold (expert store +
non-expert weights + expert cache), which shows whether the load made a second host copy.

HybriMoE runs as ``score+cpu+uniform``: its retention and dispatch; its prefetch part (``gate-capped``)
reads the next layer's predicted routes, which only a recorded trace holds, so it runs in replay only.

Random weights route nearly uniformly, so a cache of a fraction R of the experts hits about R of the
routes whatever the policy: retention has little to hold on to here, unlike a trained model's routing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a clone without installing
    sys.path.insert(0, str(ROOT))

PROMPT = "Explain why the sky is blue in one short paragraph."


SYSTEMS = {"hybrimoe": "score+cpu+uniform"}  # live spellings of presets whose prefetch runs in replay only


def write_whole(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_bytes() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("read_bytes"))


def rss_parts() -> dict[str, float]:
    """RssAnon and RssFile of this process, in GiB."""
    with open("/proc/self/status") as f:
        got = {line.split(":")[0]: int(line.split()[1]) for line in f if line.startswith(("RssAnon", "RssFile"))}
    return {k: v / 2**20 for k, v in got.items()}


def worker(spec: dict) -> dict:
    """One configuration, in this (fresh) process."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import oled_hf
    from oled_hf.offload.config import OffloadConfig

    torch.set_num_threads(spec["threads"])
    tok = AutoTokenizer.from_pretrained(spec["dir"])
    ids = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    start_read = read_bytes()
    t0 = time.perf_counter()
    kwargs = {}
    if spec["system"] != "resident":
        kwargs["offload_config"] = OffloadConfig(cache_ratio=spec["ratio"], system=SYSTEMS.get(spec["system"],
                                                 spec["system"]), store=spec.get("store", "auto"))
    model = AutoModelForCausalLM.from_pretrained(spec["dir"], **kwargs).eval()
    load_s = time.perf_counter() - t0
    rss_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    before = read_bytes()
    t1 = time.perf_counter()
    out = model.generate(**ids, max_new_tokens=spec["new_tokens"], block_length=spec["block_length"],
                         steps=spec["steps"], eos_early_stop=False)
    gen_s = time.perf_counter() - t1
    new = out[0, ids["input_ids"].shape[1]:].tolist()
    rt = getattr(model, "_offload_runtime", None)
    stats = rt.controller.stats if rt is not None else None
    held = held_bytes(model, rt)
    return dict(spec, load_s=load_s, gen_s=gen_s, s_per_token=gen_s / max(len(new), 1), tokens=new,
                hit_rate=stats.hit_rate if stats is not None else 1.0,
                store=rt.store.mode if rt is not None else "resident",
                peak_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, rss_after_load_gib=rss_load,
                read_gib_load=(before - start_read) / 2**30,
                read_mib_per_token=(read_bytes() - before) / 2**20 / max(len(new), 1),
                oled_hf=oled_hf.__version__, **held, **{k.lower(): v for k, v in rss_parts().items()})


def held_bytes(model, rt) -> dict[str, float]:
    """GiB the process must hold: the model's own weights (offloaded: all but the routed experts), the
    expert store's host copy (0 when mapped: the shards' pages are the kernel's), the expert cache."""
    tensors = [*model.parameters(), *model.buffers()]
    nonexpert = sum(t.numel() * t.element_size() for t in tensors if t.device.type != "meta")
    store = cache = 0
    if rt is not None:
        store = rt.store.host_bytes() if rt.store.mode == "pinned" else 0
        cache = rt.cache.total_slots * rt.store.expert_bytes
    got = dict(weights_gib=nonexpert / 2**30, store_gib=store / 2**30, cache_gib=cache / 2**30)
    got["held_gib"] = sum(got.values())
    return got


def run_sub(args: list[str], env: dict) -> dict:
    p = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def write_folder(folder: Path) -> dict:
    """The real-size folder, written streaming (in this process: it is a subprocess of the driver)."""
    from oled_hf.checkpoints.factory import make_checkpoint

    t0 = time.perf_counter()
    make_checkpoint(folder, preset="mini", seed=0)
    size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    return dict(write_s=time.perf_counter() - t0, write_gib=size / 2**30,
                write_peak_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)


def table(results: list[dict]) -> str:
    head = ["system", "cache", "store", "load s", "s / token", "hit rate", "peak RSS GiB", "anon GiB",
            "file-backed GiB", "disk MiB / token", "held GiB", "peak / held", "tokens = resident"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by: dict[tuple, list[dict]] = {}
    for r in results:
        by.setdefault((r["system"], r["ratio"]), []).append(r)
    ref = next((v[0]["tokens"] for k, v in by.items() if k[0] == "resident" and "tokens" in v[0]), None)
    for (system, ratio), rs in by.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            rows.append(f"| {system} | {ratio:g} | failed: {rs[0]['error']} |" + " |" * (len(head) - 3))
            continue

        def med(key, ok=ok):
            vals = [r[key] for r in ok]
            m = statistics.median(vals)
            return f"{m:.2f}" + (f" [{min(vals):.2f}-{max(vals):.2f}]" if len(vals) > 1 else "")
        same = "-" if ref is None or system == "resident" else ("yes" if all(r["tokens"] == ref for r in ok) else "NO")
        rows.append(f"| {system} | {'all' if system == 'resident' else f'{ratio:g}'} | {ok[0]['store']} | "
                    f"{med('load_s')} | {med('s_per_token')} | {med('hit_rate')} | {med('peak_rss_gib')} | "
                    f"{med('rssanon')} | {med('rssfile')} | {med('read_mib_per_token')} | {med('held_gib')} | "
                    f"{statistics.median(r['peak_rss_gib'] / r['held_gib'] for r in ok):.2f} | {same} |")
    return "\n".join(rows)


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for system in sorted({r["system"] for r in results if r["system"] != "resident"}):
        rs = sorted((r for r in results if r["system"] == system and "error" not in r), key=lambda r: r["ratio"])
        ratios = sorted({r["ratio"] for r in rs})
        med = lambda key, x, rs=rs: statistics.median(r[key] for r in rs if r["ratio"] == x)  # noqa: E731
        a.plot([100 * x for x in ratios], [med("s_per_token", x) for x in ratios], "o-", label=system)
        b.plot([100 * x for x in ratios], [med("peak_rss_gib", x) for x in ratios], "o-", label=system)
    a.set(xlabel="cache (% of routed experts)", ylabel="s per generated token", title="time per token")
    b.set(xlabel="cache (% of routed experts)", ylabel="GiB", title="peak RSS (incl. mapped shards)")
    a.legend()
    fig.suptitle("LLaDA2.0-mini dimensions (random weights), 2 CPU cores, store on disk")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", type=Path, required=True, help="the real-size folder (written first if absent)")
    p.add_argument("--out", type=Path, required=True,
                   help="Markdown of the figures (written whole; its .json beside it holds every run)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out, its .json and --png")
    p.add_argument("--store", default="auto", choices=["auto", "pinned", "mmap"],
                   help="the expert store of every offloaded row (default auto: mmap when pinned would not fit)")
    p.add_argument("--png", type=Path, default=None)
    p.add_argument("--ratios", nargs="+", type=float, default=[0.1, 0.25, 0.4])
    p.add_argument("--systems", nargs="+", default=["oled", "lru-full", "hybrimoe"],
                   help="systems (presets or parts); hybrimoe runs without its replay-only prefetch")
    p.add_argument("--resident", action="store_true", help="also load resident (refused where it cannot fit)")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--block-length", type=int, default=32)
    p.add_argument("--steps", type=int, default=4, help="denoising steps per block (default 4)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--write", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    if args.write:
        print(json.dumps(write_folder(args.dir)))
        return 0
    bad = [r for r in args.ratios if not 0 < r <= 1]
    if bad or args.reps < 1 or args.steps < 1 or args.new_tokens < 1:
        print("real_size: --ratios must be in (0, 1], --reps, --steps and --new-tokens at least 1", file=sys.stderr)
        return 2
    outputs = [args.out, args.out.with_suffix(".json"), *([args.png] if args.png else [])]
    existing = [str(f) for f in outputs if f.exists()]
    if existing and not args.overwrite:
        print(f"real_size: {existing[0]} exists: pass --overwrite to replace it", file=sys.stderr)
        return 2
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    head = {}
    if not (args.dir / "model.safetensors.index.json").is_file():
        head = run_sub(["--dir", str(args.dir), "--out", str(args.out), "--write"], env)
        if "error" in head:
            print(f"real_size: writing {args.dir} failed: {head['error']}", file=sys.stderr)
            return 1
        print(f"[wrote {head['write_gib']:.1f} GiB in {head['write_s']:.0f} s, peak RSS "
              f"{head['write_peak_rss_gib']:.2f} GiB]", flush=True)
    specs = [dict(system=s, ratio=r) for r in args.ratios for s in args.systems]
    if args.resident:
        specs.insert(0, dict(system="resident", ratio=1.0))
    results = []
    t0 = time.time()
    for rep in range(args.reps):
        order = specs[rep % len(specs):] + specs[:rep % len(specs)]
        for spec in order:
            spec = dict(spec, dir=str(args.dir), new_tokens=args.new_tokens, block_length=args.block_length,
                        steps=args.steps, threads=args.threads, store=args.store)
            r = run_sub(["--dir", str(args.dir), "--out", str(args.out), "--worker", json.dumps(spec)], env)
            r = dict(spec, **r)
            results.append(r)
            print(f"[{time.time() - t0:.0f} s] {spec['system']} {spec['ratio']:g}: "
                  + (r["error"] if "error" in r else f"load {r['load_s']:.1f} s, {r['s_per_token']:.2f} s/token, "
                     f"hit {r['hit_rate']:.3f}, peak RSS {r['peak_rss_gib']:.2f} GiB (anon {r['rssanon']:.2f}), "
                     f"{r['read_mib_per_token']:.0f} MiB read/token, store {r['store']}"), flush=True)
    lines = ["# LLaDA2.0-mini at real size on this machine", "",
             "Command: `.venv/bin/python eval/real_size.py --dir DIR --out FILE "
             f"--steps {args.steps} --reps {args.reps}`"
             f"; {os.cpu_count()} CPU cores, {args.threads} torch threads; {args.new_tokens} new tokens, one block of "
             f"{args.block_length}, {args.steps} denoising steps; run time {time.time() - t0:.0f} s.", ""]
    if head:
        rate = head["write_gib"] / head["write_s"]
        lines += [f"Write: {head['write_gib']:.1f} GiB in {head['write_s']:.0f} s ({rate:.2f} GiB/s), "
                  f"peak RSS {head['write_peak_rss_gib']:.2f} GiB.", ""]
    lines += [table(results), ""]
    write_whole(args.out, "\n".join(lines) + "\n")
    write_whole(args.out.with_suffix(".json"), json.dumps(results))
    if args.png:
        plot(results, args.png)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
