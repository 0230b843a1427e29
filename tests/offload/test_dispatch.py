"""Dispatcher (copy vs CPU) and the cost model it uses."""

import numpy as np
import pytest

from oled_hf.offload.config import OffloadConfig
from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.dispatch import Dispatcher

CM = CostModel.h200_pcie5(2048, 512)


def test_h200_preset_is_plausible():
    assert CM.expert_bytes == 3 * 2048 * 512 * 2
    assert 100e-6 < CM.copy_time() < 150e-6  # 6.3 MB over ~50 GB/s
    assert 5e-6 < CM.gpu_time(1) < 20e-6 and CM.gpu_time(32) < 2 * CM.gpu_time(1)
    assert CM.cpu_time(1) == pytest.approx(CM.cpu_time(2))  # memory-bound for few tokens
    assert CM.cpu_time(64) > 2 * CM.cpu_time(1)  # compute-bound beyond
    assert CM.gpu_time(0) == CM.cpu_time(0) == 0.0


def test_overrides():
    cm = CM.with_overrides(h2d_gbps=25, cpu_gbps=50, gpu_s_per_token=1e-6, cpu_overhead_us=None)
    assert cm.copy_time() == pytest.approx(2 * CM.copy_time())
    assert cm.cpu_expert_fixed_s == pytest.approx(2 * CM.cpu_expert_fixed_s)
    assert cm.gpu_s_per_token == 1e-6 and cm.cpu_overhead_s == CM.cpu_overhead_s
    with pytest.raises(ValueError, match="unknown cost-model override 'warp'"):
        CM.with_overrides(warp=9)
    with pytest.raises(ValueError, match="CostModel.h2d_bytes_per_s=0"):
        CM.with_overrides(h2d_bytes_per_s=0.0)
    cfg = OffloadConfig(cache_size=4, h2d_bandwidth_gbps=10.0, cpu_expert_ms_per_token=0.5)
    applied = CM.with_config(cfg)
    assert applied.h2d_bytes_per_s == 10e9 and applied.cpu_s_per_token == pytest.approx(5e-4)


def test_gpu_path_overlaps_copies():
    hits, copies = np.array([4, 4]), np.array([1, 1, 1])
    t = CM.gpu_path_time(hits, copies)
    assert t >= 3 * CM.copy_time() and t >= CM.gpu_times(np.r_[hits, copies]).sum()
    assert t < 3 * CM.copy_time() + CM.gpu_times(np.r_[hits, copies]).sum()  # hits overlap the copies
    assert CM.access_time(hits, copies, np.array([2])) == max(t, CM.cpu_time(2))


def test_off_copies_everything_and_non_admitted_go_to_cpu():
    tokens = np.array([1, 5, 30])
    assert Dispatcher(None, "off").decide(tokens, np.zeros(3), None, 3, np.array([])).all()
    d = Dispatcher(CM, "auto")
    mask = d.decide(tokens, np.full(3, 32.0), np.array([True, False, True]), 3, np.array([]))
    assert not mask[1]
    assert not d.decide(tokens, np.full(3, 32.0), np.zeros(3, bool), 3, np.array([])).any()
    with pytest.raises(ValueError, match="cpu_compute='maybe' is unknown"):
        Dispatcher(CM, "maybe")


def test_reuse_decides_copy_vs_cpu():
    d = Dispatcher(CM, "auto")
    one = np.array([1])
    assert not d.decide(one, np.array([0.0]), None, 4, np.array([]))[0]  # 1 token, no reuse: CPU is cheaper
    assert d.decide(one, np.array([20.0]), None, 4, np.array([]))[0]  # will be reused: cache it
    assert not d.decide(one, np.array([20.0]), None, 0, np.array([]))[0]  # no room: it would not stay


def test_balances_and_prefers_high_reuse():
    d = Dispatcher(CM, "auto")
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 6, size=40)
    reuse = rng.random(40) * 4
    mask = d.decide(tokens, reuse, None, 40, np.array([3] * 20))
    assert 0 < mask.sum() < 40
    assert reuse[mask].mean() > reuse[~mask].mean()
    assert (mask == d.decide(tokens.copy(), reuse.copy(), None, 40, np.array([3] * 20))).all()
    cpu_left = CM.cpu_times(tokens[~mask]).sum()
    gpu_all_cpu = CM.cpu_times(tokens).sum()
    assert cpu_left < gpu_all_cpu


def test_resolve_cpu_compute_by_device():
    from oled_hf.offload.dispatch import resolve_cpu_compute

    assert [resolve_cpu_compute(m, accelerator=True) for m in ("auto", "on", "off")] == ["on", "on", "off"]
    assert [resolve_cpu_compute(m, accelerator=False) for m in ("auto", "on", "off")] == ["off", "on", "off"]
    with pytest.raises(ValueError, match="cpu_compute='gpu' is unknown; allowed: auto, on, off"):
        resolve_cpu_compute("gpu", accelerator=False)


def _best_prefix_by_batch_time(cm, tokens, reuse, room, g0):
    """The documented rule by brute force: every prefix of the ranking, CPU side as one batch."""
    cpu = cm.cpu_times(tokens)
    gpu = cm.gpu_times(tokens)
    r1 = 1.0 + np.maximum(reuse, 0.0)
    order = np.argsort(-(cpu * r1 / (gpu + cm.copy_time())), kind="stable")
    spans = []
    for j in range(len(tokens) + 1):
        amort = [cm.copy_time() / r1[i] if k < room else cm.copy_time() for k, i in enumerate(order[:j])]
        g = g0 + float(np.sum(gpu[order[:j]])) + float(np.sum(amort))
        spans.append(max(g, cm.cpu_batch_time(tokens[order[j:]])))
    return spans


