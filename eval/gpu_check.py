"""GPU check: full residency vs offloading on one CUDA GPU, identical tokens, TPOT, hit rate, bytes.

Builds a random-weight checkpoint with LLaDA2.0-mini's full dimensions (or takes --model), then
decodes the same prompts fully resident and offloaded (``oled`` and ``lru`` at cache sizes 40 and
100 slots per layer, CPU compute on: token agreement reported; plus ``oled`` at 40 with CPU compute
off, which must match exactly). It also times full residency with the per-expert loop (the grouped
kernels' reference: grouped vs loop TPOT, token agreement) and reports the host time per layer
access of each offloaded run (routing to host + policy + planning, from the runtime's ``policy``
timer). A last run caches every expert (cache size = experts per layer, each layer filled by one
synthetic access that requests all of them): every layer then runs without waiting for its
routing on the host (deferred planning: pinned buffers and events on CUDA), which must give
exactly the resident tokens with no routing sync. The tests run it on the CPU in a reduced form
(--preset tiny).

    python eval/gpu_check.py [--model DIR] [--preset mini] [--device cuda] [--out-dir /tmp/gpu_check]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch
from oled_hf.modeling import OledLLaDA2Config, OledLLaDA2ForDiffusionLM
from oled_hf.modeling.experts import LOOP_EXECUTOR, grouped_supported

import oled_hf  # noqa: F401
from oled_hf import OffloadConfig
from oled_hf.checkpoints.presets import preset_config_kwargs
from oled_hf.checkpoints.streaming import write_random_checkpoint
from oled_hf.fileio import check_new_files, write_text_atomically
from oled_hf.offload.system import spelling, system_of_legacy

RESULT_NAME = "gpu_check.json"
MINI = dict(vocab_size=157184, hidden_size=2048, num_hidden_layers=20, num_attention_heads=16, num_key_value_heads=4,
            head_dim=128, rotary_dim=64, intermediate_size=5120, num_experts=256, num_experts_per_tok=8,
            moe_intermediate_size=512, n_group=8, topk_group=4, max_position_embeddings=32768)


def build_config(preset: str) -> OledLLaDA2Config:
    if preset == "mini":
        return OledLLaDA2Config(**MINI)
    kw = preset_config_kwargs(preset)
    v = kw["vocab_size"]
    return OledLLaDA2Config(**kw, eos_token_id=v - 3, pad_token_id=v - 3, mask_token_id=v - 1)


def run(model, prompts, gen_length, block_length):
    outs, seconds, tokens = [], 0.0, 0
    for ids in prompts:
        ids = ids.to(model.device)
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=gen_length, block_length=block_length, threshold=0.95)
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        seconds += time.perf_counter() - start
        tokens += out.shape[1] - ids.shape[1]
        outs.append(out.cpu())
    return outs, seconds / max(tokens, 1)


def agreement(a, b) -> float:
    same = sum(int((x == y).sum()) for x, y in zip(a, b) if x.shape == y.shape)
    total = sum(x.numel() for x in a)
    return same / total


def fill_every_layer(model) -> None:
    """One synthetic access per MoE layer requesting every expert (the cache must hold them all); stats reset."""
    rt, cfg = model._offload_runtime, model.config
    ids = torch.arange(cfg.num_experts, device=model.device).reshape(-1, cfg.num_experts_per_tok)
    x = torch.zeros(ids.shape[0], cfg.hidden_size, dtype=model.dtype, device=model.device)
    weights = torch.full(ids.shape, 1.0 / ids.shape[1], device=model.device)
    with torch.no_grad():
        for block, executor in zip(model.moe_blocks(), rt.executors):
            executor(block, x, ids, weights)
    rt.reset_stats()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="existing checkpoint (default: build a random one)")
    p.add_argument("--preset", default="mini", choices=["mini", "small", "tiny"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--out-dir", default="/tmp/oled_gpu_check",
                   help="gpu_check.json (and the built checkpoint) go here; made if its parent exists")
    p.add_argument("--overwrite", action="store_true", help="replace an existing gpu_check.json in --out-dir")
    p.add_argument("--cache-sizes", type=int, nargs="+", default=[40, 100])
    p.add_argument("--policies", nargs="+", default=["oled", "lru"])
    p.add_argument("--gen-length", type=int, default=32)
    p.add_argument("--block-length", type=int, default=32)
    p.add_argument("--prompts", type=int, default=1)
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check: no CUDA device; use --device cpu --preset tiny for the reduced check", file=sys.stderr)
        return 2
    out_dir = Path(args.out_dir)
    try:  # refused now, not after minutes of building and decoding
        check_new_files(out_dir, [RESULT_NAME], overwrite=args.overwrite, field="--out-dir", flag="--overwrite",
                        create=True)
    except ValueError as err:
        p.error(str(err))
    path = Path(args.model) if args.model else out_dir / f"ckpt-{args.preset}"
    if not (path / "config.json").is_file():
        start = time.perf_counter()
        dtype = torch.bfloat16 if args.preset == "mini" else torch.float32
        write_random_checkpoint(path, build_config(args.preset), dtype=dtype)
        print(f"built {args.preset} checkpoint at {path} in {time.perf_counter() - start:.0f} s", flush=True)
    config = OledLLaDA2Config.from_pretrained(path)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, config.vocab_size - 8, (1, 24 + 9 * i), generator=gen) for i in range(args.prompts)]
    resident = OledLLaDA2ForDiffusionLM.from_pretrained(path, device_map=args.device).eval()
    reference, full_tpot = run(resident, prompts, args.gen_length, args.block_length)
    grouped = grouped_supported(resident.device.type, resident.dtype)
    for block in resident.moe_blocks():
        block.experts_executor = LOOP_EXECUTOR
    loop_outs, loop_tpot = run(resident, prompts, args.gen_length, args.block_length)
    del resident
    gc.collect()
    rows = [{"config": "full residency", "tpot_ms": 1e3 * full_tpot, "hit_rate": None, "bytes_copied": 0,
             "token_agreement": 1.0},
            {"config": "full residency, expert loop", "tpot_ms": 1e3 * loop_tpot, "hit_rate": None,
             "bytes_copied": 0, "token_agreement": agreement(loop_outs, reference), "x_full": loop_tpot / full_tpot}]
    configs = [(pol, cs, "auto") for cs in args.cache_sizes for pol in args.policies]
    configs.append((args.policies[0], args.cache_sizes[0], "off"))
    configs.append((args.policies[0], config.num_experts, "full"))
    exact_ok = deferred_ok = True
    for policy, size, cpu in configs:
        size = min(size, config.num_experts)
        oc = OffloadConfig(cache_size=size, system=spelling(system_of_legacy(policy)),
                           cpu_compute="auto" if cpu == "full" else cpu)
        model = OledLLaDA2ForDiffusionLM.from_pretrained(path, device_map=args.device, offload_config=oc).eval()
        if cpu == "full":
            fill_every_layer(model)
        outs, tpot = run(model, prompts, args.gen_length, args.block_length)
        total = model.offload_stats()["total"]
        agree = agreement(outs, reference)
        if cpu in ("off", "full") and agree != 1.0:
            exact_ok = False
        accesses = max(total["forwards"] * config.num_moe_layers, 1)
        syncs = int(model._offload_runtime.routing_transfers.sum())
        if cpu == "full" and (syncs or agree != 1.0 or total["misses"]):
            deferred_ok = False
        label = f"{policy} @ {size} slots, " + ("all cached" if cpu == "full" else f"cpu {cpu}")
        rows.append({"config": label, "tpot_ms": 1e3 * tpot,
                     "hit_rate": total["hit_rate"], "bytes_copied": total["bytes_copied"],
                     "token_agreement": agree, "cpu_expert_tokens": total["cpu_expert_tokens"],
                     "x_full": tpot / full_tpot, "host_us_per_layer": 1e6 * total["policy_seconds"] / accesses,
                     "routing_syncs_per_layer": syncs / accesses})
        del model
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    print(f"grouped expert GEMM on {args.device}: {'yes' if grouped else 'NO (per-expert loop fallback)'}; "
          f"resident grouped vs loop TPOT: {1e3 * full_tpot:.2f} vs {1e3 * loop_tpot:.2f} ms "
          f"({loop_tpot / full_tpot:.2f}x)")
    for r in rows:
        hit = "-" if r["hit_rate"] is None else f"{r['hit_rate']:.3f}"
        host = (f"  host {r['host_us_per_layer']:7.1f} us/layer, {r['routing_syncs_per_layer']:.2f} routing syncs"
                if "host_us_per_layer" in r else "")
        print(f"{r['config']:<32} TPOT {r['tpot_ms']:9.2f} ms  hit rate {hit:>6}  "
              f"bytes copied {r['bytes_copied'] / 2**20:10.1f} MiB  token agreement {r['token_agreement']:.4f}{host}")
    out_dir.mkdir(exist_ok=True)
    write_text_atomically(json.dumps(rows, indent=2), out_dir / RESULT_NAME)
    print("exact tokens with CPU compute off:", "yes" if exact_ok else "NO")
    print("every expert cached: no routing sync, no miss, exact tokens:", "yes" if deferred_ok else "NO")
    return 0 if exact_ok and deferred_ok else 1


if __name__ == "__main__":
    sys.exit(main())
