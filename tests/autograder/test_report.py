"""The one shape of a check: criteria declared with their points, judged, scaled, and the
"did not run" state (autograder/grader/report.py, autograder/checks/README.md). That every check package
has that shape, and a docstring table of its declared mistakes: tests/exercises/test_conformance.py."""
from __future__ import annotations


import pytest

from autograder.grader.diagnosis import KnownError, diagnose, mistake, translate
from autograder.grader.launches import launch_timeout
from autograder.grader.registry import Exercise, check_modules
from autograder.grader.report import DID_NOT_RUN, ExerciseReport, criterion, failed, passed, total_points

EX = Exercise(number=99, name="toy", filename="ex99_toy.py", max_score=10, time_limit=90)


@criterion("[W={world}] ranks agree", points=3)
def ranks_agree(obs: dict):
    return passed("max abs difference 0", gap=0.0) if obs["agree"] else failed("rank 1 differs by 0.5")


@criterion("[W={world}] matches the reference", points=2, requires=[ranks_agree])
def matches(obs: dict):
    return passed() if obs["close"] else failed("off by 3%")


def test_judge_names_fills_templates_and_records_measurements():
    report = EX.new_report()
    report.judge([ranks_agree, matches], {"agree": True, "close": False}, world=2)
    assert [(c.name, c.points, c.earned, c.feedback) for c in report.criteria] == [
        ("[W=2] ranks agree", 3, 3, "max abs difference 0"),
        ("[W=2] matches the reference", 2, 0, "off by 3%")]
    assert report.measurements == {"gap": 0.0}


def test_a_criterion_whose_requirement_failed_is_not_run_and_says_which():
    seen = []

    @criterion("second", points=1, requires=[ranks_agree])
    def second(obs):
        seen.append(obs)
        return passed()

    report = EX.new_report()
    report.judge([ranks_agree, second], {"agree": False}, world=4)
    assert seen == []
    assert report.criteria[1].feedback == "not checked: needs '[W=4] ranks agree' first"
    assert report.score == 0


def test_scale_to_makes_two_world_sizes_add_up_to_the_exercise():
    report = EX.new_report()
    for world in (2, 4):
        report.judge([ranks_agree, matches], {"agree": True, "close": world == 2}, world=world)
    assert total_points([ranks_agree, matches]) == 5
    report.scale_to()
    assert sum(c.points for c in report.criteria) == pytest.approx(10)
    assert report.score == pytest.approx(8)  # lost the W=4 reference's 2 of 10 scaled points


def test_did_not_run_is_one_criterion_at_zero_and_survives_json():
    report = EX.new_report().did_not_run("not implemented yet")
    assert (report.ran, report.score, report.feedback) == (False, 0, f"FAIL {DID_NOT_RUN}: not implemented yet")
    back = ExerciseReport.from_dict(report.to_dict())
    assert back.ran is False and back.feedback == report.feedback
    assert ExerciseReport.from_dict(EX.new_report().to_dict()).ran is True


def test_launch_timeout_stays_inside_the_exercise_limit_for_one_file():
    def nominal(**kw) -> float:
        return launch_timeout(EX, **kw).nominal_s

    assert nominal() < EX.time_limit
    assert sum(nominal(launches=3) for _ in range(3)) < EX.time_limit
    assert nominal(files=3) > nominal()  # mutants graded in the same launch get more
    assert nominal(share=0.25) + nominal(share=0.75) == pytest.approx(nominal())
    budget = launch_timeout(EX)  # at this process's scale, read once and kept
    assert budget.scale == launch_timeout(EX, files=2).scale and budget.limit_s == budget.nominal_s * budget.scale


def test_diagnose_names_the_first_cause_that_explains_and_none_otherwise():
    @mistake("too big")
    def too_big(x):
        return f"{x} is over 10" if x > 10 else None

    @mistake("odd")
    def odd(x):
        return f"{x} is odd" if x % 2 else None

    assert diagnose([too_big, odd], 13) == "13 is over 10"
    assert diagnose([too_big, odd], 3) == "3 is odd"
    assert diagnose([too_big, odd], 4) is None


def test_known_errors_are_translated_the_checks_first_then_the_common_ones():
    known = [KnownError("scaler.update() missing", r"unscale_\(\) is being called after step", "call update()")]
    assert translate("RuntimeError: unscale_() is being called after step().", known) == \
        "scaler.update() missing: call update()"
    gloo = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Timed out waiting 30000ms for recv"
    assert translate(gloo).startswith("a collective called on some ranks only")
    assert translate("ValueError: something else", known) is None
    renamed = "AttributeError: module 'learner_ex07_pipeline' has no attribute 'gpipe_step'"
    assert translate(renamed).startswith("a graded function renamed or missing: ")
    assert translate("AttributeError: module 'torch' has no attribute 'cudaa'") is None  # the learner's typo


def test_the_registry_reads_every_exercise_without_importing_torch():
    import subprocess
    import sys

    from autograder.grader.registry import exercises
    from tests.helpers import REPO

    assert exercises() == {n: m.EXERCISE for n, m in check_modules().items()}
    # The CLI and check(N) only supervise: the grading subprocess imports torch, they need not.
    code = ("import sys, autograder.__main__, autograder.commands.check; "
            "from autograder.grader.registry import exercises; from autograder import check; "
            "from autograder.commands.check import check as defined; "
            "exercises(); print('torch' in sys.modules, check is defined)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False True"  # autograder.check is check(N), and costs no torch import


def test_the_notebook_shows_feedback_as_a_table_of_criterion_points_and_message():
    from autograder.commands.check import Feedback

    report = EX.new_report()
    report.judge([ranks_agree, matches], {"agree": False}, world=2)
    report.notes.append("a <note>")
    page = Feedback(report)._repr_html_()
    assert page.count('<tr class="fail">') == 2 and 'class="distlab-feedback"' in page
    assert "<td>✘ [W=2] ranks agree</td>" in page and "&lt;note&gt;" in page and "<note>" not in page
    assert repr(Feedback(report)).startswith("score 0/") and report.feedback in repr(Feedback(report))
