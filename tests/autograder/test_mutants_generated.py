"""Mistakes nobody listed, end to end: the first divergence from the reference names the learner's line.

One hand-made mutant of exercise 5 (the scheduler's first step skipped: in no table) and two generated
ones of exercise 7 (``benchmarks.bench_feedback.mutants``); ``make bench`` grades all of them.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from autograder.grader import divergence
from autograder.checks import ex05_checkpoint, ex07_pipeline
from benchmarks.bench_feedback import mutants, names_line

pytestmark = pytest.mark.timeout(240)
SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"


def test_generated_mutants_parse_and_differ():
    found = mutants(SOLUTIONS / "ex07_pipeline.py")
    assert len(found) >= 15 and len({m.source for m in found}) == len(found)
    assert {m.edit.split(":")[0].split(" ", 2)[2] for m in found} == {"dropped", "moved down", "literal changed"}


def test_scheduler_step_skipped_is_named_at_its_line(tmp_path):
    src = (SOLUTIONS / "ex05_checkpoint.py").read_text()
    mutant = src.replace("            scheduler.step()\n            step += 1\n",
                         "            step += 1\n            if step > 1:\n                scheduler.step()\n")
    assert mutant != src
    path = tmp_path / "ex05_checkpoint.py"
    path.write_text(mutant)
    line = mutant.splitlines().index("                scheduler.step()") + 1
    (report,) = divergence.grade(ex05_checkpoint, [path], with_reference=True, scenarios=())
    assert not report.passed
    assert "first difference from the reference (after 1 optimizer.step() call(s)" in report.feedback
    assert "where the reference stepped the LR scheduler (to lr 0.00294889); yours does that" in report.feedback
    assert f"(ex05_checkpoint.py:{line}: `scheduler.step()`)" in report.feedback


def test_generated_pipeline_mutants_name_the_edited_line(tmp_path):
    found = {m.edit.split(":")[0]: m for m in mutants(SOLUTIONS / "ex07_pipeline.py")}
    picked = [found["line 77 moved down"], found["line 91 literal changed"]]
    paths = []
    for i, m in enumerate(picked):
        (tmp_path / str(i)).mkdir()
        paths.append(tmp_path / str(i) / "ex07_pipeline.py")
        paths[-1].write_text(m.source)
    reports = divergence.grade(ex07_pipeline, paths, with_reference=True, p2p_timeout_s=1.0)
    for m, report in zip(picked, reports):
        assert not report.passed
        assert names_line(report.feedback, "ex07_pipeline.py", m.lines), (m.edit, report.feedback)


def test_the_realistic_family_covers_every_exercise_and_applies_to_todays_solutions():
    """benchmarks/realistic/ (make bench grades it): every exercise has mistakes and legal variants, each with its
    source in one line, and each edit still applies to its solution once and parses (a rewritten solution
    must take its family along, not silently shrink it)."""
    import ast

    from autograder.grader.registry import exercises
    from benchmarks.realistic import family, solution

    found = family()
    assert set(found) == set(exercises())
    for number, (mistakes, legal) in found.items():
        assert mistakes and legal, f"exercise {number}: {len(mistakes)} mistakes, {len(legal)} legal variants"
        names = [m.name for m in mistakes + legal]
        assert len(names) == len(set(names)), f"exercise {number}: a name is used twice"
        original = solution(number).read_text()
        for m in mistakes + legal:
            assert m.source.strip() and "\n" not in m.source and m.what.strip(), m.name
            edited = m.apply(original)  # raises unless each old text occurs exactly once
            assert edited != original, m.name
            ast.parse(edited)
