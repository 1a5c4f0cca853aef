"""Grade a whole class: ``python -m autograder class ROOT [--jobs N] [--exercise N ...] [--csv F] [--json F]``.

Across machines, each task of a Slurm job array grades one ``--slice K/N`` of the learners and
``python -m autograder merge OUT.csv SLICE.csv ...`` joins their CSVs
(``course/slurm/grade_class.sbatch``).

ROOT holds one folder per learner, named by the learner's id, each with any of the ``exNN_*.py``
files. Every learner's every exercise is graded exactly as ``python -m autograder grade DIR`` grades it
(:func:`autograder.grader.supervise.grade_one`: its own grading subprocess, its own launches, each contained),
``N`` gradings at a time, so no two learners' code ever share a process. The grades do not depend
on ``N``: a grading that runs out of time while still advancing is *not graded*, never scored
(slow is not wrong), so contention between gradings cannot turn time into marks.

In the learner sandbox (root, ``DISTLAB_STUDENT_USER``), learners graded at the same time must not
share a user either (one could signal the other's ranks, or read its scratch files): each
concurrent grading takes one user of ``DISTLAB_STUDENT_USERS`` (comma-separated; default the one
``DISTLAB_STUDENT_USER``), so ``N`` is at most their number.

Written: a CSV row per learner (id, one column per exercise, total; a cell is the score, ``missing``,
``stub`` or ``not graded`` where the machine was too slow), the JSON of every report (``--json``), one
Markdown file of feedback per learner (``--feedback DIR``), and progress on stderr; the last lines name
every file written. Exit status: 0 when every exercise was graded, whatever the scores; 1 when some
could not be (the machine was too slow: grade again); 2 for bad usage.
"""
from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import queue
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from distlab.runtime.sandbox import STUDENT_USER_VAR, SandboxError, learner_user, preflight

from ..grader.hints import feedback_with_hints
from ..grader.registry import Exercise, exercises, hints
from ..grader.report import ExerciseReport
from ..grader.supervise import grade_one
from .grade import usage_error

USERS_VAR = "DISTLAB_STUDENT_USERS"
RANKS_PER_JOB = 4  # the largest world a check launches (exercises 1, 2, 8 grade at W=4)


def default_jobs() -> int:
    """What the machine holds: one job per free set of GPUs on GPUs, cores / ranks per job on CPUs."""
    gpus = len(glob.glob("/dev/nvidia[0-9]*")) if os.environ.get("CUDA_VISIBLE_DEVICES") != "" else 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, (gpus if gpus else cores) // RANKS_PER_JOB)


def learner_users() -> list[str | None]:
    """The users concurrent gradings run learners as: ``[None]`` outside the sandbox."""
    if learner_user() is None:
        return [None]
    names = [u.strip() for u in os.environ.get(USERS_VAR, "").split(",") if u.strip()]
    return names or [os.environ[STUDENT_USER_VAR].strip()]


def learners(root: Path, part: tuple[int, int] = (0, 1)) -> list[Path]:
    """The learner folders of ``root``, in id order; with ``part=(k, n)`` only every n-th from the k-th
    (one slice of the class, for one task of a Slurm job array)."""
    k, n = part
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))[k::n]


def parse_slice(text: str) -> tuple[int, int]:
    """``"K/N"`` -> (K, N), 0 <= K < N."""
    k, _, n = text.partition("/")
    if not (k.isdigit() and n.isdigit() and 0 <= int(k) < int(n)):
        raise argparse.ArgumentTypeError(f"--slice takes K/N with 0 <= K < N, not {text!r}")
    return int(k), int(n)


def merge(out: str | Path, parts: list[str | Path]) -> int:
    """One CSV from the slices' CSVs (the same columns), learners in id order; returns how many."""
    header, rows = None, []
    for part in parts:
        with open(part, newline="") as f:
            lines = list(csv.reader(f))
        if header is not None and lines[0] != header:
            raise ValueError(f"{part}: its columns {lines[0]} differ from {header}: graded with other exercises?")
        header, rows = lines[0], rows + lines[1:]
    with open(out, "w", newline="") as f:
        csv.writer(f).writerows([header, *sorted(rows)])
    return len(rows)


class Progress:
    """``[3/8 learners] 0:12 elapsed, about 0:20 left`` on stderr, as each learner's last grading ends."""

    def __init__(self, total: int, per_learner: int):
        self.total, self.per_learner, self.start = total, per_learner, time.monotonic()
        self.left: dict[str, int] = {}
        self.done, self.lock = 0, threading.Lock()

    def graded(self, learner: str) -> None:
        with self.lock:
            self.left[learner] = self.left.get(learner, self.per_learner) - 1
            if self.left[learner]:
                return
            self.done += 1
            elapsed = time.monotonic() - self.start
            eta = elapsed / self.done * (self.total - self.done)
            print(f"[{self.done}/{self.total} learners] {_clock(elapsed)} elapsed, about {_clock(eta)} left",
                  file=sys.stderr, flush=True)


