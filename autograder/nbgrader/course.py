"""The nbgrader cycle for instructors: ``python -m autograder.nbgrader STEP [options]``.

Steps, each over every exercise's assignment (or ``--exercise N``, repeatable):

``generate``   write ``source/`` from the registry and ``solutions/``, then ``nbgrader generate_assignment``
``release``    ``nbgrader release_assignment`` to the exchange
``collect``    ``nbgrader collect``
``autograde``  repair the submissions (see :mod:`autograder.nbgrader.repair`), ``nbgrader autograde``
               (``--jobs N``: N learners at once, :mod:`autograder.nbgrader.parallel`),
               then regrade outside the kernel every submission credited with points
               (:mod:`autograder.nbgrader.verify`)
``feedback``   ``nbgrader generate_feedback`` and ``nbgrader release_feedback``
``export``     ``nbgrader export`` to ``grades.csv``
``grade``      collect, autograde, feedback, export: the whole cycle after the learners submitted
``mark``       autograde, generate_feedback, export: grade what is in ``submitted/`` with no exchange
               (what the grader image runs; the submissions were collected elsewhere)

The course directory (the class's data) is the repository's top-level
``nbgrader/`` folder (``--course-dir``); the exchange is ``$DISTLAB_EXCHANGE``
(or ``--exchange``). Every step runs nbgrader's own command in the course
directory, so its ``nbgrader_config.py`` applies. A step goes on with the
other assignments when one fails, and the exit status is 1 if any failed.
Problems found in submissions are printed and written to
``nbgrader_problems.txt`` in the course directory.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from distlab.runtime.importing import REPO_ROOT

from .assignments import MANIFEST, write_source
from .parallel import autograde_in_parallel
from .repair import repair_course
from .verify import regrade

COURSE_DIR = REPO_ROOT / "nbgrader"
OLD_COURSE_DIR = Path(__file__).resolve().parent  # where the class's data was before it left the package
STEPS = ("generate", "release", "collect", "autograde", "feedback", "export", "grade", "mark")
# `python -m nbgrader`, less 3 s of CPU at every start: jsonschema (imported by nbformat) builds the
# IRI grammar of rfc3987_syntax at import when that package is installed (jupyter-events brings it).
# Without it jsonschema only skips the "iri" format checks, which no notebook or nbgrader schema uses.
# A new gradebook asks `alembic heads` for its schema version in a subprocess, which imports nbgrader,
# grammar included (5-10 s): the same answer is read here from nbgrader's own migration scripts.
NBGRADER_MAIN = ("import sys\nsys.modules['rfc3987_syntax'] = None\n"
                 "import nbgrader.api, nbgrader.dbutil\n"
                 "from alembic.script import ScriptDirectory\n"
                 "nbgrader.api.get_alembic_version = "
                 "lambda: ScriptDirectory(nbgrader.dbutil.ALEMBIC_DIR).get_current_head()\n"
                 "from nbgrader.apps.nbgraderapp import main\nmain()\n")


# jupyter_client picks a kernel's five ports by binding port 0 and closing the socket; the kernel binds them
# later, so a port another process took in between kills the kernel before it answers kernel_info, before any
# cell of the learner's ran ("ZMQError: Address already in use"). Such a kernel's submission is autograded again.
KERNEL_DIED_AT_START = "Kernel died before replying to kernel_info"
KERNEL_START_RETRIES = 2


class Course:
    def __init__(self, course_dir: Path = COURSE_DIR, exchange: str | None = None,
                 only: list[int] | None = None, force: bool = False, timeout_s: float | None = None,
                 student: str | None = None, jobs: int = 1):
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
        self.jobs = jobs
        self.failed: list[str] = []

    @property
    def spec(self) -> dict[str, dict]:
        """``{assignment: spec}`` from the manifest ``generate`` wrote (no torch import), ``--exercise`` only."""
        manifest = self.dir / MANIFEST
        if not manifest.is_file():
            raise SystemExit(f"{manifest} is missing: run the generate step first")
        spec = json.loads(manifest.read_text())["assignments"]
        return {a: s for a, s in spec.items() if not self.only or s["exercise"] in self.only}

    @property
    def modules(self) -> dict[str, list[str]]:
        """``{assignment: [module files]}``."""
        return {a: s["modules"] for a, s in self.spec.items()}

    @property
    def assignments(self) -> list[str]:
        return list(self.spec)

    def _options(self) -> list[str]:
        return (["--force"] if self.force else []) + (["--student", self.student] if self.student else [])

    def nbgrader(self, *args: str) -> bool:
        """Run ``nbgrader ARGS`` in the course directory; record a failure instead of raising.

        nbgrader runs contained (:func:`distlab.runtime.process.run_contained`): on timeout it, its
        kernels and whatever they started are all ended. In the grading image the kernels run as
        the learner user (``docker/as-student.sh``); afterwards every process of that user is
        ended too, so nothing a learner's notebook started survives into the next step. An
        autograde whose kernel died before running a cell (:data:`KERNEL_DIED_AT_START`) runs again.
        """
        for attempt in range(1 + KERNEL_START_RETRIES):
            ok, died = self._run(args)
            if ok or not died or args[0] != "autograde" or attempt == KERNEL_START_RETRIES:
                break
            # nbgrader removed the failed submission's autograded copy, so a rerun grades only those again
            print(f"nbgrader autograde: {died} kernel(s) died before running a cell (a kernel's port taken "
                  "between jupyter_client choosing it and the kernel binding it); those are graded again", flush=True)
        if not ok:
            self.failed.append(" ".join(args))
        return ok

    def _run(self, args: tuple[str, ...]) -> tuple[bool, int]:
        """One contained run of ``nbgrader ARGS``: whether it succeeded, and how many kernels died at start."""
        from distlab.runtime.process import kill_user_processes, run_contained  # imports torch: only when needed
        from distlab.runtime.sandbox import learner_user

        print("$ nbgrader " + " ".join(args), flush=True)
        died = 0

        def on_line(line: str) -> None:
            nonlocal died
            print(line)
            died += KERNEL_DIED_AT_START in line

        finished = run_contained([sys.executable, "-c", NBGRADER_MAIN, *args], env=self.env, cwd=self.dir,
                                 timeout=self.timeout_s or float("inf"), on_line=on_line, grace_s=5.0)
        if finished.timed_out:
            print(f"nbgrader {args[0]} took longer than {self.timeout_s:g} s and was stopped", flush=True)
        user = learner_user()
        if user:
            kill_user_processes(user)
        return finished.returncode == 0 and not finished.timed_out, died

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
        jobs = self._parallel_jobs()
        for a in self.assignments:
            if jobs > 1:  # each learner's autograde in its own process, one writer to the gradebook
                autograde_in_parallel(self.dir, a, jobs, self.nbgrader, ["--force"] if self.force else [])
            else:
                self.nbgrader("autograde", a, *self._options())
        self.verify()

    def _parallel_jobs(self) -> int:
        """How many learners autograde at once: ``--jobs``, but one in the learner sandbox, where every
        kernel runs as the one learner user and each autograde ends all of that user's processes."""
        from distlab.runtime.sandbox import learner_user

        if self.jobs > 1 and not self.student and learner_user():
            print("autograde: one learner at a time in the learner sandbox (the kernels share its one user)",
                  flush=True)
            return 1
        return 1 if self.student else self.jobs

    def verify(self) -> None:
        """Regrade outside any kernel what the gradebook credits with points (:mod:`.verify`)."""
        self._problems(regrade(self.dir, {a: s["exercise"] for a, s in self.spec.items()}, self.student))

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


