"""Next-set predictors and the pure-caching ladder (oled_hf/sim/predictors.py) on a hand-built trace.

Two MoE layers, 6 experts, top-2, blocks of 2 rows. Timeline: block 0 (denoise it0, event; denoise
it1, event; refresh), block 1 (denoise it0, event). Every expected number below is worked out by
hand in the comments.

    layer 0: S0={0,1,2,3}  S1={0,1,4}  S2={0,1,2,4}  S3={2,3,5}
    layer 1: S0={0,1,2}    S1={0,1,3}  S2={0,1,3}    S3={0,4,5}
    event 0: row 0 masked conf 0.5 (bin 0.40-0.60), row 1 committed
    event 1: row 0 committed, row 1 decoded; event 3: row 0 committed, row 1 masked (conf 0.3)
    token ids after each event: [0, 7], [9, 7], [7, 0]
"""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from oled_hf.modeling.events import IterationEvent

from oled_hf.offload.trace import TraceWriter
from oled_hf.sim import predictors as P
from oled_hf.sim.replay import replay

ROOT = Path(__file__).resolve().parents[2]
ROUTES = {  # forward -> per layer [row0, row1]
    0: ([[0, 1], [2, 3]], [[0, 1], [0, 2]]),
    1: ([[0, 1], [4, 1]], [[0, 1], [0, 3]]),
    2: ([[0, 1], [4, 2]], [[0, 1], [0, 3]]),
    3: ([[3, 5], [2, 5]], [[4, 5], [4, 0]]),
}


def _event(block, it, masked, conf, committed, tokens):
    t = lambda x, d: torch.tensor([x], dtype=d)  # noqa: E731
    return IterationEvent(block, it, t(masked, torch.bool), t(conf, torch.float32), t(committed, torch.bool),
                          t(tokens, torch.long), t([False, False], torch.bool))


def _forward(w, kind, block, it, i):
    ids = [np.asarray(r) for r in ROUTES[i]]
    w.add_forward(kind, block, it, ids, [np.full((2, 2), 0.5, np.float32)] * 2)


@pytest.fixture(scope="module")
def trace():
    w = TraceWriter(2, 6, 2, 2, hidden_size=8, moe_intermediate_size=8)
    w.on_block_start(0, torch.zeros(1, 2, dtype=torch.long))
    _forward(w, "denoise", 0, 0, 0)
    w.on_iteration(_event(0, 0, [True, True], [0.5, 0.97], [False, True], [0, 7]))
    _forward(w, "denoise", 0, 1, 1)
    w.on_iteration(_event(0, 1, [True, False], [0.92, 1.0], [True, False], [9, 7]))
    _forward(w, "refresh", 0, 2, 2)
    w.on_block_end(0, torch.zeros(1, 2, dtype=torch.long))
    w.on_block_start(1, torch.zeros(1, 2, dtype=torch.long))
    _forward(w, "denoise", 1, 0, 3)
    w.on_iteration(_event(1, 0, [True, True], [0.1, 0.3], [True, False], [7, 0]))
    return w.trace()


@pytest.fixture(scope="module")
def acc(trace):
    return P.accesses(trace)


def test_accesses_positions_and_classes(acc):
    assert [P.POSITIONS[p] for p in acc.position] == ["first", "last", "refresh", "first"]
    masked_40 = P.MASKED + 2  # bin 0.40-0.60
    assert acc.row_class[0].tolist() == [masked_40, P.COMMITTED]
    assert acc.row_class[1].tolist() == [P.COMMITTED, P.DECODED]
    assert acc.row_class[2] is None  # a refresh has no event
    assert acc.row_class[3].tolist() == [P.COMMITTED, P.MASKED + 1]
    assert acc.row_token[1].tolist() == [9, 7]
    assert [sorted(np.flatnonzero(s).tolist()) for s in acc.sets[0]] == [[0, 1, 2, 3], [0, 1, 4], [0, 1, 2, 4],
                                                                          [2, 3, 5]]


def test_previous_set_precision_recall_by_position(acc):
    q = P.score_predictor("previous", acc.sets, acc)
    # tp 2+3+1 (layer 0) + 2+3+1 (layer 1); predicted 4+3+4 + 3+3+3; true 3+4+3 + 3+3+3
    assert q.precision() == 12 / 20 and q.recall() == 12 / 19
    assert q.precision(layer=0) == 6 / 11 and q.recall(layer=1) == 6 / 9
    first, last, refresh = (P.POSITIONS.index(p) for p in ("first", "last", "refresh"))
    assert (q.precision(position=last), q.recall(position=last)) == (4 / 7, 4 / 6)
    assert (q.precision(position=refresh), q.recall(position=refresh)) == (1.0, 6 / 7)
    assert (q.precision(position=first), q.recall(position=first)) == (2 / 7, 2 / 6)
    assert q.returns_recall() == 0.0  # returns are, by definition, outside S_t
    assert np.isnan(q.precision(position=P.POSITIONS.index("middle")))


