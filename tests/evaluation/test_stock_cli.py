"""lm-eval's own command line (``python -m oled_hf.evaluation``) knows ``oled_llada2`` and finds the task data."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "eval" / "tasks"


# lm-eval's CLI indexes its ~15k stock task YAMLs first (30-40 s on 2 shared cores); the test skips
# that index and nothing else: the parser, model registry, task loading and evaluation are lm-eval's.
SCRIPT = """
import sys
import lm_eval.tasks
init = lm_eval.tasks.TaskManager.__init__
lm_eval.tasks.TaskManager.__init__ = lambda self, *a, include_defaults=False, **k: init(
    self, *a, include_defaults=include_defaults, **k)
from oled_hf.evaluation.__main__ import main
try:
    main(["--model", "no_such_model", "--tasks", "toy_addition", "--include_path", sys.argv[2]])
except ValueError as err:
    print("unknown model:", err)
sys.exit(main(sys.argv[1:]))
"""


def test_lm_eval_cli_with_oled_llada2_from_another_folder(tiny_path, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    argv = ["--include_path", str(TASKS), "--model", "oled_llada2", "--model_args",
            f"pretrained={tiny_path},cache_size=4", "--tasks", "toy_addition", "--limit", "2", "--batch_size", "2"]
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    unknown = proc.stdout.splitlines()[0]
    assert unknown.startswith("unknown model: Attempted to load model 'no_such_model', but no model for this name")
    assert "oled_llada2" in unknown  # registered: lm-eval lists it among the supported names
    table = [line.replace(" ", "") for line in proc.stdout.splitlines() if line.startswith("|")]
    assert table[0] == "|Tasks|Version|Filter|n-shot|Metric||Value||Stderr|"
    assert table[2].startswith("|toy_addition|1|none|0|exact_match|↑|0|")  # random weights: every answer wrong
    assert f"oled_llada2 ({{'pretrained': '{tiny_path}', 'cache_size': 4}})" in proc.stdout


def test_stock_task_manager_reads_the_toy_data_from_any_folder(tmp_path, monkeypatch):
    """Without ``oled-moe eval``'s path rewriting: what the stock ``lm_eval --include_path`` does."""
    from lm_eval.tasks import TaskManager

    monkeypatch.chdir(tmp_path)
    manager = TaskManager(include_path=str(TASKS), include_defaults=False)
    task = manager.load(["toy_addition_mc"])["tasks"]["toy_addition_mc"]
    docs = list(task.test_docs())
    assert len(docs) == 500 and docs[0]["question"].startswith("What is ")
