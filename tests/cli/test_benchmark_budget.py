"""The budget flags of ``oled-moe benchmark``: --cache-ratio auto, --max-gpu-memory, one budget at a time."""

import json

import pytest

from oled_hf.cli.main import main

QUICK = ["--max-new-tokens", "8", "--block-length", "8", "--runs", "1", "--warmup-runs", "0", "--prompt", "hi"]


def test_max_gpu_memory_sizes_the_pool_and_the_row_says_so(tiny_path, capsys):
    code = main(["benchmark", "--model", str(tiny_path), "--max-gpu-memory", "1MiB", "--system", "lru", "--json",
                 *QUICK])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    # tiny: 3 MoE layers, float32 experts of 96 KiB -> 10 slots in 1 MiB
    assert [r["config"] for r in rows] == ["full residency", "lru @ max gpu memory 1MiB (3.3 slots/layer)"]
    assert rows[1]["same_tokens"]


def test_cache_ratio_auto_without_cuda_is_one_line(tiny_path, capsys):
    assert main(["benchmark", "--model", str(tiny_path), "--device", "cpu", "--cache-ratio", "auto", *QUICK]) == 2
    err = capsys.readouterr().err.strip().splitlines()  # refused before loading: no loading bars either
    assert len(err) == 1 and err[0].startswith("oled-moe benchmark: error: cache_ratio='auto' needs a CUDA device")


def test_one_budget_at_a_time(tiny_path, capsys):
    assert main(["benchmark", "--model", str(tiny_path), "--cache-size", "4", "--cache-ratio", "0.5", *QUICK]) == 2
    assert capsys.readouterr().err.strip() == (
        "oled-moe benchmark: error: give one of --cache-size, --cache-ratio or --max-gpu-memory, "
        "not --cache-size and --cache-ratio")


@pytest.mark.parametrize("flag, value, message", [
    ("--cache-ratio", "half", "argument --cache-ratio: 'half' is not a fraction of routed-expert bytes in (0, 1] "
                              "or 'auto'"),
    ("--max-gpu-memory", "20G", "argument --max-gpu-memory: --max-gpu-memory='20G' is invalid: must be an int of "
                                "bytes > 0 or a size string such as '20GiB', '20GB' or '500MiB'"),
])
def test_a_misspelt_budget_names_the_flag(tiny_path, capsys, flag, value, message):
    with pytest.raises(SystemExit) as exit_:
        main(["benchmark", "--model", str(tiny_path), flag, value])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
