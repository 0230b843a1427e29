"""The compiled kernels (``oled_hf.offload.kernels``) give the very floats and choices of the NumPy code.

Both paths run here: OLED's state after the same accesses must be bit-identical, and the golden
plan digests must hold with the kernels on and off.
"""

import numpy as np
import pytest
from oled_hf.modeling.events import IterationEvent

from oled_hf.offload import kernels
from oled_hf.offload.policies.oled import OledPolicy

from .test_plan_checksum import REFERENCE, REUSE_REFERENCE, _trace, plan_digest

numba = pytest.importorskip("numba")
pytestmark = pytest.mark.skipif(not kernels.ENABLED, reason="kernels disabled (OLED_HF_KERNELS=numpy)")


def test_pairwise_sum_is_numpys_row_sum():
    rng = np.random.default_rng(0)
    for n in (*range(1, 41), 64, 100, 127, 128):
        for _ in range(50):
            row = np.sqrt(rng.random(n).astype(np.float32) * rng.choice([1e-3, 1.0, 1e3]), dtype=np.float32)
            assert kernels._pairwise(row, n) == np.add.reduce(row[None, :], axis=1)[0], n


def _event(rng, rows, threshold=0.9):
    masked = rng.random(rows) < 0.6
    committed = ~masked & (rng.random(rows) < 0.3)
    edited = ~masked & ~committed & (rng.random(rows) < 0.1)
    return IterationEvent(block_index=0, iteration=1, masked=masked, committed=committed,
                          confidence=np.where(masked, rng.random(rows), 1.0), token_ids=np.zeros(rows),
                          edited=edited)


@pytest.mark.parametrize("k,gate_power,weights", [(8, 0.5, True), (6, 0.5, True), (8, 1.0, True), (8, 0.5, False)])
def test_oled_update_matches_numpy_bit_for_bit(monkeypatch, k, gate_power, weights):
    num_layers, num_experts, rows = 2, 48, 32
    pols = []
    for on in (True, False):
        monkeypatch.setattr(kernels, "ENABLED", on)
        pols.append(OledPolicy(num_layers, num_experts, gate_power=gate_power))
    assert pols[0]._compiled and not pols[1]._compiled
    monkeypatch.setattr(kernels, "ENABLED", True)
    assert not OledPolicy(1, 8, gate_power=0.7)._compiled  # a power the kernel lacks: the NumPy update
    rng = np.random.default_rng(k)
    for pol in pols:
        pol.on_block_start(0, np.zeros((1, rows)))
    for step in range(12):
        if step % 4 == 3:  # a prefill-sized access (all STABLE rows), then a new block
            n = 5
        else:
            n = rows
        ids = np.stack([rng.choice(num_experts, k, replace=False) for _ in range(n)])
        w = rng.random((n, k)).astype(np.float32) if weights else None
        event = _event(rng, rows)
        for pol in pols:
            for layer in range(num_layers):
                pol.observe_access(layer, ids, w, step)
            if step % 4 == 3:
                pol.on_block_end(0, None)
                pol.on_block_start(1, np.zeros((1, rows)))
            else:
                pol.on_iteration(event)
        for layer in range(num_layers):
            a, b = pols
            assert np.array_equal(a.priority_array(layer), b.priority_array(layer))
            assert np.array_equal(a.stability(layer), b.stability(layer))
            assert np.array_equal(a._stab[layer], b._stab[layer])
            experts = np.arange(num_experts)
            assert np.array_equal(a.reuse_of(layer, experts), b.reuse_of(layer, experts))
    assert not np.array_equal(pols[0]._calib, 0.0)  # calibration ran


def test_lowest_idle_matches_stable_argsort():
    rng = np.random.default_rng(1)
    for _ in range(300):
        e = int(rng.integers(4, 80))
        resident = rng.random(e) < 0.6
        counts = np.where(rng.random(e) < 0.4, rng.integers(1, 5, e), 0)
        prio = rng.integers(0, 4, e).astype(np.float64)  # many ties: they go to the lower id
        n = int(rng.integers(0, e + 2))
        cand = (resident & (counts == 0)).nonzero()[0]
        want = cand[np.argsort(prio[cand], kind="stable")][:n].tolist()
        assert kernels.lowest_idle(resident, counts, prio, n).tolist() == want


@pytest.mark.parametrize("on", [True, False], ids=["kernels", "numpy"])
@pytest.mark.parametrize("case", [("e64", "oled", 6, "auto"), ("e256", "oled", 40, "off"),
                                  ("e48k6", "oled", 5, "auto"), ("e256", "lru", 40, "auto")],
                         ids=lambda c: "-".join(map(str, c)))
def test_plan_digests_hold_with_and_without_kernels(monkeypatch, on, case):
    t, p, c, cpu = case
    monkeypatch.setattr(kernels, "ENABLED", on)
    assert plan_digest(_trace(t), p, c, cpu) == REFERENCE[f"{t}-{p}-c{c}-{cpu}"]


@pytest.mark.parametrize("on", [True, False], ids=["kernels", "numpy"])
def test_reuse_copy_digest_holds_with_and_without_kernels(monkeypatch, on):
    monkeypatch.setattr(kernels, "ENABLED", on)
    assert plan_digest(_trace("e256"), "oled", 40, "auto", oled_background_copies=2) == REUSE_REFERENCE["e256-c40-auto"]


