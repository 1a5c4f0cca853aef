"""Exercise 9 (a hang diagnosed and fixed): the solution and the independent one score full marks, the
stub 0, and each known mistake (the unfixed job among them: its would-be hang is stopped by the
grader's ledger of collectives, on every rank at once, naming each rank's line) fails with its own
feedback. One launch on 2 ranks grades every file."""
from __future__ import annotations

import pytest

from autograder.checks import ex09_hang as check
from tests.exercises import independent
from tests.helpers import EXERCISES, SOLUTIONS, failed, mutant

FILE = check.EXERCISE.filename
FIX = ("        # No branch on this rank's data before a collective: an empty selection gives a loss of 0\n"
       "        # and zero gradients, which is exactly this rank's share of the global sum.\n")
SKIP = "        if not keep.any():\n            continue\n"
MISTAKES = {
    "the unfixed job": {FIX: SKIP},
    "a barrier in its place": {FIX: "        if not keep.any():\n            dist.barrier()\n            continue\n"},
    "the collectives removed": {FIX: SKIP, "        dist.all_reduce(count)\n": "",
                                "                dist.all_reduce(grad)\n": ""},
    "the step skipped everywhere": {FIX: "        empty = torch.tensor(float(not keep.any()))\n"
                                         "        dist.all_reduce(empty)\n"
                                         "        if empty > 0:\n            continue\n"},
    "a stale gradient sent": {FIX: "        if not keep.any():  # take part, with what is left in .grad\n"
                                   "            dist.all_reduce(torch.zeros(()))\n"
                                   "            for p in model.parameters():\n"
                                   "                dist.all_reduce(p.grad.clone())\n"
                                   "            continue\n"},
    "zero_grad after backward": {"        model.zero_grad()\n        loss.backward()\n":
                                 "        loss.backward()\n        model.zero_grad()\n"},
    "no backward": {"        loss.backward()\n": ""},
    "the count kept local": {"        dist.all_reduce(count)\n": ""},
    # the realistic family's (benchmarks/realistic/ex09.py): no guard for a step no rank kept anything at
    "a global count of 0 divided by": {"                if count > 0:  # the same on every rank: count is the "
                                       "all-reduced, global one\n                    p -= lr * grad / count":
                                       "                p -= lr * grad / count"},
    "the gradients kept local": {"                dist.all_reduce(grad)\n": ""},
    "the update rebinds the name": {"p -= lr * grad / count": "p = p - lr * grad / count"},
    "the count reduced before it is set": {
        "        count = keep.sum().to(torch.float32)\n        dist.all_reduce(count)\n":
        "        dist.all_reduce(count)\n        count = keep.sum().to(torch.float32)\n"},
}
FINISHES = "[W=2] the job finishes: every rank makes the same collectives, in order"
SAME = "[W=2] the same all-reduces on every rank, each step"
MATCHES = "[W=2] matches one process on the global batches"
EMPTY = "[W=2] a rank with nothing to keep takes part with a zero gradient"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    paths = [SOLUTIONS / FILE, independent.path(9), EXERCISES / FILE]
    paths += [mutant(tmp_path_factory.mktemp(f"m{i}"), FILE, change) for i, change in enumerate(MISTAKES.values())]
    reports = dict(zip(["solution", "independent", "stub", *MISTAKES], check.grade(paths)))
    return reports


@pytest.mark.parametrize("name", ["solution", "independent"])
def test_a_fixed_job_scores_full_marks(graded, name):
    r = graded[name]
    assert r.score == r.max_score, r.feedback
    assert r.measurements["max_abs_diff_vs_reference"] < 1e-5


def test_the_solution_counts_one_all_reduce_of_the_count_and_one_per_parameter_each_step(graded):
    # 6 steps x (1 count + 4 parameters: two Linear layers' weight and bias)
    assert graded["solution"].measurements["all_reduces_per_rank"] == 30


def test_the_stub_scores_zero(graded):
    assert graded["stub"].score == 0


