"""After ``nbgrader autograde``: the scores checked outside the kernel, and a line for each submission that did not run.

The test cell runs in the learner's kernel, after any cells the learner
added; such a cell can patch the standard library (``json.loads``, say) and
make the cell report full marks. The process that runs :func:`regrade` never
ran learner code, so its score stands: where the two differ the gradebook
takes this one (as a manual score) and the instructor is told. A cheat can
only raise a score, so submissions at 0 are not graded twice; for those that
did not run at all, the instructor gets the reason in one line.
"""
from __future__ import annotations

from pathlib import Path

import nbformat

from ..grader.registry import exercises
from ..grader.report import DID_NOT_RUN, NOT_GRADED
from ..grader.supervise import grade_one
from .assignments import grade_id

# How a report that did not run reads in the feedback a test cell prints (ExerciseReport.feedback).
DID_NOT_RUN_PREFIX = f"FAIL {DID_NOT_RUN}: "
NOT_GRADED_MARK = "NOT GRADED, the machine was too slow"
UNFINISHED = "not implemented yet"  # a stub left as it was: unfinished work, not a problem to report


def regrade(course_dir: Path, exercise_of: dict[str, int], student: str | None = None) -> list[str]:
    """Regrade every submission of the assignments ``exercise_of`` (``{assignment: exercise}``) that the
    gradebook credits with points (only ``student``'s if given); return the lines for the instructor."""
    from nbgrader.api import Gradebook  # SQLAlchemy: only for the steps that read the gradebook

    lines = []
    with Gradebook(f"sqlite:///{course_dir / 'gradebook.db'}") as gb:
        for a, number in exercise_of.items():
            ex = exercises()[number]
            for sub in gb.assignment_submissions(a):
                if student and sub.student.id != student:
                    continue
                grade = gb.find_grade(grade_id(ex), a, a, sub.student.id)
                if not grade.score:
                    found = did_not_run(course_dir, sub.student.id, a, grade_id(ex))
                    if any(NOT_GRADED_MARK in line for line in found):
                        # Slow is not wrong: no score at all (nbgrader lists it as needing grading), not a 0.
                        grade.auto_score, grade.needs_manual_grade = None, True
                        gb.db.commit()
                    lines += found
                    continue
                truth = grade_one(ex, course_dir / "autograded" / sub.student.id / a).score
                if abs(truth - grade.score) > 1e-6:
                    lines.append(f"{sub.student.id} / {a}: the notebook reported {grade.score:g} points "
                                 f"but the grader, run outside the notebook, gives {truth:g}: "
                                 "kept the grader's score (did a cell of the notebook patch the grader?)")
                    grade.manual_score = truth
                    gb.db.commit()
    return lines


def did_not_run(course_dir: Path, student: str, assignment: str, cell_id: str) -> list[str]:
    """A line for the instructor when a submission scored 0 because it did not run at all (it
    raised, exited, hung, or hit a limit), from the feedback its test cell printed."""
    path = course_dir / "autograded" / student / assignment / f"{assignment}.ipynb"
    try:
        nb = nbformat.read(path, as_version=4)
    except (OSError, ValueError):
        return []
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == cell_id:
            text = cell_text(cell)
            runs = [ln.removeprefix(DID_NOT_RUN_PREFIX) for ln in text.splitlines()
                    if ln.startswith(DID_NOT_RUN_PREFIX) and not ln.startswith(DID_NOT_RUN_PREFIX + UNFINISHED)]
            if runs and runs[0].startswith(NOT_GRADED):
                return [f"{student} / {assignment}: {NOT_GRADED_MARK} (no score recorded): {runs[0][:300]}; "
                        f"regrade it: make nbgrader STEP=autograde ARGS=\"--student {student} --force\" "
                        "with DISTLAB_TIME_SCALE=2"]
            if runs:
                return [f"{student} / {assignment}: 0 points, the submission did not run: {runs[0][:300]}"]
    return []


def cell_text(cell) -> str:
    """What a cell showed as text: printed lines (check(N)'s progress) and the plain-text form of what
    it displayed (check(N)'s feedback, shown as a table in JupyterLab)."""
    return "".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in cell.get("outputs", []))
