"""``oled-moe benchmark --system``: live composed systems, refused in one line before loading; --policy (deprecated)."""

import json

import pytest

from oled_hf.cli.main import main

QUICK = ["--max-new-tokens", "8", "--block-length", "8", "--runs", "1", "--warmup-runs", "0", "--prompt", "hi"]


def test_benchmark_runs_composed_systems_next_to_policies(tiny_path, capsys):
    code = main(["benchmark", "--model", str(tiny_path), "--cache-size", "6", "--cpu-compute", "on",
                 "--system", "oled", "lru+cpu+reuse+adaptive", "mixtral-offloading", "--json", *QUICK])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["config"], r["system"]) for r in rows] == [
        ("full residency", None), ("oled @ cache size 6", "oled+none+cpu+reuse+adaptive"),
        ("lru+cpu+reuse+adaptive @ cache size 6", "lru+none+cpu+reuse+adaptive"),
        ("mixtral-offloading @ cache size 6", "lru+none+copy+uniform")]
    assert all(r["same_tokens"] for r in rows)
    assert rows[3]["cpu_share"] == 0.0  # every miss copied


@pytest.mark.parametrize("argv, message", [
    (["--system", "lru+gpu"], "--system lru+gpu: system='lru+gpu' is invalid: unknown part 'gpu'; expected "
                              "RETENTION[+PREFETCH][+DISPATCH][+ALLOCATION]"),
    (["--system", "promoe"], "--system promoe: system='promoe' is invalid for a live run: its prefetch part "
                             "'gate-capped' reads the next layer's predicted routes"),
    (["--system", "lru", "lru"], "'lru' is named twice by --system/--policy: name each configuration once"),
])
def test_bad_systems_are_one_line_before_loading(tiny_path, capsys, argv, message):
    assert main(["benchmark", "--model", str(tiny_path), "--cache-size", "6", *argv, *QUICK]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"oled-moe benchmark: error: {message}")


def test_policy_rows_run_their_system_with_one_deprecation_line(tiny_path, capsys):
    """--policy (deprecated, issue 67 item 3) still runs its systems; stderr says once what to write instead, and the
    user never sees a Python FutureWarning."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        code = main(["benchmark", "--model", str(tiny_path), "--cache-size", "6", "--cpu-compute", "on",
                     "--policy", "lru", "tide", "--json", *QUICK])
    assert code == 0
    out, err = capsys.readouterr()
    rows = json.loads(out)["rows"]
    assert [(r["config"], r["system"]) for r in rows[1:]] == [
        ("lru @ cache size 6", "lru+none+cpu+adaptive"), ("tide @ cache size 6", "tide+none+cpu+adaptive")]
    assert [line for line in err.splitlines() if "warning" in line] == [
        "oled-moe benchmark: warning: --policy is deprecated and will be removed; use --system lru+cpu+adaptive "
        "tide+cpu+adaptive (the systems it ran)"]
    assert all(r["same_tokens"] for r in rows)
