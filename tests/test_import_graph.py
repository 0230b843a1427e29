"""Who may import whom: the package's layers, and the modules of ``oled_hf/offload`` without a cycle.

Every import counts: module level, inside a function (a lazy import is still a dependency), and
under ``if TYPE_CHECKING:`` (a type-only import is a dependency of the design too).

Layers, lowest first (``LAYERS``): the model code and the file/progress helpers; the checkpoint
writers; the offload runtime (which also records traces); the package's front door
(``oled_hf/__init__``, which registers the Auto classes); then simulation, the shared command-line
options and the toy models; then the server and the evaluation adapters; the ``oled-moe`` command
line on top. A module imports only from layers below its own (never from beside it nor above), so
``serve`` and ``evaluation`` never import ``cli``, and ``offload`` never imports ``sim``.

Within ``offload``, the direction is system.py (naming) <- config.py (validation) -> runtime.py
(attach resolves the config) -> controller/executor (plain values); an import added against it
would otherwise pass unnoticed. The subpackage ``policies/`` is one node there: a package
populating its registry from its own modules is not a dependency between the offload modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import oled_hf.modeling

import oled_hf

PACKAGE = "oled_hf.offload"
PACKAGE_ROOT = Path(oled_hf.__file__).parent
MODELING_ROOT = Path(oled_hf.modeling.__file__).parent  # modeling/ installs as oled_hf.modeling
LAYERS = (
    ("oled_hf.modeling", "oled_hf.fileio", "oled_hf.progress"),
    ("oled_hf.checkpoints",),
    ("oled_hf.offload",),
    ("oled_hf",),
    ("oled_hf.sim", "oled_hf.options", "oled_hf.toy"),
    ("oled_hf.evaluation", "oled_hf.serve"),
    ("oled_hf.cli",),
)
RANK = {node: rank for rank, nodes in enumerate(LAYERS) for node in nodes}


def _is_module(path: Path, root: Path) -> bool:
    """A module of a package: every folder from ``root`` down to it has an ``__init__.py`` (the
    checkpoints' copies of ``modeling/`` are data folders, not packages)."""
    folder = path.parent
    while folder != root.parent:
        if not (folder / "__init__.py").exists():
            return False
        folder = folder.parent
    return "__pycache__" not in path.parts


def package_modules() -> dict[str, Path]:
    """Every module of the installed package, by its dotted name (``modeling/`` as ``oled_hf.modeling``)."""
    out: dict[str, Path] = {}
    for root, name in ((PACKAGE_ROOT, "oled_hf"), (MODELING_ROOT, "oled_hf.modeling")):
        for path in root.rglob("*.py"):
            if root == PACKAGE_ROOT and MODELING_ROOT in path.parents:
                continue
            if _is_module(path, root):
                parts = [p for p in path.relative_to(root).with_suffix("").parts if p != "__init__"]
                out[".".join([name, *parts])] = path
    return out


def _imported_modules(name: str, path: Path, modules: set[str]) -> set[str]:
    """Every module of the package that ``path`` (module ``name``) imports, anywhere in the file."""
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
    found = set()
    for m in out:
        while m and m not in modules:  # ``oled_hf.sim.replay.replay`` -> the module oled_hf.sim.replay
            m = m.rpartition(".")[0]
        if m:
            found.add(m)
    return found


def import_graph(node_of, prefix: str = "oled_hf") -> dict[str, set[str]]:
    """Node -> the nodes it imports (self-edges dropped), over the modules whose name starts with ``prefix``;
    ``node_of(module)`` names a module's node."""
    modules = package_modules()
    names = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        if name != prefix and not name.startswith(prefix + "."):
            continue
        src = node_of(name)
        deps = {node_of(m) for m in _imported_modules(name, path, names)
                if m == prefix or m.startswith(prefix + ".")}
        graph.setdefault(src, set()).update(deps - {src})
    return graph


def layer_node(name: str) -> str:
    """A module's layer node: ``oled_hf.sim.replay`` -> ``oled_hf.sim``; the package's ``__init__`` is ``oled_hf``."""
    return ".".join(name.split(".")[:2])


def offload_node(name: str) -> str:
    """A module of ``offload``: itself, except that a module of ``policies/`` is the node ``policies``."""
    return ".".join(name.split(".")[:3])


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every edge that does not go to a strictly lower layer, as ``a -> b``; an unlisted node is one too."""
    bad = []
    for src, deps in sorted(graph.items()):
        for dst in sorted(deps):
            if src not in RANK or dst not in RANK or RANK[dst] >= RANK[src]:
                bad.append(f"{src} -> {dst}")
    return bad


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


def test_upward_imports_finds_an_edge_up_beside_and_off_the_map():
    assert upward_imports({"oled_hf.offload": {"oled_hf.sim"}}) == ["oled_hf.offload -> oled_hf.sim"]
    assert upward_imports({"oled_hf.serve": {"oled_hf.evaluation"}}) == ["oled_hf.serve -> oled_hf.evaluation"]
    assert upward_imports({"oled_hf.newpart": {"oled_hf.fileio"}}) == ["oled_hf.newpart -> oled_hf.fileio"]
    assert upward_imports({"oled_hf.cli": {"oled_hf.serve", "oled_hf.sim", "oled_hf"}}) == []


def test_every_part_of_the_package_has_a_layer():
    assert {layer_node(m) for m in package_modules()} == set(RANK)


def test_no_import_runs_upwards():
    """serve and evaluation never import cli, offload never imports sim, modeling imports nothing of ours, ..."""
    bad = upward_imports(import_graph(layer_node))
    assert bad == [], "imports against the layers (LAYERS, lowest first): " + "; ".join(bad)


def test_the_parser_sees_lazy_and_type_only_imports():
    """A function-level and a TYPE_CHECKING import are edges (what the cycle check relies on)."""
    graph = import_graph(offload_node, PACKAGE)
    assert f"{PACKAGE}.runtime" in graph[f"{PACKAGE}.config"]  # OffloadConfig.attach: a lazy import
    assert f"{PACKAGE}.controller" in graph[f"{PACKAGE}.executor"]
    assert f"{PACKAGE}.kernels" in graph[f"{PACKAGE}.dispatch"]  # ``from . import kernels``
    assert f"{PACKAGE}.policies" in graph[f"{PACKAGE}.system"]
    assert "oled_hf.offload" in import_graph(layer_node)["oled_hf.sim"]  # ``from ..offload.x import`` in sim


def test_offload_modules_import_without_a_cycle():
    cycle = find_cycle(import_graph(offload_node, PACKAGE))
    assert cycle is None, "import cycle in oled_hf/offload: " + " -> ".join(c.rsplit(".", 1)[-1] for c in cycle)


def test_nothing_config_builds_imports_the_config():
    """The config is read once, by attach: the modules below it do not import it (not even for typing)."""
    graph = import_graph(offload_node, PACKAGE)
    for name in ("runtime", "controller", "executor", "system"):
        assert f"{PACKAGE}.config" not in graph[f"{PACKAGE}.{name}"], name
