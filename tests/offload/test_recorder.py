"""A recorder's trace file: refused at load if it cannot be written, never worth a generate's tokens (issue 35.4)."""

from __future__ import annotations

import errno
import warnings

import pytest
import torch
from oled_hf.modeling import OledLLaDA2ForDiffusionLM

from oled_hf.offload import OffloadConfig
from oled_hf.offload import trace as trace_module
from oled_hf.offload.recorder import TraceNotSaved, TraceRecorder
from oled_hf.offload.trace import load_trace
from tests.read_only import read_only

PROMPT = torch.tensor([[1, 2, 3, 4, 5]])


def _offloaded(path, **kwargs):
    return OledLLaDA2ForDiffusionLM.from_pretrained(path, offload_config=OffloadConfig(**kwargs)).eval()


def _generate(model):
    return model.generate(PROMPT, max_new_tokens=16, block_length=8)


def test_record_trace_refuses_a_read_only_folder_at_load(tiny_path, tmp_path):
    """Before: accepted at load; the first generate decoded, then raised OSError and lost its tokens."""
    target = tmp_path / "ro" / "t.trace"
    with read_only(target.parent):
        with pytest.raises(ValueError) as err:
            _offloaded(tiny_path, cache_size=4, record_trace=str(target))
    assert str(err.value).startswith(f"record_trace={str(target)!r}: its folder {str(target.parent)!r} is not "
                                     "writable (")
    assert "\n" not in str(err.value) and list(target.parent.iterdir()) == []


def _full_disk(monkeypatch):
    """``torch.save`` inside Trace.save writes a few bytes, then the disk is full."""
    def save(obj, f, *args, **kwargs):
        if hasattr(f, "write"):
            f.write(b"PK\x03\x04 half a trace")
        else:
            with open(f, "wb") as fh:
                fh.write(b"PK\x03\x04 half a trace")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(trace_module.torch, "save", save)


def test_a_failed_trace_save_returns_the_tokens_with_a_warning(tiny_path, tmp_path, monkeypatch):
    """Before: generate raised OSError after decoding and left a partial file."""
    reference = _generate(_offloaded(tiny_path, cache_size=4))
    target = tmp_path / "t.trace"
    model = _offloaded(tiny_path, cache_size=4, record_trace=str(target))
    with monkeypatch.context() as patch:
        _full_disk(patch)
        with pytest.warns(TraceNotSaved) as caught:
            out = _generate(model)
    assert torch.equal(out, reference)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert message.startswith(f"record_trace={str(target)!r}: the trace was not saved ([Errno 28] could not write "
                              f"{target}: No space left on device; nothing was written there)")
    assert "\n" not in message
    assert list(tmp_path.iterdir()) == []  # no partial file, no temporary file
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the disk has room again: the next generate writes the whole trace
        assert torch.equal(_generate(model), reference)
    trace = load_trace(target)
    assert sorted(set(trace.arrays["fwd_seq"].tolist())) == [0, 1]  # both generates' routing, none lost
    assert [p.name for p in tmp_path.iterdir()] == ["t.trace"]


def test_an_explicit_save_replaces_a_link_never_its_target(tiny_model, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / "link.trace"
    link.symlink_to(victim)
    recorder = TraceRecorder(tiny_model)
    try:
        tiny_model.generate(PROMPT, max_new_tokens=8, block_length=8)
        recorder.save(link)
    finally:
        recorder.detach()
    assert victim.read_text() == "precious"
    assert not link.is_symlink() and load_trace(link).num_forwards > 0


def test_a_zero_block_length_in_the_generation_config_is_refused_not_replaced(tiny_model, monkeypatch):
    monkeypatch.setattr(tiny_model.generation_config, "block_length", 0)
    with pytest.raises(ValueError, match=r"generation_config.block_length=0 is invalid: must be an integer >= 1"):
        TraceRecorder(tiny_model)
