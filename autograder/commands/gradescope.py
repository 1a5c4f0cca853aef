"""Gradescope, where a course has no hub: ``python -m autograder gradescope --exercise N [-o FILE]`` builds the
autograder zip; ``python -m autograder gradescope-run`` is what its ``run_autograder`` runs, in Gradescope's
container (docs/gradescope.md).

The zip holds, at its root, what Gradescope's autograder specification asks for: ``setup.sh`` (run once, as
root, when Gradescope builds the image: the pinned packages with torch's CPU wheel, and the unprivileged user
learners' code runs as) and ``run_autograder`` (executable; run as root for every submission), both from
``docker/gradescope/``; and beside them what grading needs: ``requirements.txt`` (this repository's, as it
is), ``autograder/`` and ``distlab/``, the graded exercises' reference solutions (the stubs are told from
them; ``setup.sh`` makes them unreadable to the learner's user), and ``gradescope.json`` (which exercises, the
tests' visibility, a time scale).

``gradescope-run`` grades every exercise of ``gradescope.json`` from the file of that name the learner uploaded
(at the top of the submission, or the shallowest one in its folders), copied into a folder of its own that the
learner's user can read and not write. Each exercise is graded by
:func:`autograder.grader.supervise.grade_one`, as ``python -m autograder grade`` grades it: the learner's code
runs only in the torchrun ranks, as ``DISTLAB_STUDENT_USER`` (``run_autograder`` sets ``student``; as root
without one, nothing is graded), and the verdict is computed in grading processes it never ran in. Then every
process of that user is ended, and only then is ``results.json`` written, by this process, in a folder the
learner's user cannot write (:mod:`autograder.grader.gradescope` says what it holds, and why a grading the
machine could not finish writes none). Its stdout, which Gradescope shows the instructor, has the table and
the feedback. Exit status: 0 results written; 1 not graded (no results.json); 2 bad usage.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from distlab.runtime.importing import REPO_ROOT
from distlab.runtime.process import REAPER, TIME_SCALE_VAR
from distlab.runtime.sandbox import SandboxError, learner_user, preflight

from ..grader.gradescope import RESULTS, VISIBILITIES, results, unfinished, unfinished_message, write_results
from ..grader.progress import to_stderr
from ..grader.registry import Exercise, exercises, hints
from ..grader.report import table
from ..grader.supervise import grade_one
from .grade import usage_error

SCRIPTS = REPO_ROOT / "docker" / "gradescope"
CONFIG = "gradescope.json"
PACKAGES = ("autograder", "distlab")
EXTEND = 3  # a grading still advancing at its limit goes on up to 3 times it (distlab.runtime.process.ProgressLimit)
GRADESCOPE_MAX_S = 40 * 60  # the longest timeout Gradescope's settings offer


def members(chosen: list[Exercise], config: dict) -> list[tuple[str, bytes, int]]:
    """``(name in the zip, bytes, mode)`` of every file of the autograder zip for the exercises ``chosen``."""
    files = [("setup.sh", (SCRIPTS / "setup.sh").read_bytes(), 0o755),
             ("run_autograder", (SCRIPTS / "run_autograder").read_bytes(), 0o755),
             ("requirements.txt", (REPO_ROOT / "requirements.txt").read_bytes(), 0o644),
             (CONFIG, (json.dumps(config, indent=2) + "\n").encode(), 0o644)]
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                files.append((path.relative_to(REPO_ROOT).as_posix(), path.read_bytes(), 0o644))
    files += [(f"solutions/{ex.filename}", (REPO_ROOT / "solutions" / ex.filename).read_bytes(), 0o644)
              for ex in chosen]
    return files


def build(numbers: list[int], out: str | os.PathLike, visibility: str = "visible",
          time_scale: float | None = None) -> Path:
    """Write the autograder zip for exercises ``numbers`` to ``out``; the files at its root, as Gradescope wants."""
    known = exercises()
    chosen = [known[n] for n in numbers]
    config = {"exercises": numbers, "visibility": visibility, "time_scale": time_scale}
    out = Path(out)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data, mode in members(chosen, config):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))  # the same sources, the same zip
            info.external_attr = (0o100000 | mode) << 16  # a regular file with its mode (unzip keeps it)
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return out


def longest_s(chosen: list[Exercise], time_scale: float | None) -> float:
    """The longest a submission's grading can take: every exercise's limit, at the scale, extended while advancing."""
    return sum(ex.time_limit for ex in chosen) * (time_scale or 1.0) * EXTEND


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """``gradescope`` and ``gradescope-run``, as subcommands of ``python -m autograder``."""
    p = commands.add_parser("gradescope", help="build the Gradescope autograder zip (setup.sh, run_autograder)",
                            description="Build the autograder zip to upload to a Gradescope programming "
                                        "assignment: it grades the exercises named, from the files learners upload.")
    p.add_argument("--exercise", "-e", type=int, action="append", metavar="N", required=True,
                   help="grade exercise N (repeatable: one assignment for several exercises)")
    p.add_argument("--output", "-o", metavar="FILE", help="the zip (default gradescope-exNN.zip)")
    p.add_argument("--visibility", choices=VISIBILITIES, default="visible",
                   help="when learners see each criterion's test (default visible)")
    p.add_argument("--time-scale", type=float, metavar="S",
                   help=f"every time limit times S on Gradescope's machines ({TIME_SCALE_VAR}; default 1)")
    p.set_defaults(run=run_build)
    p = commands.add_parser("gradescope-run", help="grade a Gradescope submission (what run_autograder runs)",
                            description="Grade /autograder/submission and write /autograder/results/results.json, "
                                        "in Gradescope's container, from the zip `gradescope` builds.")
    p.add_argument("--submission", default="/autograder/submission", help="the learner's uploaded files")
    p.add_argument("--results", default="/autograder/results", help="where results.json is written")
    p.set_defaults(run=run_grade)


def run_build(args: argparse.Namespace) -> int:
    known = exercises()
    numbers = list(dict.fromkeys(args.exercise))
    if unknown := [n for n in numbers if n not in known]:
        return usage_error(f"no exercise {unknown[0]} (known: {', '.join(map(str, known))})")
    if args.time_scale is not None and args.time_scale <= 0:
        return usage_error("--time-scale must be more than 0")
    out = Path(args.output or "gradescope-" + "-".join(f"ex{n:02d}" for n in numbers) + ".zip")
    build(numbers, out, args.visibility, args.time_scale)
    chosen = [known[n] for n in numbers]
    longest = longest_s(chosen, args.time_scale)
    print(f"wrote {out}: grades {', '.join(ex.filename for ex in chosen)} "
          f"({sum(ex.max_score for ex in chosen):g} points)")
    print(f"Gradescope settings: learners upload {', '.join(ex.filename for ex in chosen)}; give the autograder "
          f"a timeout of at least {math.ceil(longest / 60)} min (a run Gradescope stops scores 0)")
    if longest > GRADESCOPE_MAX_S:
        print(f"warning: that is more than Gradescope's {GRADESCOPE_MAX_S // 60} min: grade fewer exercises per "
              "assignment", file=sys.stderr)
    return 0


def find_upload(folder: Path, filename: str) -> Path | None:
    """The learner's ``filename`` in the submission ``folder``: at its top, else the shallowest in its folders
    (an upload from a repository keeps them); never a symbolic link, nor a file outside ``folder``."""
    root = folder.resolve()
    found = sorted(folder.rglob(filename), key=lambda p: (len(p.parts), str(p)))
    for path in found:
        hidden = any(part.startswith(".") for part in path.relative_to(folder).parts[:-1])
        if path.is_file() and not path.is_symlink() and not hidden and path.resolve().is_relative_to(root):
            return path
    return None


def stage(submission: Path, chosen: list[Exercise], into: Path) -> dict[int, Path]:
    """Copy each exercise's uploaded file into ``into`` (readable by the learner's user, not writable);
    ``{exercise: where it was uploaded}`` for those found."""
    found = {}
    for ex in chosen:
        path = find_upload(submission, ex.filename)
        if path is not None:
            shutil.copyfile(path, into / ex.filename, follow_symlinks=False)
            os.chmod(into / ex.filename, 0o644)
            found[ex.number] = path
    return found


def keep_out(results_dir: Path) -> None:
    """The results folder belongs to this process's user and only it writes there (the learner's user cannot)."""
    os.chown(results_dir, os.geteuid(), os.getegid(), follow_symlinks=False)
    os.chmod(results_dir, 0o755)


def end_user(user: str) -> None:
    """End every process of the learner's ``user`` (``reaper.py end-user``, as docker/grade.sh does)."""
    subprocess.run([sys.executable, "-I", "-S", str(REAPER), "end-user", user], capture_output=True, timeout=300)


