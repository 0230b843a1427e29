"""The kernels (``oled_hf.offload.kernels``), the one implementation of OLED's update and the planner.

Two kinds of test. Same source, two executions: each kernel compiled by numba against the very
same function run as Python (``.py_func``; a subprocess runs everything as Python, and its plan
digests must be the pinned ones). And the rules themselves, on cases small enough to work out by hand.
"""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from oled_hf.modeling.events import IterationEvent

from oled_hf.offload import kernels
from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.policies.oled import COMMITTED, CONFIDENT, DECODED, EDITED, UNSURE, OledPolicy

compiled_only = pytest.mark.skipif(not kernels.COMPILED, reason="kernels run as Python (nothing to compare)")
CODES = np.array([DECODED, COMMITTED, CONFIDENT, UNSURE, EDITED], dtype=np.intp)


def py(fn):
    """The Python function a kernel was compiled from (the kernel itself where nothing is compiled)."""
    return getattr(fn, "py_func", fn)


def _event(rng, rows):
    masked = rng.random(rows) < 0.6
    committed = ~masked & (rng.random(rows) < 0.3)
    edited = ~masked & ~committed & (rng.random(rows) < 0.1)
    return IterationEvent(block_index=0, iteration=1, masked=masked, committed=committed,
                          confidence=np.where(masked, rng.random(rows), 1.0), token_ids=np.zeros(rows),
                          edited=edited)


# ------------------------------------------------------------------------------ same source, two executions
def test_pairwise_sum_is_numpys_compiled_and_not():
    rng = np.random.default_rng(0)
    for n in (*range(1, 41), 64, 100, 127, 128, 129, 136, 250, 257, 600, 1031):
        for _ in range(10):
            a = rng.random(n) * rng.choice([1e-6, 1.0, 1e6])
            row = np.sqrt(a.astype(np.float32), dtype=np.float32)
            want32, want64 = np.add.reduce(row[None, :], axis=1)[0], np.add.reduce(a)
            for fn in (kernels._pairwise, py(kernels._pairwise)):
                got32 = fn(row, n)
                assert got32 == want32 and np.float32(got32) == got32, n  # a float32 value
                assert fn(a, n) == want64, n


@compiled_only
@pytest.mark.parametrize("k,gate_power,weights", [(8, 0.5, True), (6, 0.5, True), (8, 1.0, True), (8, 0.7, True),
                                                  (8, 0.5, False)])
def test_oled_update_compiled_is_its_python(monkeypatch, k, gate_power, weights):
    num_layers, num_experts, rows = 2, 48, 32
    pols = [OledPolicy(num_layers, num_experts, gate_power=gate_power) for _ in range(2)]
    rng = np.random.default_rng(k)
    for pol in pols:
        pol.on_block_start(0, np.zeros((1, rows)))
    for step in range(12):
        n = 5 if step % 4 == 3 else rows  # a prefill-sized access (all STABLE rows), then a new block
        ids = np.stack([rng.choice(num_experts, k, replace=False) for _ in range(n)])
        w = rng.random((n, k)).astype(np.float32) if weights else None
        event = _event(rng, rows)
        for pol, fn in zip(pols, (kernels.oled_update, py(kernels.oled_update))):
            monkeypatch.setattr(kernels, "oled_update", fn)
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
            experts = np.arange(num_experts)
            assert np.array_equal(a.reuse_of(layer, experts), b.reuse_of(layer, experts))
    assert not np.array_equal(pols[0]._calib, 0.0)  # calibration ran


@compiled_only
def test_classes_reuse_and_orders_compiled_are_their_python():
    rng = np.random.default_rng(6)
    for trial in range(100):
        rows = int(rng.integers(1, 70))
        ev = _event(rng, rows)
        conf = np.where(rng.random(rows) < 0.2, rng.choice([0.0, 0.85, 0.2125, 1.0, -0.1], rows), ev.confidence)
        got = []
        for fn in (kernels.classify, py(kernels.classify)):
            cls, counts = np.empty(rows, dtype=np.intp), np.empty(10, dtype=np.int64)
            fn(ev.masked, conf, ev.committed, ev.edited, trial % 3 > 0, 0.85, 4, CODES, cls, counts)
            got.append((cls.tolist(), counts.tolist()))
        assert got[0] == got[1], trial
        E = int(rng.integers(4, 300))
        flat = rng.integers(0, E, int(rng.integers(1, 400)))
        entry_cls = rng.integers(0, 10, flat.size).astype(np.intp)
        stab = np.clip(rng.random(10) * 1.1, 0.05, 1.0)
        experts = rng.permutation(E)[: int(rng.integers(1, E + 1))]
        outs = [np.empty(experts.size), np.empty(experts.size)]
        for fn, out in zip((kernels.oled_reuse, py(kernels.oled_reuse)), outs):
            fn(flat, entry_cls, stab, E, experts, out)
        assert np.array_equal(outs[0], outs[1])
        u = rng.random(E) * rng.choice([1.0, 1.0 + 1e-9])
        assert np.array_equal(kernels.geometric_reuse(u), py(kernels.geometric_reuse)(u))
        resident = rng.random(E) < 0.6
        counts = np.where(rng.random(E) < 0.4, rng.integers(1, 5, E), 0)
        prio = rng.integers(0, 4, E).astype(np.float64)  # many ties
        n = int(rng.integers(0, E + 2))
        assert kernels.lowest_idle(resident, counts, prio, n).tolist() == \
            py(kernels.lowest_idle)(resident, counts, prio, n).tolist()


