"""Which exercises exist: every ``autograder/checks/exNN_*.py`` module is one.

A check module defines ``EXERCISE = Exercise(...)`` and ``grade(paths) -> list[ExerciseReport]``
(the shape every check has: ``autograder/checks/README.md``).
Adding an exercise is adding a file; nothing else needs to be edited.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from types import ModuleType

from . import checks
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


def check_modules() -> dict[int, ModuleType]:
    found: dict[int, ModuleType] = {}
    for info in pkgutil.iter_modules(checks.__path__):
        if info.name.startswith("ex"):
            module = importlib.import_module(f"{checks.__name__}.{info.name}")
            found[module.EXERCISE.number] = module
    return dict(sorted(found.items()))


def exercises() -> dict[int, Exercise]:
    return {n: m.EXERCISE for n, m in check_modules().items()}
