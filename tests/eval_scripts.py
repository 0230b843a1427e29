"""Import a script under eval/ as a module (they are scripts, not a package), for the tests that drive them."""

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_eval_script(name: str) -> ModuleType:
    return load_script(ROOT / "eval" / f"{name}.py")


def load_script(path: Path) -> ModuleType:
    """A Python file of the repository that is not in a package (eval/ scripts, mkdocs_hooks.py), as a module."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