def test_cpu_overhead_is_charged_once_per_batch():
    """One grouped CPU call per layer access: 20 us once, however many experts it computes."""
    assert CM.cpu_batch_time([1, 1, 1]) == pytest.approx(CM.cpu_overhead_s + 3 * CM.cpu_time(1))
    assert CM.cpu_batch_time([]) == 0.0 and CM.cpu_time(1) == CM.cpu_expert_fixed_s
    # the per-expert charge would make eight 1-token misses cost 8 x 83 us on the CPU and copy some;
    # one batch costs 20 + 8 x 63 us: the split is the brute-force optimum of the batch model
    cm = CM.with_overrides(cpu_overhead_us=100)
    rng = np.random.default_rng(3)
    for _ in range(200):
        m = int(rng.integers(1, 9))
        tokens = rng.integers(1, 12, size=m)
        reuse = rng.choice([0.0, 0.5, 2.0], size=m)
        room, g0 = int(rng.integers(0, m + 1)), float(rng.choice([0.0, 2e-4]))
        mask = Dispatcher(cm, "on").decide(tokens, reuse, None, room, np.ones(3) if g0 else np.array([]))
        spans = _best_prefix_by_batch_time(cm, tokens, reuse, room, Dispatcher(cm, "on").cost_model.gpu_expert_fixed_s
                                           * (3 if g0 else 0) + cm.gpu_s_per_token * (3 if g0 else 0))
        j = int(mask.sum())
        assert spans[j] == pytest.approx(min(spans)), (tokens, reuse, room)


def test_shared_dram_knob_charges_cpu_experts_at_the_rate_dma_leaves():
    """Dispatch knob ``shared_dram``: with host DRAM at 100 GB/s and DMA taking 50, a read-bound CPU
    expert runs at half its rate; the dispatcher that knows it copies more misses (8 one-token misses:
    4 copies instead of 2). Off (every preset) it keeps the unshared rate; at 200 GB/s nothing changes."""
    from oled_hf.offload.system import build_dispatcher, parse_system

    cm = CM.with_overrides(host_dram_gbps=100)
    plain = build_dispatcher(parse_system("lru+cpu"), cm)
    shared = build_dispatcher(parse_system("lru+cpu").with_knobs(dispatch__shared_dram=True), cm)
    assert plain.kernel_costs()[2] == cm.cpu_expert_fixed_s
    assert shared.kernel_costs()[2] == pytest.approx(2 * cm.cpu_expert_fixed_s)
    tokens, reuse = np.ones(8, dtype=np.int64), np.zeros(8)
    assert plain.decide(tokens, reuse, None, 8, np.array([])).sum() == 2
    assert shared.decide(tokens, reuse, None, 8, np.array([])).sum() == 4
    roomy = build_dispatcher(parse_system("lru+cpu").with_knobs(dispatch__shared_dram=True), CM)
    assert roomy.kernel_costs()[2] == CM.cpu_expert_fixed_s  # 200 - 50 >= 100 GB/s: no sharing
    with pytest.raises(ValueError, match="dispatch knob shared_dram='yes' is invalid"):
        build_dispatcher(parse_system("lru+cpu").with_knobs(dispatch__shared_dram="yes"), CM)


class _Fixed:
    """A retention part with fixed priorities (for the admission rule alone)."""

    def __new__(cls, prio):
        from oled_hf.offload.policies.base import CachePolicy

        class Fixed(CachePolicy):
            name = "fixed"

            def priority_array(self, layer):
                return prio

        return Fixed(1, len(prio))


def _plan_with(admission, cpu="on"):
    """One layer of 4 experts and 2 slots holding experts 0 (priority 5) and 1 (priority 4); then an access
    requesting 2 (priority 1) and 3 (priority 9), with a CPU so slow that the split copies both."""
    from oled_hf.offload.planner import CacheState

    prio = np.array([5.0, 4.0, 1.0, 9.0])
    policy, state = _Fixed(prio), CacheState(1, 4, [2])
    slow_cpu = CM.with_overrides(cpu_s_per_token=1.0)
    fill = Dispatcher(None, "off")
    state.plan(0, np.array([[0], [1]]), None, policy, fill, np.array([1, 1, 0, 0]))
    d = Dispatcher(slow_cpu, cpu, admission=admission)
    return state.plan(0, np.array([[2], [3]]), None, policy, d, np.array([0, 0, 4, 4]))


def test_admission_by_priority_keeps_a_resident_that_outranks_the_miss():
    """``admission=priority``: expert 3 outranks the lowest resident (1) and takes its slot; expert 2 does not
    outrank the next (0), so it runs on the CPU and 0 stays. ``all`` copies both, evicting both."""
    plan = _plan_with("priority")
    assert plan.copies == [(3, plan.copies[0][1], 1)] and plan.cpu == [2]
    plan = _plan_with("all")
    assert sorted(c[0] for c in plan.copies) == [2, 3] and plan.cpu == []
    plan = _plan_with("priority", cpu="off")  # every miss must be copied: the rule does nothing
    assert sorted(c[0] for c in plan.copies) == [2, 3] and plan.cpu == []


def test_admission_knob_is_checked_in_one_line():
    with pytest.raises(ValueError, match=r"^admission='sometimes' is unknown; allowed: all, priority$"):
        Dispatcher(CM, "on", admission="sometimes")
    from oled_hf.offload.system import build_dispatcher, parse_system

    system = parse_system("lru+cpu+reuse+adaptive").with_knobs(dispatch__admission="never")
    with pytest.raises(ValueError, match=r"^dispatch knob admission='never' is unknown; allowed: all, priority$"):
        build_dispatcher(system, CM)
    assert build_dispatcher(system.with_knobs(dispatch__admission="priority"), CM).admission == "priority"
