"""Localisation by substitution: which of the learner's graded functions makes the run wrong.

Where an exercise has several graded functions (exercise 5: ``save_checkpoint``, ``load_checkpoint``,
``train``...), a failing run that names no cause is graded again with the reference's version of one
function swapped in, one function at a time; the function whose replacement makes the run pass is
named: "the difference is in save_checkpoint: with the reference's save_checkpoint your run passes".
This is how CMU's llmsys grader grades one part at a time (``../shared/REFERENCES.md``, "Grade one part
at a time"), and the one-factor-at-a-time isolation of delta debugging (Zeller and Hildebrandt, 2002).

The variants are written to a temporary directory (the reference's code never enters the learner's
own file) and graded in one call of the check's ``grade`` (one launch for all of them). Note that a
variant holds the reference's function: a learner's code that reads its own file could print it, so
the grader runs this only where the learner cannot read the job's log (``grader.main``, opt-in).
"""
from __future__ import annotations

import ast
import tempfile
from pathlib import Path
from typing import Sequence

MARK = "### BEGIN SOLUTION"


def _functions(source: str) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}


def graded_functions(solution: str) -> list[str]:
    """The top-level functions of a reference solution the learner writes (those with a solution block)."""
    lines = solution.splitlines()
    return [name for name, fn in _functions(solution).items()
            if any(MARK in ln for ln in lines[fn.lineno - 1:fn.end_lineno])]


def _span(fn: ast.FunctionDef) -> tuple[int, int]:
    start = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
    return start - 1, fn.end_lineno


def swapped(learner: str, solution: str, name: str) -> str | None:
    """``learner``'s source with function ``name`` replaced by the reference's; ``None`` when the
    learner's file does not parse or lacks it."""
    try:
        mine, theirs = _functions(learner), _functions(solution)
    except SyntaxError:
        return None
    if name not in mine or name not in theirs:
        return None
    lines, ref = learner.splitlines(), solution.splitlines()
    (a, b), (c, d) = _span(mine[name]), _span(theirs[name])
    return "\n".join(lines[:a] + ref[c:d] + lines[b:]) + "\n"


def localise(check, path: Path, report, solution: Path, **kwargs) -> str | None:
    """Grade ``path`` again with each graded function of ``solution`` swapped in, in one ``grade`` call;
    the sentence naming the function(s) whose replacement makes the run pass, or raise its score most."""
    learner, reference = Path(path).read_text(), Path(solution).read_text()
    names = graded_functions(reference)
    if len(names) < 2:
        return None  # one graded function: the divergence already says where
    with tempfile.TemporaryDirectory(prefix="distlab-swap-") as tmp:
        variants: list[tuple[str, Path]] = []
        for name in names:
            source = swapped(learner, reference, name)
            if source is None or source.strip() == learner.strip():
                continue
            (Path(tmp) / name).mkdir()
            variant = Path(tmp) / name / Path(path).name
            variant.write_text(source)
            variants.append((name, variant))
        if not variants:
            return None
        reports = check.grade([v for _, v in variants], **kwargs)
    return verdict([(name, r.score, r.passed) for (name, _), r in zip(variants, reports)], report.score,
                   report.max_score)


def verdict(outcomes: Sequence[tuple[str, float, bool]], score: float, max_score: float) -> str | None:
    """The sentence for the outcomes ``(function, score, passed)`` of the swapped gradings."""
    whole = [name for name, _, ok in outcomes if ok]
    if whole:
        return (f"the difference is in {' or '.join(whole)}: with the reference's {whole[0]} your run passes every "
                "criterion, so look there first")
    best = max(outcomes, key=lambda o: o[1], default=None)
    if best and best[1] > score:
        return (f"the difference is mostly in {best[0]}: with the reference's {best[0]} your run scores "
                f"{best[1]:g}/{max_score:g} instead of {score:g} (more than one function differs)")
    return None
