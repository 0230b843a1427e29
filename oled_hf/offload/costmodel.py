"""Cost model of one routed expert: copy it to the GPU, run it there, or run it on the CPU.

The same model drives the dispatcher at run time (copy vs CPU per miss) and the simulated time in
``oled_hf.sim.replay``. The live runtime calibrates it at load by a short measurement
(:meth:`CostModel.with_overrides`); the presets below are first-principles estimates.

Shapes of the three costs:

* copy: ``expert_bytes / h2d_bytes_per_s`` (one H2D transfer on the copy engine);
* GPU: ``gpu_layer_fixed_s`` once per layer access that runs any expert on the GPU, plus per expert
  ``gpu_expert_fixed_s + n * gpu_s_per_token``. Two kernel models (``from_hardware(kernel=...)``):
  ``loop`` (one launch chain per expert: the fixed cost is launch + weight read, nothing per layer)
  and ``grouped`` (one grouped GEMM per layer: one launch per layer, each expert's weights read
  once from HBM). Weight reads dominate for the few tokens a diffusion block sends to one expert;
  compute grows with tokens;
* CPU: ``cpu_overhead_s + max(cpu_expert_fixed_s, n * cpu_s_per_token)`` (a roofline: streaming the
  weights through DRAM bounds small token counts, FLOPs bound large ones).

Full residency is timed two ways, both from the same fields: :meth:`fused_layer_time` (a fused /
grouped MoE: one launch per layer, each active expert's bytes once at HBM bandwidth, FLOPs at the
stated efficiency; the reference every comparison uses) and :meth:`loop_layer_time` (a Python loop
over experts: one launch per active expert, the second row, named as such).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

_FRIENDLY = {
    # CLI-friendly names -> (field, converter)
    "h2d_gbps": ("h2d_bytes_per_s", lambda v: float(v) * 1e9),
    "gpu_fixed_us": ("gpu_expert_fixed_s", lambda v: float(v) * 1e-6),
    "gpu_us_per_token": ("gpu_s_per_token", lambda v: float(v) * 1e-6),
    "cpu_us_per_token": ("cpu_s_per_token", lambda v: float(v) * 1e-6),
    "cpu_overhead_us": ("cpu_overhead_s", lambda v: float(v) * 1e-6),
    "nonexpert_us_per_layer": ("nonexpert_s_per_layer", lambda v: float(v) * 1e-6),
    "gpu_launch_us": ("gpu_launch_s", lambda v: float(v) * 1e-6),
    "gpu_layer_fixed_us": ("gpu_layer_fixed_s", lambda v: float(v) * 1e-6),
    "hbm_gbps": ("gpu_hbm_bytes_per_s", lambda v: float(v) * 1e9),
}


@dataclass
class CostModel:
    """Seconds for one expert's copy, GPU run and CPU run (see module docstring for the shapes)."""

    expert_bytes: int
    h2d_bytes_per_s: float
    gpu_expert_fixed_s: float
    gpu_s_per_token: float
    cpu_expert_fixed_s: float
    cpu_s_per_token: float
    cpu_overhead_s: float = 0.0
    nonexpert_s_per_layer: float = 0.0  # attention, shared expert, router per MoE layer forward
    gpu_layer_fixed_s: float = 0.0  # per layer access of the live GPU kernel (grouped: one launch)
    gpu_launch_s: float = 10e-6  # one expert-kernel launch chain (the references' launch term)
    gpu_hbm_bytes_per_s: float = 4.8e12  # HBM bandwidth for the references' weight reads

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"CostModel.{f.name}={value!r} is invalid: must be a finite number >= 0")
        for name in ("h2d_bytes_per_s", "gpu_hbm_bytes_per_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"CostModel.{name}={getattr(self, name)!r} is invalid: must be > 0")

    @property
    def kernel(self) -> str:
        """``grouped`` if the live GPU kernel pays a per-layer launch, else ``loop`` (per expert)."""
        return "grouped" if self.gpu_layer_fixed_s > 0 else "loop"

    @property
    def expert_read_s(self) -> float:
        """One expert's weights read once from HBM."""
        return self.expert_bytes / self.gpu_hbm_bytes_per_s

    # ------------------------------------------------------------------ scalar costs
    def copy_time(self) -> float:
        return self.expert_bytes / self.h2d_bytes_per_s

    def gpu_time(self, n_tokens: int | float) -> float:
        return 0.0 if n_tokens <= 0 else self.gpu_expert_fixed_s + n_tokens * self.gpu_s_per_token

    def cpu_time(self, n_tokens: int | float) -> float:
        if n_tokens <= 0:
            return 0.0
        return self.cpu_overhead_s + max(self.cpu_expert_fixed_s, n_tokens * self.cpu_s_per_token)

    # ------------------------------------------------------------------ vectorised costs
    def gpu_times(self, n_tokens: np.ndarray) -> np.ndarray:
        n = np.asarray(n_tokens, dtype=np.float64)
        return np.where(n > 0, self.gpu_expert_fixed_s + n * self.gpu_s_per_token, 0.0)

    def cpu_times(self, n_tokens: np.ndarray) -> np.ndarray:
        n = np.asarray(n_tokens, dtype=np.float64)
        return np.where(n > 0, self.cpu_overhead_s + np.maximum(self.cpu_expert_fixed_s, n * self.cpu_s_per_token), 0.0)

    def gpu_path_time(self, hit_tokens: np.ndarray, copy_tokens: np.ndarray) -> float:
        """GPU-side time of one layer access: hits run while copies stream in, in copy order.

        Two-stage pipeline (copy engine, then SMs): copy j lands at ``(j+1) * copy_time`` and its
        expert runs once it has landed and the SMs are free. The closed form is the max of "SMs
        never idle" and, for every j, "wait for copy j, then run j and everything after it".
        """
        g_hits = float(self.gpu_times(hit_tokens).sum())
        if len(hit_tokens) or len(copy_tokens):
            g_hits += self.gpu_layer_fixed_s
        if len(copy_tokens) == 0:
            return g_hits
        g = self.gpu_times(copy_tokens)
        suffix = np.cumsum(g[::-1])[::-1]
        lands = self.copy_time() * np.arange(1, len(g) + 1)
        return max(g_hits + float(suffix[0]), float((lands + suffix).max()))

    def access_time(self, hit_tokens: np.ndarray, copy_tokens: np.ndarray, cpu_tokens: np.ndarray) -> float:
        """Routed-expert time of one layer access: CPU and GPU(+copies) run concurrently."""
        cpu = float(self.cpu_times(cpu_tokens).sum())
        return max(cpu, self.gpu_path_time(hit_tokens, copy_tokens))

    # ------------------------------------------------------------------ full-residency references
    def fused_layer_time(self, counts: np.ndarray) -> float:
        """Routed-expert time of one layer access with every expert resident, as a fused/grouped MoE.

        One launch, each active expert's weights read once at HBM bandwidth, every routed token's
        FLOPs at the stated efficiency: ``gpu_launch_s + n_active * expert_read_s + tokens * gpu_s_per_token``.
        """
        c = np.asarray(counts)
        n_active = int(np.count_nonzero(c))
        if n_active == 0:
            return 0.0
        return self.gpu_launch_s + n_active * self.expert_read_s + float(c.sum()) * self.gpu_s_per_token

    def loop_layer_time(self, counts: np.ndarray) -> float:
        """The per-expert-loop resident reference: one launch chain and one weight read per active expert."""
        c = np.asarray(counts)
        n_active = int(np.count_nonzero(c))
        return n_active * (self.gpu_launch_s + self.expert_read_s) + float(c.sum()) * self.gpu_s_per_token

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_hardware(
        cls,
        hidden_size: int,
        moe_intermediate_size: int,
        dtype_bytes: int = 2,
        *,
        h2d_gbps: float = 50.0,
        gpu_tflops: float = 989.0,
        gpu_efficiency: float = 0.15,
        gpu_hbm_gbps: float = 4800.0,
        launch_us: float = 10.0,
        cpu_gbps: float = 100.0,
        cpu_tflops: float = 1.0,
        cpu_overhead_us: float = 20.0,
        nonexpert_us_per_layer: float = 60.0,
        kernel: str = "loop",
    ) -> CostModel:
        """Estimate from hardware figures; one expert = gate, up and down projections (SwiGLU).

        Sources of the defaults (H200 SXM + PCIe 5.0 x16 host):

        * ``h2d_gbps=50``: PCIe 5.0 x16 is 64 GB/s raw; pinned-memory cudaMemcpyAsync reaches ~50-55.
        * ``gpu_tflops=989``: H200 dense BF16 tensor-core peak (NVIDIA H200 datasheet).
        * ``gpu_efficiency=0.15``: skinny GEMMs (a few tokens x 2048 x 512) reach ~10-20% of peak.
        * ``gpu_hbm_gbps=4800``: H200 HBM3e bandwidth (datasheet).
        * ``launch_us=10``: three GEMMs + activation (or one grouped MoE kernel chain) at ~2-3 us each.
        * ``cpu_gbps=100``: one socket of a DDR5 server streaming one expert's weights (~300 peak).
        * ``cpu_tflops=1``: AMX/AVX-512 BF16 GEMM on one socket, small-batch efficiency.
        * ``cpu_overhead_us=20``: activations D2H + result H2D + thread-pool wake-up per CPU batch.
        * ``nonexpert_us_per_layer=60``: attention, norms, router, shared expert of one LLaDA2.0-mini
          layer over a 32-token block (bf16, ~3 ms fused-resident forward in ``docs/design.md``).

        ``kernel``: ``loop`` (the live per-expert executor: every expert pays ``launch_us``) or
        ``grouped`` (one grouped GEMM per layer: ``launch_us`` once per layer access, each expert
        only its HBM read). The resident references use the same launch and HBM figures either way.
        """
        if kernel not in ("loop", "grouped"):
            raise ValueError(f"kernel={kernel!r} is unknown; allowed: loop, grouped")
        params = 3 * hidden_size * moe_intermediate_size
        expert_bytes = params * dtype_bytes
        flops_per_token = 2.0 * params
        read_s = expert_bytes / (gpu_hbm_gbps * 1e9)
        grouped = kernel == "grouped"
        return cls(
            expert_bytes=int(expert_bytes),
            h2d_bytes_per_s=h2d_gbps * 1e9,
            gpu_expert_fixed_s=read_s if grouped else launch_us * 1e-6 + read_s,
            gpu_layer_fixed_s=launch_us * 1e-6 if grouped else 0.0,
            gpu_launch_s=launch_us * 1e-6,
            gpu_hbm_bytes_per_s=gpu_hbm_gbps * 1e9,
            gpu_s_per_token=flops_per_token / (gpu_tflops * 1e12 * gpu_efficiency),
            cpu_expert_fixed_s=expert_bytes / (cpu_gbps * 1e9),
            cpu_s_per_token=flops_per_token / (cpu_tflops * 1e12),
            cpu_overhead_s=cpu_overhead_us * 1e-6,
            nonexpert_s_per_layer=nonexpert_us_per_layer * 1e-6,
        )

    @classmethod
    def h200_pcie5(cls, hidden_size: int, moe_intermediate_size: int, dtype_bytes: int = 2, **kw: Any) -> CostModel:
        """H200 (bf16, 4.8 TB/s HBM) on PCIe 5.0 x16 (~50 GB/s effective H2D), server CPU at ~100 GB/s.

        For LLaDA2.0-mini (h=2048, i=512, bf16): 6.3 MB/expert, copy ~126 us, GPU ~11 us + 0.04 us/token,
        CPU ~63 us up to ~10 tokens then ~6.3 us/token. Keyword arguments as in :meth:`from_hardware`.
        """
        return cls.from_hardware(hidden_size, moe_intermediate_size, dtype_bytes, **kw)

    def with_overrides(self, **kw: Any) -> CostModel:
        """A copy with fields replaced; accepts field names or CLI-friendly units (``h2d_gbps``...).

        ``None`` values are ignored, so optional CLI flags can be passed straight through.
        """
        names = {f.name for f in fields(self)}
        changes: dict[str, Any] = {}
        for key, value in kw.items():
            if value is None:
                continue
            if key in _FRIENDLY:
                field, conv = _FRIENDLY[key]
                changes[field] = conv(value)
            elif key == "cpu_gbps":
                changes["cpu_expert_fixed_s"] = self.expert_bytes / (float(value) * 1e9)
            elif key in names:
                changes[key] = value
            else:
                known = sorted(names | set(_FRIENDLY) | {"cpu_gbps"})
                raise ValueError(f"unknown cost-model override {key!r}; known: {', '.join(known)}")
        return replace(self, **changes)

    def with_config(self, config: Any) -> CostModel:
        """Apply an ``OffloadConfig``'s cost-model overrides (those that are not None)."""
        def ms(v: float | None) -> float | None:
            return None if v is None else float(v) * 1e-3

        return self.with_overrides(
            h2d_gbps=config.h2d_bandwidth_gbps,
            cpu_gbps=config.cpu_bandwidth_gbps,
            cpu_s_per_token=ms(config.cpu_expert_ms_per_token),
            gpu_s_per_token=ms(config.gpu_expert_ms_per_token),
            gpu_expert_fixed_s=ms(config.gpu_expert_fixed_ms),
        )
