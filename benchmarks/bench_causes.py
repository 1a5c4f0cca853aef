"""What each check's hand-written causes buy over the general feedback layer, measured on the generated mutants.

A check names the mistakes it anticipated (``@mistake`` functions, :mod:`autograder.grader.diagnosis`);
under them the general layer (the trace, the first divergence from the reference, errors at the learner's
line) names what no cause does. For each exercise the line-edit mutants of ``bench_feedback`` are graded
twice in one run: with every cause, and with every cause answering ``None`` (``DISTLAB_DISABLED_CAUSES=*``).
A cause *costs* the mutants it named whose feedback the general layer alone leaves unnamed; a cause whose
cost is 0 here is a candidate for deletion, on this family of mistakes only: its own planted mutants in the
check's tests, and realistic mistakes, may still need it (a deletion is decided on all three).

Also the size the issue sets a target for: each check's lines (its package, sub-packages included) over its
reference solution's. ``python -m benchmarks causes`` (minutes: every exercise's mutants, twice);
``DISTLAB_BENCH_EXERCISES=5,7`` restricts the exercises.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from unittest import mock

from benchmarks import Row
from benchmarks.bench_feedback import graded, how_named

REPO = Path(__file__).resolve().parents[1]


def _lines(paths) -> int:
    return sum(len(p.read_text().splitlines()) for p in paths)


def size_ratio(check) -> float:
    """The check package's lines over its reference solution's."""
    from autograder.grader import divergence

    folder = Path(check.__file__).parent
    return _lines(folder.rglob("*.py")) / _lines([divergence.solution_path(check)])


# Causes a criterion's control flow needs (it reads a figure only once they have said there is one): kept in the
# run without causes, and not counted as candidates for deletion.
GUARDS = {6: ("no figure returned", "nothing returned")}


def _run(number: int, disabled: str | None) -> tuple[list, list[str | None], list[set[str]]]:
    from autograder.grader import diagnosis
    from autograder.grader.diagnosis import DISABLED_VAR, KEPT_VAR, causes_named

    diagnosis.NAMED.clear()  # what the run before named is not this run's
    diagnosis.NAMED_BY.clear()
    with mock.patch.dict(os.environ):  # the environment as it was, after this grading
        for var in (DISABLED_VAR, KEPT_VAR):
            os.environ.pop(var, None)
        if disabled:
            os.environ.update({DISABLED_VAR: disabled, KEPT_VAR: "|".join(GUARDS.get(number, ()))})
        solution, found, reports, _ = graded(number)
    caught = [not r.passed and not r.not_graded for r in reports]
    kinds = [how_named(m, r, solution.name) if c else "not caught" for m, r, c in zip(found, reports, caught)]
    return found, kinds, [causes_named(r.feedback) for r in reports]


def costs(number: int) -> dict:
    """Per declared cause of exercise ``number``: how many mutants it named, and how many of those the general
    layer alone leaves unnamed (or uncaught)."""
    from autograder.grader.diagnosis import declared_mistakes
    from autograder.grader.registry import check_module

    check = check_module(number)
    known = {k.mistake for k in getattr(check, "KNOWN_ERRORS", ())}
    causes = [c for c in declared_mistakes(check) if c not in known and c not in GUARDS.get(number, ())]
    found, on, fired = _run(number, None)
    _, off, _ = _run(number, "*")
    named = {c: [i for i, f in enumerate(fired) if c in f] for c in causes}
    return {"causes": causes, "mutants": len(found), "named_on": sum(k not in (None, "not caught") for k in on),
            "named_off": sum(k not in (None, "not caught") for k in off),
            "cost": {c: sum(off[i] in (None, "not caught") for i in idx) for c, idx in named.items()},
            "named": {c: len(idx) for c, idx in named.items()}, "ratio": size_ratio(check)}


def rows() -> list[Row]:
    from autograder.grader.registry import exercises

    wanted = os.environ.get("DISTLAB_BENCH_EXERCISES")
    numbers = [int(n) for n in wanted.split(",")] if wanted else sorted(exercises())
    out = []
    for n in numbers:
        got = costs(n)
        print(f"# causes ex{n:02d}: {got}", file=sys.stderr, flush=True)  # each exercise's figures as they come
        fired = [c for c in got["causes"] if got["named"][c]]
        free = [c for c in fired if not got["cost"][c]]
        out += [Row("causes", f"ex{n:02d}: check lines / solution lines", got["ratio"], "x",
                    "issue 36's target: <= 3x"),
                Row("causes", f"ex{n:02d}: mutants named, every cause / general layer only",
                    got["named_on"] - got["named_off"], "mutants",
                    f"{got['named_on']} vs {got['named_off']} of {got['mutants']} line-edit mutants"),
                Row("causes", f"ex{n:02d}: causes that named a line-edit mutant, of those declared", len(fired),
                    "causes", f"of {len(got['causes'])}; the general layer names every mutant of {len(free)} "
                    f"of them too: {'; '.join(free) or 'none'}. The others' cost: "
                    + ("; ".join(f"{c} ({got['cost'][c]})" for c in fired if got["cost"][c]) or "none"))]
    return out
