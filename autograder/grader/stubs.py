"""The learner's stubs, made from the reference solutions (``python -m autograder stubs`` writes them).

Every ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` region in
``solutions/*.py`` becomes ``raise NotImplementedError`` in ``exercises/``,
the way nbgrader treats solution regions in notebooks, so the stubs keep the
solutions' names, signatures and docstrings and cannot drift from them.
A file that is still its stub is told so without a launch (:func:`untouched`).
"""
from __future__ import annotations

import ast
from pathlib import Path

from distlab.runtime.importing import REPO_ROOT

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"


def strip_solutions(source: str, name: str = "<source>") -> str:
    out: list[str] = []
    inside = False
    for number, line in enumerate(source.splitlines(keepends=True), 1):
        stripped = line.strip()
        if stripped == BEGIN:
            if inside:
                raise ValueError(f"{name}:{number}: nested {BEGIN}")
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}# YOUR CODE HERE\n{indent}raise NotImplementedError\n")
        elif stripped == END:
            if not inside:
                raise ValueError(f"{name}:{number}: {END} without {BEGIN}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{name}: {BEGIN} is never closed")
    return "".join(out)


def generate(src: Path = REPO_ROOT / "solutions", dst: Path = REPO_ROOT / "exercises") -> dict[Path, str]:
    """``{stub path: stub text}`` for every solution file."""
    return {dst / p.name: strip_solutions(p.read_text(), str(p)) for p in sorted(src.glob("ex*.py"))}


def differing(stubs: dict[Path, str], folder: Path | None = None) -> list[Path]:
    """The stubs of ``stubs`` (:func:`generate`'s) whose file is missing or holds other text: in ``folder``, by
    name, or where ``stubs`` puts them."""
    where = {p: folder / p.name if folder else p for p in stubs}
    return [p for p, text in stubs.items() if not where[p].is_file() or where[p].read_text() != text]


def raises_not_implemented(node: ast.AST) -> bool:
    """Whether ``node`` is a ``raise NotImplementedError`` statement: what a stub's functions still do."""
    return isinstance(node, ast.Raise) and "NotImplementedError" in ast.unparse(node)


def unwritten(body: list[ast.stmt], prefix: str = ""):
    """``("name", raise)`` for each ``raise NotImplementedError`` in a module's functions, and
    ``("Class.method", raise)`` in its classes' methods (exercise 8's graded pieces are classes)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from ((prefix + node.name, r) for r in ast.walk(node) if raises_not_implemented(r))
        elif isinstance(node, ast.ClassDef):
            yield from unwritten(node.body, f"{prefix}{node.name}.")


def untouched(path: Path, solution: Path, max_bytes: int = 1 << 20) -> str | None:
    """If the file at ``path`` is still the stub made from ``solution`` (the same code; comments and
    blank lines aside), the one line of feedback that says so; otherwise ``None``.

    The grader then need not start a job to learn that every function raises
    ``NotImplementedError`` (seconds of start-up per rank). It parses the file and never runs it; a file
    it cannot read or parse, or a large one, is graded by running it, as any other.
    """
    try:
        if path.stat().st_size > max_bytes:
            return None
        mine = ast.parse(path.read_text(), filename=str(path))
        stub = ast.parse(strip_solutions(solution.read_text(), str(solution)), filename=str(solution))
    except (OSError, ValueError, SyntaxError, RecursionError, MemoryError):
        return None
    if ast.dump(mine) != ast.dump(stub):
        return None
    left = list(unwritten(mine.body))
    if not left:
        return None
    where, raise_ = left[0]
    names = ", ".join(dict.fromkeys(name.split(".")[0] for name, _ in left))
    return (f"not implemented yet ({path.name} line {raise_.lineno} in {where}: {ast.unparse(raise_)}); "
            f"still to write: {names}")
