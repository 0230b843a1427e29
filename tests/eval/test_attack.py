"""eval/attack.py and eval/attack_cli.py: the case tables are well formed and the CLI helpers keep their contract.

Runs none of the slow cases (no server, no model): it imports the two scripts and checks the tables
(every issue-35 item 1-8 has a case, labels unique and labelled with their item, each case callable
with the arguments its runner passes) and the shared helpers (the one-line exit-2 check, the memory
limit on every subprocess, the row format).
"""

import importlib.util
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "eval" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def attack():
    return _load("attack")


@pytest.fixture(scope="module")
def attack_cli(attack):
    return sys.modules["attack_cli"]  # the one attack.py imported: the same tables it runs


def _tables(attack, attack_cli) -> dict[str, tuple[list, int]]:
    """Each table and how many positional arguments its runner passes to a case."""
    return {"KEYED_CASES": (attack.KEYED_CASES, 1), "WEB_CASES": (attack.WEB_CASES, 1),
            "OWN_SERVER_CASES": (attack.OWN_SERVER_CASES, 2), "CLI CASES": (attack_cli.CASES, 1)}


def test_every_issue_35_item_has_a_case_and_labels_are_unique(attack, attack_cli):
    labels = [label for table, _ in _tables(attack, attack_cli).values() for label, _ in table]
    assert len(labels) == len(set(labels)), sorted(x for x in labels if labels.count(x) > 1)
    items = {label.split(" ", 1)[0] for label in labels}
    assert {f"35.{i}" for i in range(1, 9)} <= items, sorted(items)
    assert {"37.1", "37.3", "37.4", "37.5"} <= items


def test_labels_name_their_item_and_fit_the_column(attack, attack_cli):
    for name, (table, _) in _tables(attack, attack_cli).items():
        assert table, name
        for label, _ in table:
            assert re.fullmatch(r"\d+\.\d+ \S.*", label), (name, label)
            assert len(label) <= attack_cli.WIDTH, (name, label)


def test_each_case_takes_what_its_runner_passes(attack, attack_cli):
    for name, (table, nargs) in _tables(attack, attack_cli).items():
        for label, case in table:
            assert callable(case), (name, label)
            inspect.signature(case).bind(*range(nargs))  # raises TypeError on a wrong arity


def test_server_cases_in_the_server_tables_and_cli_cases_in_the_cli_table(attack, attack_cli):
    # 35.5 needs batching flags of its own; 37.5 is answered by the server; the rest of 35 is CLI or Python
    assert [label for label, _ in attack.OWN_SERVER_CASES] == ["35.5 lone request after burst"]
    assert {label.split()[0] for label, _ in attack.WEB_CASES if label.startswith("37")} == {"37.5"}
    cli_items = {label.split()[0] for label, _ in attack_cli.CASES}
    assert {f"35.{i}" for i in (1, 2, 3, 4, 6, 7, 8)} <= cli_items and "35.5" not in cli_items


def _done(code: int, stderr: str) -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess(["oled-moe"], code, "", stderr)


def test_refused_wants_exit_2_one_line_and_every_expected_text(attack_cli):
    line = "oled-moe trace synth: error: --top-k 0: allowed 1 to 256\n"
    assert attack_cli.refused(_done(2, line), "--top-k 0", "allowed 1 to 256") == (f"exit 2: {line.strip()}", True)
    assert not attack_cli.refused(_done(2, line), "--top-k 0", "allowed 1 to 4096")[1]
    assert not attack_cli.refused(_done(1, line), "--top-k 0")[1]
    text, ok = attack_cli.refused(_done(2, "x.py:1: FutureWarning: old\n" + line), "--top-k 0")
    assert not ok and text.endswith("(2 stderr lines, first: x.py:1: FutureWarning: old)")
    assert attack_cli.refused(_done(2, ""), "x") == ("exit 2: (no stderr)", False)


def test_every_subprocess_runs_under_the_memory_limit(attack_cli):
    r = attack_cli.run([sys.executable, "-c", f"bytearray({2 * attack_cli.AS_LIMIT})"])
    assert r.returncode != 0 and "MemoryError" in r.stderr
    assert attack_cli.run([sys.executable, "-c", "print(len(bytearray(1 << 20)))"]).stdout == "1048576\n"


def test_rows_share_the_columns(attack_cli):
    w = attack_cli.WIDTH
    assert attack_cli.row("35.1 x", True, "exit 2: ...") == f"{'35.1 x':{w}} ok              -  -     exit 2: ..."
    assert attack_cli.row("13.1 y", False, "200 -", "0.25 s", "ok") == f"{'13.1 y':{w}} FAIL       0.25 s  ok    200 -"


def test_each_joins_sub_checks(attack_cli):
    assert attack_cli._each({"a": ("fine", True), "b": ("exit 1: boom", False)}) == ("a: ok; b: exit 1: boom", False)
    assert attack_cli._each({"a": ("fine", True)}) == ("a: ok", True)


def test_case_prefixes_choose_labels(attack, attack_cli):
    picked = attack.chosen(attack_cli.CASES, ["35.8", "13.5 blank"])
    assert [label for label, _ in picked] == ["13.5 blank --api-key", "35.8 repetition_penalty 1e-38",
                                              "35.8 toys' served names", "35.8 --model ~nouser/x"]
    assert attack.chosen(attack.WEB_CASES, None) == attack.WEB_CASES
    assert attack.chosen(attack.KEYED_CASES, ["35."]) == []


def test_a_case_prefix_that_matches_nothing_is_one_line_exit_2():
    """It used to run zero cases and print ALL PASSED."""
    r = subprocess.run([sys.executable, str(ROOT / "eval" / "attack.py"), "--case", "99.9"], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == ("attack.py: error: --case 99.9: no case label starts with that "
                                                 "(e.g. '35.8', '13.5 blank')")
    assert "PASSED" not in r.stdout
