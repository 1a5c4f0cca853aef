"""The autograder: ``python -m autograder COMMAND`` (grade, class, selftest, ...), or ``check(N)`` from a notebook.

Its folders are the processes its code runs in, each importing only the ones below it
(``tests/project/test_layout.py`` holds them to it):

* :mod:`autograder.commands`: the commands a person runs (``grade``, ``class``, ``selftest``, ``stubs``,
  ``nbgrader``, ``check(N)``);
* :mod:`autograder.grader`: the grading process (the registry, the launches and their supervision, the
  verdicts and the feedback), where the learner's code never runs;
* :mod:`autograder.rank`: what runs inside a rank around the learner's code (loading, spies, the trace);
* :mod:`autograder.checks`: one package per exercise, its probes on the rank side and its criteria and
  causes on the grader's; :mod:`autograder.nbgrader`: the course's nbgrader cycle.

``check`` loads on first use (PEP 562), so ``from autograder import check`` costs no torch import. The
module names of earlier releases keep working for now (:mod:`autograder._moved`).
"""
from ._moved import install as _install_moved

_install_moved()


def __getattr__(name: str):
    if name == "check":
        from .commands.check import check

        return check
    raise AttributeError(f"module 'autograder' has no attribute {name!r}")
