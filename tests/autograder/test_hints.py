"""Hints in tiers (issue 28): every check package's ``hints.py`` covers exactly its criteria with three
tiers that do not quote the solution, and ``check(N, hint=k)``, the CLI's ``--hint K`` and nbgrader's
test cell show the right tier under a failing report. No launch: the reports are built here."""
from __future__ import annotations

import re
from types import ModuleType

import pytest

import autograder.__main__ as cli
from autograder.commands import check as check_command
from autograder.nbgrader import cell
from autograder.grader.registry import check_modules, exercises, hints
from autograder.grader.report import criterion, failed, passed
from distlab.runtime.importing import REPO_ROOT

MIN_QUOTE = 20  # a solution line longer than this, found verbatim in a hint, is the answer given away


def _criterion_names(check: ModuleType) -> set[str]:
    """The criterion functions a check package declares (``@criterion``), in it and its modules."""
    modules = [check] + [m for m in vars(check).values()
                         if isinstance(m, ModuleType) and m.__name__.startswith(f"{check.__name__}.")]
    return {fn.__name__ for m in modules for fn in vars(m).values() if callable(fn) and hasattr(fn, "rule")}


def _solution_lines(filename: str) -> set[str]:
    """The lines of the solution's function bodies (between the BEGIN/END SOLUTION markers), without
    their comments, longer than ``MIN_QUOTE`` characters."""
    lines, inside = set(), False
    for line in (REPO_ROOT / "solutions" / filename).read_text().splitlines():
        if "### BEGIN SOLUTION" in line or "### END SOLUTION" in line:
            inside = "BEGIN" in line
            continue
        code = re.sub(r"\s+#.*$", "", line).strip()
        if inside and len(code) > MIN_QUOTE:
            lines.add(code)
    return lines


@pytest.mark.parametrize("number", sorted(exercises()))
def test_every_criterion_has_three_tiers_that_do_not_quote_the_solution(number):
    known = hints(number)
    assert known, f"exercise {number}'s check package has no hints.py"
    declared = _criterion_names(check_modules()[number])
    assert set(known) == declared, (f"missing hints: {sorted(declared - set(known))}; "
                                    f"hints of no criterion: {sorted(set(known) - declared)}")
    quotes = _solution_lines(exercises()[number].filename)
    for name, tiers in known.items():
        assert isinstance(tiers, tuple) and len(tiers) == 3, name
        assert all(isinstance(t, str) and t.strip() for t in tiers), name
        assert len(set(tiers)) == 3, f"{name}: the tiers repeat each other"
        for line in quotes:
            assert not any(line in t for t in tiers), f"{name}'s hint quotes the solution: {line!r}"


def test_judge_records_which_function_each_criterion_is():
    @criterion("[W={world}] agrees", points=1)
    def agrees(subject):
        return passed() if subject["ok"] else failed("no")

    report = exercises()[7].new_report()
    report.judge([agrees], {"ok": False}, world=2)
    assert (report.criteria[0].name, report.criteria[0].key) == ("[W=2] agrees", "agrees")
    assert type(report).from_dict(report.to_dict()).criteria[0].key == "agrees"  # crosses the subprocess


def _failing_report():
    """Exercise 7 with its loss right and its stage 0 gradients wrong (twice: a repeated criterion)."""
    report = exercises()[7].new_report()
    report.check("loss matches the unsplit model", 2, True, key="loss_matches")
    report.check("stage 0 gradients match the unsplit model", 2, False, "differ", key="stage0_grads_match")
    report.check("stage 0 gradients match the unsplit model (again)", 2, False, "differ", key="stage0_grads_match")
    report.check("stages overlap in time", 2, False, "not checked: needs 4 forwards first", key="stages_overlap")
    return report


@pytest.fixture
def graded(monkeypatch):
    """``check`` and the CLI grade nothing: they get :func:`_failing_report`."""
    monkeypatch.setattr(check_command, "grade_one", lambda *args, **kwargs: _failing_report())
    monkeypatch.setattr(cli, "grade", lambda *args, **kwargs: [_failing_report()])
    monkeypatch.setattr(cli, "preflight", lambda: None)
    return hints(7)


@pytest.mark.parametrize("tier", [None, 1, 2, 3])
def test_check_shows_the_asked_tier_of_each_failed_criterion_once(graded, capsys, tier):
    check_command.check(7, raise_on_fail=False, hint=tier)
    out = capsys.readouterr().out
    wrong, right = graded["stage0_grads_match"], graded["loss_matches"]
    for k in (1, 2, 3):
        assert (wrong[k - 1] in out) == (k == tier), (k, out)
        assert right[k - 1] not in out  # a criterion that passed gets no hint
        assert graded["stages_overlap"][k - 1] not in out  # nor one not checked: its cause is another's
    assert out.count("for 'stage 0 gradients") == (tier is not None)
    follow = {None: "check(7, hint=1) gives", 1: "check(7, hint=2) gives", 2: "check(7, hint=3) gives",
              3: "that was the last tier"}[tier]
    assert follow in out


def test_a_tier_that_does_not_exist_is_refused_before_grading(graded):
    with pytest.raises(ValueError, match="tiers are 1"):
        check_command.check(7, hint=4)


def test_the_cli_prints_the_tier_asked_for(graded, capsys, tmp_path):
    assert cli.main([str(tmp_path), "--exercise", "7", "--hint", "2"]) == 1
    out = capsys.readouterr().out
    assert graded["stage0_grads_match"][1] in out and "--exercise 7 --hint 3 gives" in out


def test_nbgraders_feedback_has_the_first_tier(graded, capsys, tmp_path):
    """The test cell's output is what nbgrader's feedback shows: it holds tier 1 of each failed criterion."""
    assert cell.grade(7, tmp_path) == 2.0
    out = capsys.readouterr().out
    assert graded["stage0_grads_match"][0] in out and graded["stage0_grads_match"][1] not in out
