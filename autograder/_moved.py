"""The module names the autograder was released with, before its processes had folders of their own.

Instructors' scripts and notebooks already handed out import ``autograder.notebook``, ``autograder.runner``,
``autograder.harness``... and run ``python -m autograder.stubs`` or ``python -m autograder.nbgrader_course``.
The same finder as distlab's (:mod:`distlab._moved`) answers each old name with the module that now holds
it, with a :class:`DeprecationWarning` naming that module; an old command module run with ``-m`` runs
today's command and says so. ``autograder.nbgrader_cell`` is no old name: it is the import path of the
cells nbgrader generates (:mod:`autograder.nbgrader_cell`), and stays.
"""
from __future__ import annotations

_G, _R, _C = "autograder.grader.", "autograder.rank.", "autograder.commands."
MOVED: dict[str, tuple[str, ...]] = {
    "autograder.harness": ("autograder.rank",),
    **{f"autograder.harness.{m}": (_R + m,) for m in ("errors", "events", "loading", "replace", "spies", "trace")},
    "autograder.answers": (_R + "runtime_copies",),
    **{f"autograder.{m}": (_G + m,) for m in ("advice", "diagnosis", "divergence", "parity", "progress",
                                              "registry", "report", "substitute")},
    "autograder.grading": (_G + "launches",),
    "autograder.runner": (_G + "supervise",),
    "autograder.run_one": (_G + "main",),
    "autograder.notebook": (_C + "check", _G + "hints"),
    "autograder.stubs": (_G + "stubs", _C + "stubs"),
    "autograder.classroom": (_C + "classroom",),
    "autograder.selftest": (_C + "selftest",),
    "autograder.nbgrader_course": ("autograder.nbgrader.course",),
}


def _command(old: str, command: str) -> str:
    """What ``python -m OLD ARGS`` runs: ``python -m autograder COMMAND ARGS``, saying so on stderr."""
    return ("import sys\nfrom autograder.__main__ import main\n"
            f"print({f'python -m {old} is python -m autograder {command} now'!r}, file=sys.stderr)\n"
            f"sys.exit(main([{command!r}, *sys.argv[1:]]))\n")


SCRIPTS = {old: _command(old, command) for old, command in {
    "autograder.stubs": "stubs", "autograder.selftest": "selftest", "autograder.classroom": "class",
    "autograder.nbgrader_course": "nbgrader"}.items()}


def install() -> None:
    from distlab._moved import install as answer

    answer(MOVED, SCRIPTS)
