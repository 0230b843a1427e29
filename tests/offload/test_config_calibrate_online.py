"""OffloadConfig(calibrate_online=True): the live run's dispatcher calibrates itself (issue 36.3)."""

import pytest
import torch
from oled_hf.modeling import OledLLaDA2ForDiffusionLM

from oled_hf import OffloadConfig

PROMPT = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
LIVE = dict(cache_size=4, system="oled", cpu_compute="on", h2d_bandwidth_gbps=1e-3)


def test_calibrate_online_turns_the_dispatch_knob_on_and_keeps_tokens(tiny_path, tiny_model):
    want = tiny_model.generate(PROMPT, max_new_tokens=16, block_length=8)
    model = OledLLaDA2ForDiffusionLM.from_pretrained(
        tiny_path, offload_config=OffloadConfig(**LIVE, calibrate_online=True)).eval()
    assert model._offload_runtime.controller.system.knobs["dispatch.calibrate"] == 1
    assert torch.equal(model.generate(PROMPT, max_new_tokens=16, block_length=8), want)
    stats = model.offload_stats()
    assert set(stats["calibration"]) == {"copy", "cpu_fixed", "cpu_token"}
    assert model._offload_runtime.controller.dispatcher.calibrator.cpu_samples > 0


def test_calibrate_online_is_off_by_default_and_validated():
    assert "dispatch.calibrate" not in OffloadConfig(cache_size=4).resolved_system().knobs
    # a copy dispatch reads no cost: nothing to calibrate, no knob
    assert "dispatch.calibrate" not in OffloadConfig(cache_size=4, calibrate_online=True,
                                                     cpu_compute="off").resolved_system().knobs
    with pytest.raises(ValueError, match=r"^calibrate_online=1 is invalid: must be True or False$"):
        OffloadConfig(cache_size=4, calibrate_online=1)
