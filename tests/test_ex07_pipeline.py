"""Exercise 7 (GPipe by hand): the solution scores full marks, each known mistake fails with its
own feedback. The solution and the mutants are graded in one launch (the stub: test_selftest.py)."""
from __future__ import annotations

import pytest

from autograder.checks import ex07_pipeline as check
from tests.helpers import SOLUTIONS, failed, mutant

FILE = check.EXERCISE.filename
SEND_NOW = """            out = stage(x_i)
            dist.send(out.detach().contiguous(), dst=1)  # stage 1 can start on it now
            outputs.append(out)
"""
SEND_LATER = """            out = stage(x_i)
            outputs.append(out)
        for out in outputs:
            dist.send(out.detach().contiguous(), dst=1)
"""
MISTAKES = {
    "one micro-batch": {"m = n_microbatches": "m = 1"},
    "sends after the forward loop": {SEND_NOW: SEND_LATER},
    "loss not scaled": {"cross_entropy(stage(act), y_i) / m": "cross_entropy(stage(act), y_i)"},
    "stage 0 ignores the received gradient": {"out.backward(grad)": "out.sum().backward()"},
}


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    paths = [SOLUTIONS / FILE]
    for i, (name, repl) in enumerate(MISTAKES.items()):
        paths.append(mutant(tmp_path_factory.mktemp(f"m{i}"), FILE, repl))
    graded = check.grade(paths)
    return {"solution": graded[0], **dict(zip(MISTAKES, graded[1:]))}


def test_solution_full_marks(reports):
    r = reports["solution"]
    assert r.score == r.max_score, r.feedback
    # The only timing verdict of this file. It compares timestamps, but the check fixes the timeline
    # with sleeps (Delay: 30 ms per stage-0 forward), so stage 1 starts about three of stage 0's four
    # forwards before stage 0 is done: -92 to -103 ms measured on 2 cores at load 6.5, while a
    # missed overlap needs stage 1 to wake >90 ms late. The mistake (sends after the loop) fails
    # by causality, whatever the load.
    assert r.measurements["stage1_start_minus_stage0_forwards_end_ms"] < 0


def test_no_microbatches_fails_count_and_overlap(reports):
    f = failed(reports["one micro-batch"])
    assert "stage 0 ran 1 forward(s) of [64] rows; expected 4 micro-batches of 16" in \
        f["each stage processes every micro-batch once"]
    assert "not checked" in f["stages overlap in time"]
    # Without micro-batches the maths is still right: only the schedule is wrong.
    assert "loss matches the unsplit model" not in f


def test_sending_after_the_loop_fails_overlap_only(reports):
    f = failed(reports["sends after the forward loop"])
    assert list(f) == ["stages overlap in time"]
    assert "after stage 0 finished all 4 forwards" in f["stages overlap in time"]
    assert "not after the loop" in f["stages overlap in time"]


def test_unscaled_loss_fails_parity_with_the_factor(reports):
    f = failed(reports["loss not scaled"])
    assert "divide each micro-batch's loss by n_microbatches" in f["loss matches the unsplit model"]
    for s in (0, 1):
        assert "4.00x the unsplit model's" in f[f"stage {s} gradients match the unsplit model"]


def test_ignoring_the_received_gradient_fails_stage0_only(reports):
    f = failed(reports["stage 0 ignores the received gradient"])
    assert list(f) == ["stage 0 gradients match the unsplit model"]
    assert "stage 1's gradients match" in f["stage 0 gradients match the unsplit model"]

# The stub's grading (0, "not implemented yet", through the CLI's subprocess) is in
# tests/test_selftest.py, which grades exercise 7's solution and stub as an instructor does.
