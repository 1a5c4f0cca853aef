"""What an nbgrader test cell runs: ``from autograder.nbgrader_cell import grade; grade(N)``.

(``autograder.nbgrader_cell`` re-exports this module: it is the import path of
every notebook released to learners.)

The cell grades the exercise module that sits beside the notebook with
exactly the checks of ``python -m autograder grade --exercise N``
(:func:`autograder.commands.check.check`, hence :func:`autograder.grader.supervise.grade_one`:
one subprocess with the exercise's time limit), prints the feedback, and
returns the score. The feedback includes the first tier of the hint of each
failed criterion (``hints.py``; :mod:`autograder.commands.check`), so nbgrader's
released feedback has it too. The score is the cell's value, and nbgrader gives a test
cell whose ``execute_result`` is a number that many points (partial credit,
``nbgrader.utils.determine_grade``), so the gradebook holds the same score as
the CLI, criterion for criterion.

nbgrader scores a test cell 0 if *anything* reaches its stderr, and ipykernel
forwards the kernel's file descriptor 2 to the cell. The ranks' output (gloo
and torchrun warnings included) already stays in the grading subprocess's
log; while the cell runs we also point the kernel's own stderr (Python's and
fd 2) at stdout, so an import warning cannot zero a correct answer. A real
failure is still shown: the feedback lines name it with numbers, the score
says how much it cost, and an error in the grader itself is raised (which
nbgrader scores 0 and shows with its traceback).
"""
from __future__ import annotations

import ast
import contextlib
import os
import sys
from pathlib import Path

from ..commands.check import check
from ..grader.stubs import unwritten


@contextlib.contextmanager
def stderr_to_stdout():
    """Send Python's ``sys.stderr`` and the process's fd 2 to stdout until the block ends."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = None
    with contextlib.suppress(OSError, ValueError):
        saved = os.dup(2)
        os.dup2(1, 2)
    try:
        with contextlib.redirect_stderr(sys.stdout):
            yield
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        if saved is not None:
            os.dup2(saved, 2)
            os.close(saved)


def grade(exercise: int, directory: str | Path = ".") -> float:
    """Grade exercise ``exercise`` from ``directory`` (the notebook's folder); return its score.

    Use it as the last line of a test cell so the score is the cell's value.
    """
    with stderr_to_stdout():
        report = check(exercise, directory, raise_on_fail=False, hint=1)
    return float(report.score)


def fresh_grader_source() -> str:
    """The code a test cell runs first at autograding (kept out of the released notebook).

    Cells the learner added run in the same kernel before the test cells, and
    the kernel's working directory (the submission) comes first on
    ``sys.path``: a submitted ``autograder.py`` or a cell that patches
    ``autograder.commands.check.check`` would otherwise grade itself. This drops the
    submission folder from ``sys.path`` and forgets every loaded
    ``autograder``/``distlab`` module, so the import that follows loads the
    instructor's grader afresh. It is plain code (not a call into this
    module) because this module is exactly what it must not trust.
    """
    return (
        "import os as _os, sys as _sys\n"
        "_sys.path[:] = [_p for _p in _sys.path if _p not in ('', '.', _os.getcwd())]\n"
        "for _m in [_m for _m in _sys.modules if _m.split('.')[0] in ('autograder', 'distlab')]:\n"
        "    del _sys.modules[_m]\n"
    )


def stubs_left(filename: str | Path, directory: str | Path = ".") -> list[str]:
    """Print (and return) the functions of the module that still only ``raise NotImplementedError``.

    Reads the file without running it, so it is instant and safe to run anywhere.
    """
    path = Path(directory) / filename
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except FileNotFoundError:
        print(f"{filename} is not beside this notebook: it is the file you edit and submit")
        return []
    except SyntaxError as exc:
        print(f"{filename} line {exc.lineno}: syntax error: {exc.msg}")
        return []
    left = list(dict.fromkeys(name for name, _ in unwritten(tree.body)))
    print(f"still to write in {filename}: {', '.join(left)}" if left else
          f"no stubs left in {filename}: run the check below")
    return left
