"""The modules of ``oled_hf/offload`` import each other without a cycle (issue 37.8).

Every import counts: module level, inside a function (a lazy import is still a dependency), and
under ``if TYPE_CHECKING:`` (a type-only import is a dependency of the design: the issue's circle
config -> runtime -> controller -> config closed through one). Why a test: the direction is
system.py (naming) <- config.py (validation) -> runtime.py (attach resolves the config) ->
controller/executor (plain values); an import added against it would otherwise pass unnoticed.
The subpackage ``policies/`` is one node: a package populating its registry from its own modules
is not a dependency between the offload modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import oled_hf.offload

PACKAGE = "oled_hf.offload"
ROOT = Path(oled_hf.offload.__file__).parent


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join([PACKAGE, *parts])


def _node(name: str) -> str:
    """The graph node of a module of the package: a module of ``policies/`` is the node ``policies``."""
    parts = name.split(".")
    return ".".join(parts[:3])


def _imported_modules(path: Path, modules: set[str]) -> set[str]:
    """Every module of the package that ``path`` imports, anywhere in the file (all levels, any guard)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            for alias in node.names:  # ``from . import kernels`` imports the module kernels, ``from .x import f`` x
                sub = f"{origin}.{alias.name}"
                out.add(sub if sub in modules else origin)
    return {m for m in out if m in modules}


def import_graph() -> dict[str, set[str]]:
    """Node -> the nodes it imports (self-edges dropped), over every module file of the package."""
    files = [p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts]
    modules = {_module_name(p) for p in files}
    graph: dict[str, set[str]] = {_node(m): set() for m in modules}
    for p in files:
        src = _node(_module_name(p))
        graph[src] |= {_node(m) for m in _imported_modules(p, modules)} - {src}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path (first == last), or None (depth-first search, three colours)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_parser_sees_lazy_and_type_only_imports():
    """A function-level and a TYPE_CHECKING import are edges (what the cycle check relies on)."""
    graph = import_graph()
    assert f"{PACKAGE}.runtime" in graph[f"{PACKAGE}.config"]  # OffloadConfig.attach: a lazy import
    assert f"{PACKAGE}.controller" in graph[f"{PACKAGE}.executor"]
    assert f"{PACKAGE}.kernels" in graph[f"{PACKAGE}.dispatch"]  # ``from . import kernels``
    assert f"{PACKAGE}.policies" in graph[f"{PACKAGE}.system"]


def test_offload_modules_import_without_a_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle in oled_hf/offload: " + " -> ".join(c.rsplit(".", 1)[-1] for c in cycle)


def test_nothing_config_builds_imports_the_config():
    """The config is read once, by attach: the modules below it do not import it (not even for typing)."""
    graph = import_graph()
    for name in ("runtime", "controller", "executor", "system"):
        assert f"{PACKAGE}.config" not in graph[f"{PACKAGE}.{name}"], name
