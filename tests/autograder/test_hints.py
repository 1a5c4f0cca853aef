"""Hints in tiers (issue 28): ``check(N, hint=k)``, the CLI's ``--hint K`` and nbgrader's test cell show
the right tier under a failing report. No launch: the reports are built here. That every check package's
``hints.py`` covers exactly its criteria with three tiers that do not quote the solution:
``tests/exercises/test_conformance.py``."""
from __future__ import annotations


import pytest

from autograder.__main__ import main
from autograder.commands import check as check_command
from autograder.commands import grade as grade_command
from autograder.nbgrader import cell
from autograder.grader.registry import exercises, hints
from autograder.grader.report import criterion, failed, passed


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
    monkeypatch.setattr(check_command, "_LAST", {})  # no grading of another test's to show again
    monkeypatch.setattr(grade_command, "grade", lambda *args, **kwargs: [_failing_report()])
    monkeypatch.setattr(grade_command, "preflight", lambda: None)
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
    assert main(["grade", str(tmp_path), "--exercise", "7", "--hint", "2"]) == 1
    out = capsys.readouterr().out
    assert graded["stage0_grads_match"][1] in out and "--exercise 7 --hint 3 gives" in out


def test_nbgraders_feedback_has_the_first_tier(graded, capsys, tmp_path):
    """The test cell's output is what nbgrader's feedback shows: it holds tier 1 of each failed criterion."""
    assert cell.grade(7, tmp_path) == 2.0
    out = capsys.readouterr().out
    assert graded["stage0_grads_match"][0] in out and graded["stage0_grads_match"][1] not in out


def test_each_hint_stands_under_its_criterion_in_the_text_and_the_table(graded):
    shown = check_command.Feedback(_failing_report(), graded, 2)
    lines = repr(shown).splitlines()
    first = lines.index("FAIL stage 0 gradients match the unsplit model: differ")
    assert lines[first + 1] == f"  hint 2/3 (the mechanism) for 'stage 0 gradients match the unsplit model': " \
                               f"{graded['stage0_grads_match'][1]}"
    assert sum(line.startswith("  hint ") for line in lines) == 1  # once per criterion, not once per world size
    assert lines[-1].startswith("next: check(7, hint=3) gives")
    page = shown._repr_html_()
    row = page.split("<tr")[3]  # header, the passed criterion, then the failed one: its hint in its message cell
    assert "stage 0 gradients" in row and "hint 2/3" in row


def test_a_hint_right_after_a_grading_of_the_unchanged_file_grades_nothing_again(monkeypatch, tmp_path, capsys):
    """``check(7, hint=2)`` after ``check(7)`` shows that grading with the hint (issue 42): in no time, and
    the same report; an edited file is graded again."""
    calls = []
    monkeypatch.setattr(check_command, "grade_one", lambda *a, **k: calls.append(a) or _failing_report())
    monkeypatch.setattr(check_command, "_LAST", {})
    (tmp_path / "ex07_pipeline.py").write_text("# my pipeline\n")
    first = check_command.check(7, tmp_path, raise_on_fail=False)
    again = check_command.check(7, tmp_path, raise_on_fail=False, hint=2)
    assert len(calls) == 1 and again is first
    assert "is unchanged since its last grading here: that grading, with hint 2" in capsys.readouterr().out
    check_command.check(7, tmp_path, raise_on_fail=False)  # no hint asked: graded again
    (tmp_path / "ex07_pipeline.py").write_text("# my pipeline, edited\n")
    check_command.check(7, tmp_path, raise_on_fail=False, hint=3)
    assert len(calls) == 3


def test_a_class_reads_missing_stub_not_graded_or_the_score_and_gets_feedback_files(monkeypatch, tmp_path, capsys):
    """``class`` (issue 42): each CSV cell says what happened, the last lines name every file written, one
    Markdown file per learner holds every exercise's feedback with the first tier of each failed criterion's
    hint, and the exit status is 1 only when an exercise could not be graded. No launch: the reports are built."""
    from autograder.commands import classroom

    missing = exercises()[7].new_report().nothing_handed_in("ex07_pipeline.py not found", "missing")
    stub = exercises()[7].new_report().nothing_handed_in("not implemented yet", "stub")
    slow = exercises()[7].new_report().machine_too_slow("still advancing")
    results = {"ann": [_failing_report()], "ben": [stub], "cat": [missing]}
    for learner in results:
        (tmp_path / "class" / learner).mkdir(parents=True)
    monkeypatch.setattr(classroom, "preflight", lambda: None)
    monkeypatch.setattr(classroom, "grade_class", lambda *a, **k: results)
    out = tmp_path / "out"
    args = ["class", str(tmp_path / "class"), "--csv", str(out / "g.csv"), "--feedback", str(out / "fb")]
    out.mkdir()
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2:] == [f"wrote {out / 'g.csv'} (a row per learner: the score, or missing, stub, not graded)",
                          f"wrote 3 feedback files in {out / 'fb'}"]
    assert (out / "g.csv").read_text().splitlines() == ["learner,ex07_pipeline,total", "ann,2,2", "ben,stub,0",
                                                         "cat,missing,0"]
    ann = (out / "fb" / "ann.md").read_text()
    assert ann.startswith("# Feedback for ann\n") and "## Exercise 7 (pipeline): 2/10" in ann
    assert hints(7)["stage0_grads_match"][0] in ann and hints(7)["stage0_grads_match"][1] not in ann
    assert "## Exercise 7 (pipeline): stub" in (out / "fb" / "ben.md").read_text()
    results["cat"] = [slow]
    assert main(args) == 1  # not graded: the machine's, and a script grades it again
    assert "1 exercise(s) not graded (the machine was too slow)" in capsys.readouterr().err
    assert classroom.cell(slow) == "not graded"


def test_a_failed_check_ends_in_one_line_in_a_notebook_not_a_traceback():
    """``check(N)`` raises when the exercise is not fully correct (an nbgrader test cell scores 0); IPython shows
    that as one line under the feedback, not a traceback through the grader's code."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    shell = InteractiveShell.instance()
    shell.user_ns["ExerciseFailed"] = check_command.ExerciseFailed
    with capture_output() as shown:
        result = shell.run_cell("raise ExerciseFailed('exercise 1: 9.17/10; see the feedback above')")
    assert isinstance(result.error_in_exec, check_command.ExerciseFailed)  # the cell still fails
    assert shown.stdout.strip() == "ExerciseFailed: exercise 1: 9.17/10; see the feedback above"
