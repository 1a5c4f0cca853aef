"""A crash in one graded part costs that part only (``autograder.grader.parts``): the parts kept are graded, the
part that was running is named, the rest runs again in another launch, and a part that needs the one that
ended is not run again.

The rank program (``tests.helpers.targets.parted``) records in which launch each part ran, so what is asserted
is which launch kept what: decided by the code, not by which rank got where first.
"""
from __future__ import annotations

import pytest

from autograder.grader.parts import launch_parts
from distlab.runtime.process import Budget
from tests.helpers.targets.parted import PARTS, parted_main

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _untraced(monkeypatch):
    monkeypatch.setenv("DISTLAB_TRACE", "0")  # the paths are names, not files to trace


def _launch(behaviour: dict, timeout_s: float = 60.0, **kw):
    return launch_parts(parted_main, list(behaviour), world=2, timeout=Budget.read(timeout_s), parts=PARTS,
                        args=(behaviour,), **kw)


def test_a_part_that_never_returns_costs_itself_only():
    # rank 1 loops in part b of the first file: the launch runs out of time with no rank advancing (a time-out,
    # no collective waited in). Part a was kept by both ranks in launch 0; c, which rank 0 alone kept, runs
    # again in launch 1 with the second file, which rank 1 never reached. 5 s: the launch ends 5 s after the last
    # advance (rank 0's, soon after start-up) unless that came after 3 x 5 - 5 s, so a loaded machine's slow
    # start-up is not taken for a rank still advancing (MachineTooSlow); a 2 s limit left it 1 s.
    (first, second), wall_s = _launch({"one": {"b": "loop on 1"}, "two": {}}, timeout_s=5.0)
    assert first.ended.keys() == {"b"} and "did not return in time" in first.ended["b"]
    assert "rank 1 is at parted.py" in first.ended["b"]
    assert first.part("a") == [[0, 2], [0, 2]] and first.part("b") is None
    assert first.part("c") == [[1, 2], [1, 2]]
    assert all(second.part(p) == [[1, 2], [1, 2]] for p in PARTS) and not second.ended
    assert wall_s is None  # more than one launch: no launch's seconds stand for the grading


def test_a_part_that_needs_the_one_that_ended_is_not_run_again():
    # rank 0 raises in part b; c needs b: nothing of the first file is left to run, so the second launch has
    # the second file only (1 path), which rank 0 never reached.
    (first, second), _ = _launch({"one": {"b": "raise on 0"}, "two": {}}, needs={"c": ("b",)})
    assert "ValueError: part b of one raised on rank 0" in first.ended["b"]
    assert first.unrun == {"c": "b"} and first.part("c") is None
    assert first.part("a") == [[0, 2], [0, 2]]
    assert all(second.part(p) == [[1, 1], [1, 1]] for p in PARTS)

