"""Issue 24's cost model: CPU overhead once per batch, host DRAM shared with DMA, belief vs truth."""

import numpy as np
import pytest

from oled_hf.offload import calibration
from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.dispatch import Dispatcher
from oled_hf.sim.timeline import Timeline

CM = CostModel.h200_pcie5(2048, 512)


def test_calibrated_cpu_call_cost_is_charged_once_per_batch(tiny_path, monkeypatch):
    """The measured grouped CPU call (fixed c, per expert F, per token S) is reproduced by one batch."""
    from oled_hf.modeling import OledLLaDA2ForDiffusionLM

    from oled_hf import OffloadConfig

    rt = OledLLaDA2ForDiffusionLM.from_pretrained(
        tiny_path, offload_config=OffloadConfig(cache_size=8, calibrate=False))._offload_runtime

    def g(call, expert, token, e, n):
        return call + e * (expert + n * token)

    dev, cpu = (30e-6, 5e-6, 0.2e-6), (40e-6, 20e-6, 3e-6)
    measured = iter([tuple(g(*p, e, n) for e, n in ((1, 1), (8, 1), (8, 16))) + (8,) for p in (dev, cpu)])
    monkeypatch.setattr(calibration, "_grouped_times", lambda *args: next(measured))
    cm = calibration.calibrate(rt.store, rt.cache, rt.cost_model)
    assert cm.cpu_overhead_s == pytest.approx(40e-6)
    for e, n in ((8, 1), (8, 16), (2, 16)):  # any batch size: the call's cost once
        assert cm.cpu_batch_time([n] * e) == pytest.approx(g(*cpu, e, n))


def test_host_dram_is_shared_by_dma_and_cpu_reads():
    """DMA keeps its PCIe rate; CPU weight reads get min(cpu_gbps, dram - h2d) while copies run."""
    cm = CM.with_overrides(host_dram_gbps=120)  # 120 - 50 = 70 GB/s left for the CPU (alone: 100)
    assert cm.cpu_shared_fixed_s == pytest.approx(cm.expert_bytes / 70e9)
    alone, shared = cm.cpu_batch_time([1, 1]), cm.cpu_batch_time([1, 1], shared=True)
    assert alone == pytest.approx(20e-6 + 2 * cm.expert_bytes / 100e9)
    assert shared == pytest.approx(20e-6 + 2 * cm.expert_bytes / 70e9)
    assert CM.cpu_shared_fixed_s == CM.cpu_expert_fixed_s  # the preset: 200 - 50 >= 100, no contention
    # compute-bound experts are not slowed (their read rate is below what is left)
    assert cm.cpu_batch_time([64], shared=True) == cm.cpu_batch_time([64])
    with pytest.raises(ValueError, match="host_dram_bytes_per_s=40000000000.0 is invalid: must exceed h2d_bytes_per_s"):
        CM.with_overrides(host_dram_gbps=40)


def test_timeline_slows_only_the_overlap_with_the_copy_engine():
    tl = Timeline(copy_s=100e-6)
    tl.copies(1, 0.0)  # copy engine busy until 100 us
    # alone 200 us, shared 400 us (half speed): 100 us overlap does 50 us of work, 150 us remain
    assert tl.cpu_batch_end(0.0, 200e-6, 400e-6) == pytest.approx(250e-6)
    assert tl.cpu_batch_end(100e-6, 200e-6, 400e-6) == pytest.approx(300e-6)  # no overlap
    assert tl.cpu_batch_end(0.0, 40e-6, 80e-6) == pytest.approx(80e-6)  # all within the overlap


def test_demand_copies_overtake_queued_prefetches():
    tl = Timeline(copy_s=10.0, demand_first=True)
    tl.copies(1, 0.0)  # a demand copy: 0..10
    pf = tl.copies(2, 1.0, low=True, keys=[(1, 7), (1, 8)])  # prefetches 10..20, 20..30
    assert pf.tolist() == [20.0, 30.0]
    lands = tl.copies(1, 5.0)  # demand at t=5: the prefetches have not started, it goes first
    assert lands.tolist() == [20.0] and tl.moved == {(1, 7): 30.0, (1, 8): 40.0} and tl.copy_free == 40.0
    fifo = Timeline(copy_s=10.0)
    fifo.copies(1, 0.0)
    fifo.copies(2, 1.0, low=True)
    assert fifo.copies(1, 5.0).tolist() == [40.0]  # without demand_first: behind them


def test_believed_cost_model_scales_only_what_it_names():
    b = CM.believed(cpu_scale=2.0, pcie_scale=0.5)
    assert b.cpu_batch_time([1, 3]) == pytest.approx(CM.cpu_batch_time([1, 3]) / 2)
    assert b.copy_time() == pytest.approx(2 * CM.copy_time()) and b.gpu_time(4) == CM.gpu_time(4)
    assert CM.believed() is CM
    with pytest.raises(ValueError, match="cpu_scale=0 is invalid"):
        CM.believed(cpu_scale=0)
    # believing the CPU 4x faster than it is sends more misses to the CPU
    tokens = np.array([1, 2, 3, 4, 1, 2])
    truth = Dispatcher(CM, "on").decide(tokens, np.zeros(6), None, 6, np.array([]))
    fast = Dispatcher(CM.believed(cpu_scale=4.0), "on").decide(tokens, np.zeros(6), None, 6, np.array([]))
    assert fast.sum() <= truth.sum()
