"""``python -m autograder stubs [--check]``: write ``exercises/`` from ``solutions/`` (:mod:`autograder.grader.stubs`).

``--check`` writes nothing and exits 1 if ``exercises/`` is not what the solutions generate.
"""
from __future__ import annotations

import argparse

from distlab.runtime.importing import REPO_ROOT

from ..grader.stubs import differing, generate


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """``stubs``, as a subcommand of ``python -m autograder``."""
    p = commands.add_parser("stubs", help="write exercises/ from solutions/ (--check: only compare)",
                            description="Write exercises/ from solutions/: every solution region becomes "
                                        "raise NotImplementedError.")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if exercises/ is not current")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    stubs = generate()
    if args.check:
        stale = differing(stubs)
        for p in stale:
            print(f"{p.relative_to(REPO_ROOT)} is not generated from solutions/: run make stubs")
        return 1 if stale else 0
    for p, text in stubs.items():
        p.write_text(text)
        print(f"wrote {p.relative_to(REPO_ROOT)}")
    return 0

