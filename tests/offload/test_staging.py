"""The pinned staging ring: a buffer is written again only once the copy that read it has completed."""

import pytest
import torch

from oled_hf.offload.staging import PinnedRing
from tests.offload.cuda_fake import FakeCuda, FakeEvent


def _stage_five(cuda, ring):
    """Stage five tensors through a two-buffer ring, a copy and an event after each; check each rewrite."""
    stream = cuda.stream(True)
    for i in range(5):
        previous = ring.events[ring.next]  # the event of the copy that last read the buffer about to be written
        with cuda.use(stream):
            staged = ring.stage(torch.full((4,), float(i)))
            assert cuda.is_pinned(staged) and torch.equal(staged, torch.full((4,), float(i)))
            cuda.kernel([])  # the copy from it, on the copy stream
            event = cuda.event()
            event.record(stream)
        assert previous is None or previous.query(), f"buffer rewritten at stage {i} before its copy completed"
        ring.release(event)


def test_the_ring_waits_for_a_buffers_last_copy_before_rewriting_it():
    cuda, syncs = FakeCuda(), []
    ring = PinnedRing(cuda, 2, lambda: syncs.append(1))
    _stage_five(cuda, ring)
    assert ring.waits == len(syncs) == 3  # stages 3, 4, 5 reuse a buffer whose copy the device had not finished


def test_without_the_wait_the_host_overwrites_a_buffer_the_copy_still_reads(monkeypatch):
    cuda = FakeCuda()
    ring = PinnedRing(cuda, 2, lambda: None)
    monkeypatch.setattr(FakeEvent, "synchronize", lambda self: None)
    with pytest.raises(AssertionError, match="rewritten at stage 2 before its copy completed"):
        _stage_five(cuda, ring)


def test_a_wave_longer_than_the_ring_releases_what_it_staged_before_reusing_a_buffer():
    cuda = FakeCuda()
    ring = PinnedRing(cuda, 3, lambda: None)
    stream = cuda.stream(True)
    with cuda.use(stream):
        for i in range(7):  # one wave: no event of its own until it ends
            ring.stage(torch.full((2,), float(i)))
            cuda.kernel([])
    assert ring.waits == 2 and [op[0] for op in cuda.log].count("record") == 2  # at stages 4 and 7
