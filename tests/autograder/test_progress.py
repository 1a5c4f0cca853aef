"""Slow is not wrong, and a hang is named: launches and gradings judged by whether they advance.

A launch past its limit whose ranks still advance (optimizer steps, backward passes, new places in
their code: distlab.runtime.heartbeat) is extended, up to three times its limit; past that, the machine was
too slow, and the code is not scored. A launch whose ranks all stopped advancing while one waits in
a collective is ended as soon as that is clear, naming each rank's line. A busy loop advances
nowhere. Nothing here asserts a duration: each outcome is decided by what the ranks do.
"""
from __future__ import annotations

import pytest

from autograder.checks.ex07_pipeline import EXERCISE
from autograder.grader.supervise import grade_one
from distlab import LaunchError, LaunchHang, LaunchTimeout, MachineTooSlow, torchrun
from distlab.runtime.launch import time_scale
from tests.helpers import REPO, SOLUTIONS
from tests.helpers.targets import ranks

pytestmark = pytest.mark.slow


def test_a_hang_is_ended_early_and_named_at_each_ranks_line():
    with pytest.raises(LaunchHang) as info:
        # named long before this limit; 3 s of no rank advancing is enough for a job that cannot advance
        torchrun(ranks.barrier_while_rank1_sleeps, 2, timeout=300, hang_after_s=3)
    message = str(info.value)
    assert "rank 0 waits in barrier at ranks.py:" in message
    assert "rank 1 is at ranks.py:" in message and "(time.sleep(seconds))" in message


# a hang in a collective that a library issues (rank 1 asleep, rank 0 left waiting): what rank 0 waits in
LIBRARY_HANGS = {
    "ddp forward": (ranks.ddp_step_while_rank1_sleeps, (600, 1), "DDP's broadcast before the forward"),
    "ddp backward": (ranks.ddp_step_while_rank1_sleeps, (600, 2), "DDP's all-reduce of the gradients"),
    "fsdp": (ranks.fsdp_step_while_rank1_sleeps, (600, "forward"), "FSDP's all-gather of the parameters"),
    "pipeline": (ranks.pipeline_while_rank1_sleeps, (600,), "the pipeline schedule's send/receive"),
}


@pytest.fixture(scope="module")
def library_hangs():
    """Each case's LaunchHang message; the jobs mostly wait, so they run at the same time."""
    from concurrent.futures import ThreadPoolExecutor

    def hang(case):
        target, args, _ = LIBRARY_HANGS[case]
        try:
            torchrun(target, 2, args=args, timeout=300, hang_after_s=3)
        except LaunchHang as exc:
            return str(exc)
        except LaunchError as exc:
            return f"not a hang: {type(exc).__name__}: {exc}"
        return "finished"

    with ThreadPoolExecutor(max_workers=len(LIBRARY_HANGS)) as pool:
        return dict(zip(LIBRARY_HANGS, pool.map(hang, LIBRARY_HANGS)))


@pytest.mark.parametrize("case", sorted(LIBRARY_HANGS))
def test_a_hang_in_a_collective_ddp_fsdp_or_a_pipeline_issues_is_named_at_each_ranks_line(library_hangs, case):
    message = library_hangs[case]
    assert f"rank 0 waits in {LIBRARY_HANGS[case][2]} at ranks.py:" in message, message
    assert "rank 1 is at ranks.py:" in message and "(time.sleep(seconds))" in message, message


def test_a_slow_backward_of_a_ddp_model_is_slow_not_a_hang():
    # both ranks spend 6 s between the gradients of the model's two layers, with no rank advancing; neither
    # has all its gradients in, so neither waits in DDP's all-reduce, and the job is not ended at 2 s
    run = torchrun(ranks.ddp_with_a_slow_backward, 2, args=(6,), timeout=120, hang_after_s=2)
    assert run.results == [2, 2]


def test_a_launch_still_advancing_past_its_bound_is_the_machines_problem_not_the_codes():
    with pytest.raises(MachineTooSlow, match=r"too slow for this launch: its ranks were still advancing") as info:
        torchrun(ranks.slow_steps, 2, args=(100_000, 0.05), timeout=2)
    assert not isinstance(info.value, LaunchError)  # no check can score it as the code's failure
    assert "DISTLAB_TIME_SCALE=2" in str(info.value)


