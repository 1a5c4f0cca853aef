"""The instructor's self-test: its verdict on fabricated reports, and one real run on the fastest exercise."""
from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from autograder.__main__ import main
from autograder.checks.ex07_pipeline import EXERCISE
from autograder.commands import selftest
from autograder.commands.selftest import finish, stub_workers, surprises
from distlab.runtime.launch import time_scale
from tests.helpers import REPO

FAST_EXERCISE = str(EXERCISE.number)  # pipeline: its solution and its stub each grade in about 15 s here


def _row(score: float, feedback: str, seconds: float = 10.0) -> dict:
    return {"exercise": 7, "name": "pipeline", "score": score, "max_score": 10, "seconds": seconds,
            "limit_s": 90, "feedback": feedback}


CLEAN = {
    "environment": {"torch": "2.13.0", "cuda": None, "nccl": None, "cuda_available": False, "gpu_count": 0,
                    "gpu_device_node": False, "python": "3.11", "time_scale": 1.0},
    "sandbox": {"root": False, "learner_user": None, "sandboxed": False, "problem": None},
    "probes": [{"world_size": w, "backend": "gloo", "devices": ["cpu"] * w, "gpus": [], "seconds": 3.0,
                "error": None} for w in (1, 2, 4)],
    "stub_workers": 1, "seconds": 60.0,
    "solutions": [_row(10, "ok sends\nok recvs")],
    "stubs": [_row(0, "FAIL runs: NotImplementedError")],
}


def _doc(**changes) -> dict:
    doc = copy.deepcopy(CLEAN)
    doc.update(changes)
    return doc


def test_a_clean_report_has_no_surprise_and_exits_0(capsys, tmp_path):
    assert finish(_doc(), str(tmp_path / "r.json")) == 0
    assert capsys.readouterr().out.rstrip().endswith("no surprises: this machine grades as expected")
    assert json.loads((tmp_path / "r.json").read_text())["ok"] is True


def test_a_solution_short_of_full_marks_is_one_surprise_line_and_exit_1(capsys):
    doc = _doc(solutions=[_row(8, "ok sends\nFAIL recvs: rank 1 got the wrong tensor")])
    assert finish(doc) == 1
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("SURPRISE")]
    assert lines == ["SURPRISE: solution 7 pipeline: 8/10, expected full marks: recvs: rank 1 got the wrong tensor"]


def test_a_solution_that_fails_near_its_limit_suggests_more_time():
    (line,) = surprises(_doc(solutions=[_row(9, "FAIL resumes: the run did not finish", seconds=85)]))
    assert line.endswith("(it took 85 of its 90 s: a slow or busy machine? DISTLAB_TIME_SCALE=2 allows twice as long)")


def test_a_stub_that_scores_names_the_criteria_it_earned():
    doc = _doc(stubs=[_row(2, "ok sends: fine\nFAIL recvs: NotImplementedError")])
    assert surprises(doc) == ["stub 7 pipeline: 2/10, expected 0 (points for unimplemented code: sends)"]


def test_a_stub_that_runs_into_its_limit_is_a_surprise_even_at_0():
    assert surprises(_doc(stubs=[_row(0, "FAIL runs: grading took longer", seconds=90)])) == [
        "stub 7 pipeline: ran into its 90 s limit instead of failing at once (a hang in the grader?)"]


def test_a_failed_probe_a_sandbox_problem_and_an_unusable_gpu_are_surprises():
    doc = _doc(sandbox={**CLEAN["sandbox"], "problem": "DISTLAB_STUDENT_USER=bob: no such user"},
               environment={**CLEAN["environment"], "gpu_device_node": True})
    doc["probes"][2]["error"] = "job ran past its 90 s limit and was ended"
    found = surprises(doc)
    assert found[0] == "sandbox: DISTLAB_STUDENT_USER=bob: no such user"
    assert found[1].startswith("GPU: /dev/nvidia0 exists but torch cannot use CUDA")
    assert found[2] == "probe W=4: job ran past its 90 s limit and was ended" and len(found) == 3


