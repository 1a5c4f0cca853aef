"""``python -m autograder grade [DIR] [--exercise N ...] [--hint K] [--json FILE]``, and ``list``.

Grades the exercises found in DIR (default ``exercises/``), each in its own grading process
(:func:`autograder.grader.supervise.grade_one`), prints a table and each exercise's feedback (with
``--hint K``, tier K of each failed criterion's hint), and with ``--json`` writes the reports as JSON.
Exit status: 0 all graded exercises pass, 1 any fails, 2 bad usage.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from distlab.runtime.sandbox import SandboxError, preflight

from ..grader.hints import feedback_with_hints
from ..grader.progress import to_stderr
from ..grader.registry import exercises, hints
from ..grader.report import table, write_json
from ..grader.supervise import DEFAULT_DIR, grade


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """``grade`` and ``list``, as subcommands of ``python -m autograder``."""
    p = commands.add_parser("grade", help="grade the exercises in a folder (default exercises/)",
                            description="Grade the exercises found in a folder, each in its own grading process: a "
                                        "table, each exercise's feedback and, with --hint K, tier K of each "
                                        "failed criterion's hint.")
    p.add_argument("directory", nargs="?", help="folder holding exNN_*.py files (default: exercises/)")
    p.add_argument("--exercise", "-e", type=int, action="append", metavar="N",
                   help="grade only exercise N (repeatable)")
    p.add_argument("--json", metavar="FILE", help="also write the reports as JSON")
    p.add_argument("--hint", type=int, choices=(1, 2, 3), metavar="K",
                   help="after the feedback, tier K (1 concept, 2 mechanism, 3 API) of each failed criterion's hint")
    p.set_defaults(run=run)
    p = commands.add_parser("list", help="list the exercises", description="List the exercises and their points.")
    p.set_defaults(run=run_list)


def run_list(args: argparse.Namespace) -> int:
    for n, ex in exercises().items():
        print(f"{n}  {ex.name:<24} {ex.filename}  ({ex.max_score:g} points)")
    return 0


def usage_error(message: str) -> int:
    """Bad input: one line on stderr, and the exit status 2 (every command's)."""
    print(f"autograder: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    known = exercises()
    directory = Path(args.directory or DEFAULT_DIR)
    if not directory.is_dir():
        return usage_error(f"{directory} is not a directory")
    unknown = [n for n in args.exercise or [] if n not in known]
    if unknown:
        return usage_error(f"no exercise {unknown[0]} (known: {', '.join(map(str, known))})")
    try:
        preflight()  # as root with a learner user: can that user run this interpreter? One line if not
    except SandboxError as exc:
        return usage_error(str(exc))
    reports = grade(directory, args.exercise, on_progress=to_stderr)  # the table comes at the end
    if not reports:
        names = ", ".join(ex.filename for ex in known.values())
        return usage_error(f"no exercise files in {directory} (looked for {names})")
    ask = "--exercise {exercise} --hint {tier}"
    print(table(reports, lambda r: feedback_with_hints(r, hints(r.exercise), args.hint, ask=ask)))
    if args.json:
        write_json(reports, args.json)
    return 0 if all(r.passed for r in reports) else 1
