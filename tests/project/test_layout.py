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
import fnmatch
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("distlab", "autograder", "benchmarks")
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
    ("autograder.grader", ("autograder.commands",)),
    ("autograder.rank", ("autograder.grader", "autograder.commands", "autograder.checks")),
    ("benchmarks", ("tests",)),
], ids=["runtime-imports-neither-measure-nor-lab", "measure-does-not-import-lab",
        "distlab-imports-nothing-from-autograder", "grader-imports-no-command",
        "rank-imports-neither-grader-commands-nor-checks", "benchmarks-import-no-test"])
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


# The autograder's seam: the learner's code runs only inside the ranks; the verdict is the grading process's.
RANK_SIDE = ("autograder.rank", "autograder.rank.*", "autograder.checks.*.probes")
GRADER_SIDE = ("autograder.grader", "autograder.grader.*", "autograder.commands", "autograder.commands.*",
               "*.causes")


def reached(edges: list[Import], source: str, modules: dict[str, Path]) -> dict[str, list[Import]]:
    """Every module of the tree that ``source`` loads, directly or through others: the shortest chain to each."""
    out: dict[str, list[Import]] = {}
    for e in edges:
        if e.target in modules:
            out.setdefault(e.source, []).append(e)
    chains, frontier = {source: []}, [source]
    while frontier:
        following = []
        for v in frontier:
            for e in out.get(v, []):
                if e.target not in chains:
                    chains[e.target] = chains[v] + [e]
                    following.append(e.target)
        frontier = following
    del chains[source]
    return chains


def seam_violations(modules: dict[str, Path], edges: list[Import], root: Path = REPO) -> list[str]:
    """Each rank-side module that loads a grading-process module (a chain of imports of any kind)."""
    found = []
    for name in sorted(m for m in modules if any(fnmatch.fnmatchcase(m, p) for p in RANK_SIDE)):
        for target, chain in sorted(reached(edges, name, modules).items()):
            if any(fnmatch.fnmatchcase(target, p) for p in GRADER_SIDE):
                found.append(f"{name} loads {target}: " + ", ".join(
                    f"{e.where(modules, root)} ({e.kind})" for e in chain))
    return found


def test_the_rank_side_never_loads_the_grading_process(graph):
    """``autograder.rank`` and every check's ``probes`` run in the ranks, beside the learner's code: nothing they
    load (directly or through another module) is the grader's, a command or a check's causes."""
    modules, edges = graph
    rank_side = [m for m in modules if any(fnmatch.fnmatchcase(m, p) for p in RANK_SIDE)]
    assert len(rank_side) >= 20 and "autograder.checks.ex04_fsdp.zero1.probes" in rank_side  # not vacuous
    bad = seam_violations(modules, edges)
    assert not bad, "the rank side loads the grading process's code:\n  " + "\n  ".join(bad)


def tracked_python(root: Path = REPO) -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z", "*.py"], cwd=root, capture_output=True, check=True).stdout
    return [root / name for name in listed.decode().split("\0") if name]


def old_name_imports(files: list[Path], moved: dict[str, tuple[str, ...]], root: Path) -> list[str]:
    """``path:line: old -> new`` for every import of an old name in ``files``: ``import old``, ``from old import
    x``, ``from pkg import m`` where ``pkg.m`` is old, and their relative spellings."""
    found = set()
    for path in files:
        package = ".".join(path.relative_to(root).parent.parts)
        try:
            tree = ast.parse(path.read_text(), str(path))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], node.module or ""] if node.level
                                else [node.module or ""]).strip(".")
                names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                continue
            found |= {f"{path.relative_to(root)}:{node.lineno}: {n} -> {', '.join(moved[n])}" for n in names
                      if n in moved}
    return sorted(found)


def _all_moved() -> dict[str, tuple[str, ...]]:
    from autograder._moved import MOVED as autograder_moved  # the standard library only, as distlab's

    return {**_moved_table(), **autograder_moved}


def test_no_tracked_file_imports_a_released_name():
    """Old names are for code outside the repository; every file of it imports today's modules."""
    bad = old_name_imports(tracked_python(), _all_moved(), REPO)
    assert not bad, "imports of old module names (import the new one):\n  " + "\n  ".join(bad)


def test_the_autograders_old_names_point_at_modules_that_exist_and_are_no_files():
    from autograder._moved import MOVED as autograder_moved

    missing = {old: [t for t in new if _module_file(t) is None] for old, new in autograder_moved.items()}
    assert not {k: v for k, v in missing.items() if v}, f"autograder/_moved.py points at missing modules: {missing}"
    left = sorted(old for old in autograder_moved if _module_file(old))
    assert not left, f"old autograder module names still in the tree: {left}"


