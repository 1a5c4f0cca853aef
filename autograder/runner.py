"""Grade exercises, each in its own subprocess with its own time limit.

Whatever happens in one exercise's grading (a hang, a crash of the
interpreter, a report that is not valid JSON) it scores 0 with one clear
line, every process it started is ended, and the other exercises are still
graded.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from distlab.launch import TIME_SCALE_VAR, time_scale
from distlab.process import end_job, tag_env

from .registry import Exercise, exercises
from .report import ExerciseReport

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = REPO_ROOT / "exercises"


def grade_one(ex: Exercise, directory: Path, time_limit: float | None = None) -> ExerciseReport:
    """Grade ``ex`` from the file in ``directory`` in a subprocess limited to ``time_limit`` s."""
    time_limit = (time_limit or ex.time_limit) * time_scale()
    report = ExerciseReport(ex.number, ex.name, ex.max_score)
    path = Path(directory) / ex.filename
    if not path.is_file():
        return report.fail_all(f"{ex.filename} not found in {directory}: nothing to grade")
    job_id = uuid.uuid4().hex
    env = tag_env(job_id, dict(os.environ))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="autograder-") as tmp:
        out, log = Path(tmp) / "report.json", Path(tmp) / "log.txt"
        # Everything the grading subprocess and its ranks put in temp files lands in here and goes
        # with it, even when they are killed before they can clean up after themselves.
        (Path(tmp) / "tmp").mkdir()
        env["TMPDIR"] = str(Path(tmp) / "tmp")
        cmd = [sys.executable, "-m", "autograder.run_one", str(ex.number), str(path.resolve()), str(out)]
        with open(log, "w") as log_f:
            proc = subprocess.Popen(cmd, stdout=log_f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, cwd=REPO_ROOT, start_new_session=True)
            try:
                proc.wait(timeout=time_limit)
            except subprocess.TimeoutExpired:
                return report.fail_all(
                    f"grading took longer than its {time_limit:g} s limit and was stopped: an endless loop "
                    f"in your code? (If this machine is just slow or busy, {TIME_SCALE_VAR}=2 allows twice as long.)")
            finally:
                end_job(proc, job_id, grace_s=1.0)
        try:
            return ExerciseReport.from_dict(json.loads(out.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-8:])
            return report.fail_all(f"the grader could not finish (exit code {proc.returncode}):\n{tail}")


def grade(directory: Path = DEFAULT_DIR, only: list[int] | None = None) -> list[ExerciseReport]:
    """Grade the exercises numbered ``only`` (default: every exercise whose file is in ``directory``)."""
    known = exercises()
    if only is None:
        only = [n for n, ex in known.items() if (Path(directory) / ex.filename).is_file()]
    return [grade_one(known[n], Path(directory)) for n in only]
