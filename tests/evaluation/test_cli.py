"""``oled-moe eval`` offline end to end, task path resolution, the committed toy data."""

import json
from pathlib import Path

import pytest

from oled_hf.cli.main import build_parser
from oled_hf.evaluation.tasks import default_tasks_dir, load_task_config, task_spec, toy_data_dir, write_toy_data
from oled_hf.toy import TOY_CHECKPOINT

ROOT = Path(__file__).resolve().parents[2]


def _run(argv):
    args = build_parser(["eval"]).parse_args(["eval", *argv])
    return args.func(args)


def test_eval_cli_prints_table_from_any_cwd(tiny_path, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)  # data paths must not depend on the working directory
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # and outside any clone
    out = tmp_path / "res.json"
    code = _run(["--model", str(tiny_path), "--tasks", "toy_addition", "--limit", "8", "--batch-size", "4",
                 "--output-path", str(out)])
    printed, err = capfd.readouterr()  # fd level: git's own stderr included
    assert code == 0
    assert "fatal: not a git repository" not in err and "Generating test split" not in err
    assert "requests:   0%" not in err  # lm-eval's bar (the "Loading weights" one is the CLI's, not run here)
    assert "Running generate_until requests: done, 8/8 request in " in err  # a log line with the duration
    assert "|toy_addition|" in printed.replace(" ", "") and "exact_match" in printed
    saved = json.loads(out.read_text())
    assert saved["results"]["toy_addition"]["exact_match,none"] == 0.0  # random weights: gibberish
    assert saved["n-samples"]["toy_addition"]["effective"] == 8


