"""concat_traces / take_sequences: every access kept in order, boundaries right, mismatched shapes refused."""

import numpy as np
import pytest

from oled_hf.sim.concat import Segment, concat_traces, sequence_runs, take_sequences
from oled_hf.sim.replay import replay
from oled_hf.sim.synthetic import synthetic_trace


def small(seed: int, seqs: int = 2, **kw):
    return synthetic_trace(num_layers=2, num_experts=8, top_k=2, block_length=4, num_blocks=2,
                           num_sequences=seqs, seed=seed, **kw)




def test_concat_keeps_every_access_in_order_and_marks_the_segments():
    a, b, c = small(0, 2), small(1, 3), small(2, 1)
    joined, segs = concat_traces([a, b, c])
    assert segs == [Segment(0, 0, 2), Segment(a.num_forwards, 2, 3), Segment(a.num_forwards + b.num_forwards, 5, 1)]
    assert joined.num_forwards == a.num_forwards + b.num_forwards + c.num_forwards
    routes = [joined.routing(i)[0].tolist() for i in range(joined.num_forwards)]
    assert routes == [t.routing(i)[0].tolist() for t in (a, b, c) for i in range(t.num_forwards)]
    assert [joined.event(i).committed.tolist() for i in range(joined.num_events)] == \
        [t.event(i).committed.tolist() for t in (a, b, c) for i in range(t.num_events)]
    assert [op for op, _ in joined.ops()] == [op for t in (a, b, c) for op, _ in t.ops()]
    assert sequence_runs(joined.arrays["fwd_seq"]).max() == 5
    assert joined.arrays["fwd_seq"][segs[1].start_forward] == 2
    assert joined.output_tokens() == a.output_tokens() + b.output_tokens() + c.output_tokens()
    assert joined.has_predictions


def test_a_part_without_predictions_predicts_nothing():
    joined, _ = concat_traces([small(0, 1), small(1, 1, predict_keep=None)])
    first = small(0, 1).num_forwards
    assert joined.has_predictions
    assert (joined.predicted_routing(first)[0] == -1).all()


def test_take_sequences_cuts_at_the_next_sequence_and_replays_as_a_prefix():
    a, b = small(0, 2), small(1, 2)
    joined, segs = concat_traces([a, b])
    head = take_sequences(joined, 2)
    assert head.num_forwards == a.num_forwards and head.num_events == a.num_events
    assert [op for op, _ in head.ops()] == [op for op, _ in a.ops()]
    assert take_sequences(joined, 4).num_forwards == joined.num_forwards
    # replay of the head = replay of the first segment alone (same accesses, same state)
    r1 = replay(head, "lru", 3, planner_s=20e-6, system="lru+cpu+reuse+adaptive")
    r2 = replay(a, "lru", 3, planner_s=20e-6, system="lru+cpu+reuse+adaptive")
    assert (r1.hits, r1.misses, r1.sim_time_s) == (r2.hits, r2.misses, r2.sim_time_s)
    with pytest.raises(ValueError, match=r"take_sequences: n=5 is invalid: must be an integer in \[1, 4\]"):
        take_sequences(joined, 5)


def test_segment_times_add_up_to_the_run():
    joined, segs = concat_traces([small(0, 2), small(1, 2)])
    kw = dict(planner_s=20e-6, system="oled")
    whole = replay(joined, "oled", 3, **kw).sim_time_s
    first = replay(take_sequences(joined, 2), "oled", 3, **kw).sim_time_s
    second = replay(joined, "oled", 3, warmup_sequences=segs[1].start_sequence, **kw).sim_time_s
    assert first + second == pytest.approx(whole, rel=1e-9)


@pytest.mark.parametrize("kw, field", [(dict(num_experts=16), "num_experts=16"),
                                       (dict(num_layers=3), "num_moe_layers=3"), (dict(top_k=3), "top_k=3")])
def test_mismatched_shapes_are_refused_naming_the_field(kw, field):
    base = dict(num_layers=2, num_experts=8, top_k=2, block_length=4, num_blocks=1, num_sequences=1)
    other = synthetic_trace(**{**base, **kw}, seed=1)
    with pytest.raises(ValueError, match=rf"trace 1 has {field}, trace 0 has .*: only traces with the same "
                                         r"num_moe_layers, num_experts, top_k can be concatenated"):
        concat_traces([synthetic_trace(**base), other])


def test_nothing_to_concatenate_is_refused():
    with pytest.raises(ValueError, match="concat_traces needs at least one trace"):
        concat_traces([])
    assert np.array_equal(concat_traces([small(0)])[0].arrays["topk_ids"], small(0).arrays["topk_ids"])
