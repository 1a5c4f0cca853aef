"""The layout shows the architecture: distlab's layers import downward only, nothing imports in a
cycle, and the released module names (distlab/_moved.py) point at modules that exist.

The import graph is read from the source with :mod:`ast` (nothing is imported, torch least of all):

* an edge per import statement, to the module it loads: ``from pkg import name`` is an edge to
  ``pkg.name`` when that is a module, else to ``pkg`` (the attribute is read from its ``__init__``);
  the parent packages that Python imports on the way are not edges (they are already in
  ``sys.modules`` when a submodule runs, and nothing is read from them), so a package's
  ``__init__`` importing its own submodules is no cycle by itself;
* an old name of :mod:`distlab._moved` is an edge to the module that now holds it;
* each edge has a kind: ``module`` (runs at import, class bodies and ``try:`` included),
  ``type_checking`` (under ``if TYPE_CHECKING:``) or ``function`` (inside a function).

The layering rules hold for every kind (a function's import is as much a dependency); the cycle
rule for ``module`` and ``type_checking`` (an import inside a function is how a cycle is broken at
run time, and a ``TYPE_CHECKING`` one is a cycle for the type checker and for the reader).
"""
from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("distlab", "autograder")
CYCLE_KINDS = ("module", "type_checking")


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, dotted
    target: str  # the module it loads, dotted (outside modules keep their full dotted name)
    line: int
    kind: str  # "module" | "type_checking" | "function"

    def where(self, files: dict[str, Path], root: Path) -> str:
        return f"{files[self.source].relative_to(root)}:{self.line}"


