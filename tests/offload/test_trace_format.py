"""Every field of a trace file is checked before any reader uses it (issue 35 item 3).

Each case writes a small valid trace, corrupts one field of the file and loads it: the loader
(shared by replay, synth --fit/--like, the report and the figures) raises one ValueError naming the
file, the field, the value and what is allowed, before any reader allocates or indexes with it.
"""

from __future__ import annotations

import errno
import math
import resource

import numpy as np
import pytest
import torch

from oled_hf.cli.main import main
from oled_hf.offload.trace import Trace, load_trace
from oled_hf.offload.trace_format import READER_BYTES_LIMIT, reader_bytes
from oled_hf.sim.synthetic import synthetic_trace


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    """A version-2 trace (predictions included): 2 MoE layers x 8 experts, top-2, blocks of 4, batch 2."""
    path = tmp_path_factory.mktemp("trace") / "ok.trace"
    synthetic_trace(num_layers=2, num_experts=8, top_k=2, block_length=4, num_blocks=2, batch=2,
                    num_sequences=2, seed=3).save(str(path))
    return path


def corrupted(valid, tmp_path, edit) -> str:
    data = torch.load(valid, weights_only=True)
    edit(data)
    path = tmp_path / "bad.trace"
    torch.save(data, path)
    return str(path)


def _set(name, index, value):
    def edit(data):
        data[name][index] = value
    return edit


def _header(name, value):
    def edit(data):
        data["header"][name] = value
    return edit


def _drop(name, header=False):
    def edit(data):
        del (data["header"] if header else data)[name]
    return edit


def _replace(name, make):
    def edit(data):
        data[name] = make(data[name])
    return edit


