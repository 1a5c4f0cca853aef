"""A class on the project's JupyterHub (docker/hub/), end to end in Chromium, and what the hub must refuse.

The hub is the real one, started by ``make hub`` (PAM with local users, each server a process of its
learner's user), with the course, exchange, users and ports of the test (tests/helpers/hub.py); every
command of the README's "Running a class" is run as written there (``make hub``, ``add-users.sh``,
``make hub-class``). The class, in one module-scoped run whose screenshots (one per step) go into its
output folder:

1. alice and bob (and the instructor) log in through the hub's login page; their servers start at once;
2. each opens nbgrader's Assignments tab and fetches ex01_ddp; bob submits the untouched stub at once;
3. in JupyterLab's editor alice writes the solution into ex01_ddp.py, bob a known mistake (set_epoch
   left out); each runs the notebook's check cell (both gradings at once), and bob asks for a hint;
4. alice submits; the instructor sets the due date to now; bob submits again, late;
5. the instructor grades (collect, autograde with learners' code as the sandbox's user, feedback);
6. each fetches the feedback from the Assignments tab and reads the score, and bob the named mistake.

Then each refusal the hub owes a class, each a real attempt (as the learner's user, with the learner's
token, or in the learner's browser) with its refusal asserted; and last, the hub stopped and nothing
left running. Root and ``docker/hub/install.sh`` are needed: without them the module skips with the
reason (fails under ``DISTLAB_REQUIRE_HUB=1``), and without Chromium under ``DISTLAB_REQUIRE_BROWSER=1``.
"""
from __future__ import annotations

import json
import re
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tests.helpers import REPO, SOLUTIONS
from tests.helpers import hub as hubs
from tests.helpers import hub_attempts as attempts
from tests.helpers.browser import AS_ROOT, find_chromium
from tests.helpers.hub_browser import Learner, ms

