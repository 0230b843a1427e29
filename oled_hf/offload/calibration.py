"""calibrate(): time this machine's expert copy and expert kernels, as the executor runs them.

The executor computes experts as grouped calls (``oled_hf.modeling.experts.grouped_swiglu``):
on the device over a slot range of the cache's pool, on the CPU over the store's stacked layer
buffer. So those are the calls measured. Each time is the fastest of ``repeats`` batches of
``repeats`` back-to-back runs (the device synchronised around each batch) after one warm-up run:
the minimum keeps a busy machine's stalls out. ``G(e, n)`` is one call in which ``e`` experts get
``n`` tokens each:

* copy: one expert from the store into a slot (``ExpertCache.load``);
  ``h2d_bytes_per_s = expert_bytes / t``.
* device, grouped (``grouped_supported`` for its type and dtype): one call over ``span`` slots
  (one layer's share of the pool: the range a layer's call covers, idle slots as zero-token
  groups), experts in the first ``e = min(8, span)`` slots; ``G(1, 1)``, ``G(e, 1)``,
  ``G(e, 16)``. The cost model charges a layer access ``gpu_layer_fixed_s`` once and each expert
  ``gpu_expert_fixed_s + n * gpu_s_per_token``, so ``G(e, n) = L + e * (F + n * S)`` and::

      S = (G(e, 16) - G(e, 1)) / (15 e)       gpu_s_per_token
      F = (G(e, 1) - G(1, 1)) / (e - 1) - S   gpu_expert_fixed_s
      L = G(1, 1) - F - S                     gpu_layer_fixed_s

  which reproduce all three measurements (with one slot, ``e = 1``: ``L = 0``, ``F = G(1, 1) - S``,
  every expert then being its own call).
* device, loop (no grouped GEMM there: the executor's per-expert loop): ``swiglu_expert`` on one
  slot at 1 and 16 tokens, ``t(n) = F + n * S``; ``L = 0``.
* CPU, grouped (pinned store and a CPU grouped GEMM): one call over the layer buffer, all its
  experts as groups as in the executor; the same three shapes. The same fit gives the call's
  fixed cost ``c`` and an expert's ``a(n) = F + n * S`` at 1 and 16 tokens. The cost model charges
  a CPU batch (one grouped call per layer access) ``cpu_overhead_s`` once plus each expert
  ``max(cpu_expert_fixed_s, n * cpu_s_per_token)``, so::

      cpu_expert_fixed_s = a(1)          the roofline's memory floor, met at 1 token
      cpu_s_per_token    = a(16) / 16    its compute slope, met at 16 tokens
      cpu_overhead_s     = c             the call's fixed cost, once per batch

  (``G(e, 1)`` and ``G(e, 16)`` are reproduced exactly by ``CostModel.cpu_batch_time``).
* CPU, loop (mmap store, or no CPU grouped GEMM): ``swiglu_expert`` at 1 and 16 tokens,
  ``cpu_expert_fixed_s = t(1)``, ``cpu_s_per_token = t(16) / 16``, ``cpu_overhead_s = 0``.

Every difference is clamped at 0 (timer noise). The other fields (references, non-expert time)
come from ``base``.
"""

from __future__ import annotations

import math
import time

import torch

from ..modeling.experts import grouped_supported, grouped_swiglu, swiglu_expert
from .cache import ExpertCache
from .costmodel import CostModel
from .store import ExpertStore

MAX_EXPERTS = 8  # experts of the multi-expert measurements
TOKENS = 16  # tokens per expert of the larger measurement


