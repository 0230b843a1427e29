"""The plan of one MoE layer access, as the planner hands it to the executor and to replay.

A compiled plan (``kernels.plan_access``) is a small block of int64 rows; the executor reads them
as arrays and the Python lists are built only for whoever asks (replay, tests, traces), so the
live path never converts an access's ~100 experts into Python objects.
"""

from __future__ import annotations

import numpy as np

Copies = list[tuple[int, int, int | None]]  # (expert, slot, evicted_expert_or_None), execution order


class LayerPlan:
    """What one MoE layer access does with its requested experts.

    ``hits`` (resident now: computed from their slots), ``copies``, ``cpu`` (computed on the CPU
    from the host store), ``slot_of`` (expert -> slot for every GPU-computed expert), ``counts``
    (tokens per expert) and ``background`` (rule 4's reuse copies, which nothing of this access
    reads). A compiled plan holds arrays (:meth:`hit_arrays`, :meth:`copy_arrays`, which the
    executor reads) and builds the Python lists only when asked for them.
    """

    __slots__ = ("layer", "counts", "_hits", "_copies", "_cpu", "_slot_of", "_background", "_arr", "_n")

    def __init__(self, hits: list[int], copies: Copies, cpu: list[int], slot_of: dict[int, int], layer: int = -1,
                 counts: np.ndarray | None = None, background: Copies | None = None) -> None:
        self.layer, self.counts = layer, counts
        self._hits, self._copies, self._cpu, self._slot_of = hits, copies, cpu, slot_of
        self._background = [] if background is None else background
        self._arr: np.ndarray | None = None
        self._n: list[int] = []

    @classmethod
    def from_arrays(cls, layer: int, counts: np.ndarray, arr: np.ndarray, n: list[int]) -> LayerPlan:
        """A plan over ``kernels.plan_access``'s rows (``arr``, owned) and counts (``n``: hits, copies,
        CPU experts, reuse copies, copies into free slots, reuse copies into free slots, streamed)."""
        plan = cls.__new__(cls)
        plan.layer, plan.counts, plan._arr, plan._n = layer, counts, arr, n
        plan._hits = plan._copies = plan._cpu = plan._slot_of = plan._background = None
        return plan

    def hit_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(experts, slots) of the hits, int64."""
        if self._arr is not None:
            return self._arr[0, : self._n[0]], self._arr[1, : self._n[0]]
        return (np.asarray(self._hits, dtype=np.int64),
                np.fromiter(map(self._slot_of.__getitem__, self._hits), np.int64, len(self._hits)))

    def copy_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(experts, slots) of the copies in execution order, int64."""
        if self._arr is not None:
            return self._arr[2, : self._n[1]], self._arr[3, : self._n[1]]
        return (np.fromiter((c[0] for c in self._copies), np.int64, len(self._copies)),
                np.fromiter((c[1] for c in self._copies), np.int64, len(self._copies)))

    def cpu_array(self) -> np.ndarray:
        """The CPU-computed experts, int64."""
        if self._arr is not None:
            return self._arr[5, : self._n[2]]
        return np.asarray(self._cpu, dtype=np.int64)

    @property
    def n_background(self) -> int:
        """How many reuse copies (``background``) the plan makes."""
        return self._n[3] if self._arr is not None else len(self._background)

    @property
    def streamed(self) -> bool | None:
        """Whether a copy reuses a slot of this access (a request over the capacity); None: not known."""
        return bool(self._n[6]) if self._arr is not None else None

    @property
    def hits(self) -> list[int]:
        if self._hits is None:
            self._hits = self._arr[0, : self._n[0]].tolist()
        return self._hits

    @property
    def cpu(self) -> list[int]:
        if self._cpu is None:
            self._cpu = self._arr[5, : self._n[2]].tolist()
        return self._cpu

    @property
    def copies(self) -> Copies:
        if self._copies is None:
            self._copies = self._zip(2, self._n[1], self._n[4])
        return self._copies

    @property
    def background(self) -> Copies:
        if self._background is None:
            self._background = self._zip(6, self._n[3], self._n[5])
        return self._background

    @property
    def slot_of(self) -> dict[int, int]:
        if self._slot_of is None:
            n_hits, n_copies = self._n[0], self._n[1]
            self._slot_of = dict(zip(self._arr[0, :n_hits].tolist(), self._arr[1, :n_hits].tolist()))
            self._slot_of.update(zip(self._arr[2, :n_copies].tolist(), self._arr[3, :n_copies].tolist()))
        return self._slot_of

    def _zip(self, row: int, n: int, n_free: int) -> Copies:
        """(expert, slot, victim) from rows ``row``..``row+2``; the first ``n_free`` took free slots."""
        a = self._arr
        return list(zip(a[row, :n].tolist(), a[row + 1, :n].tolist(), [None] * n_free + a[row + 2, n_free:n].tolist()))

    def __repr__(self) -> str:
        return (f"LayerPlan(layer={self.layer}, hits={self.hits}, copies={self.copies}, cpu={self.cpu}, "
                f"background={self.background})")