def test_the_unfixed_job_is_stopped_as_a_hang_naming_both_ranks_lines(graded):
    f = failed(graded["the unfixed job"])
    assert set(f) == {FINISHES, SAME, MATCHES, EMPTY}
    said = f[FINISHES]
    assert said.startswith("the job hangs: ") and "Rank 1 kept no sample at step 1" in said
    assert "(step 1) at ex09_hang.py:" in said and "(step 2) at ex09_hang.py:" in said
    assert "dist.all_reduce(count)" in said
    assert f[SAME].startswith("not checked")


def test_a_barrier_in_place_of_the_all_reduces_is_named(graded):
    said = failed(graded["a barrier in its place"])[FINISHES]
    assert "is barrier (step 1) at ex09_hang.py:" in said and "(dist.barrier())" in said
    assert "A barrier does not match an all-reduce" in said


def test_removing_the_collectives_is_named(graded):
    f = failed(graded["the collectives removed"])
    assert set(f) == {SAME, MATCHES, EMPTY}
    for name in (SAME, MATCHES, EMPTY):
        assert "no rank made an all-reduce in 6 steps" in f[name], name


def test_skipping_the_step_everywhere_drops_the_other_ranks_samples(graded):
    f = failed(graded["the step skipped everywhere"])
    assert set(f) == {MATCHES, EMPTY}
    for said in f.values():
        assert "at step 1 no rank all-reduced its gradients (4 all-reduces of gradients at other steps)" in said
        assert "although rank 0 kept" in said


def test_a_stale_gradient_from_the_empty_rank_is_named(graded):
    f = failed(graded["a stale gradient sent"])
    assert set(f) == {MATCHES, EMPTY}
    for said in f.values():
        assert "rank 1 kept no sample at step 1 but all-reduced tensors whose |values| sum to" in said


def test_gradients_cleared_after_backward_or_never_filled_are_named_with_what_ran(graded):
    cleared = failed(graded["zero_grad after backward"])
    assert set(cleared) == {MATCHES}
    said = cleared[MATCHES]
    assert "rank 0 kept 4 samples at step 0, yet every gradient it all-reduced there" in said
    assert "(dist.all_reduce(grad))" in said and "its backward() had given gradients whose |values| sum to" in said
    assert "cleared before the all-reduce" in said and "call loss.backward()" not in said  # it was called
    said = failed(graded["no backward"])[MATCHES]
    assert "no backward() reached the parameters at that step" in said and "cleared" not in said


def test_a_count_or_gradients_left_local_are_named(graded):
    said = failed(graded["the count kept local"])[MATCHES]
    assert "at step 0 every all-reduce was of a gradient (4 on rank 0" in said
    assert "rank 0 kept 4, rank 1 kept 4) where one process divides by all 8" in said
    said = failed(graded["the gradients kept local"])[MATCHES]
    assert "no rank all-reduced a gradient in 6 steps: rank 0's 6 all-reduces were all of [] tensors" in said
    assert "(dist.all_reduce(count))" in said and "all-reduce the count" not in said  # it was


def test_an_update_that_only_rebinds_the_name_is_named(graded):
    said = failed(graded["the update rebinds the name"])[MATCHES]
    assert "after 6 steps every rank's weights are still the initial ones" in said
    assert "(48 all-reduces of gradients)" in said


def test_an_error_in_train_names_the_learners_line(graded):
    said = failed(graded["the count reduced before it is set"])[FINISHES]
    assert said.startswith("train raised on rank 0 at ex09_hang.py line 73 in train: dist.all_reduce(count): ")
    assert "UnboundLocalError" in said


def test_a_division_by_a_global_count_of_0_is_named_not_read_as_a_missing_backward(graded):
    f = failed(graded["a global count of 0 divided by"])
    said = f[MATCHES]
    assert "no rank kept a sample (the all-reduced count was 0)" in said and "NaN gradients" in said
    assert "backward" not in said  # the gradients were NaN, not zero: backward() ran
