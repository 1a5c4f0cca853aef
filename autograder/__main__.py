"""``python -m autograder COMMAND ...``: the grader's commands. ``python -m autograder COMMAND --help`` for one.

Each command is a module of :mod:`autograder.commands` that adds its own subparser; this module only
dispatches. The spellings of earlier releases (``python -m autograder DIR``, ``--selftest``, ``--list``,
``class merge``) still work, and say once, on stderr, what replaced them.
"""
from __future__ import annotations

import argparse
import sys

from .commands import classroom, grade, gradescope, nbgrader, selftest, stubs

COMMANDS = (grade, classroom, selftest, stubs, nbgrader, gradescope)
EPILOG = """exit status: grade 0 when every graded exercise passes, 1 when any fails; selftest 0 with no
surprise, 1 with any; class 0 when every exercise was graded, whatever the scores (the CSV holds them), 1 when
some could not be (the machine was too slow: grade again); gradescope-run 0 when results.json is written, 1 when
not (not graded); 2 bad usage, for every command.
From a notebook: `from autograder import check; check(1)`."""


def parser() -> tuple[argparse.ArgumentParser, set[str]]:
    """The command line, and its commands' names."""
    top = argparse.ArgumentParser(prog="python -m autograder", epilog=EPILOG,
                                  description="Grade distributed-training exercises against single-process "
                                              "references, from this repository's solutions and checks.",
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = top.add_subparsers(title="commands", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.add_parsers(commands)
    return top, set(commands.choices)


def legacy(argv: list[str], names: set[str]) -> list[str]:
    """``argv`` in today's spelling, with a note on stderr where it was an earlier release's."""
    if argv[:2] == ["class", "merge"]:
        new = ["merge", *argv[2:]]
    elif "--selftest" in argv:
        new = ["selftest", *(a for a in argv if a != "--selftest")]
    elif "--list" in argv:
        new = ["list"]
    elif argv and (argv[0] in names or argv[0] in ("-h", "--help")):
        return argv
    else:  # python -m autograder [DIR] [--exercise N] ...: grade
        new = ["grade", *argv]
    print(f"autograder: note: `python -m autograder {' '.join(argv)}` is spelled "
          f"`python -m autograder {' '.join(new)}` now", file=sys.stderr)
    return new


def main(argv: list[str] | None = None) -> int:
    top, names = parser()
    try:
        args = top.parse_args(legacy(sys.argv[1:] if argv is None else argv, names))
    except SystemExit as exc:  # --help (0) or a usage error (2, said on stderr): the status, for callers of main()
        return exc.code if isinstance(exc.code, int) else 2
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
