"""The grader's contract: exit codes, one-line errors, and bad input that loses nothing."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

import pytest

from autograder.__main__ import main
from autograder.checks import ex07_pipeline
from autograder.checks.ex01_ddp import EXERCISE
from autograder.grader.supervise import grade_one
from distlab.runtime.launch import time_scale
from tests.helpers import REPO, mutant


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    # a hang guard, scaled like the grader's own limits (DISTLAB_TIME_SCALE)
    return subprocess.run([sys.executable, "-m", "autograder", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout * time_scale())


def test_a_directory_that_does_not_exist_is_a_usage_error(tmp_path, capsys):
    assert main(["grade", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.strip() == f"autograder: error: {tmp_path / 'nowhere'} is not a directory"


def test_an_unknown_exercise_is_a_usage_error(capsys):
    assert main(["grade", "--exercise", "99"]) == 2
    assert capsys.readouterr().err.startswith("autograder: error: no exercise 99 (known: 1")


def test_an_empty_directory_is_a_usage_error(tmp_path, capsys):
    assert main(["grade", str(tmp_path)]) == 2 and "no exercise files in" in capsys.readouterr().err


def test_list_names_every_exercise(capsys):
    assert main(["list"]) == 0 and "ex01_ddp.py" in capsys.readouterr().out


def test_help_lists_every_command_and_the_exit_statuses(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("grade", "list", "class", "merge", "selftest", "stubs", "nbgrader"):
        assert re.search(rf"^    {command} ", out, re.M), f"{command} missing from --help:\n{out}"
    assert "exit status:" in out and "from autograder import check" in out


@pytest.mark.parametrize("old, new", [
    (["--list"], ["list"]),
    (["--exercise", "99"], ["grade", "--exercise", "99"]),
    (["--selftest", "exercises"], ["selftest", "exercises"]),
    (["class", "merge", "out.csv"], ["merge", "out.csv"]),
])
def test_the_spellings_of_earlier_releases_still_work_and_say_what_replaced_them(old, new, capsys):
    assert main(old) == main(new)
    first, second = capsys.readouterr().err.split("autograder: note: ", 1)[1].split("\n", 1)
    assert first == f"`python -m autograder {' '.join(old)}` is spelled `python -m autograder {' '.join(new)}` now"
    assert "autograder: note:" not in second  # once, and not for today's spelling


def test_an_old_module_name_runs_todays_command_and_says_so():
    proc = subprocess.run([sys.executable, "-m", "autograder.stubs", "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=60 * time_scale())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.strip() == "python -m autograder.stubs is python -m autograder stubs now"


def test_a_missing_file_scores_zero_and_says_so(tmp_path):
    proc = cli("grade", str(tmp_path), "--exercise", "1", "--json", str(tmp_path / "r.json"))
    assert proc.returncode == 1
    report = json.loads((tmp_path / "r.json").read_text())["exercises"][0]
    assert report["score"] == 0
    assert report["feedback"] == f"FAIL runs: ex01_ddp.py not found in {tmp_path}: nothing to grade"


# A file that cannot be imported fails the same way in every exercise: these grade exercise 7,
# whose grading is one launch of 2 ranks (exercise 1 launches 6).
@pytest.mark.slow
def test_a_file_that_does_not_import_names_the_error(tmp_path):
    (tmp_path / ex07_pipeline.EXERCISE.filename).write_text("def setup(:\n    pass\n")
    progress: list[str] = []
    report = grade_one(ex07_pipeline.EXERCISE, tmp_path, on_progress=progress.append)
    assert report.score == 0
    # the notebook's check(N) and the CLI show each launch as it starts and ends
    assert progress[0] == "[W=2] torchrun, 2 ranks ..." and len(progress) == 2, progress
    assert re.fullmatch(r"\[W=2\] torchrun, 2 ranks: stopped after \d+ s", progress[1]), progress
    # Every rank raises the same SyntaxError; which one the launcher hears of first is a race
    # (a rank torchrun stops before it writes its error is not reported). Deterministic: a rank
    # of the job is named, with the error and the learner's file and line.
    found = re.match(r"FAIL runs: your code raised on rank (\d+): SyntaxError: invalid syntax "
                     r"\(ex07_pipeline\.py, line 1\)", report.feedback)
    assert found, report.feedback
    assert int(found[1]) < 2, report.feedback


@pytest.mark.slow
def test_copying_the_reference_solution_is_refused(tmp_path):
    (tmp_path / ex07_pipeline.EXERCISE.filename).write_text("from solutions.ex07_pipeline import *\n")
    report = grade_one(ex07_pipeline.EXERCISE, tmp_path)
    assert report.score == 0 and "ImportError: the reference solutions cannot be imported while grading" \
        in report.feedback


@pytest.mark.slow
def test_a_hang_is_stopped_at_the_time_limit_and_leaves_nothing(tmp_path, monkeypatch, leftover_processes):
    # A temp dir of this test's own: grade_one makes its folder there and hands the grading
    # subprocess TMPDIR inside it, so "nothing left" is checked without seeing other suites'
    # files in the shared /tmp. How long the stop took is a bench row (bench_launch.py).
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("TMPDIR", str(tmp))
    submission = tmp_path / "submission"
    submission.mkdir()
    mutant(submission, "ex01_ddp.py", {"    rank = dist.get_rank()\n": "    rank = dist.get_rank()\n"
                                       "    import time; time.sleep(3600)\n"})
    report = grade_one(EXERCISE, submission, time_limit=8)
    # grade_one multiplies the limit by DISTLAB_TIME_SCALE, and says the limit it applied
    assert report.score == 0 and f"grading took longer than its {8 * time_scale():g} s limit" in report.feedback
    assert leftover_processes() == []
    assert list(tmp.iterdir()) == [], "the killed grading left its temporary files behind"


def _outside_make() -> dict[str, str]:
    """This environment without the variables of a make that runs the suite (``make test``): a nested make
    would read its flags and announce its directories."""
    return {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}


def test_make_grade_passes_the_exercise_and_the_hint_tier_on():
    """``make grade EX="1 3" HINT=2`` is ``python -m autograder grade exercises --exercise 1 --exercise 3 --hint 2``
    (read from ``make -n``: nothing runs)."""
    proc = subprocess.run(["make", "--no-print-directory", "-n", "grade", "EX=1 3", "HINT=2"], cwd=REPO,
                          env=_outside_make(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].split() == [".venv/bin/python", "-m", "autograder", "grade", "exercises",
                                                    "--exercise", "1", "--exercise", "3", "--hint", "2"]


def test_make_lab_binds_to_this_machine_takes_a_port_and_extra_arguments_and_starts_as_root():
    """``make lab`` as root (a container, a cloud VM) passes JupyterLab's --allow-root and says so (issue 42);
    it binds to 127.0.0.1 unless IP says otherwise, on PORT, with LAB_ARGS_EXTRA (read from ``make -n``)."""
    proc = subprocess.run(["make", "--no-print-directory", "-n", "lab", "PORT=9123", "LAB_ARGS_EXTRA=--no-browser"],
                          cwd=REPO, env=_outside_make(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    line = next(line.split() for line in proc.stdout.splitlines() if "/jupyter lab " in line)
    lab = line[line.index("lab"):]
    assert line[0].startswith("JUPYTER_CONFIG_PATH=") and "/jupyter/learner:" in line[0]  # a learner's, by default
    assert {"--ServerApp.ip=127.0.0.1", "--ServerApp.port=9123"} <= set(lab) and lab[-1] == "--no-browser"
    root = os.getuid() == 0
    assert ("--allow-root" in lab) == root
    assert ('echo "make lab: running as root: JupyterLab gets --allow-root"' in proc.stdout) == root


def test_the_graders_own_code_is_refused_to_a_learners_file(tmp_path, monkeypatch):
    """In the rank: the grader's modules are imported already, so no finder sees the learner's import of them;
    the import statement itself refuses them to a learner's module (its reference step, sort, Adam...)."""
    import builtins
    import sys

    from autograder.rank.loading import load_learner

    monkeypatch.setattr(builtins, "__import__", builtins.__import__)  # put back after the test
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    copied = tmp_path / "ex04_fsdp.py"
    copied.write_text("from autograder.checks.ex04_fsdp.probes import _grader_step as train_step\n")
    with pytest.raises(ImportError, match="the grader's own code cannot be imported while grading"):
        load_learner(copied)
    allowed = tmp_path / "ex01_ddp.py"
    allowed.write_text("import torch\nfrom autograder import check\n")  # the public API, and anything else
    assert load_learner(allowed).check is not None
