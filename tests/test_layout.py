"""The layout rules of docs/design.md, checked on the source: who may import whom."""

import ast
import glob
import sys
from pathlib import Path

import pytest
from oled_hf.modeling.auto_map import CODE_FILES

REPO = Path(__file__).resolve().parents[1]
ALLOWED_IN_MODELING = {"torch", "transformers", "safetensors"}  # safetensors: a dependency of transformers


def _imports(path: Path, package: str) -> set[str]:
    """Absolute names of every module a file imports, lazy ones included, TYPE_CHECKING ones not."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)}
    names = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
                names.update([module] if node.module else [f"{module}.{a.name}" for a in node.names])
            else:
                names.add(node.module)
    return names


def _module_map() -> dict[str, Path]:
    modules = {}
    for path in (REPO / "oled_hf").rglob("*.py"):
        if "checkpoint" in path.parts:  # copies of modeling/ inside shipped checkpoints
            continue
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for path in (REPO / "modeling").glob("*.py"):
        name = "oled_hf.modeling" if path.stem == "__init__" else f"oled_hf.modeling.{path.stem}"
        modules[name] = path
    return modules


def test_modeling_imports_only_torch_transformers_and_siblings():
    for path in sorted((REPO / "modeling").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.level == 1 and node.module and f"{node.module}.py" in CODE_FILES, (path.name, node.module)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                for name in names:
                    top = name.split(".")[0]
                    assert top in ALLOWED_IN_MODELING or top in sys.stdlib_module_names, (path.name, name)


def test_code_files_are_the_whole_modeling_folder():
    assert set(CODE_FILES) == {p.name for p in (REPO / "modeling").glob("*.py")} - {"__init__.py"}


def test_no_import_cycles():
    modules = _module_map()
    graph = {}
    for name, path in modules.items():
        package = name if path.stem == "__init__" else name.rpartition(".")[0]
        deps = set()
        for imported in _imports(path, package):
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name and not name.startswith(imported + "."):
                deps.add(imported)  # a package's __init__ is a parent, not a cycle partner
        graph[name] = deps
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == "open":
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(dep):] + [dep]))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)


def _setuptools_config() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_pyproject_lists_every_package():
    setuptools = _setuptools_config()
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "oled_hf").rglob("__init__.py")}
    assert set(setuptools["packages"]) == found | {"oled_hf.modeling", "oled_hf.eval_tasks"}
    assert setuptools["package-dir"] == {"oled_hf.modeling": "modeling", "oled_hf.eval_tasks": "eval/tasks"}
    # data folders are package data, not packages: without this, setuptools warns "Package would be ignored"
    assert setuptools["include-package-data"] is False


def test_wheel_carries_every_task_file_where_the_tasks_module_looks():
    """Every file of eval/tasks matches a package-data glob, under the name default_tasks_dir() imports."""
    from oled_hf.evaluation.tasks import INSTALLED_FOLDER, INSTALLED_PACKAGE

    setuptools = _setuptools_config()
    name = f"{INSTALLED_PACKAGE}.{INSTALLED_FOLDER}"
    assert setuptools["package-dir"][name] == "eval/tasks"
    folder = REPO / "eval" / "tasks"
    shipped = {path for pattern in setuptools["package-data"][name]
               for path in glob.glob(pattern, root_dir=folder, recursive=True) if (folder / path).is_file()}
    files = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert files - shipped == set()
    assert "toy_addition/toy_addition.yaml" in shipped and "toy_addition/data/test.jsonl" in shipped


def test_shipped_checkpoints_carry_the_current_code():
    """Regenerate with: python -c "from oled_hf.modeling.auto_map import write_model_code as w; w('FOLDER')"."""
    for config in (REPO / "oled_hf").rglob("config.json"):
        for name in CODE_FILES:
            assert (config.parent / name).read_bytes() == (REPO / "modeling" / name).read_bytes(), (config.parent, name)
