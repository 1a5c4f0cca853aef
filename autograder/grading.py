"""Grade several files of one exercise in a single torchrun launch.

A launch costs seconds of process start-up; the test suite grades a solution
and its mutants (known mistakes) together. ``rank_main`` receives the list of
paths and returns one observation per path; ``verdict(report, per_rank)``
turns one path's observations from every rank into criteria.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from distlab import torchrun

from .registry import Exercise
from .report import ExerciseReport


def grade_files(exercise: Exercise, rank_main: Callable, paths: Sequence[str | Path], *, world: int,
                timeout: float, verdict: Callable[[ExerciseReport, list], None],
                args: tuple = ()) -> list[ExerciseReport]:
    """One launch of ``rank_main(paths, *args)`` on ``world`` ranks; one report per path."""
    run = torchrun(rank_main, world, args=([str(p) for p in paths], *args), timeout=timeout)
    reports = []
    for i in range(len(paths)):
        report = ExerciseReport(exercise.number, exercise.name, exercise.max_score)
        report.measurements["launch_s"] = round(run.wall_s, 2)
        verdict(report, [per_rank[i] for per_rank in run.results])
        reports.append(report)
    return reports