@compiled_only
@pytest.mark.parametrize("cm", [CostModel.h200_pcie5(2048, 512),
                                CostModel(expert_bytes=1000, h2d_bytes_per_s=1e9, gpu_expert_fixed_s=0.0,
                                          gpu_s_per_token=0.0, cpu_expert_fixed_s=2e-6, cpu_s_per_token=1e-6)])
def test_split_compiled_is_its_python(cm):
    costs = (cm.copy_time(), cm.cpu_overhead_s, cm.cpu_expert_fixed_s, cm.cpu_s_per_token, cm.gpu_expert_fixed_s,
             cm.gpu_s_per_token)
    rng = np.random.default_rng(2)
    for trial in range(400):
        m = int(rng.integers(1, 45)) if trial < 350 else int(rng.integers(45, 300))
        tokens = rng.integers(1, 4 if trial % 2 else 40, m)  # few distinct values: exact ties
        reuse = rng.choice([0.0, 0.5, 1.0, 3.0, 32.0], m) if trial % 3 else rng.random(m) * 5
        admitted = rng.random(m) < (0.6 if trial % 4 == 0 else 1.0)
        args = (tokens, reuse, admitted, int(rng.integers(-2, m + 3)), float(rng.choice([0.0, 1e-5, 3e-4])), *costs)
        takes = [np.empty(m, dtype=bool), np.empty(m, dtype=bool)]
        kernels.split_misses(*args, takes[0])
        py(kernels.split_misses)(*args, takes[1])
        assert takes[0].tolist() == takes[1].tolist(), trial


