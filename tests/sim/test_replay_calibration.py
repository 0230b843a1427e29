"""Replay with online calibration (dispatch knob calibrate=1): noisy true times, seeded; fairness; errors."""

import pytest

from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.system import parse_system
from oled_hf.sim.replay import replay, split_calibration
from oled_hf.sim.synthetic import synthetic_trace

CM = CostModel.h200_pcie5(2048, 512)
OLED = parse_system("oled")
CAL = OLED.with_knobs(dispatch__calibrate=1, dispatch__calibrate_every=4)


@pytest.fixture(scope="module")
def trace():
    return synthetic_trace(num_layers=3, num_experts=32, top_k=4, block_length=8, num_blocks=3, batch=2,
                           num_sequences=3, seed=1)


def run(trace, system, believed=None, **kw):
    return replay(trace, "oled", 6, system=system, cost_model=CM, planner_s=20e-6, believed=believed,
                  warmup_sequences=1, **kw)


def test_exact_belief_with_calibration_is_within_one_percent(trace):
    plain, cal = run(trace, OLED), run(trace, CAL)
    assert cal.tpot_s == pytest.approx(plain.tpot_s, rel=0.01)
    assert all(v == pytest.approx(1.0, rel=0.02) for v in cal.calibration.values())
    assert plain.calibration == {}


@pytest.mark.parametrize("cpu_scale,pcie_scale", [(2.0, 1.0), (0.5, 1.0), (1.0, 2.0), (1.0, 0.5)])
def test_a_2x_wrong_belief_calibrated_is_within_5_percent_of_the_true_one(trace, cpu_scale, pcie_scale):
    true = run(trace, OLED).tpot_s
    bel = CM.believed(cpu_scale, pcie_scale)
    wrong, cal = run(trace, OLED, bel), run(trace, CAL, bel)
    assert cal.tpot_s <= 1.05 * true
    assert cal.tpot_s < wrong.tpot_s  # this trace: every such belief costs the uncalibrated run > 5 %
    learned = cal.calibration
    assert learned["cpu_fixed"] == pytest.approx(cpu_scale, rel=0.05)
    assert learned["copy"] == pytest.approx(pcie_scale, rel=0.05)


def test_deterministic_given_the_seed(trace):
    bel = CM.believed(2.0, 1.0)
    a, b = run(trace, CAL, bel, measure_seed=3), run(trace, CAL, bel, measure_seed=3)
    assert a.to_dict() == b.to_dict()
    assert run(trace, CAL, bel, measure_seed=4).calibration != a.calibration
    # without calibration the noise is never drawn: the seed changes nothing
    assert run(trace, OLED, bel, measure_seed=4).to_dict() == run(trace, OLED, bel).to_dict()


def test_copy_dispatch_is_not_calibrated(trace):
    r = replay(trace, "lru", 6, system=parse_system("lru").with_knobs(dispatch__calibrate=1), cost_model=CM,
               planner_s=20e-6)
    assert r.calibration == {}


def test_split_calibration_strips_the_knobs():
    sys_, settings = split_calibration(CAL.with_knobs(dispatch__reuse_copies=4))
    assert settings is not None and settings.every == 4
    assert sys_.knobs == {**OLED.knobs, "dispatch.reuse_copies": 4}
    assert split_calibration(OLED) == (OLED, None)


@pytest.mark.parametrize("kw,match", [
    ({"measure_sigma": -0.1}, r"measure_sigma=-0.1 is invalid: must be a number in \[0, 2\]"),
    ({"measure_sigma": float("nan")}, "measure_sigma=nan is invalid"),
    ({"measure_seed": -1}, "measure_seed=-1 is invalid: must be an integer >= 0"),
    ({"measure_seed": 1.5}, "measure_seed=1.5 is invalid"),
])
def test_bad_measurement_settings_are_refused(trace, kw, match):
    with pytest.raises(ValueError, match=match):
        run(trace, CAL, **kw)


def test_bad_calibration_knob_is_refused(trace):
    with pytest.raises(ValueError, match="dispatch knob calibrate=2 is invalid"):
        run(trace, OLED.with_knobs(dispatch__calibrate=2))
    with pytest.raises(ValueError, match="calibration every=0 is invalid"):
        run(trace, CAL.with_knobs(dispatch__calibrate_every=0))
