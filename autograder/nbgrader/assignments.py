"""The nbgrader assignments, one per exercise, generated from the registry and ``solutions/``.

For every exercise that :mod:`autograder.grader.registry` knows, ``source/exNN_name/``
in the course directory gets

* ``exNN_name.py``: the learner's module, the stub that
  :mod:`autograder.grader.stubs` makes from ``solutions/exNN_name.py`` (each
  ``### BEGIN SOLUTION`` region becomes ``raise NotImplementedError``, as
  nbgrader does in notebooks). nbgrader copies non-notebook files as they
  are, so this is what is released, and the learner submits it, edited,
  beside the notebook;
* ``exNN_name.ipynb``: the instructions (the solution module's docstring and
  the contract of every function to write), a cell that lists what is still
  a stub, and one locked test cell worth the exercise's ``max_score`` that
  grades the module with the checks of ``python -m autograder`` (see
  :mod:`autograder.nbgrader.cell`). Its ``### BEGIN HIDDEN TESTS`` region,
  removed from the released notebook and restored at autograding, makes the
  cell load the instructor's grader afresh whatever the learner's cells did.

Nothing here is exercise-specific: a new ``autograder/checks/exNN_*/`` package
and ``solutions/exNN_*.py`` join the course with no edit.
"""
from __future__ import annotations

import ast
import json
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from distlab.runtime.importing import REPO_ROOT

from ..grader.registry import Exercise, exercises
from ..grader.stubs import BEGIN, strip_solutions
from .cell import fresh_grader_source

SOLUTIONS = REPO_ROOT / "solutions"
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def assignment_id(ex: Exercise) -> str:
    """``"ex01_ddp"``: the assignment, its notebook and its module share the exercise file's stem."""
    return Path(ex.filename).stem


def grade_id(ex: Exercise) -> str:
    return f"{assignment_id(ex)}_checks"


def released_files(ex: Exercise) -> list[str]:
    """Files of the assignment besides the notebook that the learner edits and submits."""
    return [ex.filename]


def _markdown(docstring: str) -> str:
    """reST-ish docstring text to Markdown (double backticks become single ones)."""
    return docstring.replace("``", "`")


def contracts(solution_source: str) -> list[tuple[str, str]]:
    """``[(signature, docstring)]`` of every top-level function or class with a solution region."""
    tree = ast.parse(solution_source)
    lines = solution_source.splitlines()
    out = []
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        body = "\n".join(lines[node.lineno - 1:node.end_lineno])
        if BEGIN not in body:
            continue
        if isinstance(node, ast.ClassDef):  # exercise 8's graded pieces are classes: "class Name(Base)"
            bases = ", ".join(ast.unparse(b) for b in node.bases)
            signature = f"class {node.name}({bases})" if bases else f"class {node.name}"
        else:
            header = ast.unparse(node).split("\n")
            signature = next(h for h in header if h.lstrip().startswith(("def ", "async def "))).rstrip(":")
            signature = signature.removeprefix("async ").removeprefix("def ")
        out.append((signature, _markdown(ast.get_docstring(node) or "")))
    return out


# The cells import ``autograder.nbgrader_cell`` (a re-export of :mod:`.cell`), not the module itself:
# it is what every notebook in learners' hands imports, so a notebook works with any checkout.
def check_cell_source(ex: Exercise, hidden: bool = True) -> str:
    """The test cell: the instructor's version, with the hidden region unless ``hidden=False``."""
    head = (f"# Grades {ex.filename} (beside this notebook) with the checks of\n"
            f"# `python -m autograder grade --exercise {ex.number}`; the cell's value is your score out of "
            f"{ex.max_score:g}.\n")
    guard = f"### BEGIN HIDDEN TESTS\n{fresh_grader_source()}### END HIDDEN TESTS\n" if hidden else ""
    return head + guard + f"from autograder.nbgrader_cell import grade\ngrade({ex.number})"