def test_split_misses_matches_the_python_rule():
    from oled_hf.offload.costmodel import CostModel
    from oled_hf.offload.dispatch import Dispatcher

    cm = CostModel.h200_pcie5(2048, 512)
    copy_t = cm.copy_time()
    rng = np.random.default_rng(2)
    for trial in range(500):
        m = int(rng.integers(1, 40)) if trial < 400 else int(rng.integers(40, kernels.MAX_ROW + 1))
        tokens = rng.integers(1, 40, m)
        reuse = np.where(rng.random(m) < 0.3, 0.0, rng.random(m) * 4)  # ties at 0
        admitted = None if trial % 3 else rng.random(m) < 0.7
        room = int(rng.integers(-2, m + 2))
        g0 = float(rng.random() * 1e-4)
        want = Dispatcher._split_small(cm, copy_t, g0, tokens.tolist(), reuse.tolist(), admitted, room)
        if m >= Dispatcher.small:  # the compiled planner splits up to MAX_ROW misses: NumPy's rule there
            want = Dispatcher._split_numpy(cm, copy_t, g0, tokens, reuse, admitted, room).tolist()
        take = np.empty(m, dtype=bool)
        adm = np.ones(m, dtype=bool) if admitted is None else admitted
        assert kernels.split_misses(tokens, reuse, adm, room, g0, copy_t, cm.cpu_overhead_s, cm.cpu_expert_fixed_s,
                                    cm.cpu_s_per_token, cm.gpu_expert_fixed_s, cm.gpu_s_per_token, take)
        assert take.tolist() == want, trial
    nan = np.array([np.nan])
    assert not kernels.split_misses(np.ones(1, dtype=np.int64), nan, np.ones(1, dtype=bool), 1, 0.0, copy_t,
                                    0.0, 1.0, 1.0, 1.0, 1.0, np.empty(1, dtype=bool))


def test_pairwise_f64_is_numpys_sum():
    rng = np.random.default_rng(3)
    for n in (*range(1, 41), 64, 128):
        for _ in range(30):
            a = rng.random(n) * rng.choice([1e-6, 1.0, 1e6])
            assert kernels._pairwise(a, n) == np.add.reduce(a), n


# (e256, oled, 40, off): copy-only prefill requests exceed the slots (a streamed access); since the CPU
# overhead is per batch, the CPU-on e256 case no longer streams (its prefill misses go to the CPU)
@pytest.mark.parametrize("case", [("e64", "oled", 6, "auto"), ("e256", "oled", 40, "off"),
                                  ("e48k6", "static", 5, "on"), ("e64", "lru", 26, "off")],
                         ids=lambda c: "-".join(map(str, c)))
def test_compiled_plan_handles_every_access(monkeypatch, case):
    """The whole access runs as one compiled call (streamed requests and reuse copies included), so
    the speed of ``eval/planner_speed.py`` is the compiled path's, not the Python fallback's."""
    from oled_hf.offload.planner import CacheState

    handled = []
    compiled = CacheState._plan_compiled
    monkeypatch.setattr(CacheState, "_plan_compiled", lambda self, *a: handled.append(p := compiled(self, *a)) or p)
    t, p, c, cpu = case
    plan_digest(_trace(t), p, c, cpu, oled_background_copies=2)
    assert handled and all(x is not None for x in handled)
    for plan in handled:  # what the executor's waves rely on: no slot twice among unstreamed copies
        slots = plan.copy_arrays()[1]
        assert plan.streamed or np.unique(slots).size == slots.size
    assert any(plan.streamed for plan in handled)  # prefill-sized requests exceed the layers' slots


def test_compiled_classes_are_numpys():
    rng = np.random.default_rng(6)
    pol = OledPolicy(1, 8, confidence_threshold=0.85)
    for trial in range(200):
        rows = int(rng.integers(1, 70))
        event = _event(rng, rows, 0.85)
        event.confidence = np.where(rng.random(rows) < 0.2, rng.choice([0.0, 0.85, 0.2125, 1.0, -0.1], rows),
                                    event.confidence).astype(rng.choice([np.float32, np.float64]))
        if trial % 3 == 0:
            event.edited = None
        pol.on_iteration(event)
        want = pol.classify(event.masked, event.confidence, event.committed, event.edited)
        assert pol._row_class.tolist() == want.tolist(), trial
        assert pol._class_counts.tolist() == np.bincount(want, minlength=10).tolist()


def test_compiled_reuse_prediction_is_numpys():
    """The planner kernel's OLED reuse (libm log1p/expm1) equals the policy's NumPy one bit for bit
    where NumPy uses libm (AVX2 builds, this machine); AVX-512 builds carry their own versions."""
    import math

    from oled_hf.offload.policies.oled import _reuse_from

    probe = -np.random.default_rng(0).random(1000) * 20
    if not all(np.expm1(x) == math.expm1(x) and np.log1p(x / 21) == math.log1p(x / 21) for x in probe):
        pytest.skip("NumPy's log1p/expm1 are not libm's on this machine")
    rng = np.random.default_rng(7)
    for _ in range(50):
        E = int(rng.integers(4, 300))
        flat = rng.integers(0, E, int(rng.integers(1, 400)))
        entry_cls = rng.integers(0, 10, flat.size).astype(np.intp)
        stab = np.clip(rng.random(10) * 1.1, 0.05, 1.0)
        want_log = np.bincount(flat, weights=np.log1p(-np.minimum(stab, 0.99))[entry_cls], minlength=E)
        log_miss = kernels._log_miss(2, flat, entry_cls, stab, E)
        assert np.array_equal(log_miss, want_log)
        want = _reuse_from(want_log)
        got = np.array([kernels._reuse_at(e, 2, np.zeros(0), log_miss) for e in range(E)])
        assert np.array_equal(got, want)
