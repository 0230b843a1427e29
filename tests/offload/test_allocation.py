"""Layer-adaptive allocation: budget invariants, determinism, and that it helps skewed layers."""

import numpy as np
import pytest

from oled_hf.offload import allocation, kernels
from oled_hf.offload.allocation import (
    AdaptiveAllocator,
    allocate_capacities,
    antitonic_pav,
    fold_counts,
    uniform_capacities,
)
from oled_hf.sim.replay import replay
from oled_hf.sim.synthetic import synthetic_trace

compiled_only = pytest.mark.skipif(not kernels.COMPILED, reason="kernels run as Python (nothing to compare)")


def py(fn):
    """The Python function a kernel was compiled from (the kernel itself where nothing is compiled)."""
    return getattr(fn, "py_func", fn)


def test_uniform():
    assert uniform_capacities(10, 3, 8) == [4, 3, 3]
    assert uniform_capacities(24, 3, 8) == [8, 8, 8]
    with pytest.raises(ValueError, match="total=25 slots cannot be split over 3 layers of 8 experts"):
        uniform_capacities(25, 3, 8)
    with pytest.raises(ValueError, match="total=2"):
        uniform_capacities(2, 3, 8)


@pytest.mark.parametrize("total", [4, 9, 17, 31, 32])
def test_allocate_invariants(total):
    rng = np.random.default_rng(total)
    for demand in (rng.random(4), rng.random((4, 8)) * 10, np.zeros(4), np.zeros((4, 8))):
        caps = allocate_capacities(total, 4, 8, demand)
        assert sum(caps) == total and all(1 <= c <= 8 for c in caps)
        assert caps == allocate_capacities(total, 4, 8, demand.copy())


def test_allocate_follows_demand():
    assert allocate_capacities(12, 3, 16, [1.0, 2.0, 3.0]) == [2, 4, 6]
    assert allocate_capacities(12, 3, 16, [0.0, 0.0, 0.0]) == [4, 4, 4]
    assert allocate_capacities(20, 2, 16, [1.0, 100.0]) == [4, 16]  # capped at num_experts
    gains = np.zeros((3, 16))
    gains[0, :10] = 5.0  # layer 0 profits from 10 slots, the others from 2
    gains[1, :2] = gains[2, :2] = 5.0
    assert allocate_capacities(14, 3, 16, gains) == [10, 2, 2]
    assert allocate_capacities(14, 3, 16, gains, min_slots=3) == [8, 3, 3]
    with pytest.raises(ValueError, match="min_slots=5 is infeasible"):
        allocate_capacities(14, 3, 16, gains, min_slots=5)
    with pytest.raises(ValueError, match="demand must have shape"):
        allocate_capacities(14, 3, 16, np.zeros((2, 16)))


def test_adaptive_allocator_proposals_are_damped_and_valid():
    L, E, total = 3, 16, 18
    alloc = AdaptiveAllocator(L, E, total, warmup_accesses=4, damping=0.5)
    rng = np.random.default_rng(0)
    assert alloc.propose([6, 6, 6]) is None  # no data yet
    for _ in range(30):
        for layer, width in enumerate((2, 6, 14)):  # layer 2 cycles through many experts
            counts = np.zeros(E, dtype=np.int64)
            counts[rng.choice(width, size=2, replace=False)] = 1
            alloc.observe(layer, counts)
    target = alloc.target()
    assert sum(target) == total and target[0] < target[2]
    new = alloc.propose([6, 6, 6])
    assert new is not None and sum(new) == total and all(1 <= c <= E for c in new)
    assert all(abs(n - 6) <= abs(t - 6) for n, t in zip(new, target))  # moved part of the way


def test_layer_adaptive_helps_when_layers_differ():
    trace = synthetic_trace(num_layers=4, num_experts=64, top_k=4, block_length=16, num_blocks=6,
                            popularity_scale=[0.0, 0.5, 2.0, 4.0], seed=0)
    uniform = replay(trace, "lru", 16, layer_adaptive=False, cpu_compute="off")
    adaptive = replay(trace, "lru", 16, layer_adaptive=True, cpu_compute="off")
    assert sum(adaptive.capacities) == 64 and adaptive.capacities != [16] * 4
    assert adaptive.hit_rate > uniform.hit_rate + 0.01


class _PerAccessHistogram:
    """The stack-distance histogram updated access by access (float recency keys, one sort per access):
    the straightforward form of what AdaptiveAllocator computes in batches."""

    def __init__(self, L, E):
        self.E = E
        self.hist = np.zeros((L, E + 1))
        self.last = np.full((L, E), -1.0)
        self.accesses = np.zeros(L, dtype=np.int64)
        self.id_frac = np.arange(E) / (E + 1.0)

    def observe(self, layer, counts):
        req = np.flatnonzero(counts)
        last = self.last[layer]
        prev = last[req]
        dist = self.E - np.searchsorted(np.sort(last), prev, side="right")
        dist[prev < 0] = self.E
        self.hist[layer] += np.bincount(dist, minlength=self.E + 1)
        c = counts[req]
        last[req] = (c + self.id_frac[req]) * (0.5 / (float(c.max()) + 1.0)) + float(self.accesses[layer])
        self.accesses[layer] += 1


