"""Answers to graded functions cannot be imported from the runtime (the guide's rule; issue 38).

Every graded function of ``solutions/`` (one whose body holds a ``### BEGIN SOLUTION`` block) is compared with
every function of ``distlab/``, the package learners import, by their bodies' ASTs with the names numbered in
order of appearance, the constants reduced to their types and the docstrings dropped: a renamed copy is the
same answer. A match is allowed only where a check recognises the copy when it is handed in (a
``RuntimeCopies`` of its package: exercise 3's ``median_seconds`` is ``distlab.measure.timing.median_seconds``,
which notebook 03 and the benchmarks use).
"""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

from tests.helpers import REPO

MIN_STATEMENTS = 3  # a two-line body ("return x.sum() / n") is a phrase of the language, not an answer


class _Numbered(ast.NodeTransformer):
    """Names numbered by first appearance, constants by their type, annotations dropped."""

    def __init__(self):
        self.names: dict[str, str] = {}

    def _name(self, name: str) -> str:
        return self.names.setdefault(name, f"n{len(self.names)}")

    def visit_Name(self, node):
        return ast.copy_location(ast.Name(id=self._name(node.id), ctx=node.ctx), node)

    def visit_arg(self, node):
        return ast.copy_location(ast.arg(arg=self._name(node.arg)), node)

    def visit_Constant(self, node):
        return ast.copy_location(ast.Constant(value=type(node.value).__name__), node)


def shape(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The normalised body of ``fn`` (None when it is too short to be an answer)."""
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                       and isinstance(s.value.value, str))]
    if sum(isinstance(n, ast.stmt) for s in body for n in ast.walk(s)) < MIN_STATEMENTS:
        return None
    return ast.dump(_Numbered().visit(ast.Module(body=body, type_ignores=[])), annotate_fields=False)


def functions(path: Path):
    """``(qualified name, node)`` of every function of the file, methods as ``Class.method``."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{item.name}", item


def graded(solutions: Path) -> dict[str, str]:
    """``{"exNN_name.py::function": shape}`` of every graded function of the solutions."""
    out = {}
    for path in sorted(solutions.glob("ex*.py")):
        text = path.read_text()
        for name, fn in functions(path):
            if "### BEGIN SOLUTION" in (ast.get_source_segment(text, fn) or "") and (s := shape(fn)):
                out[f"{path.name}::{name}"] = s
    return out


def copies_in(runtime: Path, answers: dict[str, str], package: str) -> list[tuple[str, str]]:
    """``(answer, dotted runtime function)`` for each function under ``runtime`` whose body is an answer's."""
    by_shape = {s: key for key, s in answers.items()}
    found = []
    for path in sorted(runtime.rglob("*.py")):
        module = ".".join((package, *path.relative_to(runtime).with_suffix("").parts)).removesuffix(".__init__")
        for name, fn in functions(path):
            if (s := shape(fn)) in by_shape:
                found.append((by_shape[s], f"{module}.{name}"))
    return found


def recognised_copies() -> set[str]:
    """The runtime functions some check recognises when handed in (its ``RuntimeCopies``)."""
    out = set()
    for package in sorted((REPO / "autograder" / "checks").glob("ex*/answers.py")):
        module = importlib.import_module(f"autograder.checks.{package.parent.name}.answers")
        out |= {dotted for copies in module.ANSWERS.graded.values() for dotted in copies}
    return out


def test_no_graded_function_has_an_unrecognised_copy_in_distlab():
    answers = graded(REPO / "solutions")
    assert len(answers) >= 20, sorted(answers)  # the rule reads the solutions it should
    unguarded = [(a, c) for a, c in copies_in(REPO / "distlab", answers, "distlab") if c not in recognised_copies()]
    assert not unguarded, ("graded answers the runtime ships, which no check recognises when handed in "
                           f"(move them out of distlab/, or list them in the check's RuntimeCopies): {unguarded}")


def test_a_renamed_copy_with_other_constants_is_the_same_answer(tmp_path):
    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "ex99_mean.py").write_text(
        "def mean(xs, eps=1e-6):\n    ### BEGIN SOLUTION\n    total = sum(xs)\n    n = len(xs)\n"
        "    return total / (n + eps)\n    ### END SOLUTION\n")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "stats.py").write_text(
        'def average(values, tiny=1e-3):\n    """A docstring the answer does not have."""\n    s = sum(values)\n'
        "    count = len(values)\n    return s / (count + tiny)\n\n\ndef other(values):\n    s = max(values)\n"
        "    count = len(values)\n    return s * count\n")
    answers = graded(tmp_path / "solutions")
    assert list(answers) == ["ex99_mean.py::mean"]
    assert copies_in(tmp_path / "lib", answers, "lib") == [("ex99_mean.py::mean", "lib.stats.average")]
