"""GPU check: full residency vs offloading on one CUDA GPU, in stages that each leave a result file as they end.

A lent GPU is lent for minutes: a check that writes nothing until its end returns nothing when it is
killed, so every stage is its own command (``eval/gpu_check.sh`` runs each as its own process with a
time limit) and writes ``<stage>.json`` into ``--out-dir`` as soon as it ends, failed or not:

* ``build``: a random checkpoint of LLaDA2.0-mini's width (``--layers`` fewer than its 20 to fit the time),
  skipped when ``--model`` or an earlier build is there;
* ``resident``: full residency's tokens (the reference), TPOT, and the per-expert loop's TPOT;
* ``row --row SPEC``: one offloaded configuration, ``SYSTEM@SLOTS:CPU`` (``oled@40:auto``) or ``all-cached``;
* ``report``: reads every result file, prints the table and the checks, exits 1 if any failed or is missing.

Each row fails loudly (``failures`` in its file, exit 1) unless: the pool's device is CUDA (with
``--device cuda``), the store is pinned (page-locked on CUDA), bytes were copied, ``oled+previous``
issued prefetches, every layer of the all-cached row holds every expert (filled with CPU compute off:
it copies every miss) and runs without a routing read, the host syncs per layer access are within the
budget (0 all cached, 1 without CPU misses, 2 with), and the tokens equal the resident ones wherever
the experts ran on one device (within ``--cpu-tolerance`` token agreement where the CPU computed
misses beside a GPU: their kernels round differently). It reports the host syncs per layer and the
copy bandwidth a wave of expert copies reached against one plain copy of the same bytes.

Reduced mode, run by the tests both ways: ``--device cpu --preset tiny`` (``--cpu-compute on`` runs the
rows as ``auto`` resolves beside CUDA: CPU compute on).

    python eval/gpu_check.py [all|build|resident|row|report] [--row SPEC] [--out-dir D] [--device cuda] ...
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import traceback
from pathlib import Path

import torch
from oled_hf.modeling import OledLLaDA2Config, OledLLaDA2ForDiffusionLM
from oled_hf.modeling.experts import LOOP_EXECUTOR, grouped_supported

import oled_hf  # noqa: F401
from oled_hf import OffloadConfig
from oled_hf.checkpoints.presets import preset_config_kwargs
from oled_hf.checkpoints.streaming import write_random_checkpoint
from oled_hf.fileio import check_new_files, write_text_atomically
from oled_hf.progress import quiet_library_bars

STAGES = ("all", "build", "resident", "row", "report")
ALL_CACHED = "all-cached"
BUDGET = {"off": 1, "on": 2, ALL_CACHED: 0}  # host syncs per layer access (docs/performance.md)
MINI = dict(vocab_size=157184, hidden_size=2048, num_hidden_layers=20, num_attention_heads=16, num_key_value_heads=4,
            head_dim=128, rotary_dim=64, intermediate_size=5120, num_experts=256, num_experts_per_tok=8,
            moe_intermediate_size=512, n_group=8, topk_group=4, max_position_embeddings=32768)


def build_config(preset: str, layers: int | None = None) -> OledLLaDA2Config:
    """The check's model: mini's full width (``layers``: fewer transformer layers, the first one dense)."""
    if preset == "mini":
        return OledLLaDA2Config(**{**MINI, **({"num_hidden_layers": layers} if layers else {})})
    kw = preset_config_kwargs(preset)
    if layers:
        kw["num_hidden_layers"] = layers
    v = kw["vocab_size"]
    return OledLLaDA2Config(**kw, eos_token_id=v - 3, pad_token_id=v - 3, mask_token_id=v - 1)


def row_specs(args) -> list[str]:
    """The offloaded rows: each policy at each size with ``--cpu-compute``, the first with CPU compute off,
    ``oled+previous`` (prefetch) with it off, and every expert cached."""
    specs = [f"{p}@{s}:{args.cpu_compute}" for s in args.cache_sizes for p in args.policies]
    specs += [f"{args.policies[0]}@{args.cache_sizes[0]}:off", f"oled+previous@{args.cache_sizes[0]}:off", ALL_CACHED]
    return list(dict.fromkeys(specs))


def parse_row(spec: str) -> tuple[str, int | None, str]:
    """``SYSTEM@SLOTS:CPU`` -> (system, slots, cpu_compute); ``all-cached``: oled, every slot, CPU compute off."""
    if spec == ALL_CACHED:
        return "oled", None, "off"
    try:
        system, rest = spec.split("@")
        size, cpu = rest.split(":")
        if cpu not in ("auto", "on", "off"):
            raise ValueError
        return system, int(size), cpu
    except ValueError:
        raise ValueError(f"--row={spec!r} is invalid: give SYSTEM@SLOTS:CPU (e.g. oled@40:auto) or {ALL_CACHED}") \
            from None


def result_name(stage: str, spec: str | None = None) -> str:
    if stage != "row":
        return f"{stage}.json"
    return "row-" + "".join(c if c.isalnum() else "_" for c in spec) + ".json"


def prompts(config, n: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, config.vocab_size - 8, (1, 24 + 9 * i), generator=gen) for i in range(n)]


def decode(model, ids_list, args) -> tuple[list[torch.Tensor], float]:
    """Every prompt decoded; returns the new tokens and TPOT (seconds per new token)."""
    outs, seconds, tokens = [], 0.0, 0
    for ids in ids_list:
        ids = ids.to(model.device)
        sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
        sync()
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=args.max_new_tokens, block_length=args.block_length, threshold=0.95)
        sync()
        seconds += time.perf_counter() - start
        tokens += out.shape[1] - ids.shape[1]
        outs.append(out[0, ids.shape[1]:].cpu())
    return outs, seconds / max(tokens, 1)


def agreement(a: list[torch.Tensor], b: list[list[int]]) -> float:
    same = sum(int((x == torch.tensor(y)).sum()) for x, y in zip(a, b) if x.numel() == len(y))
    return same / max(sum(len(y) for y in b), 1)


def fill_every_layer(model) -> int:
    """One access per MoE layer requesting every expert (the cache must hold them all); bytes it copied."""
    rt, cfg = model._offload_runtime, model.config
    ids = torch.arange(cfg.num_experts, device=model.device).reshape(-1, cfg.num_experts_per_tok)
    x = torch.zeros(ids.shape[0], cfg.hidden_size, dtype=model.dtype, device=model.device)
    weights = torch.full(ids.shape, 1.0 / ids.shape[1], device=model.device)
    with torch.no_grad():
        for block, executor in zip(model.moe_blocks(), rt.executors):
            executor(block, x, ids, weights)
    copied = int(model.offload_stats()["total"]["bytes_copied"])
    rt.reset_stats()
    return copied


def copy_bandwidth(model, n: int = 32) -> dict:
    """GB/s of one wave of ``n`` expert copies through the cache, and of one plain copy of the same bytes.

    Run last: it overwrites slots the bookkeeping still assigns to other experts."""
    rt = model._offload_runtime
    cache, store = rt.cache, rt.store
    n = max(1, min(n, cache.total_slots, store.num_experts))
    sync = torch.cuda.synchronize if cache.cuda else (lambda: None)
    cache.synchronize()
    sync()
    start = time.perf_counter()
    cache.load_wave(list(range(n)), 0, list(range(n)))
    cache.synchronize()
    sync()
    wave_s = time.perf_counter() - start
    src = store.buffers[0][:n] if store.mode == "pinned" else torch.stack([cache.pool[0]] * n).cpu()
    start = time.perf_counter()
    cache.pool[:n].copy_(src, non_blocking=True)
    sync()
    plain_s = time.perf_counter() - start
    nbytes = n * store.expert_bytes
    return {"copies": n, "wave_gb_per_s": nbytes / max(wave_s, 1e-12) / 1e9,
            "plain_gb_per_s": nbytes / max(plain_s, 1e-12) / 1e9}


def row_checks(args, spec: str, model, agree: float, stats: dict, filled: int) -> list[str]:
    """What must hold for this row (the module docstring); each failure in one line."""
    system, _, cpu = parse_row(spec)
    rt, total, failures = model._offload_runtime, stats["total"], []
    if args.device.startswith("cuda") and not rt.cache.cuda:
        failures.append(f"the pool's device is {rt.cache.device}, not CUDA")
    if rt.store.mode != "pinned" or (rt.cache.cuda and not rt.store.buffers[0].is_pinned()):
        failures.append(f"the store is {rt.store.mode}, not pinned (page-locked)")
    if (filled if spec == ALL_CACHED else total["bytes_copied"]) <= 0:
        failures.append("no bytes were copied")
    if "+previous" in system and stats["prefetches"] <= 0:
        failures.append(f"{system} issued no prefetch")
    if spec == ALL_CACHED:
        holds = [rt.controller.holds_all(layer) for layer in range(rt.num_layers)]
        if not all(holds) or total["misses"] or rt.routing_transfers.sum():
            failures.append(f"not every expert cached: layers holding all {holds}, misses {total['misses']}, "
                            f"routing reads {int(rt.routing_transfers.sum())}")
    budget = BUDGET[ALL_CACHED if spec == ALL_CACHED else rt.cpu_compute]
    if total["host_syncs_per_access"] > budget:
        failures.append(f"{total['host_syncs_per_access']:.2f} host syncs per layer access, budget {budget}")
    split = rt.cpu_compute == "on" and rt.cache.cuda  # CPU experts beside a GPU: kernels round differently
    if split and agree < args.cpu_tolerance:
        failures.append(f"token agreement {agree:.4f} below the tolerance {args.cpu_tolerance} (CPU compute on)")
    if not split and agree != 1.0:
        failures.append(f"tokens differ from full residency (agreement {agree:.4f}) with every expert on one device")
    return failures


def stage_build(args, out: Path) -> dict:
    path = model_path(args, out)
    if (path / "config.json").is_file():
        return {"path": str(path), "built": False, "failures": []}
    dtype = torch.bfloat16 if args.preset == "mini" else torch.float32
    write_random_checkpoint(path, build_config(args.preset, args.layers), dtype=dtype, quiet=True)
    return {"path": str(path), "built": True, "failures": []}


def stage_resident(args, out: Path) -> dict:
    path = model_path(args, out)
    config = OledLLaDA2Config.from_pretrained(path)
    model = OledLLaDA2ForDiffusionLM.from_pretrained(path, device_map=args.device).eval()
    outs, tpot = decode(model, prompts(config, args.prompts), args)
    grouped = grouped_supported(model.device.type, model.dtype)
    for block in model.moe_blocks():
        block.experts_executor = LOOP_EXECUTOR
    loop_outs, loop_tpot = decode(model, prompts(config, args.prompts), args)
    reference = [o.tolist() for o in outs]
    loop_agree = agreement(loop_outs, reference)
    failures = [] if loop_agree == 1.0 else [f"the per-expert loop's tokens differ (agreement {loop_agree:.4f})"]
    return {"tpot_ms": 1e3 * tpot, "loop_tpot_ms": 1e3 * loop_tpot, "grouped": grouped, "reference": reference,
            "loop_agreement": loop_agree, "failures": failures}


def stage_row(args, out: Path, spec: str) -> dict:
    system, size, cpu = parse_row(spec)
    resident = read_result(out, "resident")
    if resident is None:
        return {"row": spec, "failures": ["no resident.json: run the resident stage first"]}
    path = model_path(args, out)
    config = OledLLaDA2Config.from_pretrained(path)
    cpu = args.cpu_compute if cpu == "auto" else cpu
    oc = OffloadConfig(cache_size=size or config.num_experts, system=system, cpu_compute=cpu)
    start = time.perf_counter()
    model = OledLLaDA2ForDiffusionLM.from_pretrained(path, device_map=args.device, offload_config=oc).eval()
    load_s = time.perf_counter() - start
    filled = fill_every_layer(model) if spec == ALL_CACHED else 0
    outs, tpot = decode(model, prompts(config, args.prompts), args)
    stats = model.offload_stats()
    agree = agreement(outs, resident["reference"])
    failures = row_checks(args, spec, model, agree, stats, filled)
    total, rt = stats["total"], model._offload_runtime
    accesses = max(total["forwards"] * rt.num_layers, 1)
    return {"row": spec, "system": stats["system"], "cpu_compute": rt.cpu_compute, "store": rt.store.mode,
            "device": stats["device"], "tpot_ms": 1e3 * tpot, "x_full": 1e3 * tpot / resident["tpot_ms"],
            "load_s": load_s, "hit_rate": total["hit_rate"], "bytes_copied": total["bytes_copied"],
            "filled_bytes": filled, "prefetches": stats["prefetches"], "token_agreement": agree,
            "cpu_expert_tokens": total["cpu_expert_tokens"], "host_syncs_per_layer": total["host_syncs_per_access"],
            "routing_syncs_per_layer": float(rt.routing_transfers.sum()) / accesses,
            "host_us_per_layer": 1e6 * total["policy_seconds"] / accesses,
            "bandwidth": copy_bandwidth(model), "failures": failures}


def stage_report(args, out: Path) -> dict:
    """Every stage's result, the checks, one table; failures: what failed or never wrote its file."""
    failures, rows = [], []
    resident = read_result(out, "resident")
    for stage in ("resident",):
        if resident is None:
            failures.append(f"{stage}: no result file (killed, crashed or not run)")
    for spec in row_specs(args):
        row = read_result(out, "row", spec)
        if row is None:
            failures.append(f"{spec}: no result file (killed, crashed or not run)")
            continue
        rows.append(row)
        failures += [f"{spec}: {f}" for f in row["failures"]]
    if resident is not None:
        failures += [f"resident: {f}" for f in resident["failures"]]
        print(f"full residency TPOT {resident['tpot_ms']:.2f} ms, per-expert loop {resident['loop_tpot_ms']:.2f} ms "
              f"(grouped GEMM: {'yes' if resident['grouped'] else 'NO'})")
    for r in rows:
        if "tpot_ms" not in r:
            continue
        bw = r["bandwidth"]
        print(f"{r['row']:<24} TPOT {r['tpot_ms']:9.2f} ms ({r['x_full']:.2f}x)  hit {r['hit_rate']:.3f}  "
              f"copied {r['bytes_copied'] / 2**20:9.1f} MiB  agree {r['token_agreement']:.4f}  "
              f"host syncs/layer {r['host_syncs_per_layer']:.2f}  copies {bw['wave_gb_per_s']:.1f} GB/s "
              f"(plain copy {bw['plain_gb_per_s']:.1f})  {'ok' if not r['failures'] else 'FAILED'}", flush=True)
    for f in failures:
        print(f"FAILED: {f}", flush=True)
    print("gpu_check:", "every check passed" if not failures else f"{len(failures)} check(s) FAILED", flush=True)
    return {"rows": len(rows), "failures": failures}


