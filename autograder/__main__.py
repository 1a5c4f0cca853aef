"""``python -m autograder [DIR] [--exercise N ...] [--json FILE] [--hint K]``

Grades the exercises found in DIR (default ``exercises/``), prints a table and
each exercise's feedback (with ``--hint K``, tier K of each failed criterion's hint), and
optionally writes the report as JSON.
Exit status: 0 all graded exercises pass, 1 any fails, 2 bad usage.

``python -m autograder --selftest [--exercise N ...] [--json FILE]`` checks this
machine instead (see :mod:`autograder.commands.selftest`): exit status 0 no surprises, 1 any.

``python -m autograder class ROOT [--jobs N] [--exercise N ...] [--csv FILE] [--json FILE]`` grades
a whole class, N gradings at a time (see :mod:`autograder.commands.classroom`).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from distlab.runtime.sandbox import SandboxError, preflight

from .grader.progress import to_stderr
from .commands.check import hint_lines
from .grader.registry import exercises, hints
from .grader.report import table, write_json
from .grader.supervise import DEFAULT_DIR, grade


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["class"]:  # python -m autograder class ROOT ...: a whole class (autograder.commands.classroom)
        from .commands.classroom import main as grade_class

        return grade_class(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__.splitlines()[2])
    parser.add_argument("directory", nargs="?",
                        help="folder holding exNN_*.py files (default: exercises/)")
    parser.add_argument("--exercise", "-e", type=int, action="append", metavar="N",
                        help="grade only exercise N (repeatable)")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    parser.add_argument("--hint", type=int, choices=(1, 2, 3), metavar="K",
                        help="after the feedback, tier K (1 concept, 2 mechanism, 3 API) of each failed hint")
    parser.add_argument("--list", action="store_true", help="list the exercises and exit")
    parser.add_argument("--selftest", action="store_true",
                        help="check this machine: grade every solution (full marks expected) and stub (0 expected)")
    args = parser.parse_args(argv)
    known = exercises()
    if args.list:
        for n, ex in known.items():
            print(f"{n}  {ex.name:<24} {ex.filename}  ({ex.max_score:g} points)")
        return 0
    if args.selftest and args.directory is not None:
        print("autograder: error: --selftest grades solutions/ and exercises/ and takes no DIR", file=sys.stderr)
        return 2
    directory = Path(args.directory or DEFAULT_DIR)
    if not directory.is_dir():
        print(f"autograder: error: {directory} is not a directory", file=sys.stderr)
        return 2
    unknown = [n for n in args.exercise or [] if n not in known]
    if unknown:
        print(f"autograder: error: no exercise {unknown[0]} (known: {', '.join(map(str, known))})",
              file=sys.stderr)
        return 2
    if args.selftest:
        from .commands import selftest  # imports torch: only here

        return selftest.run(args.exercise, args.json)
    try:
        preflight()  # as root with a learner user: can that user run this interpreter? One line if not
    except SandboxError as exc:
        print(f"autograder: error: {exc}", file=sys.stderr)
        return 2
    reports = grade(directory, args.exercise, on_progress=to_stderr)  # the table comes at the end
    if not reports:
        names = ", ".join(ex.filename for ex in known.values())
        print(f"autograder: error: no exercise files in {directory} (looked for {names})", file=sys.stderr)
        return 2
    print(table(reports))
    for r in reports:
        for line in hint_lines(r, hints(r.exercise), args.hint, ask="--exercise {exercise} --hint {tier}"):
            print(line)
    if args.json:
        write_json(reports, args.json)
    return 0 if all(r.passed for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
