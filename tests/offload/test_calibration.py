"""calibrate() times the kernels the executor runs and derives fields the cost model charges back."""

import dataclasses
import math

import pytest
from oled_hf.modeling import OledLLaDA2ForDiffusionLM
from oled_hf.modeling.experts import grouped_supported

from oled_hf import OffloadConfig
from oled_hf.offload import calibration
from oled_hf.offload.costmodel import CostModel

RUNS = 1 + 3 * 3  # calls per timed shape: a warm-up, then 3 batches of 3


def _runtime(path, **kwargs):
    config = OffloadConfig(cache_size=8, **kwargs)
    return OledLLaDA2ForDiffusionLM.from_pretrained(path, offload_config=config)._offload_runtime


def _counting(monkeypatch, name):
    calls = [0]
    fn = getattr(calibration, name)

    def counted(*args, **kwargs):
        calls[0] += 1
        return fn(*args, **kwargs)

    monkeypatch.setattr(calibration, name, counted)
    return calls


def _assert_valid(cm: CostModel):
    for f in dataclasses.fields(cm):
        value = getattr(cm, f.name)
        assert math.isfinite(value) and value >= 0, (f.name, value)


@pytest.mark.parametrize("store", ["pinned", "mmap"])
def test_calibrate_measures_the_grouped_kernels_for_both_stores(tiny_path, monkeypatch, store):
    rt = _runtime(tiny_path, store=store)  # calibrated at load (the default)
    _assert_valid(rt.cost_model)
    grouped, loop = _counting(monkeypatch, "grouped_swiglu"), _counting(monkeypatch, "swiglu_expert")
    base = CostModel.h200_pcie5(rt.store.hidden, rt.store.inter, 4)
    cm = calibration.calibrate(rt.store, rt.cache, base)
    _assert_valid(cm)
    assert cm.expert_bytes == base.expert_bytes and cm.gpu_launch_s == base.gpu_launch_s
    if grouped_supported("cpu", rt.store.dtype):
        # the device (here the CPU) runs grouped calls over the pool; CPU misses grouped over the
        # pinned layer buffer, but per expert over mmap views (the executor's loop there)
        assert grouped[0] == (6 if store == "pinned" else 3) * RUNS
        assert loop[0] == (0 if store == "pinned" else 2) * RUNS
    assert rt.cache.bytes_copied == 0 and rt.cache.copy_seconds == 0


def test_without_grouped_gemm_calibrate_times_the_loop(tiny_path, monkeypatch):
    rt = _runtime(tiny_path, calibrate=False)
    monkeypatch.setattr(calibration, "grouped_supported", lambda device_type, dtype: False)
    loop = _counting(monkeypatch, "swiglu_expert")
    cm = calibration.calibrate(rt.store, rt.cache, rt.cost_model)
    _assert_valid(cm)
    assert loop[0] == 4 * RUNS and cm.gpu_layer_fixed_s == 0 and cm.cpu_overhead_s == 0 and cm.kernel == "loop"


def test_fields_reproduce_the_measurements_through_the_cost_model(tiny_path, monkeypatch):
    """Given times of a known shape, the derived fields give those times back (CostModel's formulas)."""
    rt = _runtime(tiny_path, calibrate=False)

    def g(call, expert, token, e, n):
        return call + e * (expert + n * token)

    dev, cpu = (30e-6, 5e-6, 0.2e-6), (40e-6, 20e-6, 3e-6)  # (per call, per expert, per token)
    measured = iter([tuple(g(*p, e, n) for e, n in ((1, 1), (8, 1), (8, 16))) + (8,) for p in (dev, cpu)])
    monkeypatch.setattr(calibration, "_grouped_times", lambda *args: next(measured))
    cm = calibration.calibrate(rt.store, rt.cache, rt.cost_model)
    assert cm.kernel == "grouped"
    for e, n in ((1, 1), (8, 1), (8, 16)):
        assert cm.gpu_path_time([n] * e, []) == pytest.approx(g(*dev, e, n))
    for n in (1, 16):  # the per-call cost is charged once per batch: the 8-expert calls are reproduced
        assert cm.cpu_batch_time([n] * 8) == pytest.approx(g(*cpu, 8, n))
