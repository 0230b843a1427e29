"""Issue 67 items 1 and 2: ``oled-moe --help``/``--version`` import neither torch nor transformers (37 s on a busy
machine before), a subcommand imports what it needs when it runs, and nothing at start needs scipy (an extra).

Each check runs in a fresh interpreter: what a start imports is only visible before anything else has.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}
HEAVY = ("torch", "transformers", "numpy", "numba", "scipy", "accelerate")


def without_scipy(folder) -> str:
    """Code that swaps site-packages for ``folder``: links to all of it but scipy, as in a wheel installed without
    the eval extra (an import hook cannot fake that: transformers asks ``find_spec`` whether scipy exists)."""
    site = next(p for p in sys.path if p.endswith("site-packages"))
    folder.mkdir(exist_ok=True)
    for entry in os.listdir(site):
        if not entry.startswith("scipy") and not (folder / entry).exists():
            (folder / entry).symlink_to(os.path.join(site, entry))
    return f"import sys\nsys.path[:] = [{str(folder)!r} if p == {site!r} else p for p in sys.path]\n"


def run_python(code: str, *args: str, prefix: str = "") -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter, after ``prefix`` (:func:`without_scipy`)."""
    code = prefix + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300, env=ENV)


def imported_by(argv: list[str]) -> tuple[int, list[str], str]:
    """Exit status, which of HEAVY ``oled-moe ARGV`` imported, and its stdout."""
    proc = run_python(f"""
        import json, sys
        from oled_hf.cli.main import main
        try:
            code = main(sys.argv[1:])
        except SystemExit as e:
            code = e.code
        print(json.dumps([code, sorted(m for m in {HEAVY!r} if m in sys.modules)]))
    """, *argv)
    assert proc.returncode == 0, proc.stderr
    *out, last = proc.stdout.splitlines()
    code, heavy = json.loads(last)
    return code, heavy, "\n".join(out)


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["make-tiny", "--help"], ["prepare", "--help"],
                                  ["demo", "--help"], ["chat", "--help"], ["serve", "--help"], ["trace", "--help"],
                                  ["trace", "record", "--help"], ["trace", "synth", "--help"], ["eval", "--help"]],
                         ids=" ".join)
def test_help_and_version_import_nothing_heavy(argv):
    code, heavy, out = imported_by(argv)
    assert code == 0 and heavy == [], (argv, heavy)
    assert out.startswith("oled-moe 0") if argv == ["--version"] else "usage: oled-moe" in out


def test_import_oled_hf_is_light_and_still_registers_the_auto_classes():
    """The Auto classes know ``oled_llada2`` once transformers is imported, whichever comes first."""
    proc = run_python("""
        import sys
        import oled_hf
        assert not {"torch", "transformers"} & set(sys.modules), "import oled_hf imported torch/transformers"
        from transformers import AutoConfig, AutoModelForCausalLM
        config = AutoConfig.for_model("oled_llada2")
        assert type(config) is oled_hf.OledLLaDA2Config
        assert AutoModelForCausalLM._model_mapping[type(config)] is oled_hf.OledLLaDA2ForDiffusionLM
        print(oled_hf.__version__, oled_hf.OffloadConfig.__name__)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [__import__("oled_hf").__version__, "OffloadConfig"]


@pytest.mark.parametrize("first", ["transformers", "oled_hf.modeling.events", "oled_hf.offload.runtime"])
def test_registration_waits_for_a_half_imported_model_module(first):
    """Transformers imported before oled_hf: registered at once. A model module that imports torch/transformers
    itself: registering inside that import would import it half-done (``events`` imports torch; ``runtime`` the
    model's modules through the offload package), so it waits for the import to finish."""
    proc = run_python(f"""
        import importlib
        importlib.import_module({first!r})
        import oled_hf
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
        config = CONFIG_MAPPING["oled_llada2"]
        assert MODEL_FOR_CAUSAL_LM_MAPPING[config].__name__ == "OledLLaDA2ForDiffusionLM"
    """)
    assert proc.returncode == 0, proc.stderr


def test_a_start_without_scipy_runs_and_replays(tmp_path):
    """Item 1: the wheel's ``oled-moe --version`` stopped at ``No module named 'scipy'`` (the CLI imported the LP
    bound)."""
    trace = tmp_path / "s.trace"
    proc = run_python("""
        from oled_hf.cli.main import main
        try:
            main(["--version"])
        except SystemExit as e:
            assert e.code == 0
        assert main(["trace", "synth", "--out", sys.argv[1], "--layers", "2", "--experts", "8", "--top-k", "2",
                     "--block-length", "4", "--blocks", "1", "--sequences", "1"]) == 0
        assert main(["trace", "replay", sys.argv[1], "--cache-size", "4", "--system", "lru"]) == 0
        import importlib.util
        assert importlib.util.find_spec("scipy") is None
    """, str(trace), prefix=without_scipy(tmp_path / "site"))
    assert proc.returncode == 0, proc.stderr
    assert "lru" in proc.stdout


def test_a_missing_extra_is_one_line_naming_it(tmp_path):
    proc = run_python("""
        from oled_hf.cli.common import missing_extra
        try:
            import scipy.optimize  # noqa: F401
        except ModuleNotFoundError as err:
            print(missing_extra(err))
    """, prefix=without_scipy(tmp_path / "site"))
    assert proc.stdout.strip() == "scipy is not installed (it comes with the eval extra): pip install 'oled-hf[eval]'"
