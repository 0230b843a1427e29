"""Every field of a synthetic-workload parameter file is checked before use; sizes before allocating (issue 35)."""

import json
import math

import pytest

from oled_hf.sim.synth_check import check_memory, memory_bytes, uniform_rows
from oled_hf.sim.synthetic import SynthParams, TraceShape, generate
from tests.sim.test_synthetic_fit import truth


def _with(**change) -> str:
    data = json.loads(truth().to_json())
    data.update(change)
    return json.dumps(data)


@pytest.mark.parametrize("change, says", [
    ({"top_k": "8"}, "top_k='8': must be an integer, not str"),
    ({"threshold": math.nan}, "threshold=nan: allowed a finite number greater than 0 and at most 1"),
    ({"carry": {}}, "carry: missing states ['decoded', 'committed'"),
    ({"num_experts": True}, "num_experts=True: must be an integer, not bool"),
    ({"hazard": -1.5}, "hazard=-1.5: allowed a finite number from 0 to 1"),
    ({"num_experts": 1e12}, "num_experts=1000000000000.0: must be an integer, not float"),
    ({"num_experts": 10 ** 12}, "num_experts=1000000000000: allowed 1 to 65536"),
    ({"block_length": 10 ** 7}, "block_length=10000000: allowed 1 to 4096"),
    ({"top_k": 0}, "top_k=0: allowed 1 to 64"),
    ({"top_k": 65}, "top_k=65: allowed 1 to 64"),
    ({"popularity_scale": [0.8]}, "popularity_scale: 1 values; allowed: exactly num_layers=2"),
    ({"block_carry": [0.6, "x"]}, "block_carry[1]='x': must be a number, not str"),
    ({"mask_scale": [0.1, math.inf]}, "mask_scale[1]=inf: allowed a finite number from 0 to 100"),
    ({"carry": {"decoded": [1.0, 1.0]}}, "carry: missing states ['committed'"),
    ({"sure_alpha": 0}, "sure_alpha=0: allowed a finite number greater than 0"),
    ({"popularity_seed": -1}, "popularity_seed=-1: allowed 0 to"),
    ({"dtype_bytes": 3}, "dtype_bytes=3: allowed 1, 2, 4 or 8"),
    ({"source": 5}, "source=5: must be a string"),
])
def test_each_bad_field_is_named_with_its_value_and_what_is_allowed(change, says):
    with pytest.raises(ValueError) as exc:
        SynthParams.from_json(_with(**change))
    assert says in str(exc.value)


def test_carry_with_an_unknown_state_and_files_that_are_not_objects():
    carry = json.loads(truth().to_json())["carry"] | {"sleepy": [0.5, 0.5]}
    with pytest.raises(ValueError, match=r"unknown states \['sleepy'\]"):
        SynthParams.from_json(_with(carry=carry))
    with pytest.raises(ValueError, match="a JSON object is needed, not list"):
        SynthParams.from_json("[]")
    with pytest.raises(ValueError, match=r"missing keys \['carry'\]"):
        SynthParams.from_json(json.dumps({k: v for k, v in json.loads(truth().to_json()).items() if k != "carry"}))
    with pytest.raises(ValueError, match="not JSON"):
        SynthParams.from_json("{")


def test_a_good_file_round_trips_and_a_bad_file_names_its_path(tmp_path):
    p = truth()
    p.save(str(tmp_path / "p.json"))
    assert SynthParams.load(str(tmp_path / "p.json")) == p
    (tmp_path / "bad.json").write_text(_with(hazard=-1.5))
    with pytest.raises(ValueError, match=r"bad\.json: hazard=-1\.5"):
        SynthParams.load(str(tmp_path / "bad.json"))


def test_generate_checks_params_built_in_python_too():
    p = truth()
    p.hazard = -1.5
    with pytest.raises(ValueError, match="hazard=-1.5"):
        generate(p, TraceShape.uniform(1, 1, p.block_length))


def test_generate_refuses_a_trace_over_the_memory_budget_before_allocating():
    """1024 layers x 65536 experts x 4096 rows would need ~1.7e4 GiB of working arrays alone: refused at once."""
    p = truth()
    L = 1024
    p.num_layers, p.num_experts, p.block_length = L, 65536, 4096
    for key in ("popularity_scale", "block_scale", "block_carry", "predict_carry", "mask_scale"):
        setattr(p, key, [0.5] * L)
    p.carry = {s: [0.9] * L for s in p.carry}
    with pytest.raises(ValueError, match=r"GiB .*allowed at most 4 GiB \(--max-memory\)"):
        generate(p, TraceShape.uniform(1, 1, 4096))


def test_memory_estimate_bounds_what_a_trace_holds():
    """The estimate is an upper bound of the trace's own arrays (the routing part, held twice while saving)."""
    p = truth()
    t = generate(p, TraceShape.uniform(3, 2, p.block_length), seed=1)
    held = sum(a.nbytes for a in t.arrays.values())
    rows, widest, events = uniform_rows(3, 2, p.block_length, 1, p.block_length, p.block_length, 1)
    need = memory_bytes(p.num_layers, p.num_experts, p.top_k, rows, widest, events)
    assert held <= need
    check_memory(need, 1.0, "small")
    with pytest.raises(ValueError, match="small: an estimated"):
        check_memory(need, need / 2 ** 31, "small")
