"""``oled-moe --version``: the running code's version, the one pyproject.toml builds the wheel with."""

import pytest

import oled_hf
from oled_hf.cli.main import main


def test_version_prints_the_code_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"oled-moe {oled_hf.__version__}\n"


def test_version_is_where_pyproject_reads_it():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "oled_hf.modeling.auto_map.CODE_VERSION"}
