"""``nbgrader autograde`` of many learners at once, with one writer to the gradebook.

nbgrader grades one submission after another (its issue #174, "Autograding submissions in
parallel", open since 2015), and its gradebook is one SQLite file: two ``nbgrader autograde``
processes writing it at once would fail on its lock. Here each learner's autograde runs in a
process of its own, ``jobs`` at a time, against a *copy* of the gradebook; as each one ends, its
learner's rows are copied into the real gradebook by this process alone (the grades are written in
the order learners finish). The per-learner autograde is nbgrader's own, run the way the sequential
cycle runs it, so repairs, feedback and the regrade outside the kernel work as before.
"""
from __future__ import annotations

import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

# What autograde records per submission, per notebook, per graded cell and per comment.
SUBMISSION_FIELDS = ("timestamp", "extension")
NOTEBOOK_FIELDS = ("flagged", "late_submission_penalty")
GRADE_FIELDS = ("auto_score", "manual_score", "extra_credit", "needs_manual_grade")
COMMENT_FIELDS = ("auto_comment", "manual_comment")
STUDENT_FIELDS = ("first_name", "last_name", "email", "lms_user_id")


def submitted_learners(course_dir: Path, assignment: str) -> list[str]:
    """The learners with a submission of ``assignment`` in ``submitted/``, in id order."""
    root = course_dir / "submitted"
    return sorted(p.name for p in root.iterdir() if (p / assignment).is_dir()) if root.is_dir() else []


def copy_submission(source_db: Path, target_db: Path, assignment: str, student: str) -> bool:
    """Copy ``student``'s graded submission of ``assignment`` from one gradebook into another (whose
    assignment and cells are the same); False if the source has none."""
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(f"sqlite:///{source_db}") as src, Gradebook(f"sqlite:///{target_db}") as dst:
        try:
            sub = src.find_submission(assignment, student)
        except MissingEntry:
            return False
        who = sub.student
        dst.update_or_create_student(student, **{f: getattr(who, f) for f in STUDENT_FIELDS})
        out = dst.update_or_create_submission(assignment, student, **{f: getattr(sub, f) for f in SUBMISSION_FIELDS})
        for nb in sub.notebooks:
            target = dst.find_submission_notebook(nb.name, assignment, student)
            for f in NOTEBOOK_FIELDS:
                setattr(target, f, getattr(nb, f))
            for grade in nb.grades:
                g = dst.find_grade(grade.name, nb.name, assignment, student)
                for f in GRADE_FIELDS:
                    setattr(g, f, getattr(grade, f))
            for comment in nb.comments:
                c = dst.find_comment(comment.name, nb.name, assignment, student)
                for f in COMMENT_FIELDS:
                    setattr(c, f, getattr(comment, f))
        dst.db.commit()
        return out is not None


def autograde_in_parallel(course_dir: Path, assignment: str, jobs: int,
                          nbgrader: Callable[..., bool], options: list[str]) -> list[str]:
    """Autograde every learner of ``assignment``, ``jobs`` at a time; return the learners whose
    autograde failed. ``nbgrader(*args)`` runs one nbgrader command (the cycle's, contained)."""
    gradebook = course_dir / "gradebook.db"
    writer, failed = threading.Lock(), []

    def one(student: str) -> None:
        with tempfile.TemporaryDirectory(prefix=f"distlab-gradebook-{student}-") as tmp:
            copy = Path(tmp) / "gradebook.db"
            with writer:  # a consistent snapshot: no merge is half-written while we copy
                shutil.copy(gradebook, copy)
            ok = nbgrader("autograde", assignment, "--student", student, f"--db=sqlite:///{copy}", *options)
            with writer:  # the one writer to the real gradebook, in the order learners finish
                if not (ok and copy_submission(copy, gradebook, assignment, student)):
                    failed.append(student)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, submitted_learners(course_dir, assignment)))
    return failed