def test_a_spinning_loop_is_not_progress():
    with pytest.raises(LaunchTimeout) as info:
        torchrun(ranks.spin, 2, timeout=5)  # ends 5 s after its last advance (start-up), well before 15 s
    assert not isinstance(info.value, LaunchHang), "no rank waits in a collective: a timeout, not a hang"


def test_a_slow_launch_is_extended_while_it_advances_and_finishes():
    # 6 s of steps against a 3 s limit: it can only finish if the limit was extended. A machine so
    # loaded that it still does not fit in three times the limit gets a larger limit (rule 6).
    for scale in (1, 2, 4):
        try:
            run = torchrun(ranks.slow_steps, 2, args=(60, 0.1), timeout=3 * scale)
        except MachineTooSlow:
            continue
        assert run.results == [60, 60] and run.wall_s > 3 * scale * time_scale()
        return
    pytest.fail("three tries were each too slow even extended")


def test_a_grading_still_advancing_at_its_bound_is_not_graded(tmp_path):
    # 0.3 s (times three while it advances) cannot hold an interpreter that imports torch and launches.
    report = grade_one(EXERCISE, SOLUTIONS, time_limit=0.3)
    assert report.not_graded and report.score == 0
    assert "this machine was too slow for this grading" in report.feedback
    assert "an endless loop in your code" not in report.feedback


def test_nbgrader_lists_a_submission_not_graded_for_a_regrade_not_as_a_zero(tmp_path):
    import nbformat

    from autograder.nbgrader import verify

    report = EXERCISE.new_report().machine_too_slow("this machine was too slow for this grading: ...")
    cell = nbformat.v4.new_code_cell("grade(7)", metadata={"nbgrader": {"grade_id": "check"}},
                                     outputs=[nbformat.v4.new_output("stream", text=report.feedback + "\n")])
    folder = tmp_path / "autograded" / "alice" / "ex07_pipeline"
    folder.mkdir(parents=True)
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), folder / "ex07_pipeline.ipynb")
    (line,) = verify.did_not_run(tmp_path, "alice", "ex07_pipeline", "check")
    assert verify.NOT_GRADED_MARK in line and "0 points" not in line
    assert 'ARGS="--student alice --force"' in line and "DISTLAB_TIME_SCALE=2" in line


def test_a_correct_solution_gets_full_marks_on_a_machine_loaded_at_twice_its_cores():
    # Exercise 5 is the one that lost points under load before (its restart launch ran past a fixed
    # budget): graded beside 2 busy loops per core, it still gets full marks.
    import os
    import subprocess
    import sys

    from autograder.checks.ex05_checkpoint import EXERCISE as EX05

    hog = "import time\nend = time.monotonic() + 900\nwhile time.monotonic() < end:\n    pass\n"
    hogs = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        report = grade_one(EX05, SOLUTIONS)
    finally:
        for p in hogs:
            p.kill()
            p.wait()
    assert report.passed and not report.not_graded, report.feedback


def test_the_tutorials_fixed_master_port_is_named_not_a_minute_long_socket_timeout():
    with pytest.raises(LaunchHang, match=r"rank \d changed torchrun's MASTER_PORT \(\d+ -> 12355, at ranks\.py:\d+\)"):
        torchrun(ranks.tutorial_master_port, 2, timeout=300, hang_after_s=3)


def test_the_tutorials_to_rank_without_gpus_is_named_at_the_learners_line(tmp_path):
    import torch

    from autograder.grader.main import explain
    from distlab import RankFailure

    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs: .to(rank) works here")

    with pytest.raises(RankFailure) as info:
        torchrun(ranks.tutorial_to_rank, 2, timeout=120)
    text = explain(info.value, REPO / "tests" / "helpers" / "targets" / "ranks.py")
    assert text.startswith("a tensor or model moved to a GPU index on a machine without GPUs: `.to(rank)`")
    assert "ranks.py line" in text and "torch.ones(1).to(dist.get_rank())" in text
