"""``python -m autograder nbgrader STEP [options]``: one step of the course's nbgrader cycle
(:mod:`autograder.nbgrader.course`; ``python -m autograder.nbgrader STEP`` is the same command)."""
from __future__ import annotations

import argparse

from ..nbgrader.course import add_arguments


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """``nbgrader``, as a subcommand of ``python -m autograder``."""
    p = commands.add_parser("nbgrader", help="a step of the nbgrader cycle (generate, release, ..., grade)",
                            description="The nbgrader cycle of the distlab course, one step at a time.")
    add_arguments(p)
