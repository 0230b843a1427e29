"""Online calibration: convergence from a 2x wrong belief, robustness, publication cadence, knob errors."""

import math

import numpy as np
import pytest

from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.dispatch import Dispatcher
from oled_hf.offload.online_calibration import CalibrationSettings, OnlineCalibrator, settings_from_knobs

TRUE = CostModel.h200_pcie5(2048, 512)


def _feed(cal: OnlineCalibrator, truth: CostModel, n: int, sigma: float, seed: int) -> None:
    """``n`` accesses of synthetic measurements: batches mixing read-bound (1-9 tokens) and compute-bound
    (11-40) experts, each time the true one times lognormal noise."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        k = int(rng.integers(1, 9))
        tokens = np.where(rng.random(k) < 0.5, rng.integers(1, 10, k), rng.integers(11, 41, k))
        cal.observe_copy(truth.copy_time() * math.exp(sigma * rng.standard_normal()))
        cal.observe_cpu(tokens, truth.cpu_batch_time(tokens) * math.exp(sigma * rng.standard_normal()))
        cal.tick()


@pytest.mark.parametrize("cpu_scale,pcie_scale", [(2.0, 0.5), (0.5, 2.0)])
def test_converges_from_a_2x_wrong_belief_to_within_5_percent(cpu_scale, pcie_scale):
    cal = OnlineCalibrator(TRUE.believed(cpu_scale, pcie_scale))
    _feed(cal, TRUE, 300, sigma=0.1, seed=3)
    got = cal.publish()
    for name in ("h2d_bytes_per_s", "cpu_overhead_s", "cpu_expert_fixed_s", "cpu_s_per_token"):
        assert getattr(got, name) == pytest.approx(getattr(TRUE, name), rel=0.05), name
    # the fields calibration does not touch stay the belief's
    assert got.gpu_expert_fixed_s == TRUE.gpu_expert_fixed_s and got.expert_bytes == TRUE.expert_bytes


def test_fixed_and_per_token_terms_are_fitted_separately():
    # only the per-token slope is wrong (believed 2x fast): the fixed terms must stay put, up to the
    # bias of the experts between the believed knee (20 tokens) and the true one (10), charged to the
    # fixed term (the classes are the starting belief's)
    bel = CostModel(**{**vars(TRUE), "cpu_s_per_token": TRUE.cpu_s_per_token / 2})
    cal = OnlineCalibrator(bel)
    _feed(cal, TRUE, 300, sigma=0.05, seed=4)
    sc = cal.scales
    assert sc["cpu_token"] == pytest.approx(2.0, rel=0.05)
    assert sc["cpu_fixed"] == pytest.approx(1.0, rel=0.10)
    assert sc["copy"] == pytest.approx(1.0, rel=0.05)


def test_an_outlier_moves_the_belief_at_most_the_clip():
    s = CalibrationSettings(min_samples=1, clip=0.5)
    cal = OnlineCalibrator(TRUE, s)
    _feed(cal, TRUE, 50, sigma=0.0, seed=5)
    before = cal.scales
    cal.observe_copy(100 * TRUE.copy_time())  # a stall
    cal.observe_cpu(np.array([3, 20]), 100 * TRUE.cpu_batch_time([3, 20]))
    after = cal.scales
    step = max(1 / 51, 1 - s.forget)  # the 51st sample
    assert after["copy"] / before["copy"] <= math.exp(0.5 * step) + 1e-12
    assert max(after["cpu_fixed"], after["cpu_token"]) < 1.5
    # garbage measurements carry nothing
    cal.observe_copy(float("nan"))
    cal.observe_cpu(np.array([3]), -1.0)
    assert cal.scales == after


def test_min_samples_and_publication_every_k_accesses():
    cal = OnlineCalibrator(TRUE.believed(2.0, 1.0), CalibrationSettings(every=4, min_samples=6))
    bel = cal.belief
    _feed(cal, TRUE, 3, sigma=0.0, seed=6)
    assert cal.belief is bel  # not yet published
    _feed(cal, TRUE, 1, sigma=0.0, seed=7)
    assert cal.belief is not bel and cal.belief.cpu_expert_fixed_s == bel.cpu_expert_fixed_s  # < min_samples
    _feed(cal, TRUE, 4, sigma=0.0, seed=8)
    assert cal.belief.cpu_expert_fixed_s > 1.2 * bel.cpu_expert_fixed_s


def test_deterministic_for_a_sequence_of_measurements():
    a, b = OnlineCalibrator(TRUE.believed(0.5, 2.0)), OnlineCalibrator(TRUE.believed(0.5, 2.0))
    _feed(a, TRUE, 100, sigma=0.2, seed=9)
    _feed(b, TRUE, 100, sigma=0.2, seed=9)
    assert a.scales == b.scales and a.publish() == b.publish()


def test_dispatcher_decides_from_the_calibrated_belief():
    d = Dispatcher.for_mode("cpu+reuse", TRUE.believed(2.0, 1.0))
    d.observe(1e-4, np.array([2]), 1e-4)  # no calibrator: nothing happens
    assert d.calibrator is None and d.cost_model.cpu_expert_fixed_s < TRUE.cpu_expert_fixed_s
    d.enable_calibration(CalibrationSettings(every=1000))
    costs0 = d.kernel_costs().copy()
    rng = np.random.default_rng(1)
    for _ in range(50):
        t = rng.integers(1, 30, 4)
        d.observe(TRUE.copy_time(), t, TRUE.cpu_batch_time(t))
    assert np.array_equal(d.kernel_costs(), costs0)  # not rebuilt before `every` accesses
    d.end_block()
    assert d.kernel_costs()[2] == pytest.approx(TRUE.cpu_expert_fixed_s, rel=0.05)


@pytest.mark.parametrize("knobs,match", [
    ({"calibrate": 2}, "calibrate=2 is invalid: must be true or false"),
    ({"calibrate": "yes"}, "calibrate='yes' is invalid"),
    ({"calibrate": 1, "calibrate_every": 0}, "every=0 is invalid: must be an integer >= 1"),
    ({"calibrate": 1, "calibrate_forget": 1.0}, r"forget=1.0 is invalid: must be a number in \[0.5, 1\)"),
    ({"calibrate": 1, "calibrate_clip": -1}, "clip=-1 is invalid"),
    ({"calibrate": 1, "calibrate_evry": 3}, "unknown dispatch knob.*calibrate_evry"),
    ({"calibrate_every": 4}, "need dispatch.calibrate=1"),
])
def test_bad_knobs_are_refused_with_the_field_named(knobs, match):
    with pytest.raises(ValueError, match=match):
        settings_from_knobs(knobs)


def test_knobs_build_settings():
    assert settings_from_knobs({}) is None and settings_from_knobs({"calibrate": False}) is None
    s = settings_from_knobs({"calibrate": True, "calibrate_every": 4, "calibrate_min_samples": 2})
    assert s == CalibrationSettings(every=4, min_samples=2)
