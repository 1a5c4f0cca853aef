"""Exercise 2: the reference solution scores full marks, the stub 0, and each usual mistake fails
with its own feedback. The solution and the mutants are graded in one launch (``grade``)."""
from __future__ import annotations

import pytest

from autograder.checks import ex02_accumulation as check
from autograder.runner import grade_one

from tests.helpers import EXERCISES, failed, feedback_of, solution_and_mutants

FILE = check.EXERCISE.filename
MUTANTS = {
    "not_divided_no_sync": {
        " * (len(y) / total)": "",
        "contextlib.nullcontext() if boundary else model.no_sync()": "contextlib.nullcontext()",
    },
    "zero_grad_every_micro_step": {
        "                loss.backward()\n": "                optimizer.zero_grad()\n                loss.backward()\n",
    },
    "divided_by_k": {" * (len(y) / total)": " / accumulation_steps"},
    "step_every_micro_step": {
        "        optimizer.step()\n        optimizer.zero_grad()\n": "",
        "            window_loss += loss.item()\n":
            "            window_loss += loss.item()\n            optimizer.step()\n            optimizer.zero_grad()\n",
    },
}


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict:
    paths = solution_and_mutants(tmp_path_factory.mktemp("ex02"), FILE, MUTANTS)
    return dict(zip(paths, check.grade(list(paths.values()))))


def test_solution_full_marks(reports):
    report = reports["solution"]
    assert report.score == report.max_score, report.feedback
    assert report.measurements["equal_max_abs_diff_vs_reference"] < 1e-5


@pytest.mark.slow
def test_stub_not_implemented():
    report = grade_one(check.EXERCISE, EXERCISES)
    assert report.score == 0
    assert "not implemented yet" in report.feedback


def test_loss_not_divided(reports):
    report = reports["not_divided_no_sync"]
    msg = "is the micro-batch gradients not divided, not the mean over its N={} samples"
    assert msg.format(32) in feedback_of(report, "after 4 micro-batches")
    assert msg.format(24) in feedback_of(report, "unequal sizes")


def test_short_window_divided_by_k(reports):
    report = reports["divided_by_k"]
    short = feedback_of(report, "final short window")
    assert "micro-batch gradients divided by accumulation_steps=4" in short
    assert "normalise the final, shorter window over its own samples" in short
    unequal = feedback_of(report, "unequal sizes")
    assert "equal weights" not in unequal  # k=3 windows: 1/k is 1/3 there
    assert "divided by accumulation_steps=3" in unequal
    # Every window of the unequal scenario has k micro-batches: no "shorter window" advice there.
    assert "scale each micro-batch's mean loss by n_i / N" in unequal and "shorter" not in unequal
    assert not any("[equal sizes" in name for name in failed(report))


def test_allreduce_every_micro_step(reports):
    report = reports["not_divided_no_sync"]
    allreduce = feedback_of(report, "all-reduced once")
    assert "[4, 4, 4] times per optimizer step" in allreduce and "model.no_sync()" in allreduce
    assert "identical gradients" in feedback_of(report, "still differ inside a window")


def test_zero_grad_every_micro_step(reports):
    report = reports["zero_grad_every_micro_step"]
    msg = "zero_grad() ran in the middle of a window (after micro-step 1 of 4)"
    assert msg in feedback_of(report, "one optimizer step and zero_grad per window")
    assert msg in feedback_of(report, "after 4 micro-batches")


def test_step_every_micro_step(reports):
    report = reports["step_every_micro_step"]
    msg = "optimizer.step() ran 12 times for 12 micro-batches with accumulation_steps=4"
    assert msg in feedback_of(report, "one optimizer step and zero_grad per window")
    assert "final short window" in " ".join(failed(report))