pytestmark = [pytest.mark.browser, pytest.mark.root, pytest.mark.timeout(900)]
ASSIGNMENT = "ex01_ddp"
SOLUTION = SOLUTIONS / f"{ASSIGNMENT}.py"
FORGOT = "        sampler.set_epoch(epoch)"  # the known mistake: this line of the solution left out
ALICE, BOB = hubs.LEARNERS
SCORE = re.compile(r"Score:\s*([\d.]+)\s*/\s*([\d.]+)")  # nbgrader's feedback page
CHECKED = re.compile(r"exercise 1 \(\w+\): ([\d.]+)/([\d.]+)")  # the check's own header


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The class, run once: ``{"hub": Hub, "learners": {user: Learner} (the instructor's too), ...what each step
    showed}``."""
    chromium = find_chromium()
    hubs.require()
    from playwright.sync_api import sync_playwright

    solution = SOLUTION.read_text()
    assert FORGOT in solution, f"the known mistake leaves out {FORGOT.strip()!r}, which solutions/ no longer has"

    shots = tmp_path_factory.mktemp("hub-screenshots")
    print(f"screenshots: {shots}")
    with hubs.class_hub() as hub, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"] if AS_ROOT else [])
        learners = {u: Learner(browser, hub.base, u, hub.passwords[u], shots) for u in hubs.USERS}
        record = {"hub": hub, "learners": learners, "shots": shots, "browser": browser, "solution": solution,
                  "mistake": solution.replace(FORGOT, "        pass  # (set_epoch forgotten)")}
        step, start = "start", time.monotonic()
        try:
            for step, action in class_steps(hub, learners, record):
                action()
                print(f"[hub class] {step}: done at {time.monotonic() - start:.1f} s", flush=True)
        except Exception as exc:
            for learner in learners.values():
                learner.shot("failed")
            raise AssertionError(f"{step}: {type(exc).__name__}: {exc}\nscreenshots: {shots}\n"
                                 f"--- hub log (end) ---\n{hubs.log_tail(hub.log)}") from exc
        yield record
        browser.close()


def class_steps(hub, learners, record):
    """The class, as ``(step, action)`` pairs: the module's docstring, numbered as there."""
    alice, bob = learners[ALICE], learners[BOB]
    both = (alice, bob)
    cells = {}

    def log_in():  # every form sent before any lab is waited for: the servers start at once (the instructor's too)
        for user in learners.values():
            user.log_in()
        for user in learners.values():
            user.wait_for_lab()
            user.shot("jupyterlab")

    def fetch():
        for learner in both:
            learner.fetch(ASSIGNMENT)
            learner.shot("fetched")
        bob.submit(ASSIGNMENT, 1)
        bob.shot("submitted-the-stub")

    def edit_and_check():
        for learner, text in ((alice, record["solution"]), (bob, record["mistake"])):
            learner.open(ASSIGNMENT, f"{ASSIGNMENT}.py")
            learner.write_in_editor(text)
            learner.shot("edited")
        for learner in both:  # each grading starts before either is waited for
            learner.open(ASSIGNMENT, f"{ASSIGNMENT}.ipynb")
            cells[learner.user] = learner.run_cell("grade(1)")
        for learner in both:
            record[f"check {learner.user}"] = learner.wait_output(cells[learner.user], "criterion", timeout_s=240)
            learner.shot("checked")
        hint = bob.add_cell_below(cells[BOB], 'from autograder import check\ncheck(1, ".", hint=2)')
        record["hint"] = bob.wait_output(hint, "with hint 2", timeout_s=60)
        bob.shot("hint")

    def submit():
        alice.submit(ASSIGNMENT, 1)
        alice.shot("submitted")
        assert hubs.poll(lambda: hub.sealed(ALICE, 1) and hub.sealed(BOB, 1)), "the submissions were not sealed"
        record["due"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f UTC")
        hub.make("hub-class", "STEP=duedate", f'ARGS={ASSIGNMENT} "{record["due"]}"')
        bob.submit(ASSIGNMENT, 2)
        bob.shot("submitted-late")
        assert hubs.poll(lambda: hub.sealed(BOB, 2)), "bob's second submission was not sealed"

    def grade():
        start = time.monotonic()
        done = hub.make("hub-class", "STEP=grade", "EX=1")
        record["grade_s"] = time.monotonic() - start
        record["grade log"] = done.stdout + done.stderr
        (record["shots"] / "class-grade.log").write_text(record["grade log"])

    def read_feedback():
        for learner in both:
            learner.fetch_feedback(ASSIGNMENT)
            home = Path("/home") / learner.user / ASSIGNMENT / "feedback"
            found = hubs.poll(lambda: sorted(home.glob(f"*/{ASSIGNMENT}.html")), timeout=60)
            assert found, f"{learner.user}: no feedback fetched into {home}"
            learner.shot("feedback-fetched")
            # the learner's own server serves the file from their home
            relative = found[-1].relative_to(Path("/home") / learner.user).as_posix()
            learner.page.goto(f"{hub.base}/user/{learner.user}/files/{relative}", timeout=ms(60))
            record[f"feedback {learner.user}"] = learner.page.locator("body").inner_text()
            learner.page.get_by_role("link", name="Test cell").click()  # the score's cell: each criterion's line
            learner.shot("feedback")

    return [("1 log in", log_in), ("2 fetch", fetch), ("3 edit and check", edit_and_check),
            ("4 submit", submit), ("5 grade", grade), ("6 read the feedback", read_feedback)]


# Each command of the README's "Running a class" -> what tests/helpers/hub.py or this module runs for it.
README_COMMANDS = {
    "make hub &": '["make", "--no-print-directory", "hub"',
    "docker/hub/add-users.sh --instructor teacher": '(["--instructor", INSTRUCTOR], list(LEARNERS))',
    "docker/hub/add-users.sh alice bob": '(["--instructor", INSTRUCTOR], list(LEARNERS))',
    "make hub-class STEP=release EX=1": 'hub.make("hub-class", "STEP=release", "EX=1")',
    """make hub-class STEP=duedate ARGS='ex01_ddp "2026-03-01 17:00:00 UTC"'""":
        'hub.make("hub-class", "STEP=duedate", f\'ARGS={ASSIGNMENT} "{record["due"]}"\')',
    "make hub-class STEP=grade EX=1": 'hub.make("hub-class", "STEP=grade", "EX=1")',
}


def test_every_command_of_running_a_class_is_run_here():
    """No hub needed: the README's block, read as test_quickstart.py reads the quick starts'."""
    readme = (REPO / "README.md").read_text().split("## Running a class", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", readme, flags=re.S).group(1)
    commands = [re.sub(r"\s+#\s.*$", "", ln).strip() for ln in block.splitlines() if not ln.startswith("#")]
    assert [c for c in commands if c] == list(README_COMMANDS)
    ours = (REPO / "tests/helpers/hub.py").read_text() + Path(__file__).read_text()
    assert all(text in ours for text in README_COMMANDS.values())


def checked(run, learner: str) -> tuple[float, float]:
    """``(score, max)`` that the notebook's check cell showed ``learner``."""
    found = CHECKED.search(run[f"check {learner}"])
    assert found, run[f"check {learner}"]
    return float(found.group(1)), float(found.group(2))


def graded_cell(feedback: str) -> str:
    """The feedback page's text from the graded cell on: its output, without the instructions above it."""
    return feedback[feedback.rindex("grade(1)"):]


def test_each_learner_checks_their_module_in_the_notebook_and_bob_gets_a_hint(run):
    score, top = checked(run, ALICE)
    assert score == top  # the solution: full marks
    score, top = checked(run, BOB)
    assert 0 < score < top and "set_epoch" in run[f"check {BOB}"]  # the mistake: named, and what it costs
    assert "unchanged since its last grading here: that grading, with hint 2" in run["hint"]


def test_the_instructor_grades_and_each_learner_reads_the_score_and_the_named_mistake(run):
    scores = run["hub"].gradebook(ASSIGNMENT)
    for learner in hubs.LEARNERS:  # the gradebook, the feedback and the learner's own check agree
        shown = SCORE.search(run[f"feedback {learner}"])
        assert shown, run[f"feedback {learner}"][:2000]
        assert scores[learner]["score"] == pytest.approx(checked(run, learner)[0], abs=0.01)
        assert float(shown.group(1)) == pytest.approx(scores[learner]["score"], abs=0.01)
    assert scores[BOB]["score"] < scores[ALICE]["score"]
    assert "set_epoch" in graded_cell(run[f"feedback {BOB}"])  # the mistake, named in the graded cell's feedback
    assert "set_epoch" not in graded_cell(run[f"feedback {ALICE}"])
    # collect trusts the sealer's owner check (docker/hub/instructor): no submission is called a cheat
    assert "cheating attempt" not in run["grade log"] and "problem:" not in run["grade log"], run["grade log"][-3000:]
    print(f"make hub-class STEP=grade EX=1: {run['grade_s']:.0f} s for two learners")


def test_the_last_submission_counts_and_none_is_lost(run):
    hub = run["hub"]
    first, *later = hub.submissions(BOB)
    assert later, "bob's two submissions are both kept"
    stub = (hub.course / "release" / ASSIGNMENT / f"{ASSIGNMENT}.py").read_text()
    assert (first / f"{ASSIGNMENT}.py").read_text() == stub
    assert (later[0] / f"{ASSIGNMENT}.py").read_text() == run["mistake"]
    graded = hub.course / "submitted" / BOB / ASSIGNMENT / f"{ASSIGNMENT}.py"
    assert graded.read_text() == run["mistake"]  # the last one was collected and graded (the stub would score 0)


def test_a_submission_after_the_due_date_is_recorded_late_and_graded(run):
    scores = run["hub"].gradebook(ASSIGNMENT)
    due = datetime.strptime(run["due"], "%Y-%m-%d %H:%M:%S.%f UTC")
    assert scores[BOB]["timestamp"] > due and scores[BOB]["late_s"] > 0
    assert scores[ALICE]["timestamp"] < due and scores[ALICE]["late_s"] == 0
    assert scores[BOB]["score"] > 0  # late, not lost


def test_a_learner_cannot_read_or_change_anothers_submission(run):
    hub = run["hub"]
    found = attempts.at_anothers_submission(hub, BOB, ALICE)
    for what in ("list inbound", "read", "overwrite", "delete", "rename"):
        assert attempts.refused(found[what]), f"bob could {what}: {found[what]}"
    assert found["unchanged"]
    # a folder bob makes under alice's name is never hers: the sealer rejects it, and collect never sees it
    forged = attempts.craft(hub, BOB, ALICE, attempts.now())
    assert forged["action"] == "rejected" and f"claims to be {ALICE}'s but was made by {BOB}" in forged["reason"]
    assert len(hub.submissions(ALICE)) == 1 and (hub.exchange / "rejected").is_dir()


def test_a_learner_cannot_read_anothers_home(run):
    hub = run["hub"]
    found = attempts.at_anothers_home(hub, BOB, ALICE)
    assert attempts.refused(found["list"]) and attempts.refused(found["read"])
    assert found["through the server"][0] in (403, 404), found["through the server"]
    assert (Path("/home") / ALICE).stat().st_mode & 0o777 == 0o700


def test_a_learners_token_opens_nothing_of_another_learners(run):
    found = attempts.with_anothers_token(run["hub"], ALICE, BOB)
    assert found["whoami"][0] == 200 and json.loads(found["whoami"][1])["name"] == ALICE  # the token is valid
    assert found["own server"][0] == 200
    for what in ("other's user", "other's server", "stop other's server"):
        assert found[what][0] in (403, 404), f"{what}: {found[what]}"
    assert run["hub"].server_pid(BOB)  # bob's server still runs
    assert attempts.refused(found["other's token"])


def test_a_learner_cannot_reach_the_formgrader_or_the_gradebook(run):
    hub, learners = run["hub"], run["learners"]
    found = attempts.at_the_formgrader(hub, learners[ALICE], learners[hubs.INSTRUCTOR])
    assert found["teacher"][0] == 200 and ASSIGNMENT in found["teacher"][1]  # the control: the instructor's works
    assert found["teacher's"][0] == 403, found["teacher's"]
    assert found["own"][0] == 404, found["own"]  # a learner's server has no formgrader
    assert found["api"][0] == 403, found["api"]
    assert attempts.refused(found["gradebook"])


def test_a_submission_over_the_size_limit_is_refused(run):
    hub = run["hub"]
    found = attempts.over_the_size_limit(hub, ALICE, hubs.MAX_KB + 500)
    status, text = found["endpoint"]
    assert status == 200 and not json.loads(text)["success"] and "Directory size is too big" in text
    assert found["by hand"]["action"] == "rejected" and "over the size limit" in found["by hand"]["reason"]
    assert found["kept"], "nothing over the limit reached inbound"


def test_a_backdated_submission_is_dated_by_this_machine(run):
    hub = run["hub"]
    record = attempts.backdated(hub, BOB)
    assert record["action"] == "sealed" and record["learner_clock"].startswith("2000-01-01")
    assert record["received"] > run["due"]  # the same format: the text sorts as the time
    sealed = hub.exchange / "inbound" / record["name"]
    assert (sealed / "timestamp.txt").read_text() == record["received"]


def test_the_hub_stops_and_leaves_nothing_running(run):
    import psutil

    hub = run["hub"]
    hubs.stop(hub)
    assert hub.process.returncode == 0, hubs.log_tail(hub.log)  # make hub: the hub's own exit status

    users = {*hubs.USERS, "distlab-grading"}  # the learners', the instructor's, the grading sandbox's

    def running():  # a kernel's warm launch server exits once the kernel has (end of file on its stdin): polled
        return [p for p in psutil.process_iter(["username", "cmdline", "status"])
                if p.info["status"] != psutil.STATUS_ZOMBIE
                and (p.info["username"] in users or str(hub.root) in " ".join(p.info["cmdline"] or []))]

    hubs.poll(lambda: not running(), timeout=30)
    left = running()
    assert not left, f"left running: {[(p.pid, p.info['cmdline']) for p in left]}"
    assert hubs.get(f"{hub.base}/hub/api")[0] == 0  # the proxy is gone too