def _clock(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def grade_class(root: Path, only: list[int] | None = None, jobs: int | None = None,
                part: tuple[int, int] = (0, 1)) -> dict[str, list[ExerciseReport]]:
    """``{learner id: [report per exercise]}``, graded ``jobs`` at a time (each with its own user in the sandbox)."""
    known = exercises()
    chosen: list[Exercise] = [known[n] for n in (only or known)]
    users = learner_users()
    jobs = min(jobs or default_jobs(), len(users))
    free: queue.Queue = queue.Queue()
    for user in users[:jobs]:
        free.put(user)
    folks = learners(root, part)
    progress = Progress(len(folks), len(chosen))

    def one(task: tuple[Path, Exercise]) -> ExerciseReport:
        folder, ex = task
        user = free.get()
        try:
            return grade_one(ex, folder, learner=user)
        finally:
            free.put(user)
            progress.graded(folder.name)

    tasks = [(folder, ex) for folder in folks for ex in chosen]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        reports = list(pool.map(one, tasks))
    out: dict[str, list[ExerciseReport]] = {}
    for (folder, _), report in zip(tasks, reports):
        out.setdefault(folder.name, []).append(report)
    return out


def cell(report: ExerciseReport) -> str:
    """An exercise's cell of the CSV: ``missing`` (no file), ``stub`` (the stub, unchanged), ``not graded``
    (the machine was too slow: grade it again), or the score."""
    if report.handed_in != "file":
        return report.handed_in
    return "not graded" if report.not_graded else f"{report.score:g}"


def write_csv(results: dict[str, list[ExerciseReport]], path: str | Path) -> None:
    """One row per learner: the id, each exercise's :func:`cell`, the total of the scores."""
    first = next(iter(results.values()), [])
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["learner", *(f"ex{r.exercise:02d}_{r.name}" for r in first), "total"])
        for learner, reports in results.items():
            writer.writerow([learner, *map(cell, reports), f"{sum(r.score for r in reports if not r.not_graded):g}"])


def write_feedback(results: dict[str, list[ExerciseReport]], folder: Path) -> list[Path]:
    """One Markdown file per learner, ``folder/<id>.md``: every exercise's score, its criteria with their
    feedback and the first tier of each failed criterion's hint, ready to return through any course site."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for learner, reports in results.items():
        parts = [f"# Feedback for {learner}\n"]
        for r in reports:
            score = cell(r) if r.handed_in != "file" or r.not_graded else f"{r.score:g}/{r.max_score:g}"
            text = feedback_with_hints(r, hints(r.exercise), 1)
            parts.append(f"## Exercise {r.exercise} ({r.name}): {score}\n\n```\n{text}\n```\n")
        written.append(folder / f"{learner}.md")
        written[-1].write_text("\n".join(parts))
    return written


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """``class`` and ``merge``, as subcommands of ``python -m autograder``."""
    p = commands.add_parser("class", help="grade a whole class: one folder per learner",
                            description="Grade a whole class, one folder per learner, N gradings at a time: "
                                        "a CSV row per learner, and every report as JSON with --json.")
    p.add_argument("root", help="one folder per learner (named by the learner's id) of exNN_*.py files")
    p.add_argument("--jobs", "-j", type=int, help=f"gradings at a time (default: what this machine holds, "
                                                   f"{default_jobs()} here)")
    p.add_argument("--exercise", "-e", type=int, action="append", metavar="N", help="only exercise N")
    p.add_argument("--csv", metavar="FILE", help="the grades, a row per learner (default ROOT/grades.csv)")
    p.add_argument("--json", metavar="FILE", help="every report as JSON")
    p.add_argument("--feedback", metavar="DIR", help="one Markdown file of feedback per learner, DIR/<id>.md")
    p.add_argument("--slice", type=parse_slice, default=(0, 1), metavar="K/N",
                   help="grade only every N-th learner from the K-th (a Slurm array task's share)")
    p.set_defaults(run=run)
    p = commands.add_parser("merge", help="join the CSVs of a class graded in slices (class --slice K/N)",
                            description="Join the CSVs that the slices of a class wrote into one.")
    p.add_argument("out", metavar="OUT.csv")
    p.add_argument("parts", nargs="+", metavar="SLICE.csv")
    p.set_defaults(run=run_merge)


def run_merge(args: argparse.Namespace) -> int:
    try:
        print(f"merged {merge(args.out, args.parts)} learners into {args.out}")
    except (OSError, ValueError, IndexError) as exc:
        return usage_error(str(exc))
    return 0


def run(args: argparse.Namespace) -> int:
    root = Path(args.root)
    if not root.is_dir() or not learners(root, args.slice):
        return usage_error(f"{root} holds no learner folders")
    unknown = [n for n in args.exercise or [] if n not in exercises()]
    if unknown or (args.jobs is not None and args.jobs < 1):
        return usage_error(f"no exercise {unknown[0]}" if unknown else "--jobs must be 1 or more")
    try:
        preflight()
    except SandboxError as exc:
        return usage_error(str(exc))
    results = grade_class(root, args.exercise, args.jobs, args.slice)
    csv_path = Path(args.csv or root / "grades.csv")
    write_csv(results, csv_path)
    print(f"graded {len(results)} learners")
    print(f"wrote {csv_path} (a row per learner: the score, or missing, stub, not graded)")
    if args.json:
        Path(args.json).write_text(json.dumps({k: [r.to_dict() for r in v] for k, v in results.items()}, indent=2))
        print(f"wrote {args.json} (every report)")
    if args.feedback:
        print(f"wrote {len(write_feedback(results, Path(args.feedback)))} feedback files in {args.feedback}")
    missed = sum(r.not_graded != "" for v in results.values() for r in v)
    if missed:  # the machine's problem, not the learners': exit 1, so that a script grades them again
        print(f"{missed} exercise(s) not graded (the machine was too slow): grade them again", file=sys.stderr)
    return 1 if missed else 0