CASES = {
    # the cases
    "num_experts 1e12 (int)": (_header("num_experts", 10 ** 12),
                               "trace header num_experts=1000000000000 is invalid: must be an integer in [1, "
                               "2147483647]"),
    "num_experts 1e12 (float)": (_header("num_experts", 1e12),
                                 "trace header num_experts=1000000000000.0 is invalid: must be an integer in"),
    "num_experts 1e6 (memory)": (_header("num_experts", 10 ** 6),
                                 "trace header num_moe_layers=2, num_experts=1000000, block_length=4: readers "
                                 "would allocate about 35.8 GiB"),
    "expert id 999": (_set("topk_ids", (1, 5, 0), 999),
                      "trace field topk_ids[1, 5, 0]=999 is out of range: must be in [0, 7]"),
    "negative expert id": (_set("topk_ids", (0, 0, 1), -3),
                           "trace field topk_ids[0, 0, 1]=-3 is out of range: must be in [0, 7]"),
    "NaN gate weight": (_set("topk_weights", (0, 2, 1), math.nan),
                        "trace field topk_weights[0, 2, 1]=nan is invalid: must be a finite number >= 0.0"),
    "negative gate weight": (_set("topk_weights", (0, 2, 1), -1.0),
                             "trace field topk_weights[0, 2, 1]=-1.0 is out of range: must be >= 0.0"),
    "negative ev_offsets": (_set("ev_offsets", 1, -5), "trace field ev_offsets[1]=-5 is below ev_offsets[0]=0"),
    "fwd_kind 9": (_set("fwd_kind", 3, 9), "trace field fwd_kind[3]=9 is out of range: must be in [0, 2]"),
    "block_length 0": (_header("block_length", 0), "trace header block_length=0 is invalid: must be an integer >= 1"),
    "op_index out of range": (_set("op_index", 0, 10 ** 6),
                              "trace field op_index=1000000 is out of range for op 0: must be in [0, "),
    "fwd_rows[-1] 1e9": (_set("fwd_rows", -1, 10 ** 9),
                         "trace field fwd_rows[38]=1000000000 is invalid: offsets run from 0 to the length of "
                         "'topk_ids' (320)"),
    # types, dtypes and missing keys
    "top_k a string": (_header("top_k", "2"), "trace header top_k='2' is invalid: must be an integer in [1, "
                                              "num_experts=8]"),
    "num_moe_layers a bool": (_header("num_moe_layers", True), "trace header num_moe_layers=True is invalid"),
    "top_k over num_experts": (_header("top_k", 9), "trace header top_k=9 is invalid"),
    "dtype_bytes 3": (_header("dtype_bytes", 3), "trace header dtype_bytes=3 is invalid: must be one of 1, 2, 4, 8"),
    "threshold 7": (_header("decoding", {"threshold": 7.0}), "trace header decoding.threshold=7.0 is invalid"),
    "cost model unknown field": (_header("cost_model", {"warp": 9}), "trace header cost_model is invalid"),
    "topk_ids as floats": (_replace("topk_ids", lambda t: t.float()),
                           "trace field 'topk_ids' has dtype float32 and 3 dimension(s); must be an integer tensor"),
    "ev_masked as ints": (_replace("ev_masked", lambda t: t.int()), "trace field 'ev_masked' has dtype int32"),
    "fwd_seq not a tensor": (_replace("fwd_seq", lambda t: t.tolist()),
                             "trace field 'fwd_seq' is a list, not a tensor"),
    "missing ev_masked": (_drop("ev_masked"), "trace field 'ev_masked' is missing"),
    "missing pred_weights (v2)": (_drop("pred_weights"), "trace field 'pred_weights' is missing"),
    "missing num_experts": (_drop("num_experts", header=True), "trace header field 'num_experts' is missing"),
    "header a list": (lambda d: d.__setitem__("header", [1]), "trace header is a list, not a dict"),
    "unknown field": (lambda d: d.__setitem__("extra", torch.zeros(1)), "trace field 'extra' is unknown"),
    "fwd_seq short": (_replace("fwd_seq", lambda t: t[:-1]), "trace field 'fwd_seq' has 37 entries; must have 38"),
    "topk_weights shape": (_replace("topk_weights", lambda t: t[:, :-1]),
                           "trace field 'topk_weights' has shape [2, 319, 2]; must be [2, 320, 2]"),
    "pred id 999": (_set("pred_ids", (1, 0, 0), 999), "trace field pred_ids[1, 0, 0]=999 is out of range: must be "
                                                      "in [-1, 7]"),
    "NaN confidence": (_set("ev_confidence", 4, math.nan), "trace field ev_confidence[4]=nan is invalid"),
    "ev_batch 0": (_set("ev_batch", 0, 0), "trace field ev_batch[0]=0 is out of range: must be >= 1"),
    "event not a whole batch": (_set("ev_batch", 0, 3), "trace field ev_offsets: item 0 has 8 entries, not a "
                                                        "multiple of its batch 3"),
    "mk_offsets past the end": (_set("mk_offsets", -1, 10 ** 9), "trace field mk_offsets[8]=1000000000 is invalid"),
    "op 7": (_set("op", 2, 7), "trace field op[2]=7 is out of range: must be in [0, 3]"),
    "version 3": (lambda d: d.__setitem__("version", 3), "trace version 3 is not supported (supported: 1, 2)"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_corrupted_field_is_one_value_error_naming_it(valid, tmp_path, case):
    edit, message = CASES[case]
    path = corrupted(valid, tmp_path, edit)
    with pytest.raises(ValueError) as err:
        load_trace(path)
    assert str(err.value).startswith(f"{path}: {message}"), str(err.value)
    assert "\n" not in str(err.value)


def test_the_valid_trace_loads_and_round_trips(valid, tmp_path):
    trace = load_trace(valid)
    assert (trace.num_layers, trace.num_experts, trace.version) == (2, 8, 2)
    again = tmp_path / "again.trace"
    trace.save(str(again))
    back = load_trace(again)
    assert back.header == trace.header
    assert all(np.array_equal(back.arrays[k], v) for k, v in trace.arrays.items())


def test_a_version_1_trace_without_edits_still_loads(valid, tmp_path):
    def old(data):
        data["version"] = 1
        for name in ("pred_ids", "pred_weights", "ev_edited"):
            del data[name]

    trace = load_trace(corrupted(valid, tmp_path, old))
    assert not trace.has_predictions and trace.edits() == 0


def test_the_memory_estimate_is_stated_and_bounds_real_models():
    """LLaDA2.0-flash (32 MoE layers x 256 experts, blocks of 32) is far inside; a million experts is not."""
    assert reader_bytes(32, 256, 32) < READER_BYTES_LIMIT / 50
    assert reader_bytes(1, 10 ** 6, 1) > READER_BYTES_LIMIT


def test_writer_traces_are_checked_too():
    """A trace built in memory (the recorder's, the generator's) passes the same gate as a file."""
    trace = synthetic_trace(num_layers=2, num_experts=8, top_k=2, block_length=4, num_blocks=1)
    data = {"format": "oled-trace", "version": trace.version, "header": {**trace.header, "block_length": 0},
            **trace.arrays}
    with pytest.raises(ValueError, match="block_length=0 is invalid"):
        Trace(data)


@pytest.mark.parametrize("case", ["num_experts 1e12 (int)", "expert id 999", "op_index out of range"])
def test_trace_replay_reports_a_corrupted_trace_in_one_line(valid, tmp_path, capsys, case):
    """Before: a 69 TiB allocation, an IndexError traceback; now exit 2 and the loader's line."""
    edit, message = CASES[case]
    path = corrupted(valid, tmp_path, edit)
    assert main(["trace", "replay", path, "--cache-size", "2", "--system", "lru"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"oled-moe trace replay: error: {path}: {message}") and err.count("\n") == 1, err


def test_trace_synth_fit_refuses_nan_weights_and_bad_ids(valid, tmp_path, capsys):
    """``--fit`` reads through the same loader: NaN weights and expert 999 were fitted silently."""
    for case in ("NaN gate weight", "expert id 999"):
        edit, message = CASES[case]
        path = corrupted(valid, tmp_path, edit)
        out = tmp_path / "fitted.trace"
        assert main(["trace", "synth", "--fit", path, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"{path}: {message}" in err and err.count("\n") == 1, err
        assert not out.exists()


def test_trace_save_under_ulimit_f_leaves_nothing(valid, tmp_path):
    """Before: torch's own writer failed with "enforce fail" and left a partial file at the path."""
    trace, target = load_trace(valid), tmp_path / "t.trace"
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))  # Python ignores SIGXFSZ: the write fails with EFBIG
    try:
        with pytest.raises(OSError) as err:
            trace.save(str(target))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert str(err.value) == (f"[Errno {errno.EFBIG}] could not write {target}: File too large; nothing was "
                              "written there")
    assert list(tmp_path.iterdir()) == []