def test_eval_cli_offloaded_mc_task_reports_cache(tiny_path, capsys):
    code = _run(["--model", str(tiny_path), "--tasks", "toy_addition_mc", "--limit", "3",
                 "--model-args", "cache_size=2,system=lru+cpu+adaptive,mc_num=4"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "toy_addition_mc" in printed and "acc" in printed
    assert "offloading: policy lru" in printed and "hit rate" in printed


def test_toy_yaml_paths_resolve_relative_to_the_yaml():
    tasks_dir = default_tasks_dir()
    assert tasks_dir == (ROOT / "eval" / "tasks").resolve()
    spec = task_spec("toy_addition", [tasks_dir])
    files = spec["dataset_kwargs"]["data_files"]
    assert files["test"] == str(toy_data_dir(tasks_dir) / "test.jsonl") and Path(files["test"]).is_file()
    assert task_spec("gsm8k", [tasks_dir]) == "gsm8k"  # not ours: left to lm-eval by name


def test_gsm8k_local_needs_its_data_dir_and_includes_stock_gsm8k(tmp_path, monkeypatch):
    monkeypatch.delenv("GSM8K_DATA_DIR", raising=False)
    with pytest.raises(ValueError, match="GSM8K_DATA_DIR"):
        task_spec("gsm8k_local", [default_tasks_dir()])
    monkeypatch.setenv("GSM8K_DATA_DIR", str(tmp_path))
    cfg = load_task_config(default_tasks_dir() / "gsm8k_local.yaml")
    assert cfg["task"] == "gsm8k_local" and cfg["dataset_path"] == "json" and cfg["tag"] == []
    assert cfg["dataset_kwargs"]["data_files"]["test"] == str(tmp_path / "test.jsonl")
    assert cfg["doc_to_text"].startswith("Question:") and cfg["num_fewshot"] == 5  # from the stock gsm8k.yaml


def test_gsm8k_local_runs_offline(tiny_path, tmp_path, monkeypatch, capsys):
    row = {"question": "Tom has 2 apples and buys 3. How many now?", "answer": "2+3=5\n#### 5"}
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl").write_text(json.dumps(row) + "\n")
    monkeypatch.setenv("GSM8K_DATA_DIR", str(tmp_path))
    code = _run(["--model", str(tiny_path), "--tasks", "gsm8k_local", "--limit", "1", "--num-fewshot", "0",
                 "--gen-kwargs", "max_gen_toks=8"])
    printed = capsys.readouterr().out
    assert code == 0 and "gsm8k_local" in printed and "strict-match" in printed


def test_committed_toy_data_is_what_the_writer_makes(tmp_path):
    paths = write_toy_data(tmp_path)
    for name, path in paths.items():
        committed = toy_data_dir() / f"{name}.jsonl"
        assert committed.read_bytes() == path.read_bytes(), name
    assert len((toy_data_dir() / "test.jsonl").read_text().splitlines()) == 500


@pytest.mark.skipif(not (Path(TOY_CHECKPOINT) / "config.json").is_file(), reason="the trained toy is not built")
def test_eval_cli_defaults_to_the_trained_toy(capsys, tmp_path):
    out = tmp_path / "toy.json"
    code = _run(["--tasks", "toy_addition,toy_addition_mc", "--limit", "8", "--batch-size", "8",
                 "--model-args", "mc_num=8", "--output-path", str(out)])
    assert code == 0 and "toy_addition_mc" in capsys.readouterr().out
    results = json.loads(out.read_text())["results"]
    assert results["toy_addition"]["exact_match,none"] >= 0.75
    assert results["toy_addition_mc"]["acc,none"] >= 0.75


def _main(argv, capsys):
    from oled_hf.cli.main import main

    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_eval_takes_lm_eval_spellings_and_names_the_pretrained_checkpoint(tiny_path, tmp_path, capsys):
    """lm-eval's --model_args/--batch_size/--num_fewshot/--include_path; the header names pretrained=, not the toy."""
    out = tmp_path / "res.json"
    code, printed, _ = _main(["eval", "--model", "oled_llada2", "--model_args", f"pretrained={tiny_path}",
                              "--tasks", "toy_addition", "--limit", "2", "--batch_size", "2", "--num_fewshot", "0",
                              "--include_path", str(tmp_path), "--output_path", str(out)], capsys)
    assert code == 0
    header = printed.splitlines()[0]
    assert header.startswith(f"oled_llada2 ({tiny_path}), model_args: pretrained={tiny_path}, device: cpu,")
    assert "batch size: 2," in header and str(TOY_CHECKPOINT) not in printed
    saved = json.loads(out.read_text())
    assert saved["n-samples"]["toy_addition"]["effective"] == 2


def test_eval_refuses_two_different_checkpoints(tiny_path, tmp_path, capsys, monkeypatch):
    from oled_hf.evaluation import runner

    monkeypatch.setattr(runner, "make_lm", lambda *a, **k: pytest.fail("nothing may load"))
    code, _, err = _main(["eval", "--model", str(TOY_CHECKPOINT), "--model-args", f"pretrained={tiny_path}",
                          "--tasks", "toy_addition"], capsys)
    assert code == 2
    assert err == (f"oled-moe eval: error: --model {TOY_CHECKPOINT} and --model-args pretrained={tiny_path} name "
                   "different checkpoints; give the checkpoint once\n")
    code, _, err = _main(["eval", "--model-args", f"pretrained={tmp_path / 'nope'}", "--tasks", "toy_addition"],
                         capsys)
    assert code == 2 and err.startswith(f"oled-moe eval: error: --model-args pretrained {tmp_path / 'nope'}: "
                                        "no such folder")


@pytest.mark.parametrize(("argv", "message"), [
    (["--device", "cuda"], "--device cuda: CUDA is not available on this machine (torch.cuda.is_available() is "
                           "False); use --device cpu or --device auto"),
    (["--device", "cuda:1"], "--device cuda:1: CUDA is not available on this machine"),
    (["--model-args", "device=cuda"], "--model-args device=cuda: CUDA is not available on this machine"),
    (["--device", "gpu"], "--device gpu: not a device (allowed: auto, cpu, cuda, cuda:N)"),
])
def test_eval_device_without_cuda_is_one_line_exit_2(argv, message, tiny_path, capsys, monkeypatch):
    import torch

    from oled_hf.evaluation import runner

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(runner, "make_lm", lambda *a, **k: pytest.fail("nothing may load"))
    code, out, err = _main(["eval", "--model", str(tiny_path), "--tasks", "toy_addition", *argv], capsys)
    assert code == 2 and out == ""
    assert err.startswith(f"oled-moe eval: error: {message}") and err.count("\n") == 1


def test_tasks_folder_resolves_to_the_installed_copy_outside_a_clone(tmp_path, monkeypatch):
    """A wheel ships eval/tasks as oled_hf/eval_tasks: found through importlib.resources when no clone is around."""
    import shutil

    from oled_hf.evaluation import tasks

    site = tmp_path / "site"
    package = site / "oled_hf_installed_copy"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    shutil.copytree(ROOT / "eval" / "tasks", package / tasks.INSTALLED_FOLDER)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(tasks, "INSTALLED_PACKAGE", package.name)
    monkeypatch.setattr(tasks, "repo_root", lambda: tmp_path / "not-a-clone")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OLED_EVAL_TASKS", raising=False)
    installed = (package / "eval_tasks").resolve()
    assert tasks.installed_tasks_dir() == installed and tasks.default_tasks_dir() == installed
    spec = task_spec("toy_addition", [tasks.default_tasks_dir()])
    assert spec["dataset_kwargs"]["data_files"]["test"] == str(installed / "toy_addition" / "data" / "test.jsonl")
    assert tasks.installed_tasks_dir("no_such_package_here") is None


def test_tasks_folder_from_the_environment_must_exist(tmp_path, monkeypatch):
    monkeypatch.setenv("OLED_EVAL_TASKS", str(tmp_path))
    assert default_tasks_dir() == tmp_path.resolve()
    monkeypatch.setenv("OLED_EVAL_TASKS", str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match=r"OLED_EVAL_TASKS=.*nope: no such folder"):
        default_tasks_dir()
