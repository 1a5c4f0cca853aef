"""Which exercises exist: every ``autograder/checks/exNN_*/`` package is one.

A check package defines ``EXERCISE = Exercise(...)`` and ``grade(paths) -> list[ExerciseReport]``
(the shape every check has: ``autograder/checks/README.md``). Adding an exercise is adding a package;
nothing else needs to be edited.

:func:`exercises` reads each package's ``EXERCISE = Exercise(...)`` from its ``__init__.py``, without
importing it: the processes that only list or supervise gradings (the CLI, a notebook's
``check(N)``, nbgrader's steps) then never import torch, which costs seconds each.
:func:`check_module` imports one, for the grading process (:func:`check_modules` all of them, for
tests). :func:`hints` reads a package's ``hints.py`` the same way, by itself (it imports nothing of its
package).
"""
from __future__ import annotations

import ast
import functools
import importlib
import pkgutil
import runpy
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from .. import checks
from .report import ExerciseReport


@dataclass(frozen=True)
class Exercise:
    number: int
    name: str
    filename: str          # the learner's file, e.g. "ex01_ddp.py"
    max_score: float
    time_limit: float      # seconds for the whole grading subprocess

    def new_report(self) -> ExerciseReport:
        """An empty report for this exercise, to be judged (``ExerciseReport.judge``)."""
        return ExerciseReport(self.number, self.name, self.max_score)


def _check_names() -> list[str]:
    return sorted(info.name for info in pkgutil.iter_modules(checks.__path__)
                  if info.ispkg and info.name.startswith("ex"))


def check_module(number: int) -> ModuleType:
    """Exercise ``number``'s check package, imported alone: a grading process loads no other exercise's code
    (a package that does not import costs only its own exercise)."""
    return importlib.import_module(f"{checks.__name__}.{_folder(number).name}")


def check_modules() -> dict[int, ModuleType]:
    found: dict[int, ModuleType] = {}
    for name in _check_names():
        module = importlib.import_module(f"{checks.__name__}.{name}")
        found[module.EXERCISE.number] = module
    return dict(sorted(found.items()))


def declared(path: Path) -> Exercise:
    """The ``EXERCISE = Exercise(keyword=literal, ...)`` of the check package whose ``__init__.py`` is at ``path``."""
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["EXERCISE"]:
            call = node.value
            if isinstance(call, ast.Call) and not call.args:
                return Exercise(**{kw.arg: ast.literal_eval(kw.value) for kw in call.keywords})
    raise ValueError(f"{path}: no `EXERCISE = Exercise(number=..., ...)` with literal keywords")


@functools.lru_cache(maxsize=1)
def _packages() -> tuple[tuple[int, Exercise, Path], ...]:
    folder = Path(checks.__file__).parent
    found = [(declared(folder / name / "__init__.py"), folder / name) for name in _check_names()]
    return tuple(sorted((ex.number, ex, path) for ex, path in found))


def exercises() -> dict[int, Exercise]:
    return {n: ex for n, ex, _ in _packages()}


def _folder(number: int) -> Path:
    """Exercise ``number``'s check package folder."""
    return next(path for n, _, path in _packages() if n == number)


Hints = dict[str, tuple[str, str, str]]  # criterion function name -> (concept, mechanism, API)


def hints(number: int) -> Hints:
    """Exercise ``number``'s ``HINTS`` from its package's ``hints.py``; ``{}`` where it has none.

    The file is run on its own (``runpy``), not imported as part of the package, so reading the hints
    costs no torch import; it must therefore hold plain data and import nothing relative.
    """
    path = _folder(number) / "hints.py"
    return dict(runpy.run_path(str(path))["HINTS"]) if path.is_file() else {}
