"""lm-eval's own command line (``oled-lm-eval`` = ``python -m oled_hf.evaluation``) knows ``oled_llada2``."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "eval" / "tasks"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


# lm-eval's CLI indexes its ~15k stock task YAMLs first (30-40 s on 2 shared cores); the test skips
# that index and nothing else: the parser, model registry, task loading and evaluation are lm-eval's.
SCRIPT = """
import sys
import lm_eval.tasks
init = lm_eval.tasks.TaskManager.__init__
lm_eval.tasks.TaskManager.__init__ = lambda self, *a, include_defaults=False, **k: init(
    self, *a, include_defaults=include_defaults, **k)
from oled_hf.evaluation.lm_eval_cli import main
print("unknown model exit", main(["--model", "no_such_model", "--tasks", "toy_addition", "--include_path",
                                  sys.argv[2]]), flush=True)
sys.exit(main(sys.argv[1:]))
"""


def test_lm_eval_cli_with_oled_llada2_from_another_folder(tiny_path, tmp_path):
    """Run outside any clone with stderr piped: lm-eval's table, one-line errors, a clean log."""
    argv = ["--include_path", str(TASKS), "--model", "oled_llada2", "--model_args",
            f"pretrained={tiny_path},cache_size=4", "--tasks", "toy_addition", "--limit", "2", "--batch_size", "2"]
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0] == "unknown model exit 2"
    errors = [line for line in proc.stderr.splitlines() if line.startswith("oled-lm-eval: error:")]
    assert len(errors) == 1 and "Attempted to load model 'no_such_model', but no model for this name" in errors[0]
    assert "oled_llada2" in errors[0]  # registered: lm-eval lists it among the supported names
    assert "Traceback" not in proc.stderr
    table = [line.replace(" ", "") for line in proc.stdout.splitlines() if line.startswith("|")]
    assert table[0] == "|Tasks|Version|Filter|n-shot|Metric||Value||Stderr|"
    assert table[2].startswith("|toy_addition|1|none|0|exact_match|↑|0|")  # random weights: every answer wrong
    assert f"oled_llada2 ({{'pretrained': '{tiny_path}', 'cache_size': 4}})" in proc.stdout
    # the piped log: a progress line with the duration instead of bars; no git noise outside a clone
    assert "fatal: not a git repository" not in proc.stderr
    assert "Generating test split" not in proc.stderr and "it/s]" not in proc.stderr and "\r" not in proc.stderr
    assert "Loading weights" not in proc.stderr
    assert any(line.startswith("Running generate_until requests: done, 2/2 request in ")
               for line in proc.stderr.splitlines()), proc.stderr[-2000:]


def test_oled_lm_eval_is_the_installed_console_script():
    scripts = {ep.name: ep.value for ep in entry_points(group="console_scripts")}
    assert scripts.get("oled-lm-eval") == "oled_hf.evaluation.lm_eval_cli:main"
    from oled_hf.evaluation import __main__ as module_main
    from oled_hf.evaluation import lm_eval_cli

    assert module_main.main is lm_eval_cli.main  # python -m oled_hf.evaluation is the same program


def test_stock_lm_eval_cannot_know_oled_llada2():
    """Why the README sends users to oled-lm-eval: lm-eval 0.4 reads no model entry points.

    If a later lm-eval finds the model without our import, this fails and the README's story changes.
    """
    code = ("import lm_eval.api.registry as r\n"
            "try:\n    r.get_model('oled_llada2')\nexcept ValueError as e:\n    print('refused:', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=ENV)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("refused: Attempted to load model 'oled_llada2', but no model for this name found")


def test_stock_task_manager_reads_the_toy_data_from_any_folder(tmp_path, monkeypatch):
    """Without ``oled-moe eval``'s path rewriting: what the stock ``lm_eval --include_path`` does."""
    from lm_eval.tasks import TaskManager

    monkeypatch.chdir(tmp_path)
    manager = TaskManager(include_path=str(TASKS), include_defaults=False)
    task = manager.load(["toy_addition_mc"])["tasks"]["toy_addition_mc"]
    docs = list(task.test_docs())
    assert len(docs) == 500 and docs[0]["question"].startswith("What is ")
