"""Cost model of one routed expert: copy it to the GPU, run it there, or run it on the CPU.

The same model drives the dispatcher at run time (copy vs CPU per miss) and the simulated time in
``oled_hf.sim.replay``, but replay may give the dispatcher a different *belief* (:meth:`CostModel.believed`):
the dispatcher decides with what it believes, the timeline charges what is true. The live runtime
sets its belief by a short measurement at load (``calibrate=True``, :mod:`oled_hf.offload.calibration`);
the presets below are first-principles estimates.

Shapes of the costs:

* copy: ``expert_bytes / h2d_bytes_per_s`` (one H2D transfer on the copy engine);
* GPU: ``gpu_layer_fixed_s`` once per layer access that runs any expert on the GPU, plus per expert
  ``gpu_expert_fixed_s + n * gpu_s_per_token``. Two kernel models (``from_hardware(kernel=...)``):
  ``loop`` (one launch chain per expert: the fixed cost is launch + weight read, nothing per layer)
  and ``grouped`` (one grouped GEMM per layer: one launch per layer, each expert's weights read
  once from HBM). Weight reads dominate for the few tokens a diffusion block sends to one expert;
  compute grows with tokens;
* CPU: one grouped call per layer access (as the live executor runs its CPU misses), so a batch
  of CPU experts costs ``cpu_overhead_s`` once (activations D2H, results H2D, thread-pool wake-up)
  plus per expert ``max(cpu_expert_fixed_s, n * cpu_s_per_token)`` (a roofline: streaming the
  weights through DRAM bounds small token counts, FLOPs bound large ones): :meth:`cpu_batch_time`;
* host DRAM is shared (``host_dram_bytes_per_s``; 0 = not modelled): the copy engine's DMA reads
  and the CPU's expert-weight reads come from the same memory. Model, stated simply: DMA keeps its
  PCIe rate (a bounded stream the memory controller serves first), and while it runs the CPU's
  weight reads get what is left, ``min(cpu_gbps, host_dram - h2d)``: a read-bound CPU expert then
  takes ``expert_bytes / that`` instead of ``cpu_expert_fixed_s`` (:meth:`cpu_batch_time` with
  ``shared=True``). The timeline applies the shared rate only to the part of a CPU batch that
  overlaps the copy engine's busy time. A dispatcher with the knob ``shared_dram`` (the ``oled``
  preset's) charges every CPU expert the shared rate (it cannot know which part will overlap);
  the others do not model the sharing (a known, realistic gap between belief and truth).

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
    "host_dram_gbps": ("host_dram_bytes_per_s", lambda v: float(v) * 1e9),
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
    cpu_overhead_s: float = 0.0  # once per CPU batch (one grouped call per layer access)
    nonexpert_s_per_layer: float = 0.0  # attention, shared expert, router per MoE layer forward
    gpu_layer_fixed_s: float = 0.0  # per layer access of the live GPU kernel (grouped: one launch)
    gpu_launch_s: float = 10e-6  # one expert-kernel launch chain (the references' launch term)
    gpu_hbm_bytes_per_s: float = 4.8e12  # HBM bandwidth for the references' weight reads
    host_dram_bytes_per_s: float = 0.0  # host memory shared by DMA and CPU weight reads (0: not modelled)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"CostModel.{f.name}={value!r} is invalid: must be a finite number >= 0")
        for name in ("h2d_bytes_per_s", "gpu_hbm_bytes_per_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"CostModel.{name}={getattr(self, name)!r} is invalid: must be > 0")
        if 0 < self.host_dram_bytes_per_s <= self.h2d_bytes_per_s:
            raise ValueError(f"CostModel.host_dram_bytes_per_s={self.host_dram_bytes_per_s!r} is invalid: must "
                             f"exceed h2d_bytes_per_s={self.h2d_bytes_per_s!r} (DMA reads host memory), or be 0")

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
        """One expert's share of a CPU batch (the batch's ``cpu_overhead_s`` is charged once, not here)."""
        if n_tokens <= 0:
            return 0.0
        return max(self.cpu_expert_fixed_s, n_tokens * self.cpu_s_per_token)

    @property
    def cpu_shared_fixed_s(self) -> float:
        """A read-bound CPU expert while the copy engine reads host DRAM too (see module docstring)."""
        if self.host_dram_bytes_per_s <= 0 or self.cpu_expert_fixed_s <= 0:
            return self.cpu_expert_fixed_s
        alone = self.expert_bytes / self.cpu_expert_fixed_s  # the CPU's own weight-read rate
        left = self.host_dram_bytes_per_s - self.h2d_bytes_per_s
        if left >= alone:  # the sharing does not bite: exactly the unshared figure (no rounding trip)
            return self.cpu_expert_fixed_s
        return self.expert_bytes / left

    def cpu_batch_time(self, n_tokens: np.ndarray | list[int], shared: bool = False) -> float:
        """One grouped CPU call over experts with these token counts: overhead once, then each expert.

        ``shared``: the whole batch runs while the copy engine reads host DRAM (read-bound experts slower).
        """
        n = np.asarray(n_tokens, dtype=np.float64)
        n = n[n > 0]
        if n.size == 0:
            return 0.0
        fixed = self.cpu_shared_fixed_s if shared else self.cpu_expert_fixed_s
        return self.cpu_overhead_s + float(np.maximum(fixed, n * self.cpu_s_per_token).sum())

    # ------------------------------------------------------------------ vectorised costs
    def gpu_times(self, n_tokens: np.ndarray) -> np.ndarray:
        n = np.asarray(n_tokens, dtype=np.float64)
        return np.where(n > 0, self.gpu_expert_fixed_s + n * self.gpu_s_per_token, 0.0)

    def cpu_times(self, n_tokens: np.ndarray) -> np.ndarray:
        """Per expert, :meth:`cpu_time` (no batch overhead: :meth:`cpu_batch_time` adds it once)."""
        n = np.asarray(n_tokens, dtype=np.float64)
        return np.where(n > 0, np.maximum(self.cpu_expert_fixed_s, n * self.cpu_s_per_token), 0.0)

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
        cpu = self.cpu_batch_time(cpu_tokens)
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
        host_dram_gbps: float = 200.0,
        kernel: str = "loop",
    ) -> CostModel:
        """Estimate from hardware figures; one expert = gate, up and down projections (SwiGLU).

        Sources of the defaults (H200 SXM + PCIe 5.0 x16 host), one line each:

        * ``h2d_gbps=50``: PCIe 5.0 x16 is 64 GB/s raw; pinned cudaMemcpyAsync measures ~50-55 (nvbandwidth).
        * ``gpu_tflops=989``: H200 SXM dense BF16 tensor-core peak (NVIDIA H200 datasheet).
        * ``gpu_efficiency=0.15``: skinny GEMMs (a few tokens x 2048 x 512) reach ~10-20% of peak (estimate).
        * ``gpu_hbm_gbps=4800``: H200 HBM3e bandwidth (NVIDIA H200 datasheet).
        * ``launch_us=10``: three GEMMs + activation (or one grouped MoE kernel chain) at ~2-3 us each (estimate).
        * ``cpu_gbps=100``: one DDR5 socket streaming one expert's weights into AMX tiles (~1/3 of 307 GB/s peak).
        * ``cpu_tflops=1``: AMX BF16 GEMM on one Sapphire Rapids socket at small-batch efficiency (estimate).
        * ``cpu_overhead_us=20``: per CPU batch: activations D2H + results H2D + thread-pool wake-up (estimate).
        * ``nonexpert_us_per_layer=60``: attention, norms, router, shared expert of one LLaDA2.0-mini
          layer over a 32-token block (bf16; ~3 ms fused-resident forward, ``docs/design.md``).
        * ``host_dram_gbps=200``: 8-channel DDR5-4800 socket, 307 GB/s peak, ~65% sustained (STREAM-class);
          shared by DMA and CPU reads (at these defaults 200 - 50 >= 100: the sharing does not bite).

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
            host_dram_bytes_per_s=host_dram_gbps * 1e9,
        )

    @classmethod
    def h200_pcie5(cls, hidden_size: int, moe_intermediate_size: int, dtype_bytes: int = 2, **kw: Any) -> CostModel:
        """H200 (bf16, 4.8 TB/s HBM) on PCIe 5.0 x16 (~50 GB/s effective H2D), server CPU at ~100 GB/s.

        For LLaDA2.0-mini (h=2048, i=512, bf16): 6.3 MB/expert, copy ~126 us, GPU ~11 us + 0.04 us/token,
        CPU ~63 us per expert up to ~10 tokens then ~6.3 us/token, plus 20 us per CPU batch. Keyword
        arguments as in :meth:`from_hardware`.
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

    def believed(self, cpu_scale: float = 1.0, pcie_scale: float = 1.0) -> CostModel:
        """What a dispatcher believes when it misjudges the CPU's speed or the PCIe bandwidth.

        ``cpu_scale``: believed CPU speed / true (2 = it thinks the CPU twice as fast: every CPU
        term divided by 2); ``pcie_scale``: believed H2D bandwidth / true. 1, 1 returns ``self``.
        """
        for name, v in (("cpu_scale", cpu_scale), ("pcie_scale", pcie_scale)):
            if not (np.isfinite(v) and v > 0):
                raise ValueError(f"{name}={v!r} is invalid: must be a number > 0 (believed / true)")
        if cpu_scale == 1.0 and pcie_scale == 1.0:
            return self
        return replace(self, cpu_expert_fixed_s=self.cpu_expert_fixed_s / cpu_scale,
                       cpu_s_per_token=self.cpu_s_per_token / cpu_scale, cpu_overhead_s=self.cpu_overhead_s / cpu_scale,
                       h2d_bytes_per_s=self.h2d_bytes_per_s * pcie_scale,
                       host_dram_bytes_per_s=self.host_dram_bytes_per_s * max(pcie_scale, 1.0))

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