def _moved_data_note(course_dir: Path) -> None:
    """Tell an instructor whose class's data is still in the old course directory where it goes now."""
    if course_dir.resolve() == COURSE_DIR and (OLD_COURSE_DIR / "gradebook.db").exists():
        print(f"note: the course directory is now {COURSE_DIR}, but {OLD_COURSE_DIR} holds a gradebook: "
              "move the class's data (gradebook.db, source/, release/, submitted/, ...) there, "
              f"or pass --course-dir {OLD_COURSE_DIR}", file=sys.stderr)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The cycle's options (``python -m autograder nbgrader`` and ``python -m autograder.nbgrader``)."""
    parser.add_argument("step", choices=STEPS)
    parser.add_argument("--course-dir", default=str(COURSE_DIR), help="course root (default: %(default)s)")
    parser.add_argument("--exchange", help="exchange directory (default: $DISTLAB_EXCHANGE)")
    parser.add_argument("--exercise", "-e", type=int, action="append", metavar="N",
                        help="only exercise N's assignment (repeatable)")
    parser.add_argument("--force", action="store_true", help="redo autograde/feedback/release over old results")
    parser.add_argument("--student", help="autograde/feedback only this learner")
    parser.add_argument("--jobs", "-j", type=int, default=1,
                        help="autograde this many learners at once (one writer to the gradebook; default 1)")
    parser.add_argument("--timeout", type=float, default=6 * 3600,
                        help="seconds allowed to each nbgrader command (default: %(default)s)")
    parser.set_defaults(run=run, error=parser.error)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder.nbgrader",
                                     description="The nbgrader cycle of the distlab course.")
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """One step of the cycle; a bad option is reported by the parser that read it (``args.error``)."""
    if args.step == "generate":
        from ..grader.registry import exercises

        unknown = [n for n in args.exercise or [] if n not in exercises()]
        if unknown:
            args.error(f"no exercise {unknown[0]} (known: {', '.join(map(str, exercises()))})")
    _moved_data_note(Path(args.course_dir))
    if args.jobs < 1:
        args.error("--jobs must be 1 or more")
    course = Course(Path(args.course_dir), args.exchange, args.exercise, args.force, args.timeout,
                    args.student, args.jobs)
    getattr(course, args.step)()
    for f in course.failed:
        print(f"autograder.nbgrader: failed: nbgrader {f}", file=sys.stderr)
    return 1 if course.failed else 0
