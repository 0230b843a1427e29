"""Miss dispatch, one part of a system: for each miss, copy it to the GPU or compute it on the CPU.

The CPU computes its experts from the host store while the GPU computes hits and copied experts
(copies stream in on the copy engine). Both run concurrently, so one layer access takes roughly
``max(CPU time, GPU+copy time)``. A copy also pays off later: the expert stays cached for its
predicted reuse. The rule (deterministic; written once, ``kernels.split_misses``, which the planner
runs inside its plan of an access, ``kernels.plan_access``):

1. Misses the policy does not admit run on the CPU (with CPU compute off, everything is copied).
2. Rank the admitted misses by benefit per GPU-side cost,
   ``cpu_time(n) * (1 + reuse) / (gpu_time(n) + copy_time)``: CPU time saved now and on the
   expected reuses, per unit of GPU-side work. High-reuse and token-heavy experts come first.
3. Copy a prefix of that ranking: the one minimising the *amortised makespan*
   ``max(C_j, G_j)`` where ``C_j`` is the CPU batch time of the misses left on the CPU (the
   batch's ``cpu_overhead_s`` once, if any is left, plus each expert's roofline time) and ``G_j``
   the hits' GPU time plus, per copied expert, ``gpu_time + copy_time / (1 + reuse)`` (a copy's
   cost is spread over the accesses it will serve). Copies beyond ``room`` (slots not holding
   experts of this access) would stream through a slot and be evicted at once: they get no
   amortisation. Ties go to the longer prefix (caching has value the estimate does not see).

Three dispatch modes (``DISPATCH_MODES``; a system names one, :mod:`oled_hf.offload.system`):

* ``copy``: every miss is copied (CPU compute off);
* ``cpu``: the rule above with the policy's predicted reuse (CPU, amortised);
* ``cpu+reuse``: the rule for this access alone (reuse 0: a copy is not amortised), then up to
  ``reuse_copies`` CPU-computed misses whose predicted reuse is at least ``reuse_min`` are also
  copied off the critical path for the next access (the planner's rule 4).

Knob ``admission`` (``all`` by default; ``ADMISSIONS``): with ``priority`` a miss the split would copy
takes a slot only if the retention part ranks it above the resident it would evict (its predicted next
use is sooner); otherwise it is computed on the CPU and the resident stays (``kernels._admit_by_priority``).
Rule 4's reuse copies always obey that comparison. Any retention part can be composed with it: the
ranking is the part's own priority. With CPU compute off it does nothing (every miss must be copied;
this project has no staging slot that would let a miss be used once without displacing a resident).

Knob ``shared_dram`` (off by default): the dispatcher charges a read-bound CPU expert at the rate
host DRAM leaves it while the copy engine reads it too (``CostModel.cpu_shared_fixed_s``; equal to
the plain rate where the believed DRAM bandwidth covers both), the sharing replay times.

The dispatcher decides from the cost model it is given, its *belief*; replay may time the run with
another (``CostModel.believed``).

Knob ``calibrate`` (off by default; ``oled_hf.offload.online_calibration``): the belief is corrected
online from measured copy and CPU times. :meth:`Dispatcher.enable_calibration` attaches an
:class:`~oled_hf.offload.online_calibration.OnlineCalibrator`; after each layer access the caller
passes what it measured to :meth:`Dispatcher.observe` (replay: the true cost model's times with
seeded noise; live: CUDA events and the CPU pool's timings) and the dispatcher decides from the
calibrated belief, rebuilt every ``calibrate_every`` accesses and at block end (:meth:`end_block`).
"""

from __future__ import annotations

import math

import numpy as np

from . import kernels
from .costmodel import CostModel
from .online_calibration import CalibrationSettings, OnlineCalibrator

# auto: on beside an accelerator, off where the device is the CPU (resolve_cpu_compute)
CPU_COMPUTE_MODES = ("auto", "on", "off")
DISPATCH_MODES = ("copy", "cpu", "cpu+reuse")
# who may take a slot: every miss the split copies (``all``), or only one that outranks its would-be victim
# in the retention part's priority (``priority``; with CPU compute off every miss is copied either way)
ADMISSIONS = ("all", "priority")


