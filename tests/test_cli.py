"""The grader's contract: exit codes, one-line errors, and bad input that loses nothing."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autograder.__main__ import main
from autograder.checks.ex01_ddp import EXERCISE
from autograder.runner import grade_one
from tests.helpers import REPO, mutant, session_processes


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autograder", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def test_a_directory_that_does_not_exist_is_a_usage_error(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.strip() == f"autograder: error: {tmp_path / 'nowhere'} is not a directory"


def test_an_unknown_exercise_is_a_usage_error(capsys):
    assert main(["--exercise", "99"]) == 2
    assert capsys.readouterr().err.startswith("autograder: error: no exercise 99 (known: 1")


def test_an_empty_directory_is_a_usage_error(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2 and "no exercise files in" in capsys.readouterr().err


def test_list_names_every_exercise(capsys):
    assert main(["--list"]) == 0 and "ex01_ddp.py" in capsys.readouterr().out


def test_a_missing_file_scores_zero_and_says_so(tmp_path):
    proc = cli(str(tmp_path), "--exercise", "1", "--json", str(tmp_path / "r.json"))
    assert proc.returncode == 1
    report = json.loads((tmp_path / "r.json").read_text())["exercises"][0]
    assert report["score"] == 0 and report["feedback"] == f"FAIL runs: ex01_ddp.py not found in {tmp_path}: nothing to grade"


def test_a_file_that_does_not_import_names_the_error(tmp_path):
    (tmp_path / "ex01_ddp.py").write_text("def setup(:\n    pass\n")
    report = grade_one(EXERCISE, tmp_path)
    assert report.score == 0
    assert report.feedback.startswith("FAIL runs: your code raised on rank 0: SyntaxError: invalid syntax")


def test_copying_the_reference_solution_is_refused(tmp_path):
    (tmp_path / "ex01_ddp.py").write_text("from solutions.ex01_ddp import *\n")
    report = grade_one(EXERCISE, tmp_path)
    assert report.score == 0 and "ImportError: the reference solutions cannot be imported while grading" \
        in report.feedback


def test_a_hang_is_stopped_at_the_time_limit_and_leaves_nothing(tmp_path):
    mutant(tmp_path, "ex01_ddp.py", {"    rank = dist.get_rank()\n": "    rank = dist.get_rank()\n"
                                     "    import time; time.sleep(3600)\n"})
    start, started = time.monotonic(), time.time()
    report = grade_one(EXERCISE, tmp_path, time_limit=8)
    assert time.monotonic() - start < 18
    assert report.score == 0 and "grading took longer than its 8 s limit" in report.feedback
    assert session_processes() == []
    left = [p for pattern in ("autograder-*", "distlab-*") for p in Path(tempfile.gettempdir()).glob(pattern)
            if p.stat().st_mtime >= started]
    assert left == [], "the killed grading left its temporary files behind"