def test_stubs_grade_one_at_a_time_in_the_sandbox():
    assert stub_workers(7, sandboxed=True) == 1 and 1 <= stub_workers(7, sandboxed=False) <= 7


def test_selftest_takes_no_directory(capsys):
    assert main(["selftest", "exercises"]) == 2 and "unrecognized arguments: exercises" in capsys.readouterr().err


@pytest.mark.slow
def test_selftest_of_one_exercise_passes_and_writes_its_json(tmp_path):
    out = tmp_path / "selftest.json"
    proc = subprocess.run([sys.executable, "-m", "autograder", "selftest", "--exercise", FAST_EXERCISE,
                           "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert doc["ok"] is True and doc["surprises"] == []
    assert {"torch", "cuda", "nccl"} <= doc["environment"].keys()
    assert doc["sandbox"].keys() == {"root", "learner_user", "sandboxed", "problem"}
    assert [p["world_size"] for p in doc["probes"]] == [1, 2, 4]
    assert all(len(p["devices"]) == p["world_size"] and p["backend"] for p in doc["probes"])
    (solution,), (stub,) = doc["solutions"], doc["stubs"]
    assert solution["score"] == solution["max_score"] == 10 and stub["score"] == 0
    assert "not implemented yet" in stub["feedback"], stub["feedback"]
    limit = EXERCISE.time_limit * time_scale()  # times are reported, never asserted (tests/conftest.py, rule 3)
    assert solution["limit_s"] == stub["limit_s"] == pytest.approx(limit, abs=0.01)
    assert solution["seconds"] > 0 and stub["seconds"] >= 0  # an untouched stub: no job
    assert "no surprises" in proc.stdout


def test_budgets_come_from_the_references_own_cost_here(tmp_path, monkeypatch):
    from distlab.runtime import process

    monkeypatch.delenv(selftest.TIME_SCALE_VAR, raising=False)
    monkeypatch.setattr(process, "CALIBRATION", tmp_path / "time_scale.json")
    slow = [{"exercise": 5, "seconds": 48.0, "limit_s": 60.0}, {"exercise": 1, "seconds": 5.0, "limit_s": 90.0}]
    cal = selftest.calibrate_budgets(slow)
    assert cal["time_scale"] == 2.0 and "reference 5 took 48 of its 60 s limit" in cal["why"]
    assert process.time_scale() == 2.0  # later gradings on this machine
    selftest.calibrate_budgets([{"exercise": 1, "seconds": 5.0, "limit_s": 90.0}])
    assert process.time_scale() == 1.0


def test_the_selftest_grades_fresh_stubs_and_says_once_when_exercises_were_edited(tmp_path, capsys):
    """An instructor's checkout where exercise 1 was solved must not read as a broken grader (issue 42):
    the stubs graded are made afresh, and the edited folder is named with how to restore it."""
    edited = tmp_path / "exercises"
    fresh = tmp_path / "fresh"
    edited.mkdir(), fresh.mkdir()
    for p, text in selftest.generate(selftest.SOLUTIONS_DIR, edited).items():
        p.write_text(text)
    assert selftest.fresh_stubs(fresh, edited) == ""  # the released stubs: nothing to say
    (edited / "ex01_ddp.py").write_text((selftest.SOLUTIONS_DIR / "ex01_ddp.py").read_text())  # solved
    (edited / "ex09_hang.py").unlink()
    note = selftest.fresh_stubs(fresh, edited)
    assert note == (f"{edited} is not the released stubs (ex01_ddp.py, ex09_hang.py differ): the self-test graded "
                    "fresh stubs from solutions/; `make stubs` (or `git checkout exercises/`) restores them, losing "
                    "the edits")
    assert (fresh / "ex01_ddp.py").read_text() == (REPO / "exercises" / "ex01_ddp.py").read_text()
    assert finish(_doc(exercises_note=note)) == 0  # a note, not a surprise
    assert note in capsys.readouterr().out