def todo_cell_source(ex: Exercise) -> str:
    return ("# Which functions are still stubs? (not graded: run it as often as you like)\n"
            "from autograder.nbgrader_cell import stubs_left\n"
            f"stubs_left({ex.filename!r});")


def build_notebook(ex: Exercise, solution_source: str) -> nbformat.NotebookNode:
    doc = ast.get_docstring(ast.parse(solution_source)) or f"Exercise {ex.number}: {ex.name}"
    title, _, rest = doc.partition("\n")
    functions = "\n\n".join(f"### `{sig}`\n\n{text}" for sig, text in contracts(solution_source))
    cells = [
        new_markdown_cell(f"# {_markdown(title.strip())}\n\n{_markdown(rest.strip())}"),
        new_markdown_cell(
            f"## How to work\n\nWrite your code in **`{ex.filename}`**, the module beside this notebook "
            "(open it from the file browser), not in this notebook. The grader imports that module inside "
            "every rank that `torchrun` starts. Submit the notebook and the module together.\n\n"
            f"Check as often as you like from a terminal with `python -m autograder grade . --exercise {ex.number}` "
            f"or by running the last cell here; both run the same checks, so the score you see is the score "
            f"you get ({ex.max_score:g} points).\n\n## What to write\n\n{functions}"),
        new_code_cell(todo_cell_source(ex)),
        new_markdown_cell(
            "## Check\n\nThe cell below grades your module and prints what each check found; a failing "
            "check names the mistake with numbers (max abs difference, which rank). Do not edit or "
            "delete it: at grading time it is restored from the instructor's copy."),
        new_code_cell(check_cell_source(ex), metadata={"nbgrader": {
            "grade": True, "grade_id": grade_id(ex), "locked": True, "points": ex.max_score,
            "schema_version": 3, "solution": False, "task": False}}),
    ]
    return new_notebook(cells=cells, metadata={"kernelspec": KERNELSPEC, "language_info": {"name": "python"}})


MANIFEST = "assignments.json"


def write_source(course_dir: Path, only: list[int] | None = None) -> list[str]:
    """Write ``source/<assignment>/`` for each exercise (default: all) and the manifest; return the ids.

    The manifest (``assignments.json`` in the course directory) is what
    ``nbgrader_config.py`` reads, so nbgrader's commands need not import the
    check modules (and torch) just to read their configuration.
    """
    written = []
    for n, ex in exercises().items():
        if only and n not in only:
            continue
        solution = (SOLUTIONS / ex.filename).read_text()
        folder = Path(course_dir) / "source" / assignment_id(ex)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / ex.filename).write_text(strip_solutions(solution, ex.filename))
        nbformat.write(build_notebook(ex, solution), folder / f"{assignment_id(ex)}.ipynb")
        written.append(assignment_id(ex))
    write_manifest(course_dir)
    return written


def exclude_overwriting() -> dict[str, list[str]]:
    """For ``Autograde.exclude_overwriting``: keep the learner's module instead of the released stub."""
    return {assignment_id(ex): released_files(ex) for ex in exercises().values()}


def cell_timeout_s() -> int:
    """``Execute.timeout``: the slowest exercise's grading limit plus the kernel's own overhead."""
    return int(max((ex.time_limit for ex in exercises().values()), default=120) + 60)


def write_manifest(course_dir: Path) -> Path:
    """``assignments.json``: each generated assignment's exercise, module and points; the cell timeout."""
    made = {ex.number for ex in exercises().values()
            if (Path(course_dir) / "source" / assignment_id(ex)).is_dir()}
    doc = {
        "cell_timeout_s": cell_timeout_s(),
        "exclude_overwriting": exclude_overwriting(),
        "assignments": {assignment_id(ex): {"exercise": n, "modules": released_files(ex),
                                            "max_score": ex.max_score, "time_limit": ex.time_limit}
                        for n, ex in exercises().items() if n in made},
    }
    path = Path(course_dir) / MANIFEST
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path