def test_persisting_drops_committed_rows(acc):
    q = P.score_predictor("b", P.persisting_sets(acc), acc)
    # t0 keeps row 0 ({0,1} in both layers), t1 keeps row 1 ({1,4} / {0,3}), t2 (refresh) falls back to S2
    assert q.pred.sum() == 2 + 2 + 2 + 2 + 4 + 3 and q.tp.sum() == 2 + 2 + 2 + 2 + 1 + 1
    assert q.precision() == 10 / 15 and q.recall() == 10 / 19


def test_periodic_predicts_a_block_start_by_the_previous_block_start(acc):
    q = P.score_predictor("f", P.periodic_sets(acc), acc)
    # t2 -> t3 (block 1, it0) predicted by S0: layer 0 {0,1,2,3} & {2,3,5} = 2, layer 1 {0,1,2} & {0,4,5} = 1
    assert (q.tp.sum(), q.pred.sum()) == (13, 20)


def test_token_memory_adds_what_a_committed_token_routed_to_before(acc):
    mem = P.token_memory_sets(acc)
    # t3: row 0 commits token 7, which row 1 routed as a decoded row at t1 (layer 0 {4,1}, layer 1 {0,3});
    # row 1 stays masked and keeps its own routes (layer 0 {2,5}, layer 1 {4,0})
    assert np.flatnonzero(mem[0, 3]).tolist() == [1, 2, 4, 5] and np.flatnonzero(mem[1, 3]).tolist() == [0, 3, 4]
    assert (mem[:, :3] == P.persisting_sets(acc)[:, :3]).all()  # no committed token seen decoded before t3


def test_phase_predicts_a_block_start_from_earlier_starts(acc):
    score = P.phase_scores(acc)
    assert (score[:, 2] == acc.sets[:, 0]).all()  # made at the refresh, for block 1's first iteration
    assert not score[:, [0, 1, 3]].any()
    assert (P.phase_sets(acc)[:, 2] == acc.sets[:, 0]).all() and (P.phase_sets(acc)[:, 1] == acc.sets[:, 1]).all()


def test_return_ages(acc):
    ages = P.return_ages(acc)
    assert P.age_labels() == ["1", "2-3", "4-7", "8-15", "16-63", ">=64", "never"]
    last, refresh, first = (P.POSITIONS.index(p) for p in ("last", "refresh", "first"))
    assert ages[last].tolist() == [0, 0, 0, 0, 0, 0, 2]  # expert 4 (layer 0) and 3 (layer 1): first use
    assert ages[refresh].tolist() == [1, 0, 0, 0, 0, 0, 0]  # layer 0's expert 2, last used by t0 = t-1
    assert ages[first].tolist() == [0, 1, 0, 0, 0, 0, 3]  # layer 0's 3 (used at t0, age 2); 5, 4, 5 new
    assert ages.sum() == int((acc.sets[:, 1:] & ~acc.sets[:, :-1]).sum())


def test_lru_top_c(acc):
    lru = np.stack([P.lru_priorities(acc.counts[layer]) for layer in range(2)])
    q = P.score_predictor("lru top-3", P.top_c(lru, 3), acc)
    # layer 0: {0,1,2} (ties by id), {0,1,4}, {0,1,2}: tp 2, 3, 1; layer 1: {0,1,2}, {0,1,3}, {0,1,3}: 2, 3, 1
    assert (q.tp.sum(), q.pred.sum(), q.true.sum()) == (12, 18, 19)


def test_persistence_table_and_weighted_scores(acc):
    tab = P.persistence_table(acc)
    c, d, m40 = P.COMMITTED, P.DECODED, P.MASKED + 2
    # pair 0: layer 0 row 0 keeps 2/2 (masked), row 1 keeps 0/2 (committed); layer 1 1.0 and 0.5
    # pair 1 (into the refresh): layer 0 row 0 1.0 (committed), row 1 0.5 (decoded); layer 1 1.0 and 1.0
    assert tab.kept[0, [c, d, m40]].tolist() == [1.0, 0.5, 1.0] and tab.rows[0, [c, d, m40]].tolist() == [2, 1, 1]
    assert tab.kept[1, [c, d, m40]].tolist() == [1.5, 1.0, 1.0]
    assert tab.set_kept.tolist() == [1, 1] and tab.set_used.tolist() == [4, 3]  # refresh -> next block
    rate = tab.rate(min_rows=1)
    assert rate[1, c] == 0.75 and rate[0, d] == 0.5
    hand = P.PersistenceTable(tab.labels, np.zeros_like(tab.kept), np.zeros_like(tab.rows), np.array([2.0, 2.0]),
                              np.array([5.0, 5.0]))
    hand.kept[:, [c, m40]], hand.rows[:, [c, m40]] = [25.0, 80.0], 100.0
    w = P.weighted_scores(acc, hand)
    # layer 1, t0: expert 0 has a masked (0.8) and a committed (0.25) route: 1 - 0.2 * 0.75
    assert w[1, 0, [0, 1, 2]] == pytest.approx([0.85, 0.8, 0.25])
    assert w[0, 2, [0, 3]] == pytest.approx([0.4, 0.0])  # refresh: the set-level rate 2/5 for S2's experts


