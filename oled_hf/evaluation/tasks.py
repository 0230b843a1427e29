"""The repository's offline lm-eval tasks (``eval/tasks``): locating them, resolving their paths, toy data.

The wheel carries ``eval/tasks`` as ``oled_hf/eval_tasks`` (package data), so ``oled-moe eval
--tasks toy_addition`` works from an installed package as from a clone; :func:`default_tasks_dir`
says which copy is used.

lm-eval hands ``dataset_kwargs.data_files`` to ``datasets.load_dataset`` unchanged, and datasets
resolves a relative path against the *working directory*, not the YAML. Our YAMLs therefore
write data paths relative to the YAML file itself, and :func:`task_spec` loads such a YAML into a
complete task config (includes merged, ``!function`` resolved) with those paths made absolute.
``${VAR}`` placeholders in ``include:`` and ``data_files`` are expanded from the environment,
plus ``LM_EVAL_TASKS`` (the installed ``lm_eval/tasks`` folder) and ``OLED_EVAL_TASKS`` (our
``eval/tasks``), so ``gsm8k_local.yaml`` can include the stock gsm8k task wherever lm-eval lives.
``oled-moe eval`` passes the resulting dict to ``TaskManager.load`` instead of the bare name.

``python -m oled_hf.evaluation.tasks [--n-test 500] [--n-train 200] [--out DIR]`` rewrites the toy
task's JSONL files with ``oled_hf.toy.data.write_jsonl`` (deterministic: same files every time).
"""

from __future__ import annotations

import argparse
import os
import re
from importlib import resources
from pathlib import Path
from typing import Any

TOY_TASKS = ("toy_addition", "toy_addition_mc")
TOY_DATA_SIZES = {"n_train": 200, "n_heldout": 500}
_PLACEHOLDER = re.compile(r"\$\{(\w+)\}")


# Where the wheel installs eval/tasks (pyproject.toml maps the package oled_hf.eval_tasks to it).
INSTALLED_PACKAGE, INSTALLED_FOLDER = "oled_hf", "eval_tasks"


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def installed_tasks_dir(package: str | None = None) -> Path | None:
    """The copy of ``eval/tasks`` that an installed wheel carries, or None when this install has none.

    Found through ``importlib.resources`` rather than ``__file__`` so that it is wherever the
    package itself was imported from; only a folder on disk counts, since lm-eval and datasets
    open the YAML and JSONL files by path.
    """
    try:
        folder = resources.files(package or INSTALLED_PACKAGE) / INSTALLED_FOLDER
    except ModuleNotFoundError:
        return None
    return Path(folder) if isinstance(folder, Path) and folder.is_dir() else None


def tasks_dir_candidates() -> list[Path]:
    """Where :func:`default_tasks_dir` looks, in order: the source tree first, so a clone uses its own edits."""
    installed = installed_tasks_dir()
    return [repo_root() / "eval" / "tasks", *([installed] if installed else []), Path.cwd() / "eval" / "tasks"]


def default_tasks_dir() -> Path:
    """``$OLED_EVAL_TASKS``, else ``eval/tasks`` of the source tree, else the installed copy, else ``./eval/tasks``.

    An ``OLED_EVAL_TASKS`` that is not a folder is an error, not a reason to quietly use another copy.
    """
    env = os.environ.get("OLED_EVAL_TASKS")
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"OLED_EVAL_TASKS={env}: no such folder (it must name a folder of task YAMLs "
                                    "such as the repository's eval/tasks; unset it to use the installed tasks)")
        return path.resolve()
    candidates = tasks_dir_candidates()
    for path in candidates:
        if path.is_dir():
            return path.resolve()
    raise FileNotFoundError(
        "cannot find the eval/tasks folder (looked in: " + ", ".join(str(c) for c in candidates)
        + "); reinstall oled-hf, run from a clone of the repository, set OLED_EVAL_TASKS, or pass --include-path"
    )


def toy_data_dir(tasks_dir: Path | None = None) -> Path:
    return Path(tasks_dir or default_tasks_dir()) / "toy_addition" / "data"


def lm_eval_tasks_dir() -> Path:
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).resolve().parent


def placeholder_values(tasks_dir: Path | None = None) -> dict[str, str]:
    values = dict(os.environ)
    values["LM_EVAL_TASKS"] = str(lm_eval_tasks_dir())
    try:
        values.setdefault("OLED_EVAL_TASKS", str(tasks_dir or default_tasks_dir()))
    except FileNotFoundError:
        pass
    return values


def expand(value: str, values: dict[str, str], where: Path) -> str:
    def sub(match: re.Match) -> str:
        name = match.group(1)
        if name not in values:
            raise ValueError(
                f"{where}: {value!r} uses ${{{name}}}, which is not set; export {name}=... "
                "(see eval/tasks/README.md)"
            )
        return values[name]

    return _PLACEHOLDER.sub(sub, value)


