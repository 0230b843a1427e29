"""Online calibration on the live path (issue 36.3): the dispatch knobs, the CPU and copy hooks, lossless."""

import pytest

from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.online_calibration import CalibrationSettings
from oled_hf.offload.system import build_dispatcher, parse_system

CM = CostModel.h200_pcie5(2048, 512)
OLED = parse_system("oled")


def test_build_dispatcher_enables_calibration_from_the_knobs():
    d = build_dispatcher(OLED.with_knobs(dispatch__calibrate=1, dispatch__calibrate_every=4), CM)
    assert d.calibrator is not None and d.calibrator.settings == CalibrationSettings(every=4)
    assert d.calibrator.base is CM and d.shared_dram  # the preset's other knobs still apply
    assert build_dispatcher(OLED, CM).calibrator is None  # off by default
    assert build_dispatcher(OLED.with_knobs(dispatch__calibrate=0), CM).calibrator is None
    # a copy dispatch reads no cost: the knob is accepted (validated) and calibrates nothing
    assert build_dispatcher(parse_system("lru").with_knobs(dispatch__calibrate=1), CM).calibrator is None


@pytest.mark.parametrize("knobs,match", [
    ({"dispatch.calibrate": 2}, r"^dispatch knob calibrate=2 is invalid: must be true or false \(0 or 1\)$"),
    ({"dispatch.calibrate": 1, "dispatch.calibrate_every": 0},
     r"^calibration every=0 is invalid: must be an integer >= 1$"),
    ({"dispatch.calibrate_forget": 0.9}, r"^dispatch knob\(s\) calibrate_forget need dispatch.calibrate=1$"),
    ({"dispatch.calibrate_evry": 3}, r"^unknown dispatch knob\(s\): calibrate_evry; known: reuse_copies, .*"
                                     r"calibrate, calibrate_every, calibrate_min_samples"),
])
@pytest.mark.parametrize("system", ["oled", "lru"])
def test_bad_calibration_knobs_are_refused_in_one_line(knobs, match, system):
    with pytest.raises(ValueError, match=match) as err:
        build_dispatcher(parse_system(system).with_knobs(**knobs), CM)
    assert "\n" not in str(err.value)