def find_modules(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """``{dotted name: file}`` of every module of ``packages`` under ``root`` (``pkg/__init__.py`` is ``pkg``)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _statements(tree: ast.Module):
    """``(node, kind)`` for every import statement of ``tree``."""
    stack = [(node, "module") for node in reversed(tree.body)]
    while stack:
        node, kind = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, kind
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            kind = "function"
        children = list(ast.iter_child_nodes(node))
        if isinstance(node, ast.If) and _is_type_checking(node.test) and kind == "module":
            stack.extend((child, "type_checking") for child in reversed(node.body))
            stack.extend((child, kind) for child in reversed(node.orelse))
            continue
        stack.extend((child, kind) for child in reversed(children))


def _resolve(name: str, modules: dict[str, Path], moved: dict[str, tuple[str, ...]]) -> list[str]:
    """The module(s) ``name`` loads: itself, an old name's new modules, or (outside) the name as written."""
    if name in moved:
        return list(moved[name])
    return [name]


def imports_of(name: str, path: Path, modules: dict[str, Path], moved: dict[str, tuple[str, ...]]) -> list[Import]:
    """Every import of the module ``name`` (file ``path``), resolved to the modules it loads."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node, kind in _statements(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = []
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.append(sub if alias.name != "*" and (sub in modules or sub in moved) else base)
        for target in targets:
            found += [Import(name, t, node.lineno, kind) for t in _resolve(target, modules, moved)]
    return found


def import_graph(root: Path, moved: dict[str, tuple[str, ...]], packages=PACKAGES):
    modules = find_modules(root, packages)
    edges = [imp for name, path in modules.items() for imp in imports_of(name, path, modules, moved)]
    return modules, edges


def cycles(modules: dict[str, Path], edges: list[Import], kinds=CYCLE_KINDS) -> list[list[Import]]:
    """One shortest cycle per strongly connected component of the graph of ``kinds`` edges among ``modules``."""
    out: dict[str, list[Import]] = {}
    for e in edges:
        if e.kind in kinds and e.target in modules:
            out.setdefault(e.source, []).append(e)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components = []

    def connect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for e in out.get(v, []):
            if e.target not in index:
                connect(e.target)
                low[v] = min(low[v], low[e.target])
            elif e.target in stack:
                low[v] = min(low[v], index[e.target])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or any(e.target == v for e in out.get(v, [])):
                components.append(set(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(modules) + 100))
    try:
        for v in sorted(modules):
            if v not in index:
                connect(v)
    finally:
        sys.setrecursionlimit(limit)
    return [_shortest_cycle(min(c), c, out) for c in sorted(components, key=min)]


def _shortest_cycle(start: str, component: set[str], out: dict[str, list[Import]]) -> list[Import]:
    """The shortest path of edges from ``start`` back to itself, inside ``component`` (breadth first)."""
    paths: dict[str, list[Import]] = {start: []}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for e in out.get(v, []):
                if e.target == start:
                    return paths[v] + [e]
                if e.target in component and e.target not in paths:
                    paths[e.target] = paths[v] + [e]
                    following.append(e.target)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # a component of Tarjan's always has one


def describe(cycle: list[Import], files: dict[str, Path], root: Path = REPO) -> str:
    steps = " -> ".join([cycle[0].source, *(e.target for e in cycle)])
    where = ", ".join(f"{e.where(files, root)} ({e.kind})" for e in cycle)
    return f"{steps}   [{where}]"


def _moved_table() -> dict[str, tuple[str, ...]]:
    from distlab._moved import MOVED  # the standard library only: distlab's __init__ loads the rest lazily

    return MOVED


@pytest.fixture(scope="module")
def graph():
    return import_graph(REPO, _moved_table())


def test_the_graph_is_read_from_the_tree(graph):
    """Not vacuous: every module is found, and imports of each kind are, resolved as they load."""
    modules, edges = graph
    assert {"distlab", "distlab.runtime.reaper", "distlab.measure.comm", "distlab.lab.pipeline.run",
            "autograder", "autograder.grader.registry"} <= set(modules)
    assert len(modules) >= 80 and len(edges) >= 300
    # TYPE_CHECKING imports are read too (the made-up trees below); the tree itself may have none
    assert {"module", "function"} <= {e.kind for e in edges}
    assert any(e.source == "distlab" and e.target == "distlab._moved" and e.kind == "module"
               for e in edges)  # from ._moved import install


def _violations(edges: list[Import], source: str, forbidden: tuple[str, ...]) -> list[Import]:
    def inside(name: str, package: str) -> bool:
        return name == package or name.startswith(package + ".")

    return [e for e in edges if inside(e.source, source) and any(inside(e.target, f) for f in forbidden)]


@pytest.mark.parametrize("source, forbidden", [
    ("distlab.runtime", ("distlab.measure", "distlab.lab")),
    ("distlab.measure", ("distlab.lab",)),
    ("distlab", ("autograder",)),
], ids=["runtime-imports-neither-measure-nor-lab", "measure-does-not-import-lab",
        "distlab-imports-nothing-from-autograder"])
def test_layers_import_downward_only(graph, source, forbidden):
    modules, edges = graph
    bad = _violations(edges, source, forbidden)
    assert not bad, f"{source} must not import {' or '.join(forbidden)}:\n" + "\n".join(
        f"  {e.where(modules, REPO)}: {e.source} imports {e.target} ({e.kind})" for e in bad)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycles(graph, package):
    modules, edges = graph
    found = [c for c in cycles(modules, edges) if any(e.source.split(".")[0] == package for e in c)]
    assert not found, f"{len(found)} import cycle(s) in {package} (module-level and TYPE_CHECKING imports):\n" + \
        "\n".join(f"  {describe(c, modules)}" for c in found)


def _module_file(name: str) -> Path | None:
    path = REPO.joinpath(*name.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def test_moved_names_point_at_modules_that_exist():
    missing = {old: [t for t in new if _module_file(t) is None] for old, new in _moved_table().items()}
    assert not {k: v for k, v in missing.items() if v}, f"distlab/_moved.py points at missing modules: {missing}"


def test_no_old_flat_name_is_still_a_file():
    """An old name that is also a file would be imported from the file, not answered by _moved."""
    left = sorted(old for old in _moved_table() if _module_file(old) or REPO.joinpath(*old.split(".")).exists())
    assert not left, f"old module names still in the tree (move them, or drop them from distlab/_moved.py): {left}"


# The rules themselves, on a tree made for them.
def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_package_importing_its_submodules_is_no_cycle_but_a_real_one_is_found(tmp_path):
    _tree(tmp_path, {
        "pkg/__init__.py": "from .a import f\nfrom . import b\n",
        "pkg/a.py": "from . import b\nfrom pkg.b import g\n",  # a -> b, and b -> a only inside a function
        "pkg/b.py": "def g():\n    from .a import f\n",
        "pkg/c.py": "from typing import TYPE_CHECKING\nfrom .d import x\nif TYPE_CHECKING:\n    from .a import f\n",
        "pkg/d.py": "import pkg.c\nx = 1\n",  # c <-> d at import time
        "pkg/e.py": "from pkg import f\n",  # reads pkg's attribute: e -> pkg
        "pkg/sub/__init__.py": "from ..e import *\nfrom pkg.old import y\n",  # sub -> e -> pkg -> ... -> sub?
    })
    modules, edges = import_graph(tmp_path, {"pkg.old": ("pkg.sub",)}, packages=("pkg",))
    assert Import("pkg.b", "pkg.a", 2, "function") in edges
    assert Import("pkg.c", "pkg.a", 4, "type_checking") in edges
    assert Import("pkg.sub", "pkg.sub", 2, "module") in edges  # an old name resolved to its new module
    found = [[(e.source, e.target) for e in c] for c in cycles(modules, edges)]
    assert found == [[("pkg.c", "pkg.d"), ("pkg.d", "pkg.c")], [("pkg.sub", "pkg.sub")]]
    described = describe(cycles(modules, edges)[0], modules, tmp_path)
    assert described == "pkg.c -> pkg.d -> pkg.c   [pkg/c.py:2 (module), pkg/d.py:1 (module)]"


def test_a_type_checking_import_back_closes_a_cycle_and_layers_see_function_imports(tmp_path):
    _tree(tmp_path, {
        "top/__init__.py": "",
        "top/low/__init__.py": "",
        "top/low/run.py": "def f():\n    import top.high.lab\n",
        "top/high/__init__.py": "",
        "top/high/lab.py": "from typing import TYPE_CHECKING\nfrom ..low import run\nif TYPE_CHECKING:\n"
                           "    from .view import V\n",
        "top/high/view.py": "from .lab import *\n",
    })
    modules, edges = import_graph(tmp_path, {}, packages=("top",))
    assert [[(e.source, e.target, e.kind) for e in c] for c in cycles(modules, edges)] == [
        [("top.high.lab", "top.high.view", "type_checking"), ("top.high.view", "top.high.lab", "module")]]
    assert _violations(edges, "top.low", ("top.high",)) == [Import("top.low.run", "top.high.lab", 2, "function")]