def _resolve_path(value: str, base: Path, values: dict[str, str], where: Path) -> str:
    value = os.path.expanduser(expand(value, values, where))
    if "://" in value:  # a URL or hf:// path: leave to datasets
        return value
    path = Path(value)
    return str(path if path.is_absolute() else (base / path).resolve())


def _resolve_data_files(data_files: Any, base: Path, values: dict[str, str], where: Path) -> Any:
    if isinstance(data_files, str):
        return _resolve_path(data_files, base, values, where)
    if isinstance(data_files, list):
        return [_resolve_data_files(v, base, values, where) for v in data_files]
    if isinstance(data_files, dict):
        return {k: _resolve_data_files(v, base, values, where) for k, v in data_files.items()}
    return data_files


def load_task_config(path: Path, values: dict[str, str] | None = None, _seen: set | None = None) -> dict:
    """A task YAML as lm-eval's loader reads it, with includes and data paths resolved as described above."""
    from lm_eval.tasks._yaml_loader import load_yaml

    path = Path(path).resolve()
    values = placeholder_values() if values is None else values
    seen = set() if _seen is None else _seen
    if path in seen:
        raise ValueError(f"include cycle at {path}")
    seen.add(path)
    cfg = load_yaml(path, resolve_func=True, recursive=False)
    kwargs = cfg.get("dataset_kwargs")
    if isinstance(kwargs, dict):
        kwargs = dict(kwargs)
        for key in ("data_files", "data_dir"):
            if key in kwargs:
                kwargs[key] = _resolve_data_files(kwargs[key], path.parent, values, path)
        cfg["dataset_kwargs"] = kwargs
    includes = cfg.pop("include", None)
    if includes is None:
        return cfg
    merged: dict = {}
    for inc in includes if isinstance(includes, list) else [includes]:
        inc_path = Path(_resolve_path(inc, path.parent, values, path))
        if not inc_path.is_file():
            raise FileNotFoundError(f"{path}: include {inc!r} -> {inc_path} does not exist")
        inc_cfg = load_task_config(inc_path, values, seen)
        inc_cfg.pop("task_list", None)
        merged.update(inc_cfg)
    merged.update(cfg)
    return merged


def find_task_yaml(name: str, dirs: list[Path]) -> Path | None:
    """The YAML under ``dirs`` whose ``task:`` is ``name`` (read without includes, so placeholders are fine)."""
    from lm_eval.tasks._yaml_loader import load_yaml

    for root in dirs:
        for path in sorted(Path(root).glob("**/*.yaml")):
            if "__pycache__" in path.parts:
                continue
            try:
                cfg = load_yaml(path, resolve_func=False, recursive=False)
            except Exception:  # not a task YAML we can read (lm-eval skips it too)
                continue
            if cfg.get("task") == name:
                return path
    return None


def task_spec(name: str, dirs: list[Path], data_files: dict | None = None) -> str | dict:
    """What to give ``TaskManager.load`` for ``name``: a resolved config for our YAMLs, else the name itself.

    ``data_files`` replaces the task's ``dataset_kwargs.data_files`` (e.g. the full held-out split).
    """
    path = find_task_yaml(name, dirs)
    if path is None:
        if data_files is not None:
            raise ValueError(f"task {name!r} is not one of ours ({', '.join(map(str, dirs))}); cannot swap its data")
        return name
    cfg = load_task_config(path, placeholder_values(dirs[0] if dirs else None))
    if data_files is not None:
        cfg["dataset_kwargs"] = {**(cfg.get("dataset_kwargs") or {}), "data_files": dict(data_files)}
    return cfg


def write_toy_data(out_dir: Path | None = None, n_train: int = TOY_DATA_SIZES["n_train"],
                   n_heldout: int = TOY_DATA_SIZES["n_heldout"], overwrite: bool = False) -> dict[str, Path]:
    """The toy task's ``train.jsonl`` / ``test.jsonl`` (``oled_hf.toy.data.write_jsonl``; existing files are
    replaced only with ``overwrite``, the shipped data folder included)."""
    from ..toy.data import write_jsonl

    return write_jsonl(out_dir or toy_data_dir(), n_train=n_train, n_heldout=n_heldout, overwrite=overwrite)


def heldout_size() -> int:
    """How many problems the toy's held-out split has (the ``--full`` size)."""
    from ..toy import data

    return len(data._heldout_pairs())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="write the toy task's JSONL files for lm-eval")
    parser.add_argument("--out", default=None, help="folder (default: eval/tasks/toy_addition/data)")
    parser.add_argument("--n-test", type=int, default=TOY_DATA_SIZES["n_heldout"],
                        help="held-out problems; 0 = the complete held-out split")
    parser.add_argument("--n-train", type=int, default=TOY_DATA_SIZES["n_train"])
    parser.add_argument("--overwrite", action="store_true", help="replace existing JSONL files (default: refuse)")
    args = parser.parse_args(argv)
    n_test = args.n_test or heldout_size()
    paths = write_toy_data(Path(args.out) if args.out else None, n_train=args.n_train, n_heldout=n_test,
                           overwrite=args.overwrite)
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
