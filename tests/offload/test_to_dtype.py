"""An offloaded model refuses .to/.half/.float that would change its dtype or device, and keeps working."""

import pytest
import torch
from oled_hf.modeling import OledLLaDA2ForDiffusionLM

from oled_hf import OffloadConfig

FIXED = r"an offloaded model's dtype and device are fixed at load: this call would turn its {} weights on cpu into {}"


def _ids():
    return torch.randint(0, 500, (1, 20), generator=torch.Generator().manual_seed(5))


def _generate(model):
    return model.generate(_ids(), max_new_tokens=16, block_length=8)


@pytest.fixture(scope="module")
def offloaded(tiny_path):
    return OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, offload_config=OffloadConfig(cache_size=4)).eval()


@pytest.mark.parametrize("name, call, target", [
    ("half", lambda m: m.half(), "torch.float16 on cpu"),
    ("to bfloat16", lambda m: m.to(torch.bfloat16), "torch.bfloat16 on cpu"),
    ("to dtype=float16", lambda m: m.to(dtype=torch.float16), "torch.float16 on cpu"),
    ("to meta", lambda m: m.to("meta"), "torch.float32 on meta"),
])
def test_a_change_is_refused_and_the_model_keeps_working(offloaded, tiny_model, name, call, target):
    expected = _generate(tiny_model)
    with pytest.raises(ValueError, match=FIXED.format("torch.float32", target)) as err:
        call(offloaded)
    if "meta" in name:
        assert "the meta device holds no weights to run" in str(err.value)
    else:
        dtype = target.split()[0]
        assert f"from_pretrained(path, dtype={dtype}, device_map='cpu', offload_config=...)" in str(err.value)
    assert {p.dtype for p in offloaded.parameters()} == {torch.float32}
    assert {p.device.type for p in offloaded.parameters()} == {"cpu"}
    assert torch.equal(_generate(offloaded), expected), name


@pytest.mark.parametrize("call", [lambda m: m.float(), lambda m: m.to("cpu"), lambda m: m.to(torch.float32),
                                  lambda m: m.to(m.device, m.dtype), lambda m: m.cpu()])
def test_a_call_that_changes_nothing_runs(offloaded, tiny_model, call):
    assert call(offloaded) is offloaded
    assert torch.equal(_generate(offloaded), _generate(tiny_model))


def test_a_bfloat16_offloaded_model_refuses_float(tiny_path):
    model = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, dtype=torch.bfloat16,
                                                     offload_config=OffloadConfig(cache_size=4)).eval()
    before = _generate(model)
    with pytest.raises(ValueError, match=FIXED.format("torch.bfloat16", "torch.float32 on cpu")):
        model.float()
    assert torch.equal(_generate(model), before)


def test_a_resident_model_still_converts(tiny_path):
    model = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path).eval()
    assert model.half().dtype == torch.float16
