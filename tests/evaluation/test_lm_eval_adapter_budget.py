"""lm-eval's ``--model_args`` budget for ``oled_llada2``: ``cache_ratio=auto``, ``max_gpu_memory=SIZE`` and
``gpu_memory_utilization=F`` (vLLM's meaning) read by the one reader (``options/budget.py``), errors naming
the field as typed, and ``auto`` refused before loading where there is no CUDA device (issue 37 item 1)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from oled_hf.evaluation.lm_eval_adapter import OledLLaDA2LM
from tests.offload.test_budget import ONE, TINY
from tests.options.test_budget import fake_cuda  # noqa: F401  (the mocked device: 20 MiB free of 100)

MIB = 2**20


@pytest.fixture
def loads(monkeypatch) -> list[dict]:
    seen = []

    def from_pretrained(path, **kwargs):
        seen.append(kwargs)
        raise ValueError("loaded")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", from_pretrained)
    return seen


@pytest.mark.usefixtures("fake_cuda")
def test_model_args_size_the_cache_from_the_mocked_device(tiny_path, loads):
    """``gpu_memory_utilization=F`` alone means ``cache_ratio=auto`` with F (it used to ask for a budget);
    ``auto`` reserves KV for ``batch_size`` sequences of ``max_length`` tokens."""
    for model_args in ({"cache_ratio": "auto"}, {"gpu_memory_utilization": 0.85}, {"max_gpu_memory": "1MiB"},
                       {"cache_ratio": "auto", "batch_size": 2}):
        with pytest.raises(ValueError, match="^loaded$"):
            OledLLaDA2LM(pretrained=str(tiny_path), device="cuda", max_length=100, **model_args)
    auto, utilization, memory, batch = (kwargs["offload_config"] for kwargs in loads)
    assert all(kwargs["device_map"] == "cuda" for kwargs in loads)
    assert (auto.cache_ratio, auto.gpu_memory_utilization, auto.auto_context_length) == ("auto", 0.9, 100)
    assert auto.resolve_device_slots(TINY, 4, "cuda") == 94
    assert (utilization.cache_ratio, utilization.gpu_memory_utilization) == ("auto", 0.85)
    assert utilization.resolve_device_slots(TINY, 4, "cuda") == 40
    assert memory.resolve_device_slots(TINY, 4, "cuda") == MIB // ONE == 10
    assert batch.auto_batch_size == 2 and batch.resolve_device_slots(TINY, 4, "cuda") == 81


def test_resolve_offload_keeps_what_was_given():
    from oled_hf.evaluation.lm_eval_adapter import resolve_offload

    assert resolve_offload({}, "cpu", 1, None) == {}
    assert resolve_offload({"cache_size": 2, "policy": "lru"}, "cpu", 4, None) == {"cache_size": 2, "policy": "lru"}
    # a byte budget works on any device (as serve's --max-gpu-memory)
    assert resolve_offload({"max_gpu_memory": "1MiB"}, "cpu", 1, None) == {"max_gpu_memory": "1MiB"}


@pytest.mark.parametrize("model_args, message", [
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization=1.5 is invalid: must be more than 0 and at most 1"),
    ({"gpu_memory_utilization": "lots"}, "gpu_memory_utilization=lots is invalid: must be more than 0 and at most 1"),
    ({"gpu_memory_utilization": 0.5, "cache_size": 4},
     "gpu_memory_utilization=0.5 sizes the expert cache from the device (as cache_ratio=auto does), so it cannot be "
     "combined with cache_size: give one of them"),
    ({"cache_ratio": 0.5, "max_gpu_memory": "1GiB"},
     "give one of cache_size, cache_ratio or max_gpu_memory, not cache_ratio and max_gpu_memory"),
    ({"cache_ratio": 0}, "cache_ratio=0 is invalid: must be more than 0 and at most 1, or auto"),
    ({"cache_size": 0}, "cache_size=0 is invalid: must be at least 1 expert slot per MoE layer"),
    ({"max_gpu_memory": "lots"}, "max_gpu_memory='lots' is invalid"),
    ({"cache_ratio": "auto", "auto_batch_size": 0}, "auto_batch_size=0 is invalid: must be at least 1"),
    ({"policy": "lru"}, "need a budget"),
])
@pytest.mark.usefixtures("fake_cuda")
def test_bad_model_args_budgets_name_the_field(model_args, message, tiny_path, monkeypatch):
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("nothing may load"))
    with pytest.raises(ValueError) as err:
        OledLLaDA2LM(pretrained=str(tiny_path), device="cuda", **model_args)
    assert message in str(err.value) and "\n" not in str(err.value), err.value


def test_auto_without_cuda_is_refused_before_loading(tiny_path, monkeypatch):
    """lm-eval's CLI asks for cuda by default: the adapter falls back to the CPU, where ``auto`` cannot size."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("nothing may load"))
    for model_args in ({"cache_ratio": "auto"}, {"gpu_memory_utilization": 0.5}):
        for device in ("cuda", "cpu", None):
            with pytest.raises(ValueError, match=r"^cache_ratio='auto' needs a CUDA device .* on cpu"):
                OledLLaDA2LM(pretrained=str(tiny_path), device=device, **model_args)