def sandbox() -> str | None:
    """The learner's user (None when this process is not root); raises SandboxError where learners' code would
    run as root, or the user cannot run the grader's interpreter."""
    user = learner_user()
    if os.geteuid() == 0 and user is None:
        raise SandboxError("running as root, learners' code must run as an unprivileged user: set "
                           "DISTLAB_STUDENT_USER (run_autograder sets student, which setup.sh makes)")
    preflight()
    return user


def run_grade(args: argparse.Namespace) -> int:
    start = time.monotonic()
    submission, results_dir = Path(args.submission), Path(args.results)
    if not (REPO_ROOT / CONFIG).is_file():
        return usage_error(f"no {CONFIG} in {REPO_ROOT}: gradescope-run runs in the zip `gradescope` builds")
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / RESULTS).unlink(missing_ok=True)  # whatever happens next, no earlier verdict stands
    config = json.loads((REPO_ROOT / CONFIG).read_text())
    known = exercises()
    chosen = [known[n] for n in config["exercises"]]
    print(f"autograder from {REPO_ROOT}: exercise(s) {', '.join(map(str, config['exercises']))} of {submission}")
    try:
        user = sandbox()
    except SandboxError as exc:
        print(f"NOT GRADED: the grader is not set up: {exc}")
        return 1
    if user:
        keep_out(results_dir)
    if config.get("time_scale") and TIME_SCALE_VAR not in os.environ:
        os.environ[TIME_SCALE_VAR] = repr(float(config["time_scale"]))
    with tempfile.TemporaryDirectory(prefix="distlab-gradescope-") as staged:
        os.chmod(staged, 0o755)
        found = stage(submission, chosen, Path(staged))
        for ex in chosen:
            print(f"exercise {ex.number}: " + (f"{found[ex.number]}" if ex.number in found else
                                               f"no {ex.filename} in the submission"), flush=True)
        reports = [grade_one(ex, Path(staged), on_progress=to_stderr) for ex in chosen]
    for r, ex in zip(reports, chosen):
        if r.handed_in == "missing":
            r.criteria[0].feedback = f"{ex.filename} is not in your submission: upload a file of that name"
    if user:
        end_user(user)  # nothing of the learner's runs when the verdict is written
    print(table(reports), flush=True)
    if unfinished(reports):
        print(unfinished_message(reports))
        return 1
    path = write_results(results(reports, hints, time.monotonic() - start, config["visibility"]), results_dir)
    print(f"wrote {path}")
    return 0
