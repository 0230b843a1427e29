"""Block-start memory: armed by an iteration that leaves nothing masked, spares the last block start's experts,
disarmed by the next block's first access."""

import numpy as np
import pytest
import torch
from oled_hf.modeling.events import IterationEvent

from oled_hf.offload.policies.phase import KEEP_FIRST, PhasePolicy, StartMemory


def _event(masked, committed):
    m, c = torch.tensor([masked]), torch.tensor([committed])
    return IterationEvent(0, 0, m, torch.ones(m.shape), c, torch.zeros(m.shape, dtype=torch.long))


def _access(policy, layer, experts, clock):
    counts = np.bincount(np.asarray(experts), minlength=policy.num_experts)
    policy.observe_access(layer, np.asarray(experts).reshape(-1, 1), None, clock, counts)


def test_the_block_start_set_is_kept_across_the_boundary_only():
    p = PhasePolicy(1, 8)
    p.on_block_start(0, None)
    _access(p, 0, [0, 1], 1)  # block 0's first access: experts 0 and 1
    _access(p, 0, [2, 3], 2)
    assert p.priority_array(0).max() < KEEP_FIRST  # mid-block: plain LRU
    p.on_iteration(_event([True, False], [False, False]))  # one position still masked: not armed
    assert p.priority_array(0).max() < KEEP_FIRST
    p.on_iteration(_event([True, False], [True, False]))  # the last masked position commits
    _access(p, 0, [2, 3], 3)  # the KV refresh
    prio = p.priority_array(0)
    assert set(np.flatnonzero(prio >= KEEP_FIRST)) == {0, 1}  # block start's experts outrank recent 2, 3
    p.on_block_start(1, None)
    _access(p, 0, [4, 5], 4)  # block 1's first access disarms
    assert p.priority_array(0).max() < KEEP_FIRST
    assert p.memory.start[0].tolist() == [0.25, 0.25, 0, 0, 0.5, 0.5, 0, 0]  # decay 0.5 over two starts


def test_start_decay_is_checked():
    with pytest.raises(ValueError, match=r"start_decay=1.0 must be in \[0, 1\)"):
        StartMemory(1, 4, 1.0)
