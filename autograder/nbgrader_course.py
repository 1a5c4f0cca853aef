"""The nbgrader cycle for instructors: ``python -m autograder.nbgrader_course STEP [options]``.

Steps, each over every exercise's assignment (or ``--exercise N``, repeatable):

``generate``   write ``source/`` from the registry and ``solutions/``, then ``nbgrader generate_assignment``
``release``    ``nbgrader release_assignment`` to the exchange
``collect``    ``nbgrader collect``
``autograde``  repair the submissions (see :mod:`autograder.nbgrader_repair`), ``nbgrader autograde``,
               then regrade outside the kernel every submission credited with points (``verify``)
``feedback``   ``nbgrader generate_feedback`` and ``nbgrader release_feedback``
``export``     ``nbgrader export`` to ``grades.csv``
``grade``      collect, autograde, feedback, export: the whole cycle after the learners submitted
``mark``       autograde, generate_feedback, export: grade what is in ``submitted/`` with no exchange
               (what the grader image runs; the submissions were collected elsewhere)

The course directory is ``autograder/nbgrader`` (``--course-dir``); the
exchange is ``$DISTLAB_EXCHANGE`` (or ``--exchange``). Every step runs
nbgrader's own command in the course directory, so its ``nbgrader_config.py``
applies. A step goes on with the other assignments when one fails, and the
exit status is 1 if any failed. Problems found in submissions are printed and
written to ``nbgrader_problems.txt`` in the course directory.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .nbgrader_assignments import MANIFEST, write_source
from .nbgrader_repair import repair_course

COURSE_DIR = Path(__file__).resolve().parent / "nbgrader"
STEPS = ("generate", "release", "collect", "autograde", "feedback", "export", "grade", "mark")


class Course:
    def __init__(self, course_dir: Path = COURSE_DIR, exchange: str | None = None,
                 only: list[int] | None = None, force: bool = False, timeout_s: float | None = None,
                 student: str | None = None):
        self.dir = Path(course_dir).resolve()
        self.env = dict(os.environ)
        # nbgrader runs `alembic` (and the kernel `python`) from PATH: use this interpreter's, venv or not.
        self.env["PATH"] = os.pathsep.join(filter(None, [str(Path(sys.executable).parent),
                                                         self.env.get("PATH")]))
        if exchange:
            self.env["DISTLAB_EXCHANGE"] = str(exchange)
        self.only = only
        self.force = force
        self.timeout_s = timeout_s
        self.student = student
        self.failed: list[str] = []

    @property
    def modules(self) -> dict[str, list[str]]:
        """``{assignment: [module files]}`` from the manifest ``generate`` wrote (no torch import)."""
        manifest = self.dir / MANIFEST
        if not manifest.is_file():
            raise SystemExit(f"{manifest} is missing: run the generate step first")
        spec = json.loads(manifest.read_text())["assignments"]
        return {a: s["modules"] for a, s in spec.items() if not self.only or s["exercise"] in self.only}

    @property
    def assignments(self) -> list[str]:
        return list(self.modules)

    def _options(self) -> list[str]:
        return (["--force"] if self.force else []) + (["--student", self.student] if self.student else [])

    def nbgrader(self, *args: str) -> bool:
        """Run ``nbgrader ARGS`` in the course directory; record a failure instead of raising.

        nbgrader runs contained (:func:`distlab.process.run_contained`): on timeout it, its
        kernels and whatever they started are all ended. In the grading image the kernels run as
        the learner user (``docker/as-student.sh``); afterwards every process of that user is
        ended too, so nothing a learner's notebook started survives into the next step.
        """
        from distlab.process import kill_user_processes, run_contained  # imports torch: only when needed
        from distlab.sandbox import learner_user

        print("$ nbgrader " + " ".join(args), flush=True)
        finished = run_contained([sys.executable, "-m", "nbgrader", *args], timeout=self.timeout_s or float("inf"),
                                 env=self.env, cwd=self.dir, on_line=print, grace_s=5.0)
        if finished.timed_out:
            print(f"nbgrader {args[0]} took longer than {self.timeout_s:g} s and was stopped", flush=True)
        user = learner_user()
        if user:
            kill_user_processes(user)
        ok = finished.returncode == 0 and not finished.timed_out
        if not ok:
            self.failed.append(" ".join(args))
        return ok

    def generate(self) -> None:
        write_source(self.dir, self.only)
        for a in self.assignments:
            self.nbgrader("generate_assignment", a, "--force")

    def release(self) -> None:
        for a in self.assignments:
            self.nbgrader("release_assignment", a, *(["--force"] if self.force else []))

    def collect(self) -> None:
        for a in self.assignments:
            self.nbgrader("collect", a, "--update")

    def autograde(self) -> None:
        problems = repair_course(self.dir, self.modules, self.student)
        self._problems([f"{student} / {assignment}: {note}" for (student, assignment), notes in problems.items()
                        for note in notes])
        for a in self.assignments:
            self.nbgrader("autograde", a, *self._options())
        self.verify()

    def verify(self) -> None:
        """Regrade, outside any notebook kernel, every submission the gradebook credits with points.

        The test cell runs in the learner's kernel, after any cells the learner
        added; such a cell can patch the standard library (``json.loads``, say)
        and make the cell report full marks. This process never ran learner
        code, so its score stands: where the two differ the gradebook takes
        this one (as a manual score) and the instructor is told. A cheat can
        only raise a score, so submissions at 0 are not graded twice; for those
        that did not run at all, the instructor gets the reason in one line.
        """
        from nbgrader.api import Gradebook

        from .nbgrader_assignments import grade_id
        from .registry import exercises
        from .runner import grade_one

        spec = json.loads((self.dir / MANIFEST).read_text())["assignments"]
        lines = []
        with Gradebook(f"sqlite:///{self.dir / 'gradebook.db'}") as gb:
            for a in self.assignments:
                ex = exercises()[spec[a]["exercise"]]
                for sub in gb.assignment_submissions(a):
                    if self.student and sub.student.id != self.student:
                        continue
                    grade = gb.find_grade(grade_id(ex), a, a, sub.student.id)
                    if not grade.score:
                        lines += self._did_not_run(sub.student.id, a, grade_id(ex))
                        continue
                    truth = grade_one(ex, self.dir / "autograded" / sub.student.id / a).score
                    if abs(truth - grade.score) > 1e-6:
                        lines.append(f"{sub.student.id} / {a}: the notebook reported {grade.score:g} points "
                                     f"but the grader, run outside the notebook, gives {truth:g}: "
                                     "kept the grader's score (did a cell of the notebook patch the grader?)")
                        grade.manual_score = truth
                        gb.db.commit()
        self._problems(lines)

    def _did_not_run(self, student: str, assignment: str, cell_id: str) -> list[str]:
        """A line for the instructor when a submission scored 0 because it did not run at all (it
        raised, exited, hung, or hit a limit), from the feedback its test cell printed."""
        import nbformat

        path = self.dir / "autograded" / student / assignment / f"{assignment}.ipynb"
        try:
            nb = nbformat.read(path, as_version=4)
        except (OSError, ValueError):
            return []
        for cell in nb.cells:
            if cell.metadata.get("nbgrader", {}).get("grade_id") == cell_id:
                text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
                runs = [ln[len("FAIL runs: "):] for ln in text.splitlines() if ln.startswith("FAIL runs: ")
                        and not ln.startswith("FAIL runs: not implemented yet")]  # unfinished, not a problem
                if runs:
                    return [f"{student} / {assignment}: 0 points, the submission did not run: {runs[0][:300]}"]
        return []

    def _problems(self, lines: list[str]) -> None:
        """Print problems and add them (once) to ``nbgrader_problems.txt``."""
        for line in lines:
            print("problem: " + line, flush=True)
        log = self.dir / "nbgrader_problems.txt"
        old = log.read_text().splitlines() if log.exists() else []
        log.write_text("".join(f"{ln}\n" for ln in dict.fromkeys(old + lines)))

    def feedback(self, release: bool = True) -> None:
        for a in self.assignments:
            if self.nbgrader("generate_feedback", a, *self._options()) and release:
                self.nbgrader("release_feedback", a, *(["--student", self.student] if self.student else []))

    def export(self) -> None:
        self.nbgrader("export", "--to", str(self.dir / "grades.csv"))

    def grade(self) -> None:
        for step in (self.collect, self.autograde, self.feedback, self.export):
            step()

    def mark(self) -> None:
        self.autograde()
        self.feedback(release=False)
        self.export()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder.nbgrader_course",
                                     description="The nbgrader cycle of the distlab course.")
    parser.add_argument("step", choices=STEPS)
    parser.add_argument("--course-dir", default=str(COURSE_DIR), help="course root (default: %(default)s)")
    parser.add_argument("--exchange", help="exchange directory (default: $DISTLAB_EXCHANGE)")
    parser.add_argument("--exercise", "-e", type=int, action="append", metavar="N",
                        help="only exercise N's assignment (repeatable)")
    parser.add_argument("--force", action="store_true", help="redo autograde/feedback/release over old results")
    parser.add_argument("--student", help="autograde/feedback only this learner")
    parser.add_argument("--timeout", type=float, default=6 * 3600,
                        help="seconds allowed to each nbgrader command (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.step == "generate":
        from .registry import exercises

        unknown = [n for n in args.exercise or [] if n not in exercises()]
        if unknown:
            parser.error(f"no exercise {unknown[0]} (known: {', '.join(map(str, exercises()))})")
    course = Course(Path(args.course_dir), args.exchange, args.exercise, args.force, args.timeout,
                    args.student)
    getattr(course, args.step)()
    for f in course.failed:
        print(f"nbgrader_course: failed: nbgrader {f}", file=sys.stderr)
    return 1 if course.failed else 0


if __name__ == "__main__":
    sys.exit(main())
