"""Online calibration of the dispatcher's belief from measured copy and CPU times (issue 36.3).

The dispatcher decides copy vs CPU from a cost model, its *belief*. A belief set at load (or a
preset) can be wrong by 2x on a real machine: another tenant on the CPU, a slower PCIe link, a
NUMA-remote store. :class:`OnlineCalibrator` corrects it from what the run measures.

State (relative to the starting belief ``base``, so a calibrated belief is ``base`` with scales):

* copy: one log-scale ``c``; believed per-expert copy time ``base.copy_time() * exp(c)``.
* CPU: two scales ``theta = (s_fixed, s_token)``; the believed batch time of token counts ``n`` is
  ``s_fixed * (cpu_overhead_s + sum_{read-bound} cpu_expert_fixed_s) + s_token * sum_{compute-bound}
  n * cpu_s_per_token``, each expert classed read- or compute-bound by ``base``'s roofline. So the
  two CostModel terms (fixed and per token) are fitted separately, the overhead with the fixed one.

Update (after each layer access; :meth:`observe_copy`, :meth:`observe_cpu`):

* copy: the measured per-expert time enters an EMA of its log residual, step ``1/k`` for the first
  samples (a running mean) and ``1 - forget`` after; the residual is clipped to ``+-clip``
  (winsorised, so one stall moves the belief at most ``clip`` times the step).
* CPU: exponentially weighted least squares (forgetting ``forget``) on the *relative* error (each
  sample divided by its current prediction: least squares in log space to first order), its
  residual clipped the same way, the scales kept in ``[1/64, 64]``. The 2x2 normal equations are
  kept and solved each sample: recursive least squares with forgetting lost positive definiteness
  after a few thousand samples on the deep toy's trace and blew up. A weak tie ``s_fixed ==
  s_token`` (weight ``TIE``) holds the two scales together where the batches excite only one (all
  read-bound, say), so the other follows instead of drifting on noise.

A kind (copy, CPU) moves only after ``min_samples`` samples of it. The published belief, a plain
CostModel the planner kernels read as arrays, is rebuilt every ``every`` accesses
(:meth:`tick`) and at block end (:meth:`publish`): between rebuilds plans use one fixed belief.
Everything is float arithmetic on the measurements in the order given, so plans are deterministic
for a given sequence of measurements.

Who measures (``Dispatcher.observe``, once per layer access): replay, the true cost model's times with
seeded lognormal noise (``oled_hf.sim.replay``); the live executor, the grouped CPU call's wall time
and, on CUDA, copy intervals bracketed by timing events on the copy stream
(``oled_hf.offload.live_timing``; no copy is timed on a CPU device). A live run's measurements, and so
its plans, vary from run to run; its tokens do not (the dispatcher only chooses where a miss is served).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .costmodel import CostModel

SCALE_BOUNDS = (1.0 / 64, 64.0)
TIE = 0.05  # weight of the tie between the CPU's two scales (a mis-belief is mostly one factor)
# dispatch knobs of the calibration (``dispatch.calibrate=1`` turns it on; the others tune it)
CALIBRATION_KNOBS = ("calibrate", "calibrate_every", "calibrate_min_samples", "calibrate_forget", "calibrate_clip")


@dataclass(frozen=True)
class CalibrationSettings:
    """How fast and how robustly the calibrator moves (defaults: ``eval/calibration_sweep.py``)."""

    every: int = 16  # accesses between rebuilds of the published belief
    min_samples: int = 8  # samples of a kind before its scale moves
    forget: float = 0.99  # RLS forgetting factor / 1 - EMA step after the first samples
    clip: float = 0.7  # |log residual| beyond it is clipped (0.7: a factor 2)

    def __post_init__(self) -> None:
        for name in ("every", "min_samples"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"calibration {name}={v!r} is invalid: must be an integer >= 1")
        if not (isinstance(self.forget, (int, float)) and 0.5 <= self.forget < 1.0):
            raise ValueError(f"calibration forget={self.forget!r} is invalid: must be a number in [0.5, 1)")
        if not (isinstance(self.clip, (int, float)) and math.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"calibration clip={self.clip!r} is invalid: must be a number > 0")


def settings_from_knobs(knobs: dict[str, Any]) -> CalibrationSettings | None:
    """The calibration a system's dispatch knobs ask for (None: off). Unknown ``calibrate*`` keys are refused."""
    unknown = sorted(k for k in knobs if k.startswith("calibrate") and k not in CALIBRATION_KNOBS)
    if unknown:
        raise ValueError(f"unknown dispatch knob(s): {', '.join(unknown)}; calibration knobs: "
                         f"{', '.join(CALIBRATION_KNOBS)}")
    on = knobs.get("calibrate", False)
    if isinstance(on, float) or on not in (0, 1):
        raise ValueError(f"dispatch knob calibrate={on!r} is invalid: must be true or false (0 or 1)")
    extra = {k: knobs[k] for k in CALIBRATION_KNOBS[1:] if k in knobs}
    if not on:
        if extra:
            raise ValueError(f"dispatch knob(s) {', '.join(sorted(extra))} need dispatch.calibrate=1")
        return None
    return CalibrationSettings(**{k.removeprefix("calibrate_"): v for k, v in extra.items()})