def test_each_seam_and_name_rule_catches_a_made_up_tree(tmp_path):
    _tree(tmp_path, {
        "autograder/__init__.py": "",
        "autograder/rank/__init__.py": "",
        "autograder/rank/spies.py": "def f():\n    from ..grader import report\n",  # rank -> grader, in a function
        "autograder/grader/__init__.py": "",
        "autograder/grader/report.py": "from ..commands import check\n",  # grader -> commands
        "autograder/commands/__init__.py": "",
        "autograder/commands/check.py": "",
        "autograder/checks/__init__.py": "",
        "autograder/checks/ex01/__init__.py": "",
        "autograder/checks/ex01/observed.py": "from .causes import why\n",
        "autograder/checks/ex01/causes.py": "why = 1\n",
        "autograder/checks/ex01/probes.py": "from .observed import Run\n",  # probes -> observed -> causes
        "autograder/checks/ex01/part/__init__.py": "",
        "autograder/checks/ex01/part/probes.py": "from ...ex01 import observed\n",  # a sub-package's probes too
        "benchmarks/__init__.py": "",
        "benchmarks/bench_x.py": "def run():\n    from tests import cluster\n",
        "tests/cluster.py": "",
        "tools/use.py": "import distlab.launch\nfrom distlab import hang\nfrom .x import y\n",
        "distlab/lab/new.py": "from .. import hang\n",  # relative: distlab.hang
    })
    modules, edges = import_graph(tmp_path, {}, packages=("autograder", "benchmarks"))
    bad = seam_violations(modules, edges, tmp_path)
    assert [b.split(":")[0] for b in bad] == [
        "autograder.checks.ex01.part.probes loads autograder.checks.ex01.causes",
        "autograder.checks.ex01.probes loads autograder.checks.ex01.causes",
        "autograder.rank.spies loads autograder.commands.check",
        "autograder.rank.spies loads autograder.grader.report"]
    assert "autograder/checks/ex01/probes.py:1 (module), autograder/checks/ex01/observed.py:1 (module)" in bad[1]
    assert _violations(edges, "autograder.grader", ("autograder.commands",)) == [
        Import("autograder.grader.report", "autograder.commands.check", 1, "module")]
    assert _violations(edges, "benchmarks", ("tests",)) == [Import("benchmarks.bench_x", "tests", 2, "function")]
    moved = {"distlab.launch": ("distlab.runtime.launch",), "distlab.hang": ("distlab.lab.hang",)}
    assert old_name_imports([tmp_path / "tools" / "use.py", tmp_path / "distlab" / "lab" / "new.py"], moved,
                            tmp_path) == ["distlab/lab/new.py:1: distlab.hang -> distlab.lab.hang",
                                          "tools/use.py:1: distlab.launch -> distlab.runtime.launch",
                                          "tools/use.py:2: distlab.hang -> distlab.lab.hang"]


OLD_NAMES_IN_THREADS = """
import sys, threading, warnings
from distlab._moved import install
NEW = ["json", "csv", "string", "textwrap", "fractions", "decimal", "difflib", "heapq", "bisect", "shlex",
       "statistics", "colorsys", "calendar", "zipfile", "tarfile", "gzip", "bz2", "lzma", "pprint", "html"]
table = {f"old_{n}": (n,) for n in NEW}
install(table)
barrier = threading.Barrier(len(table))
got = {}

def load(name):
    barrier.wait()  # every thread imports its old name at the same moment
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got[name] = __import__(name)

threads = [threading.Thread(target=load, args=(n,)) for n in table]
for t in threads: t.start()
for t in threads: t.join()
wrong = [n for n in table if got[n] is not sys.modules[table[n][0]] or got[n].__spec__.name != table[n][0]]
print(len(got), wrong)
"""


def test_old_names_answer_the_new_modules_from_any_thread():
    """The finder keeps no per-import state on itself: old names imported from many threads at once each get
    their own new module, with its own spec (what reloading and pickling read). Made-up names for modules of
    the standard library: torch's own import is not thread-safe."""
    proc = subprocess.run([sys.executable, "-c", OLD_NAMES_IN_THREADS], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["20", "[]"], proc.stdout


def test_an_old_name_warns_once_at_the_line_that_imported_it(tmp_path):
    (tmp_path / "old.py").write_text("import distlab.hang\nfrom autograder.runner import grade_one\n")
    proc = subprocess.run([sys.executable, "-W", "default", str(tmp_path / "old.py")], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    warned = [line for line in proc.stderr.splitlines() if "DeprecationWarning" in line]
    assert warned == [
        f"{tmp_path / 'old.py'}:1: DeprecationWarning: distlab.hang is distlab.lab.hang now: import that "
        "(the old name goes in a later release)",
        f"{tmp_path / 'old.py'}:2: DeprecationWarning: autograder.runner is autograder.grader.supervise now: "
        "import that (the old name goes in a later release)"], proc.stderr


def test_an_old_name_is_answered_where_its_old_folder_is_left_over(tmp_path):
    """A checkout from before a move keeps the old folder with its ``__pycache__`` (git leaves it): the old name
    is still answered with the new module, not imported as an empty namespace package."""
    (tmp_path / "pkg" / "old" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    code = ("import sys, warnings; warnings.simplefilter('ignore'); from distlab._moved import install; "
            "install({'pkg.old': ('json',)}); import pkg.old; print(pkg.old is sys.modules['json'])")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"})
    assert proc.stdout.strip() == "True", proc.stderr
