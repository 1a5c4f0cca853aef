"""Every command of the README's two quick starts is run by a test, as written (issue 42).

The quick starts' code blocks are read from the README. The commands that cost seconds are run here, in a
copy of the repository whose ``exercises/`` holds the stubs as released (so a learner's own work in this
checkout changes nothing), with this checkout's ``.venv``. The others (JupyterLab in Chromium, a self-test,
nbgrader's cycle, the images, a Slurm array) are the subject of a test of their own, named in
:data:`RUN_ELSEWHERE`; for a ``make`` command, ``make -n`` shows that it runs what that test runs. A command
added to a quick start without a test fails here.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from autograder.grader.stubs import generate
from tests.helpers import REPO

SECTIONS = ("## Quick start: learners", "## Quick start: instructors")
PY = ".venv/bin/python"

# command -> (the file that runs it, text that file holds where it runs it, what `make -n` runs, for make's)
RUN_ELSEWHERE: dict[str, tuple[str, str, str | None]] = {
    "make lab": ("tests/helpers/browser.py", '"make", "--no-print-directory", "-n", "lab"', "/jupyter lab "),
    "make lab ROLE=instructor": ("tests/tiers/test_lab_config.py", 'f"ROLE={role}"', "/nbgrader:"),
    "from autograder import check": ("tests/tiers/test_browser.py", "learner_opens_the_exercise_and_checks_it", None),
    "check(1)": ("tests/helpers/browser.py", r'CHECK_CALL = re.compile(r"\bcheck\(\s*1\b")', None),
    "check(1, hint=1)": ("tests/autograder/test_hints.py", "check_command.check(7, raise_on_fail=False, hint=tier)",
                         None),
    "make selftest": ("tests/autograder/test_selftest.py", '"-m", "autograder", "selftest"',
                      "-m autograder selftest"),
    "make nbgrader STEP=generate": ("tests/tiers/test_nbgrader.py", 'instructor("generate")',
                                    "-m autograder nbgrader generate"),
    "make nbgrader STEP=release": ("tests/tiers/test_nbgrader.py", 'instructor("release")',
                                   "-m autograder nbgrader release"),
    "make nbgrader STEP=grade": ("tests/tiers/test_nbgrader.py", 'instructor("grade"', "-m autograder nbgrader grade"),
    # CI builds them with BASE=local (bases made from Debian's packages: it cannot pull the default ones)
    "make images": (".ci/prepare-tiers.sh", "BASE=local make --no-print-directory images", "docker/make-images.sh"),
    "sbatch --array=0-3 course/slurm/grade_class.sbatch submissions out": (
        "tests/tiers/test_slurm_class.py", '"course" / "slurm" / "grade_class.sbatch"', None),
}
RUN_HERE = {
    "make grade EX=1",
    "make grade EX=1 HINT=1",
    "git checkout -- exercises/ex01_ddp.py",
    f"{PY} -m autograder class submissions --csv grades.csv --feedback feedback",
}


def quick_start_commands() -> list[str]:
    """Each line of the quick starts' code blocks, without its comment."""
    readme = (REPO / "README.md").read_text()
    commands = []
    for heading in SECTIONS:
        section = readme.split(heading, 1)[1].split("\n## ", 1)[0]
        for block in re.findall(r"```(?:bash|python)\n(.*?)```", section, flags=re.S):
            for line in block.splitlines():
                command = re.sub(r"\s+#\s.*$", "", line).strip()
                if command:
                    commands.append(command)
    return commands


def without_make_flags() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}


def run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command, shell=True, cwd=cwd, env=without_make_flags(), capture_output=True, text=True,
                          timeout=240)


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    """The repository's tracked files, a git repository of its own, with the stubs as released and this
    checkout's virtual environment (make finds it set up, and installs nothing)."""
    # The copy's make finds this checkout's virtual environment set up only where this checkout's is, for these
    # requirements: else its `make setup` ran `pip install -e .` in the copy, and this checkout's environment
    # imported distlab from a temporary folder until the next setup (it did, after a change of pyproject.toml).
    subprocess.run(["make", "--no-print-directory", "setup"], cwd=REPO, check=True, capture_output=True)
    root = tmp_path_factory.mktemp("course")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True)
    for name in filter(None, tracked.stdout.split("\0")):
        if (REPO / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, root / name)
    for stub, text in generate(REPO / "solutions", root / "exercises").items():
        stub.write_text(text)
    (root / ".venv").symlink_to(REPO / ".venv")
    git = ["git", "-c", "user.name=learner", "-c", "user.email=learner@example.org"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the course as released"]):
        subprocess.run([*git, *args], cwd=root, check=True, capture_output=True)
    return root


def test_every_quick_start_command_is_run_by_a_test():
    commands = quick_start_commands()
    assert len(commands) == len(set(commands)), "a quick-start command is listed twice"
    assert set(commands) == RUN_HERE | set(RUN_ELSEWHERE), (
        f"in a quick start with no test: {sorted(set(commands) - RUN_HERE - set(RUN_ELSEWHERE))}; "
        f"tested but gone from the README: {sorted((RUN_HERE | set(RUN_ELSEWHERE)) - set(commands))}")


@pytest.mark.parametrize("command", sorted(RUN_ELSEWHERE))
def test_the_commands_run_elsewhere_are_what_those_tests_run(command):
    path, text, recipe = RUN_ELSEWHERE[command]
    assert text in (REPO / path).read_text(), f"{path} no longer runs {command!r} ({text!r})"
    if recipe is not None:
        dry = run(f"make --no-print-directory -n {command.removeprefix('make ')}", REPO)
        assert dry.returncode == 0 and recipe in dry.stdout, f"make -n {command}:\n{dry.stdout}{dry.stderr}"


def test_make_grade_ex_1_reports_the_stub_and_exits_2(course):
    for command in ("make grade EX=1", "make grade EX=1 HINT=1"):
        done = run(command, course)
        out = done.stdout + done.stderr
        assert done.returncode == 2, f"{command}: exit {done.returncode}\n{out}"  # the grader's 1, then make's 2
        assert "not implemented yet" in out and "Error 1" in out, out
        assert "ex02" not in out, f"{command} graded more than exercise 1:\n{out}"


def test_git_checkout_puts_an_exercise_back_as_released(course):
    exercise = course / "exercises" / "ex01_ddp.py"
    released = exercise.read_text()
    exercise.write_text("# a learner's attempt\n")
    done = run("git checkout -- exercises/ex01_ddp.py", course)
    assert done.returncode == 0, done.stderr
    assert exercise.read_text() == released


def test_a_class_from_a_folder_writes_the_csv_and_one_feedback_file_per_learner(course):
    submissions = course / "submissions"
    (submissions / "ann").mkdir(parents=True)
    (submissions / "ben").mkdir()
    shutil.copy(course / "exercises" / "ex01_ddp.py", submissions / "ann")  # handed in untouched
    done = run(f"{PY} -m autograder class submissions --csv grades.csv --feedback feedback", course)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = dict(line.split(",", 1) for line in (course / "grades.csv").read_text().splitlines()[1:])
    assert rows["ann"].startswith("stub") and rows["ben"].startswith("missing"), rows
    assert sorted(p.name for p in (course / "feedback").iterdir()) == ["ann.md", "ben.md"]
    assert "grades.csv" in done.stdout + done.stderr