class OnlineCalibrator:
    """Copy and CPU cost scales fitted online to measured times (see the module docstring)."""

    def __init__(self, base: CostModel, settings: CalibrationSettings | None = None) -> None:
        self.base = base
        self.settings = settings if settings is not None else CalibrationSettings()
        self.log_copy = 0.0
        self.copy_samples = 0
        self.theta = np.ones(2)
        self._A = np.zeros((2, 2))  # exponentially weighted normal equations of the relative errors
        self._b = np.zeros(2)
        self._w = 0.0  # their total weight
        self.cpu_samples = 0
        self.accesses = 0
        self.belief = base

    # ------------------------------------------------------------------ measurements
    def observe_copy(self, per_expert_s: float) -> None:
        """One measured per-expert copy time (seconds; e.g. a CUDA-event interval / copies in it)."""
        if not (math.isfinite(per_expert_s) and per_expert_s > 0):
            return  # a timer glitch carries no information
        s = self.settings
        r = math.log(per_expert_s / self.base.copy_time()) - self.log_copy
        r = min(max(r, -s.clip), s.clip)
        self.copy_samples += 1
        step = max(1.0 / self.copy_samples, 1.0 - s.forget)
        self.log_copy += step * r

    def cpu_features(self, tokens: np.ndarray) -> np.ndarray:
        """The batch's (fixed, per-token) parts under ``base`` (``theta`` scales them).

        Each expert is classed read- or compute-bound by ``base``'s roofline, fixed for the run, so
        the fit is linear least squares. (Classing by the current calibrated roofline instead runs
        away: an expert below the true knee classed compute-bound under-predicts, which raises the
        token scale, which classes more experts compute-bound; seen on the deep toy's trace.) The
        price: where only one term is mis-believed the knee moves, and the experts between the two
        knees are charged to the wrong term (a bias of a few per cent, tested).
        """
        b = self.base
        n = np.asarray(tokens, dtype=np.float64)
        n = n[n > 0]
        per_tok = n * b.cpu_s_per_token
        bound = per_tok > b.cpu_expert_fixed_s  # compute-bound under the base roofline
        fixed = b.cpu_overhead_s + b.cpu_expert_fixed_s * float(np.count_nonzero(~bound))
        return np.array([fixed, float(per_tok[bound].sum())])

    def observe_cpu(self, tokens: np.ndarray, batch_s: float) -> None:
        """One measured CPU batch: the token count of each expert in it and its wall time (seconds)."""
        if not (math.isfinite(batch_s) and batch_s > 0):
            return
        x = self.cpu_features(tokens)
        pred = float(x @ self.theta)
        if pred <= 0:
            return
        s = self.settings
        x = x / pred  # relative error: x @ theta == 1 at the current belief
        r = min(max(math.log(batch_s / pred), -s.clip), s.clip)
        y = math.exp(r)
        lam = s.forget
        self._A = lam * self._A + np.outer(x, x)
        self._b = lam * self._b + x * y
        self._w = lam * self._w + 1.0
        self.theta = self._solve()
        self.cpu_samples += 1

    def _solve(self) -> np.ndarray:
        """Weighted least squares with the tie ``TIE**2 * weight * (s_fixed - s_token)**2`` and a
        vanishing ridge toward the starting belief (so a 2x2 solve is always well posed)."""
        d = np.array([1.0, -1.0])
        eps = 1e-9 * (1.0 + self._w)
        a = self._A + (TIE ** 2) * self._w * np.outer(d, d) + eps * np.eye(2)
        theta = np.linalg.solve(a, self._b + eps * np.ones(2))
        return np.clip(theta, *SCALE_BOUNDS)

    # ------------------------------------------------------------------ the published belief
    @property
    def scales(self) -> dict[str, float]:
        """Calibrated / starting belief, per term (1 = unchanged): what the report prints."""
        m = self.settings.min_samples
        return {"copy": math.exp(self.log_copy) if self.copy_samples >= m else 1.0,
                "cpu_fixed": float(self.theta[0]) if self.cpu_samples >= m else 1.0,
                "cpu_token": float(self.theta[1]) if self.cpu_samples >= m else 1.0}

    def calibrated(self) -> CostModel:
        """``base`` with the current scales (terms with too few samples unchanged)."""
        sc = self.scales
        b = self.base
        h2d = b.h2d_bytes_per_s / sc["copy"]
        dram = b.host_dram_bytes_per_s
        if dram > 0:  # keep DMA below host DRAM, as CostModel.believed does
            dram *= max(1.0 / sc["copy"], 1.0)
        return replace(b, h2d_bytes_per_s=h2d, host_dram_bytes_per_s=dram,
                       cpu_overhead_s=b.cpu_overhead_s * sc["cpu_fixed"],
                       cpu_expert_fixed_s=b.cpu_expert_fixed_s * sc["cpu_fixed"],
                       cpu_s_per_token=b.cpu_s_per_token * sc["cpu_token"])

    def publish(self) -> CostModel:
        """Rebuild the published belief now (block end); returns it."""
        self.belief = self.calibrated()
        return self.belief

    def tick(self) -> CostModel:
        """Count one layer access; every ``every`` accesses the belief is rebuilt. Returns the belief."""
        self.accesses += 1
        if self.accesses % self.settings.every == 0:
            self.publish()
        return self.belief
