"""Which expert size and hardware a replay is timed at, and the CLI flags that set them.

A trace records its own model's dimensions, but a toy model's expert copies in 1-16 us, against a
10 us kernel launch: timed at its own size, offloading looks free. ``--as-model llada2.0-mini``
(or ``--hidden-size/--moe-intermediate-size/--dtype-bytes``) times any trace with mini's expert
size, so the routing pattern comes from the trace and the costs from the target model.
"""

from __future__ import annotations

import argparse
from typing import Any

from oled_hf.offload.costmodel import CostModel

from ..offload.trace import Trace

# hidden_size, moe_intermediate_size, dtype bytes
MODEL_SHAPES: dict[str, tuple[int, int, int]] = {
    # shared/data/llada2.0-mini/config.json: hidden 2048, moe_intermediate_size 512, bf16
    "llada2.0-mini": (2048, 512, 2),
    # LLaDA2.0-flash (shared/docs/llada2.md): hidden 4096, moe_intermediate_size 1024, bf16
    "llada2.0-flash": (4096, 1024, 2),
}

# CLI flag -> CostModel.from_hardware keyword (hardware figures; defaults are the H200 preset's)
HARDWARE_FLAGS = {
    "h2d_gbps": "host-to-device bandwidth, GB/s (50: PCIe 5.0 x16 pinned)",
    "hbm_gbps": "GPU HBM bandwidth, GB/s (4800: H200)",
    "gpu_tflops": "GPU dense BF16 peak, TFLOP/s (989: H200)",
    "gpu_efficiency": "fraction of the GPU peak small expert GEMMs reach (0.15)",
    "gpu_launch_us": "one expert-kernel launch chain, us (10)",
    "cpu_gbps": "CPU memory bandwidth for streaming expert weights, GB/s (100)",
    "cpu_tflops": "CPU BF16 GEMM throughput, TFLOP/s (1)",
    "cpu_overhead_us": "fixed cost of one CPU batch, once per layer access (transfers, wake-up), us (20)",
    "nonexpert_us_per_layer": "attention + norms + router + shared expert per layer, us (60)",
    "host_dram_gbps": "host DRAM bandwidth shared by DMA and CPU expert reads, GB/s (200; 0 = not shared)",
}
# CLI flag -> CostModel.with_overrides key (final per-field overrides, applied last)
FIELD_FLAGS = {
    "gpu_fixed_us": "per-expert GPU fixed cost, us (replaces launch/HBM-derived value)",
    "gpu_us_per_token": "GPU expert time per token, us",
    "cpu_us_per_token": "CPU expert time per token, us",
}


def add_cost_model_args(p: argparse.ArgumentParser) -> None:
    """The timing flags shared by ``trace replay`` and ``report``."""
    g = p.add_argument_group("timing (simulated hardware; default H200 + PCIe 5.0 x16 at the trace's own size)")
    g.add_argument("--as-model", choices=sorted(MODEL_SHAPES), default=None,
                   help="time the trace with this model's expert size (default: the trace's own)")
    g.add_argument("--hidden-size", type=int, default=None, help="expert input size (default: the trace's)")
    g.add_argument("--moe-intermediate-size", type=int, default=None,
                   help="expert intermediate size (default: the trace's)")
    g.add_argument("--dtype-bytes", type=int, default=None, help="bytes per weight (default: the trace's)")
    g.add_argument("--gpu-kernel", choices=["grouped", "loop"], default="grouped",
                   help="GPU expert kernel of the offloaded runs (grouped: one GEMM per layer)")
    g.add_argument("--planner-us", type=float, default=None,
                   help="host planner time per layer access, us (default: measured during replay)")
    for name, text in {**HARDWARE_FLAGS, **FIELD_FLAGS}.items():
        g.add_argument("--" + name.replace("_", "-"), type=float, default=None,
                       help=f"{text} (default: the preset's or the recorded cost model's)")


def expert_shape(trace: Trace, args: Any) -> tuple[int, int, int]:
    """``(hidden, moe_intermediate, dtype_bytes)`` to time the trace at."""
    h = trace.header
    base = MODEL_SHAPES[args.as_model] if getattr(args, "as_model", None) else (
        h.get("hidden_size"), h.get("moe_intermediate_size"), h.get("dtype_bytes", 2))
    hidden = getattr(args, "hidden_size", None) or base[0]
    inter = getattr(args, "moe_intermediate_size", None) or base[1]
    dtype = getattr(args, "dtype_bytes", None) or base[2]
    if not hidden or not inter:
        raise ValueError("the trace header lacks hidden_size/moe_intermediate_size: pass --as-model or both sizes")
    return int(hidden), int(inter), int(dtype)


def cost_model_from_args(trace: Trace, args: Any) -> CostModel:
    """The H200 + PCIe 5 preset at the chosen expert size, with every hardware and field flag applied."""
    hidden, inter, dtype = expert_shape(trace, args)
    hw = {k: getattr(args, k) for k in HARDWARE_FLAGS if getattr(args, k, None) is not None}
    if "gpu_launch_us" in hw:
        hw["launch_us"] = hw.pop("gpu_launch_us")
    if "hbm_gbps" in hw:
        hw["gpu_hbm_gbps"] = hw.pop("hbm_gbps")
    cm = CostModel.h200_pcie5(hidden, inter, dtype, kernel=getattr(args, "gpu_kernel", "grouped"), **hw)
    return cm.with_overrides(**{k: getattr(args, k, None) for k in FIELD_FLAGS})


def planner_seconds(args: Any) -> float | None:
    us = getattr(args, "planner_us", None)
    return None if us is None else float(us) * 1e-6