def resolve_cpu_compute(mode: str, accelerator: bool) -> str:
    """The CPU-compute mode a run uses: ``auto`` is ``on`` beside an accelerator, ``off`` without one.

    Computing a miss on the CPU pays off when the CPU and the GPU work at the same time. Where the
    "device" is the CPU itself, host and device are the same cores: a CPU-computed miss saves no
    time, it only leaves the expert uncached, so hit rates fall as the cache grows. ``on`` keeps
    the cost-model split even there (tests and experiments); ``off`` always copies.
    """
    if mode not in CPU_COMPUTE_MODES:
        raise ValueError(f"cpu_compute={mode!r} is unknown; allowed: {', '.join(CPU_COMPUTE_MODES)}")
    if mode == "auto":
        return "on" if accelerator else "off"
    return mode


class Dispatcher:
    """Splits one layer access's misses between copy-to-GPU and compute-on-CPU."""

    def __init__(
        self,
        cost_model: CostModel | None,
        cpu_compute: str = "auto",
        *,
        reuse_copies: int = 0,
        reuse_min: float = 1.0,
        shared_dram: bool = False,
        admission: str = "all",
    ) -> None:
        """``cpu_compute`` off: mode ``copy``; else ``cpu``, or ``cpu+reuse`` with ``reuse_copies`` > 0.

        A system's dispatcher is built by :meth:`for_mode` (``oled_hf.offload.system.build_dispatcher``).
        """
        # "auto" is "on" here: the live runtime resolves "auto" by its device before planning, and
        # replay simulates hardware with an accelerator
        if cpu_compute not in CPU_COMPUTE_MODES:
            raise ValueError(f"cpu_compute={cpu_compute!r} is unknown; allowed: {', '.join(CPU_COMPUTE_MODES)}")
        if cpu_compute != "off" and cost_model is None:
            raise ValueError(f"Dispatcher with cpu_compute={cpu_compute!r} needs a cost model")
        if isinstance(reuse_copies, bool) or not isinstance(reuse_copies, int) or reuse_copies < 0:
            raise ValueError(f"reuse_copies={reuse_copies!r} is invalid: must be an integer >= 0")
        if not (math.isfinite(reuse_min) and reuse_min >= 0):
            raise ValueError(f"reuse_min={reuse_min!r} is invalid: must be a number >= 0")
        self.cost_model = cost_model
        self.cpu_compute = cpu_compute
        self.reuse_copies = reuse_copies
        self.reuse_min = float(reuse_min)
        if admission not in ADMISSIONS:
            raise ValueError(f"admission={admission!r} is unknown; allowed: {', '.join(ADMISSIONS)}")
        self.shared_dram = bool(shared_dram)
        self.admission = admission
        self._costs: tuple[CostModel | None, np.ndarray] | None = None
        self.calibrator: OnlineCalibrator | None = None

    def enable_calibration(self, settings: CalibrationSettings | None = None) -> OnlineCalibrator:
        """Calibrate the belief online from :meth:`observe` (a no-op for decisions with CPU compute off:
        copying every miss reads no cost). Starts from the current belief; returns the calibrator."""
        if self.cost_model is None:
            raise ValueError("online calibration needs a cost model to start from")
        self.calibrator = OnlineCalibrator(self.cost_model, settings)
        return self.calibrator

    def observe(self, copy_s_per_expert: float | None, cpu_tokens: np.ndarray | None,
                cpu_batch_s: float | None) -> None:
        """What one layer access measured: per-expert copy time (None: no copy), the CPU batch's token
        counts and wall time (None: no CPU batch). Without calibration this does nothing."""
        cal = self.calibrator
        if cal is None:
            return
        if copy_s_per_expert is not None:
            cal.observe_copy(copy_s_per_expert)
        if cpu_tokens is not None and cpu_batch_s is not None:
            cal.observe_cpu(cpu_tokens, cpu_batch_s)
        self.cost_model = cal.tick()

    def end_block(self) -> None:
        """Block end: publish the calibrated belief now."""
        if self.calibrator is not None:
            self.cost_model = self.calibrator.publish()

    @classmethod
    def for_mode(cls, mode: str, cost_model: CostModel | None, *, reuse_copies: int = 2,
                 reuse_min: float = 1.0, shared_dram: bool = False, admission: str = "all") -> Dispatcher:
        """The dispatcher of a system's dispatch part (``DISPATCH_MODES``)."""
        if mode not in DISPATCH_MODES:
            raise ValueError(f"dispatch={mode!r} is unknown; allowed: {', '.join(DISPATCH_MODES)}")
        if mode == "copy":
            return cls(cost_model, "off", reuse_copies=0)
        return cls(cost_model, "on", reuse_copies=reuse_copies if mode == "cpu+reuse" else 0, reuse_min=reuse_min,
                   shared_dram=shared_dram, admission=admission)

    @property
    def mode(self) -> str:
        if not self.cpu_enabled:
            return "copy"
        return "cpu+reuse" if self.reuse_copies else "cpu"

    @property
    def cpu_enabled(self) -> bool:
        return self.cpu_compute != "off"

    def kernel_costs(self) -> np.ndarray:
        """The rule's constants for ``kernels.plan_access``: copy time, CPU overhead / fixed / per
        token, GPU fixed / per token (zeros with CPU compute off). Cached per cost model (cost models are
        replaced, e.g. by ``with_overrides``, never changed in place)."""
        cm = self.cost_model
        if self._costs is None or self._costs[0] is not cm:
            costs = np.zeros(7)
            costs[6] = 1.0 if self.admission == "priority" and self.cpu_enabled else 0.0
            if cm is not None and self.cpu_enabled:
                fixed = cm.cpu_shared_fixed_s if self.shared_dram else cm.cpu_expert_fixed_s
                costs[:6] = (cm.copy_time(), cm.cpu_overhead_s, fixed, cm.cpu_s_per_token,
                             cm.gpu_expert_fixed_s, cm.gpu_s_per_token)
            self._costs = (cm, costs)
        return self._costs[1]

    def decide(
        self,
        tokens: np.ndarray,
        reuse: np.ndarray,
        admitted: np.ndarray | None,
        room: int,
        hit_tokens: np.ndarray,
    ) -> np.ndarray:
        """Bool mask over the misses: True = copy to the GPU, False = compute on the CPU.

        ``tokens``: tokens routed to each miss; ``reuse``: the policy's predicted further uses;
        ``admitted``: per-miss admission (None = all); ``room``: copies that can stay cached;
        ``hit_tokens``: tokens of each hit (the GPU's work that is already decided).
        """
        take = self.choose(np.asarray(tokens), reuse, admitted, room, len(hit_tokens), float(np.sum(hit_tokens)))
        return np.array(take, dtype=bool)

    def choose(
        self,
        tokens: np.ndarray,
        reuse: np.ndarray,
        admitted: np.ndarray | None,
        room: int,
        n_hits: int,
        hit_token_sum: float,
    ) -> list[bool]:
        """:meth:`decide` with the hits given as their number and total tokens, answering a list of bools
        (``kernels.split_misses``, the rule the planner runs inside ``kernels.plan_access``)."""
        m = len(tokens)
        if not self.cpu_enabled:
            return [True] * m
        cm = self.cost_model
        assert cm is not None
        g0 = cm.gpu_expert_fixed_s * n_hits + cm.gpu_s_per_token * hit_token_sum
        take = np.zeros(m, dtype=bool)
        if m:
            adm = np.ones(m, dtype=bool) if admitted is None else np.ascontiguousarray(admitted, dtype=bool)
            kernels.split_misses(np.ascontiguousarray(tokens, dtype=np.int64),
                                 np.ascontiguousarray(reuse, dtype=np.float64), adm,
                                 int(room), float(g0), *self.kernel_costs()[:6].tolist(), take)
        return take.tolist()
