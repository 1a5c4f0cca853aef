"""Exercise 3: the reference solution scores full marks, the stub 0, and each usual mistake fails
with its own feedback. Independent mistakes share one mutant; all files are graded in one launch."""
from __future__ import annotations

import pytest

from autograder.checks import ex03_amp as check
from autograder.runner import grade_one

from tests.helpers import EXERCISES, failed, feedback_of, solution_and_mutants

FILE = check.EXERCISE.filename
MUTANTS = {
    # four independent mistakes: each simulated workload exposes exactly one of the first three
    "no_warmup_no_sync_mean_clip_scaled": {
        "    for _ in range(warmup):\n        fn()\n        sync()\n": "",
        'stmt="fn(); sync()"': 'stmt="fn()"',
        "blocked_autorange(min_run_time=min_run_time).median": "blocked_autorange(min_run_time=min_run_time).mean",
        "        scaler.unscale_(optimizer)  # true gradients from here on\n"
        "        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n":
        "        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n"
        "        scaler.unscale_(optimizer)\n",
    },
    "inverted_ratios": {
        '"speedup": baseline_s / candidate_s': '"speedup": candidate_s / baseline_s',
        '"memory_ratio": candidate_bytes / baseline_bytes': '"memory_ratio": baseline_bytes / candidate_bytes',
    },
    "no_autocast_no_scaler_step": {
        "enabled=amp_dtype is not None": "enabled=False",
        "        scaler.step(optimizer)      # skipped": "        optimizer.step()      # skipped",
        '"memory_ratio": candidate_bytes / baseline_bytes': '"mem_ratio": candidate_bytes / baseline_bytes',
    },
}


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict:
    paths = solution_and_mutants(tmp_path_factory.mktemp("ex03"), FILE, MUTANTS)
    return dict(zip(paths, check.grade_many(list(paths.values()))))


def test_solution_full_marks(reports):
    report = reports["solution"]
    assert report.score == report.max_score, report.feedback
    assert report.measurements["bf16_max_loss_gap"] <= check.LOSS_TOL
    assert 0.3 < report.measurements["real_memory_ratio"] < 0.7  # bf16 activations: about half of fp32's
    assert any("saved_tensors_hooks" in n or "max_memory_allocated" in n for n in report.notes)


def test_stub_not_implemented():
    report = grade_one(check.EXERCISE, EXERCISES)
    assert report.score == 0
    assert "not implemented yet" in report.feedback


def test_missing_warmup(reports):
    fb = feedback_of(reports["no_warmup_no_sync_mean_clip_scaled"], "slow first calls")
    assert "call fn(); sync() `warmup` times before timing" in fb


def test_missing_sync(reports):
    fb = feedback_of(reports["no_warmup_no_sync_mean_clip_scaled"], "asynchronous work")
    assert "time `fn(); sync()` together" in fb


def test_mean_dragged_by_outliers(reports):
    fb = feedback_of(reports["no_warmup_no_sync_mean_clip_scaled"], "outliers")
    assert "report the median per call, not the mean" in fb


def test_independent_mistakes_do_not_fail_other_parts(reports):
    bad = failed(reports["no_warmup_no_sync_mean_clip_scaled"])
    assert not any("steady" in k or "memory ratio" in k or "autocast" in k for k in bad), bad


def test_clip_before_unscale(reports):
    fb = feedback_of(reports["no_warmup_no_sync_mean_clip_scaled"], "GradScaler order")
    assert "you clipped the scaled gradients; call scaler.unscale_(optimizer) before clip_grad_norm_" in fb


def test_wrong_ratio_direction(reports):
    report = reports["inverted_ratios"]
    assert "its inverse: speedup = baseline_s / candidate_s" in feedback_of(report, "steady workload")
    assert "its inverse" in feedback_of(report, "memory ratio")


def test_no_autocast_and_unscaled_step(reports):
    report = reports["no_autocast_no_scaler_step"]
    assert "run the forward pass and the loss inside torch.autocast" in feedback_of(report, "bf16 autocast")
    assert "'optimizer.step'" in feedback_of(report, "GradScaler order")


def test_missing_key_costs_its_criterion_only(reports):
    report = reports["no_autocast_no_scaler_step"]
    assert "compare() returned a dict without 'memory_ratio'" in feedback_of(report, "memory ratio")
    assert not any("steady" in k for k in failed(report))  # speedup was there: graded as usual
    assert any("real-model measurement not available" in n and "'memory_ratio'" in n for n in report.notes)
