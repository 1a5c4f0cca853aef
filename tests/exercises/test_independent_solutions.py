"""The suite's own false-negative check: a correct solution of every exercise, written independently
of the reference in another legitimate style (``tests/exercises/independent/``), scores full marks.

Each is graded in its exercise's module fixture (``tests/exercises/test_exNN_*.py``), in the launch that grades
the reference's mutants, so this test costs nothing when those ran first (``make test`` runs them
first: files are collected in order); where one did not (``-k``, or a slow fixture left out), the file
is graded alone here. Marked slow for that reason: ``make test-fast`` leaves it out.
"""
from __future__ import annotations

import pytest

from tests.exercises import independent


@pytest.mark.slow
@pytest.mark.timeout(900)  # only where the fixtures did not run: each file then has a launch of its own
def test_every_independent_solution_scores_full_marks():
    reports = {n: independent.report(n) for n in independent.FILES}
    short = {independent.FILES[n]: f"{r.score:g}/{r.max_score:g}\n{r.feedback}" for n, r in reports.items()
             if r.score < r.max_score}
    assert not short, "\n\n".join(f"{name}: {why}" for name, why in short.items())
    for n, r in reports.items():
        print(f"{independent.FILES[n]}: {r.score:g}/{r.max_score:g}")