def calibrate(store: ExpertStore, cache: ExpertCache, base: CostModel, repeats: int = 3) -> CostModel:
    """``base`` with the copy, device and CPU expert fields measured here (see the module docstring)."""
    device, dtype = cache.device, store.dtype
    sync = (lambda: torch.cuda.synchronize(device)) if cache.cuda else cache.synchronize

    def timed(fn) -> float:
        fn()
        sync()
        best = math.inf
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(repeats):
                fn()
            sync()
            best = min(best, (time.perf_counter() - start) / repeats)
        return best

    copy_s = timed(lambda: cache.load(0, 0, 0))
    span = max(1, min(cache.total_slots // max(len(store.layer_ids), 1), store.num_experts))
    e_dev = min(MAX_EXPERTS, span)
    for slot in range(1, e_dev):  # real weights in the slots measured (the pool starts uninitialised)
        cache.load(slot, 0, slot)
    cache.wait_ready(range(e_dev))
    cache.copy_seconds, cache.bytes_copied = 0.0, 0
    fields = {"h2d_bytes_per_s": store.expert_bytes / max(copy_s, 1e-9)}

    if grouped_supported(device.type, dtype):
        call, expert, token = _fit(_grouped_times(*cache.layer_views(0, span), e_dev, timed))
    else:
        call, expert, token = 0.0, *_fit_loop(_loop_times(cache.weights(0), device, timed))
    fields.update(gpu_layer_fixed_s=call, gpu_expert_fixed_s=expert, gpu_s_per_token=token)

    views = store.grouped_views(0)
    if views is not None and grouped_supported("cpu", dtype):
        e_cpu = min(MAX_EXPERTS, store.num_experts)
        call, expert, token = _fit(_grouped_times(*views, e_cpu, timed))
        fields.update(cpu_expert_fixed_s=expert + token, cpu_s_per_token=(expert + TOKENS * token) / TOKENS,
                      cpu_overhead_s=call)
    else:
        t1, t16 = _loop_times(store.weights(0, 0), torch.device("cpu"), timed)
        fields.update(cpu_expert_fixed_s=t1, cpu_s_per_token=max(t16, t1) / TOKENS, cpu_overhead_s=0.0)
    return base.with_overrides(**fields)


def _grouped_times(gate_up: torch.Tensor, down: torch.Tensor, experts: int, timed) -> tuple[float, float, float, int]:
    """``G(1, 1)``, ``G(e, 1)``, ``G(e, 16)`` over all groups of ``gate_up``/``down``, and ``e``."""
    groups, hidden = gate_up.shape[0], gate_up.shape[-1]

    def run(e: int, n: int) -> float:
        counts = torch.zeros(groups, dtype=torch.int64)
        counts[:e] = n
        offs = torch.cumsum(counts, 0).to(device=gate_up.device, dtype=torch.int32)
        x = torch.zeros(e * n, hidden, dtype=gate_up.dtype, device=gate_up.device)
        return timed(lambda: grouped_swiglu(x, gate_up, down, offs))

    return run(1, 1), run(experts, 1), run(experts, TOKENS), experts


def _fit(times: tuple[float, float, float, int]) -> tuple[float, float, float]:
    """(per call, per expert, per token) seconds of ``G(e, n) = call + e * (expert + n * token)``."""
    g11, ge1, ge16, e = times
    token = max((ge16 - ge1) / ((TOKENS - 1) * e), 0.0)
    if e == 1:
        return 0.0, max(g11 - token, 0.0), token
    expert = max((ge1 - g11) / (e - 1) - token, 0.0)
    return max(g11 - expert - token, 0.0), expert, token


def _loop_times(weights, device: torch.device, timed) -> tuple[float, float]:
    """One expert's ``swiglu_expert`` at 1 and 16 tokens."""
    x1, x16 = (torch.zeros(n, weights[0].shape[1], dtype=weights[0].dtype, device=device) for n in (1, TOKENS))
    return timed(lambda: swiglu_expert(x1, *weights)), timed(lambda: swiglu_expert(x16, *weights))


def _fit_loop(times: tuple[float, float]) -> tuple[float, float]:
    """(per expert, per token) seconds of ``t(n) = expert + n * token``."""
    t1, t16 = times
    token = max((t16 - t1) / (TOKENS - 1), 0.0)
    return max(t1 - token, 0.0), token