def test_plan_digests_hold_where_everything_runs_as_python():
    """A subprocess with ``OLED_HF_KERNELS=numpy``: every kernel runs as plain Python, and the plans
    of the pinned cases (streaming, reuse copies, k = 6, the CPU split, the learned retention's predictor) are
    the pinned ones."""
    code = (
        "import json\n"
        "from oled_hf.offload import kernels\n"
        "from tests.offload.test_plan_checksum import LEARNED_REFERENCE, REFERENCE, REUSE_REFERENCE, _trace\n"
        "from tests.offload.test_plan_checksum import plan_digest\n"
        "assert not kernels.COMPILED\n"
        "cases = [('e64', 'oled', 6, 'auto'), ('e256', 'oled', 40, 'off'), ('e48k6', 'oled', 5, 'auto'),\n"
        "         ('e48k6', 'static', 5, 'off'), ('e256', 'lru', 40, 'auto')]\n"
        "got = {f'{t}-{p}-c{c}-{cpu}': [plan_digest(_trace(t), p, c, cpu), REFERENCE[f'{t}-{p}-c{c}-{cpu}']]\n"
        "       for t, p, c, cpu in cases}\n"
        "got['e256-c40-auto-reuse'] = [plan_digest(_trace('e256'), 'oled', 40, 'auto', oled_background_copies=2),\n"
        "                              REUSE_REFERENCE['e256-c40-auto']]\n"
        "s = 'learned+cpu+reuse+adaptive'\n"
        "got['e64-learned'] = [plan_digest(_trace('e64'), 'learned', 26, 'auto', system=s),\n"
        "                      LEARNED_REFERENCE['e64-' + s + '-c26-auto']]\n"
        "print(json.dumps(got))\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "OLED_HF_KERNELS": "numpy", "PYTHONPATH": root, "HF_HUB_OFFLINE": "1"}
    res = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert {case: a == b for case, (a, b) in got.items()} == dict.fromkeys(got, True)


# ------------------------------------------------------------------------------ the rules, by hand
def test_calibration_counts_kept_routes_per_previous_class():
    """Row 0 (class 1) keeps 1 of its 2 routes, row 1 (class 2) both: kept fractions 0.5 and 1.0."""
    prev = np.array([[0, 1], [2, 3]], dtype=np.int64)
    ids = np.array([[1, 4], [3, 2]], dtype=np.int64)
    prev_cls = np.array([1, 2], dtype=np.intp)
    calib = np.array([np.full(10, 2.0), np.full(10, 4.0)])
    kernels._measure(ids, prev, prev_cls, np.repeat(prev_cls, 2), np.bincount(prev_cls, minlength=10), calib, 0.5)
    assert calib[0, :3].tolist() == [1.0, 1.5, 2.0] and calib[1, :3].tolist() == [2.0, 3.0, 3.0]
    stab = np.empty(10)
    kernels.stability(np.array([np.zeros(10), np.ones(10)]), calib, 0.3, stab)
    assert stab[:3].tolist() == [1 / 3, 0.375, 0.5] and stab[3] == 1.0 / 3  # (0 + 1) / (1 + 2)
    kernels.stability(np.array([np.zeros(10), np.ones(10)]), calib, 0.4, stab)
    assert stab[0] == 0.4  # clipped at the floor


def test_score_update_weights_stability_by_normalised_gate_power():
    ids = np.array([[0, 1], [1, 2]], dtype=np.int64)
    gates = np.array([[0.64, 0.36], [0.25, 0.25]], dtype=np.float32)
    cls = np.array([0, 1], dtype=np.intp)
    stab = np.array([1.0, 0.5])
    for power, g in ((1.0, gates), (0.5, np.sqrt(gates)), (0.7, gates ** np.float32(0.7))):
        score = np.array([1.0, 2.0, 0.0])
        kernels._score_update_gated(ids, gates, cls, stab, power, score, 0.5, np.empty(3))
        g = g.astype(np.float64)
        want = [0.5 + g[0, 0] / g[0].sum(), 1.0 + g[0, 1] / g[0].sum() + 0.25, 0.25]
        assert score.tolist() == pytest.approx(want, rel=1e-6), power
    score = np.zeros(3)
    kernels._score_update_flat(ids, np.repeat(cls, 2), stab, score, 0.5, np.empty(3))
    assert score.tolist() == [0.5, 0.75, 0.25]  # s_row / k per route


def test_classes_follow_the_event():
    masked = np.array([0, 1, 1, 1, 1, 0, 0], dtype=bool)
    conf = np.array([1.0, 0.95, 0.9, 0.5, 0.05, 1.0, 1.0])
    committed = np.array([0, 0, 0, 0, 0, 1, 1], dtype=bool)
    edited = np.array([0, 0, 0, 0, 0, 0, 1], dtype=bool)
    cls, counts = np.empty(7, dtype=np.intp), np.empty(10, dtype=np.int64)
    kernels.classify(masked, conf, committed, edited, True, 0.9, 4, CODES, cls, counts)
    # 0.5 / 0.9 * 4 = 2.2 -> bin 2; 0.05 -> bin 0; edited wins over committed
    assert cls.tolist() == [DECODED, CONFIDENT, CONFIDENT, UNSURE + 2, UNSURE, COMMITTED, EDITED]
    assert counts.tolist() == np.bincount(cls, minlength=10).tolist()


def test_reuse_rule():
    assert kernels.geometric_reuse(np.array([0.0, 0.5, 0.75, 1.0])).tolist() == [0.0, 1.0, 3.0, kernels.MAX_REUSE]
    # expert 0: one route of s = 0.5 -> p = 0.5 -> reuse 1; expert 1: two -> p = 0.75 -> 3; s caps at 0.99
    flat = np.array([0, 1, 1, 2], dtype=np.int64)
    out = np.empty(4)
    kernels.oled_reuse(flat, np.array([0, 0, 0, 1], dtype=np.intp), np.array([0.5, 1.0]), 4,
                       np.arange(4, dtype=np.int64), out)
    assert out.tolist() == pytest.approx([1.0, 3.0, kernels.MAX_REUSE, 0.0])  # 0.99 / 0.01 = 99: capped


def test_eviction_order_is_lowest_priority_idle_resident_ties_by_id():
    resident = np.array([1, 1, 1, 0, 1, 1], dtype=bool)
    counts = np.array([0, 0, 3, 0, 0, 0])  # expert 2 is requested now, 3 not resident
    prio = np.array([2.0, 1.0, 0.0, 0.0, 1.0, 5.0])
    assert kernels.lowest_idle(resident, counts, prio, 3).tolist() == [1, 4, 0]
    assert kernels.lowest_idle(resident, counts, prio, 9).tolist() == [1, 4, 0, 5]
    assert kernels.lowest_idle(resident, counts, prio, 0).tolist() == []


def _split(tokens, reuse, admitted=None, room=8, g0=0.0, costs=(1.0, 0.0, 0.1, 0.1, 0.0, 0.01)):
    m = len(tokens)
    take = np.empty(m, dtype=bool)
    adm = np.ones(m, dtype=bool) if admitted is None else np.asarray(admitted)
    kernels.split_misses(np.asarray(tokens), np.asarray(reuse, dtype=np.float64), adm, room, g0, *costs, take)
    return take.tolist()


def test_split_copies_what_the_cpu_would_take_longest_on():
    # copy time 1, CPU 0.1 per token, GPU 0.01 per token: 30 tokens take 3 on the CPU, 1.3 copied
    assert _split([30], [0.0]) == [True]
    assert _split([5], [0.0]) == [False]  # 0.5 on the CPU beats 1.05 copied
    assert _split([5], [9.0]) == [True]  # amortised over 10 uses: 0.15 per use
    assert _split([5], [9.0], room=0) == [False]  # it would not stay cached: no amortisation
    assert _split([30, 30], [0.0, 0.0], admitted=[False, True]) == [False, True]
    assert _split([5], [math.nan]) == _split([5], [0.0])  # a NaN reuse counts as none


def test_split_handles_more_misses_than_a_pairwise_block():
    """300 misses (once a NumPy fallback; the CPU batch total is a pairwise sum beyond 128 terms): the
    copied prefix of the ranking is the one a direct evaluation of the rule's spans picks."""
    rng = np.random.default_rng(4)
    costs = (1.0, 0.5, 0.1, 0.1, 0.0, 0.01)
    copy_t, ov, cf, cs, gf, gs = costs
    for _ in range(5):
        tokens = rng.integers(1, 60, 300)
        reuse = rng.random(300) * 3
        take = _split(tokens, reuse, room=200, costs=costs)
        cpu = np.maximum(cf, tokens * cs)
        gpu = gf + tokens * gs
        order = np.argsort(-(cpu * (1 + reuse) / (gpu + copy_t)), kind="stable")
        c0 = ov + cpu.sum()
        spans = [max(c0, 0.0)] + [
            max(sum(gpu[i] + (copy_t / (1 + reuse[i]) if n < 200 else copy_t) for n, i in enumerate(order[:j])),
                c0 - cpu[order[:j]].sum() if j < 300 else 0.0)
            for j in range(1, 301)]
        best = max(j for j, s in enumerate(spans) if s == min(spans))
        assert 0 < best < 300 and sorted(np.flatnonzero(take).tolist()) == sorted(order[:best].tolist())


def test_admitted_copies_are_dead_on_arrival_only_if_never_hit():
    flags = np.zeros((2, 4), dtype=bool)
    slot_expert = np.full(3, -1)

    def i64(*x):
        return np.array(x, dtype=np.int64)

    assert kernels.apply_copies(flags, i64(0, 1), i64(), i64(0, 1), slot_expert) == 0
    flags[1, 0] = False  # expert 0 was hit since its copy
    assert kernels.apply_copies(flags, i64(2, 3), i64(0, 1), i64(0, 1), slot_expert) == 1  # 1 never was
    assert flags[0].tolist() == [False, False, True, True] and slot_expert.tolist() == [2, 3, -1]
    # a slot taken twice in one access (streamed): the last copy stays, the first is dead on arrival
    assert kernels.apply_copies(flags, i64(0, 1), i64(0,), i64(2, 2), slot_expert) == 1
    assert slot_expert.tolist() == [2, 3, 1]


@pytest.mark.parametrize("case", [("e64", "oled", 6, "auto"), ("e256", "oled", 40, "off"),
                                  ("e48k6", "static", 5, "on"), ("e64", "lru", 26, "off")],
                         ids=lambda c: "-".join(map(str, c)))
def test_streamed_plans_reuse_slots_only_when_over_capacity(monkeypatch, case):
    """Prefill-sized requests exceed the layers' slots and stream; every other plan's copies take
    distinct slots (what the executor's waves rely on)."""
    from oled_hf.offload.planner import CacheState

    from .test_plan_checksum import _trace, plan_digest

    plans = []
    plan = CacheState.plan
    monkeypatch.setattr(CacheState, "plan", lambda self, *a, **kw: plans.append(p := plan(self, *a, **kw)) or p)
    t, p, c, cpu = case
    plan_digest(_trace(t), p, c, cpu, oled_background_copies=2)
    assert plans and any(pl.streamed for pl in plans)
    for pl in plans:
        slots = pl.copy_arrays()[1]
        assert pl.streamed or np.unique(slots).size == slots.size