@pytest.mark.parametrize("run", ["compiled", "python"])
@pytest.mark.parametrize("E, max_pending", [(16, 3), (64, 32), (256, 7), (100, 32)])
def test_batched_histogram_equals_per_access_updates(monkeypatch, E, max_pending, run):
    """Folding stored accesses in batches (any batch size, any time) gives the bit-identical histogram,
    with ``fold_counts`` compiled or run as its Python source."""
    if run == "compiled" and not kernels.COMPILED:
        pytest.skip("kernels run as Python (the 'python' case covers it)")
    if run == "python":
        monkeypatch.setattr(allocation, "fold_counts", py(fold_counts))
    L = 3
    rng = np.random.default_rng(E)
    batched = type("Batched", (AdaptiveAllocator,), {"max_pending": max_pending})
    alloc = batched(L, E, L * E // 2, warmup_accesses=1)
    ref = _PerAccessHistogram(L, E)
    for step in range(150):
        layer = int(rng.integers(0, L))
        width = int(rng.integers(1, E + 1))
        ids = rng.integers(0, width, size=(int(rng.integers(1, 40)), int(rng.integers(1, 5))))
        counts = np.bincount(ids.reshape(-1), minlength=E)
        alloc.observe(layer, counts)
        ref.observe(layer, counts)
        if step % 37 == 36:  # a block end: decay applies to what was folded in so far
            assert np.array_equal(alloc.hist, ref.hist)
            alloc.hist *= 0.8
            ref.hist *= 0.8
    assert np.array_equal(alloc.hist, ref.hist)


@pytest.mark.parametrize("fn", [fold_counts, py(fold_counts)], ids=["kernel", "python"])
def test_fold_counts_by_hand(fn):
    """E = 4 (P = 4). Access 1 requests experts 0 (2 tokens) and 1: two first requests; the stack is
    then [0, 1, ...]. Access 2 requests 1 (distance 1) and 3 (first); ties by id put 3 above 1: the
    stack is [3, 1, 0, 2]. Access 3 requests 0, at distance 2. Codes after: rank * P + id, unseen id - P."""
    hist = np.zeros(5)
    recency = np.arange(4, dtype=np.int64) - 4
    fn(np.array([[2, 1, 0, 0], [0, 1, 0, 1]], dtype=np.int64), recency, hist, 2)
    assert hist.tolist() == [0.0, 1.0, 0.0, 0.0, 3.0]
    assert recency.tolist() == [0, 5, -2, 11]
    fn(np.array([[1, 0, 0, 0]], dtype=np.int64), recency, hist, 2)
    assert hist.tolist() == [0.0, 1.0, 1.0, 0.0, 3.0]
    assert recency.tolist() == [8, 1, -2, 7]  # stack [0, 3, 1, 2]


@pytest.mark.parametrize("fn", [antitonic_pav, py(antitonic_pav)], ids=["kernel", "python"])
def test_antitonic_fit_pools_adjacent_violators(fn):
    assert fn(np.array([5.0, 3.0, 3.0, 1.0])).tolist() == [5.0, 3.0, 3.0, 1.0]  # already non-increasing
    assert fn(np.array([3.0, 1.0, 2.0])).tolist() == [3.0, 1.5, 1.5]
    assert fn(np.array([1.0, 2.0, 3.0])).tolist() == [2.0, 2.0, 2.0]
    assert fn(np.array([4.0, 0.0, 1.0, 5.0, 0.0])).tolist() == [4.0, 2.0, 2.0, 2.0, 0.0]  # 5 pools with (0, 1)
    assert fn(np.array([7.0])).tolist() == [7.0]
    rng = np.random.default_rng(1)
    for _ in range(20):
        gains = rng.random(int(rng.integers(1, 60)))
        fit = fn(gains)
        assert fit.shape == gains.shape and np.all(np.diff(fit) <= 0)
        assert np.isclose(fit.sum(), gains.sum())  # pooling keeps each block's total


@compiled_only
def test_compiled_antitonic_fit_is_its_python_bit_for_bit():
    rng = np.random.default_rng(5)
    for trial in range(300):
        n = int(rng.integers(1, 300))
        gains = rng.integers(0, 6, n).astype(np.float64) * rng.choice([0.8, 1.0, 0.64])  # plateaus and ties
        if trial % 2:
            gains = np.sort(gains)[::-1] + rng.random(n) * 0.1  # mostly decreasing, small violations
        assert np.array_equal(antitonic_pav(gains), py(antitonic_pav)(gains)), trial