def test_demand_cache_ladder_hand_values(trace, acc):
    rows = {r.name: r for r in P.cache_ladder(trace, [3], acc=acc, horizons=(1,))}
    # layer 0 LRU: t0 streams 0,1,2 then 3 evicts 0; t1 hits {1}; t2 hits {0,1,4}, 2 streams over 0; t3 hits {2}
    # layer 1 LRU: 0, 2, 3, 1.  The next-oracle keeps 0 at t0 (used at t1): layer 0 gets 0, 2, 3, 1
    expect = {"MIN": 12, "MIN+bypass": 12, "next-oracle": 12, "previous set": 11, "lru": 11, "lfu": 11,
              "persisting (b) + lru": 12, "periodic (f) + lru": 11, "phase starts (g) + lru": 11,
              "token memory (h) + lru": 12, "(g) + (h) + lru": 12}
    assert {k: rows[k].hits for k in expect} == expect
    assert rows["lru"].per_layer_hits == [5, 6] and rows["lru"].requests == 26
    assert rows["next-oracle"].per_layer_hits == [6, 6]
    first = P.POSITIONS.index("first")
    assert rows["lru"].per_position_hits[first] == 0 + 1 + 0 + 1  # t0 and t3, both layers
    assert rows["lru"].per_position_requests[first] == 4 + 3 + 3 + 3
    assert rows["lru"].return_hits_by_age == [0] * 7  # every return (4, 2, 3, 5 / 3, 4, 5) was evicted or new


def test_combined_priorities_rank_signals_below_recency():
    lru = np.array([[1.25, 1.25, 2.1]])
    zero = np.zeros((1, 3))
    got = P.combined_priorities(lru, np.array([[1.0, 0.0, 0.0]]), zero, zero, np.array([[0.0, 1.0, 0.0]]))
    assert got.tolist() == [[1.25 + 0.45 / 4, 1.25 + 0.45 / 4, 2.1]]  # ties broken, never above expert 2
    mem = np.array([[False, True, False]])
    assert P.combined_priorities(lru, zero, zero, mem, zero)[0, 1] == P.BIG + 1.25 + 0.45 / 4
    with pytest.raises(ValueError, match=r"tie=0.5 must be in \[0, 0.5\)"):
        P.combined_priorities(lru, zero, zero, zero, zero, tie=0.5)


@pytest.mark.parametrize("policy", ["lru", "lfu", "oled"])
def test_simulators_match_replay_with_cpu_off(trace, acc, policy):
    if policy == "oled":
        prio = P.oled_priorities(trace)
    else:
        fn = P.lru_priorities if policy == "lru" else P.lfu_priorities
        prio = np.stack([fn(acc.counts[layer]) for layer in range(2)])
    for c in (2, 3, 4):
        mine = sum(int(P.demand_cache(acc.sets[layer], prio[layer], c).sum()) for layer in range(2))
        assert mine == replay(trace, policy, c, layer_adaptive=False, cpu_compute="off", planner_s=0.0).hits


def test_demand_cache_rejects_a_bad_capacity(acc):
    with pytest.raises(ValueError, match=r"capacity=0 must be in \[1, num_experts=6\]"):
        P.demand_cache(acc.sets[0], np.zeros((4, 6)), 0)


def _script():
    spec = importlib.util.spec_from_file_location("predictor_quality", ROOT / "eval" / "predictor_quality.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_script_prints_plots_and_refuses_to_overwrite(trace, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "t.trace"
    trace.save(str(path))
    out = tmp_path / "q.png"
    script = _script()
    assert script.main(["--dev", str(path), str(path), "--capacity", "3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "next-oracle" in text and "previous (a)" in text and "persistence" in text
    assert out.stat().st_size > 10_000
    before = out.read_bytes()
    assert script.main(["--dev", str(path), str(path), "--capacity", "3", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"predictor_quality.py: error: --out {out} exists; pass --overwrite to replace it"
    assert out.read_bytes() == before
    assert script.main(["--dev", str(path), str(path), "--capacity", "3", "--out", str(out), "--overwrite"]) == 0
    js = tmp_path / "q.json"
    js.write_text("mine")
    capsys.readouterr()
    assert script.main(["--dev", str(path), "--capacity", "3", "--json", str(js)]) == 2
    assert "--json" in capsys.readouterr().err and js.read_text() == "mine"


def test_script_rejects_bad_arguments_before_work(trace, tmp_path, capsys):
    script = _script()
    path = tmp_path / "t.trace"
    trace.save(str(path))
    assert script.main(["--dev", str(tmp_path / "missing.trace"), str(path)]) == 2
    assert "--dev" in capsys.readouterr().err
    assert script.main(["--dev", str(path), str(path), "--capacity", "7"]) == 2
    assert "--capacity 7" in capsys.readouterr().err