def model_path(args, out: Path) -> Path:
    return Path(args.model) if args.model else out / f"ckpt-{args.preset}{f'-{args.layers}l' if args.layers else ''}"


def read_result(out: Path, stage: str, spec: str | None = None) -> dict | None:
    path = out / result_name(stage, spec)
    return json.loads(path.read_text()) if path.is_file() else None


def run_stage(args, out: Path, stage: str, spec: str | None = None) -> bool:
    """Run one stage and write its result file at once (a crash too: its error in one line); True if it passed."""
    start = time.perf_counter()
    try:
        fn = {"build": stage_build, "resident": stage_resident, "report": stage_report}.get(stage)
        result = fn(args, out) if fn is not None else stage_row(args, out, spec)
    except Exception as err:  # noqa: BLE001 - the stage's file says why it failed, the next stage still runs
        traceback.print_exc()
        result = {"row": spec, "failures": [f"crashed: {type(err).__name__}: {err}"]}
    result.update(stage=stage, seconds=time.perf_counter() - start, ok=not result["failures"])
    out.mkdir(exist_ok=True)
    write_text_atomically(json.dumps(result, indent=2), out / result_name(stage, spec))
    if stage != "report":
        print(f"gpu_check {stage}{' ' + spec if spec else ''}: {'ok' if result['ok'] else 'FAILED'} "
              f"in {result['seconds']:.0f} s{''.join(chr(10) + '  ' + f for f in result['failures'])}", flush=True)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result["ok"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stage", nargs="?", default="all", choices=STAGES)
    p.add_argument("--row", default=None, help="the row stage's configuration: SYSTEM@SLOTS:CPU or all-cached")
    p.add_argument("--list-rows", action="store_true", help="print the rows the report expects, one a line")
    p.add_argument("--model", default=None, help="existing checkpoint (default: build a random one)")
    p.add_argument("--preset", default="mini", choices=["mini", "small", "tiny"])
    p.add_argument("--layers", type=int, default=None, help="transformer layers of the built checkpoint (default: "
                   "the preset's; fewer keep the write and every load inside a lent GPU's minutes)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--cpu-compute", default="auto", choices=["auto", "on"],
                   help="the offloaded rows' CPU compute: auto (on beside CUDA, off on a CPU device); on: run them "
                        "on a CPU device as auto resolves beside CUDA")
    p.add_argument("--cpu-tolerance", type=float, default=0.75,
                   help="least token agreement with full residency where the CPU computes misses beside a GPU")
    p.add_argument("--out-dir", default="/tmp/oled_gpu_check",
                   help="the result files (and the built checkpoint) go here; made if its parent exists")
    p.add_argument("--overwrite", action="store_true", help="replace result files already in --out-dir")
    p.add_argument("--cache-sizes", type=int, nargs="+", default=[40, 100])
    p.add_argument("--policies", nargs="+", default=["oled", "lru"])
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--block-length", type=int, default=32)
    p.add_argument("--prompts", type=int, default=1)
    return p


def main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)
    quiet_library_bars()  # the stages' output goes to logs: no "Loading weights" bar per row
    if args.list_rows:
        print("\n".join(row_specs(args)))
        return 0
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check: no CUDA device; use --device cpu --preset tiny for the reduced check", file=sys.stderr)
        return 2
    out = Path(args.out_dir)
    specs = row_specs(args) if args.stage == "all" else [args.row] if args.stage == "row" else []
    if args.stage == "row" and args.row is None:
        p.error("the row stage needs --row SYSTEM@SLOTS:CPU or all-cached")
    try:  # refused now, not after minutes of building and decoding
        for spec in specs:
            parse_row(spec)
        stages = ["build", "resident", "row", "report"] if args.stage == "all" else [args.stage]
        names = [result_name(s) for s in stages if s != "row"] + [result_name("row", s) for s in specs]
        check_new_files(out, names, overwrite=args.overwrite, field="--out-dir", flag="--overwrite", create=True)
    except ValueError as err:
        p.error(str(err))
    if args.stage != "all":
        return 0 if run_stage(args, out, args.stage, args.row) else 1
    ok = all([run_stage(args, out, "build"), run_stage(args, out, "resident")]
             + [run_stage(args, out, "row", spec) for spec in specs])
    return 0 if run_stage(args, out, "report") and ok else 1


if __name__ == "__main__":
    sys.exit(main())
