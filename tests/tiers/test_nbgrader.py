"""The nbgrader course, for real: nbgrader's own commands against a local exchange in a tmp dir.

One class of six learners on exercise 7, the cheapest exercise to grade (one
launch at 2 ranks): what is tested is the nbgrader flow, which is the same
for every exercise.

* alice submits the reference solution                     -> full marks
* bob submits the untouched stubs                          -> 0, "not implemented yet"
* carol edits the test cell to claim full marks, duplicates it,
  and her module fails to import                           -> 0, graded on the original cell
* dave deletes the test cell and renames gpipe_step        -> the 1F1B part only, cell restored, names gpipe_step
* erin's notebook is not JSON and her module is missing    -> 0, released notebook used, "not found"
* frank submits the stubs and adds a cell that patches round() so the
  test cell reports full marks                             -> 0, regraded outside the kernel

then feedback is generated and released, grades exported, and autograde is
run again to show it duplicates nothing. The instructor's steps are the CLI's
(each nbgrader command a process of its own, as in class); the learners'
fetch and submit are nbgrader's own apps run in this process, as nbgrader's
test suite runs them.
"""
from __future__ import annotations

import contextlib
import csv
import json
import os
import runpy
import shutil
import sqlite3
import sys
import time
from pathlib import Path

import nbformat
import pytest

from autograder.nbgrader.assignments import grade_id
from autograder.nbgrader.course import main as nbgrader_main
from autograder.nbgrader.verify import cell_text
from autograder.grader.registry import exercises
from distlab.runtime.launch import time_scale
from tests.helpers import REPO, SOLUTIONS

pytestmark = pytest.mark.timeout(900)
EX = exercises()[7]
DAVE = 3.33   # his renamed gpipe_step costs the GPipe part; his one_f_one_b_step (5 of 15 points) is the solution's
ASSIGNMENT = Path(EX.filename).stem
LEARNERS = ("alice", "bob", "carol", "dave", "erin", "frank")


@contextlib.contextmanager
def in_folder(folder: Path):
    """Run the block in ``folder``, and leave ``sys.path`` as it was (nbgrader puts the folder on it)."""
    cwd, path = os.getcwd(), sys.path[:]
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(cwd)
        sys.path[:] = path


def learner_nbgrader(home: Path, exchange: Path, *args: str) -> None:
    """A learner's nbgrader command, run in their home folder (no course config there), with their own cache.

    nbgrader's own app, run in this process the way nbgrader's test suite runs it
    (``nbgrader.tests.run_nbgrader``): a process per command would cost a Python and
    nbgrader start-up each, most of what a learner's command takes.
    """
    from jupyter_core.application import NoStart
    from nbgrader.apps import NbGraderApp

    argv = [*args, "--course", "distlab", f"--Exchange.root={exchange}",
            f"--Exchange.cache={home / '.jupyter' / 'nbgrader_cache'}"]
    app = NbGraderApp.instance()
    with in_folder(home):
        try:
            app.initialize(argv)
            app.start()
            code = 0
        except NoStart:  # what `nbgrader` raises once its subcommand has run
            code = 0
        except SystemExit as exc:  # how the subcommand reports a failure
            code = exc.code
        finally:
            app.reset()
    assert code in (0, None), f"nbgrader {' '.join(args)} failed (exit status {code})"


def tamper(folder: Path, learner: str) -> None:
    """Each learner's submission, made from the released files."""
    nb_path, module = folder / f"{ASSIGNMENT}.ipynb", folder / EX.filename
    solution = (SOLUTIONS / EX.filename).read_text()
    if learner == "alice":
        module.write_text(solution)
    elif learner == "carol":
        nb = nbformat.read(nb_path, as_version=4)
        idx = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade"))
        original = nbformat.from_dict(json.loads(json.dumps(nb.cells[idx])))
        original["id"] = "pasted-copy"
        nb.cells[idx].source = f"{EX.max_score:g}  # full marks, surely"
        nb.cells.append(original)
        nbformat.write(nb, nb_path)
        module.write_text(solution + "\nimport distlab_no_such_module\n")
    elif learner == "dave":
        nb = nbformat.read(nb_path, as_version=4)
        nb.cells = [c for c in nb.cells if not c.metadata.get("nbgrader", {}).get("grade")]
        nbformat.write(nb, nb_path)
        assert "def gpipe_step(" in solution
        module.write_text(solution.replace("def gpipe_step(", "def gpipe_schedule("))
    elif learner == "frank":
        nb = nbformat.read(nb_path, as_version=4)
        # The kernel is his: a cell of his runs before the test cell and patches a builtin the grader
        # uses (round() of the report's score), so the cell reports full marks for the untouched stub.
        cheat = ("import builtins, sys\n_round = builtins.round\n\n"
                 "def _full_marks(x, *a):\n"
                 "    if sys._getframe(1).f_globals.get('__name__') == 'autograder.grader.report':\n"
                 f"        return {EX.max_score}\n"
                 "    return _round(x, *a)\n\n"
                 "builtins.round = _full_marks\n")
        nb.cells.insert(1, nbformat.v4.new_code_cell(cheat))
        nbformat.write(nb, nb_path)
    elif learner == "erin":
        nb_path.write_text('{"cells": [ this is not json')
        module.unlink()


def gradebook_rows(db: Path) -> dict[str, list]:
    with sqlite3.connect(db) as con:
        return {t: sorted(con.execute(f"SELECT * FROM {t}").fetchall(), key=repr)
                for t in ("submitted_assignment", "submitted_notebook", "grade", "comment", "student")}


def scores(db: Path) -> dict[str, tuple[float | None, bool]]:
    """``{student: (auto_score, needs_manual_grade)}`` of the exercise's test cell."""
    with sqlite3.connect(db) as con:
        rows = con.execute(
            "SELECT sa.student_id, g.auto_score, g.needs_manual_grade FROM grade g "
            "JOIN submitted_notebook sn ON g.notebook_id = sn.id "
            "JOIN submitted_assignment sa ON sn.assignment_id = sa.id").fetchall()
    return {s: (score, bool(manual)) for s, score, manual in rows}


def check_cell_output(course: Path, learner: str) -> str:
    nb = nbformat.read(course / "autograded" / learner / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)
    cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id(EX)]
    assert len(cells) == 1, f"{learner}: {len(cells)} test cells graded"
    assert "_sys.modules" in cells[0].source, "the hidden part of the test cell was not restored"
    return cell_text(cells[0])


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = tmp_path_factory.mktemp("nbgrader")
    saved = {k: os.environ.get(k) for k in ("JUPYTER_DATA_DIR", "IPYTHONDIR", "PYTEST_CURRENT_TEST")}
    os.environ.update(JUPYTER_DATA_DIR=str(root / "jupyter-data"), IPYTHONDIR=str(root / "ipython"))
    # ipykernel stops capturing file descriptors 1 and 2 under pytest; the kernels must behave as in class
    os.environ.pop("PYTEST_CURRENT_TEST", None)
    try:
        yield run_cycle(root)
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def run_cycle(root: Path) -> dict:
    course, exchange = root / "course", root / "exchange"
    course.mkdir()
    shutil.copy(REPO / "nbgrader" / "nbgrader_config.py", course)

    start = time.perf_counter()

    def instructor(*args: str) -> None:
        argv = [*args, "--course-dir", str(course), "--exchange", str(exchange), "--exercise", str(EX.number),
                "--timeout", str(int(600 * time_scale()))]  # a hang guard, scaled (DISTLAB_TIME_SCALE)
        assert nbgrader_main(argv) == 0, f"python -m autograder.nbgrader {args[0]} failed"
        print(f"[nbgrader cycle] {' '.join(args)} done at {time.perf_counter() - start:.1f} s", flush=True)

    instructor("generate")
    instructor("release")
    homes = {name: root / name for name in LEARNERS}
    for home in homes.values():
        home.mkdir()
    for name in ("alice", "bob"):
        learner_nbgrader(homes[name], exchange, "fetch_assignment", ASSIGNMENT)
    for name in ("carol", "dave", "erin", "frank"):
        shutil.copytree(homes["bob"] / ASSIGNMENT, homes[name] / ASSIGNMENT)
    for name in LEARNERS:
        tamper(homes[name] / ASSIGNMENT, name)
        learner_nbgrader(homes[name], exchange, "submit", ASSIGNMENT, "--student", name)
    print(f"[nbgrader cycle] learners fetched and submitted at {time.perf_counter() - start:.1f} s", flush=True)
    # collect, repair + autograde (two learners at a time, one writer to the gradebook), feedback, export
    instructor("grade", "--jobs", "2")
    db = course / "gradebook.db"
    first = gradebook_rows(db), scores(db), (course / "grades.csv").read_text()
    # Autograde (and repair) again the cheapest learner: nothing may be duplicated.
    instructor("autograde", "--force", "--student", "erin")
    return {"course": course, "exchange": exchange, "homes": homes, "first": first, "db": db}


@pytest.mark.nbgrader
@pytest.mark.slow
def test_release_strips_hidden_tests_and_ships_the_stub(course):
    released = course["homes"]["bob"] / ASSIGNMENT
    text = (released / f"{ASSIGNMENT}.ipynb").read_text()
    assert "HIDDEN TESTS" not in text and "_sys.modules" not in text
    assert f"grade({EX.number})" in text
    assert (released / EX.filename).read_text() == (REPO / "exercises" / EX.filename).read_text()
    assert "### BEGIN SOLUTION" not in (released / EX.filename).read_text()


@pytest.mark.nbgrader
@pytest.mark.slow
def test_scores_full_zero_and_tampered_graded_on_original_cells(course):
    got = scores(course["db"])
    # dave renamed gpipe_step: its five criteria score 0, his 1F1B part (5 of the exercise's 15 points) stands
    assert got == {"alice": (EX.max_score, False), "bob": (0.0, False), "carol": (0.0, False),
                   "dave": (DAVE, False), "erin": (0.0, False),
                   "frank": (EX.max_score, False)}  # what his patched kernel claimed ...
    rows = {r["student_id"]: r for r in csv.DictReader(course["first"][2].splitlines())
            if r["assignment"] == ASSIGNMENT}
    assert {s: float(r["score"]) for s, r in rows.items()} == {  # ... and what he gets
        "alice": EX.max_score, "bob": 0.0, "carol": 0.0, "dave": DAVE, "erin": 0.0, "frank": 0.0}
    assert float(rows["alice"]["max_score"]) == EX.max_score


@pytest.mark.nbgrader
@pytest.mark.slow
def test_each_problem_has_a_clear_message(course):
    c = course["course"]
    assert f"score {EX.max_score:g}/{EX.max_score:g}" in check_cell_output(c, "alice")
    assert "not implemented yet" in check_cell_output(c, "bob")
    assert "ModuleNotFoundError" in check_cell_output(c, "carol")
    assert "a graded function renamed or missing" in check_cell_output(c, "dave")
    assert "gpipe_step" in check_cell_output(c, "dave")
    assert f"{EX.filename} not found" in check_cell_output(c, "erin")
    notes = (c / "nbgrader_problems.txt").read_text()
    for learner, words in {"carol": ["was edited", "more than once"], "dave": ["was deleted"],
                           "erin": ["could not be read", f"{EX.filename} was not in your submission"]}.items():
        for w in words:
            assert f"{learner} / {ASSIGNMENT}: " in notes and w in notes, (learner, w)
    assert f"frank / {ASSIGNMENT}: the notebook reported {EX.max_score:g} points but the grader, run outside " \
        "the notebook, gives 0" in notes
    assert "alice" not in notes and "bob" not in notes
    # erin's own file is kept, and the note is in the feedback released to her
    assert (c / "submitted" / "erin" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb.rejected").is_file()
    html = (c / "feedback" / "erin" / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()
    assert "Grader note" in html and "could not be read" in html
    released = list((course["exchange"] / "distlab" / "feedback").glob("*.html"))
    assert len(released) == len(LEARNERS)
    assert any("could not be read" in p.read_text() for p in released)


@pytest.mark.nbgrader
@pytest.mark.slow
def test_rerunning_autograde_duplicates_nothing(course):
    rows, got, _ = course["first"]
    assert gradebook_rows(course["db"]) == rows
    assert scores(course["db"]) == got
    assert len(rows["submitted_assignment"]) == len(LEARNERS) and len(rows["grade"]) == len(LEARNERS)
    nb = nbformat.read(course["course"] / "submitted" / "erin" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", 4)
    assert sum("distlab_grader_note" in c.metadata for c in nb.cells) == 1


# ipykernel forwards what reaches fd 1 (here also fd 2's noise, and the child's) from a reader
# thread, which may get to the pipe only after the cell has ended: the noise would then be missing
# from the cell, or land in the next one. drained() writes a mark to fd 1 and waits (polling,
# bounded) until the reader has passed it to sys.stdout.write: everything written before it has
# then been given to this cell's output, in pipe order, before the cell ends.
DRAINED = """\
import os, sys, time, uuid

def drained(timeout=60):
    mark, seen, out = f"drained-{uuid.uuid4().hex}", [], sys.stdout
    write = out.write

    def spy(text):
        seen.append(text)
        return write(text)

    out.write = spy  # the reader thread calls sys.stdout.write with what it reads from fd 1
    try:
        os.write(1, (mark + "\\n").encode())
        deadline = time.monotonic() + timeout
        while mark not in "".join(seen):
            if time.monotonic() > deadline:
                raise TimeoutError("ipykernel never forwarded fd 1")
            time.sleep(0.01)  # polling interval
    finally:
        del out.write
"""


def test_check_cells_keep_stderr_noise_out_but_still_fail_on_a_real_error(tmp_path, monkeypatch):
    """In a real kernel: noise on stderr (Python's, fd 2's, a child process's, a warning) goes to
    stdout while a check runs, so nbgrader's determine_grade keeps the score the cell returns
    (partial credit); an error in the check still scores 0 and is shown."""
    from nbclient import NotebookClient
    from nbgrader.utils import determine_grade

    noisy = ("import os, subprocess, sys, warnings\n"
             "from autograder.nbgrader_cell import stderr_to_stdout\n"
             "with stderr_to_stdout():\n"
             "    print('py-stderr', file=sys.stderr); os.write(2, b'fd-stderr\\n')\n"
             "    subprocess.run(['sh', '-c', 'echo child-stderr >&2'])\n"
             "    warnings.warn('a-warning')\n"
             "    drained()\n"
             "{result}")
    meta = {"nbgrader": {"grade": True, "grade_id": "g", "points": 10, "solution": False, "locked": True}}
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(DRAINED),
        nbformat.v4.new_code_cell(noisy.format(result="7.5"), metadata=meta),
        nbformat.v4.new_code_cell(noisy.format(result="1 / 0"), metadata=meta),
        nbformat.v4.new_code_cell("import sys; print('after', file=sys.stderr)"),
    ], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    monkeypatch.delenv("PYTEST_CURRENT_TEST")  # else ipykernel does not capture fds 1 and 2, as it does in class
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    NotebookClient(nb, timeout=120, allow_errors=True, resources={"metadata": {"path": str(tmp_path)}}).execute()
    _, ok, failing, after = nb.cells
    stdout = "".join(o.get("text", "") for o in ok.outputs if o.output_type == "stream")
    assert not [o for o in ok.outputs if o.get("name") == "stderr"], ok.outputs
    for noise in ("py-stderr", "fd-stderr", "child-stderr", "a-warning"):
        assert noise in stdout
    assert determine_grade(ok) == (7.5, 10.0)
    assert determine_grade(failing) == (0, 10.0)
    assert any(o.output_type == "error" and o.ename == "ZeroDivisionError" for o in failing.outputs)
    assert [o.get("name") for o in after.outputs] == ["stderr"]  # stderr is restored after the block


def test_every_exercise_in_the_registry_is_an_assignment_and_the_config_follows(tmp_path):
    """No nbgrader run: the generated source/ and what nbgrader_config.py makes of it."""
    from traitlets.config.loader import PyFileConfigLoader

    from autograder.nbgrader.assignments import write_source
    from autograder.grader.stubs import generate

    made = write_source(tmp_path)
    known = exercises()
    assert made == [Path(ex.filename).stem for ex in known.values()]
    stubs = {p.name: text for p, text in generate().items()}
    for ex in known.values():
        folder = tmp_path / "source" / Path(ex.filename).stem
        assert (folder / ex.filename).read_text() == stubs[ex.filename]
        nb = nbformat.read(folder / f"{folder.name}.ipynb", as_version=4)
        graded = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
        assert len(graded) == 1 and graded[0].metadata.nbgrader["points"] == ex.max_score
        assert f"grade({ex.number})" in graded[0].source and "BEGIN HIDDEN TESTS" in graded[0].source
    shutil.copy(REPO / "nbgrader" / "nbgrader_config.py", tmp_path)
    c = PyFileConfigLoader("nbgrader_config.py", path=str(tmp_path)).load_config()
    assert c.CourseDirectory.root == str(tmp_path)
    assert c.Execute.timeout > max(ex.time_limit for ex in known.values())  # the check's own limit fires first
    assert c.Autograde.exclude_overwriting == {Path(ex.filename).stem: [ex.filename] for ex in known.values()}
    assert c.OverwriteCells.add_missing_cells is True


def test_a_submission_that_did_not_run_gets_one_line_and_an_unfinished_one_none(tmp_path):
    """The instructor's line comes from the feedback the test cell printed, as ExerciseReport writes it."""
    from autograder.nbgrader.verify import did_not_run

    def cell_printed(student: str, message: str) -> None:
        feedback = EX.new_report().did_not_run(message).feedback
        cell = nbformat.v4.new_code_cell("grade(7)", metadata={"nbgrader": {"grade_id": grade_id(EX)}},
                                         outputs=[nbformat.v4.new_output("stream", text=f"{feedback}\n")])
        folder = tmp_path / "autograded" / student / ASSIGNMENT
        folder.mkdir(parents=True)
        nbformat.write(nbformat.v4.new_notebook(cells=[cell]), folder / f"{ASSIGNMENT}.ipynb")

    cell_printed("carol", "your code raised on rank 0: ModuleNotFoundError: no module named 'x'")
    cell_printed("bob", "not implemented yet (ex07_pipeline.py line 40 in gpipe_step: raise NotImplementedError)")
    assert did_not_run(tmp_path, "carol", ASSIGNMENT, grade_id(EX)) == [
        f"carol / {ASSIGNMENT}: 0 points, the submission did not run: your code raised on rank 0: "
        "ModuleNotFoundError: no module named 'x'"]
    assert did_not_run(tmp_path, "bob", ASSIGNMENT, grade_id(EX)) == []
    assert did_not_run(tmp_path, "erin", ASSIGNMENT, grade_id(EX)) == []  # no notebook: nothing to say


def test_the_old_names_still_work(monkeypatch, capsys):
    """Released notebooks import ``autograder.nbgrader_cell``; instructors' scripts run
    ``python -m autograder.nbgrader_course``; both are the new modules under the old names."""
    import autograder.nbgrader_cell as released
    from autograder.nbgrader import cell

    assert (released.grade, released.stubs_left) == (cell.grade, cell.stubs_left)
    for module in ("autograder.nbgrader", "autograder.nbgrader_course"):
        monkeypatch.setattr(sys, "argv", [module, "--help"])
        with pytest.raises(SystemExit) as exited:
            runpy.run_module(module, run_name="__main__")
        assert exited.value.code == 0
        assert "mark" in capsys.readouterr().out


def test_the_course_folder_does_not_hide_the_nbgrader_package():
    """The class's data is in the repository's ``nbgrader/`` folder (no ``__init__.py``): from the repository
    root, ``import nbgrader`` still finds nbgrader itself, since a package beats a bare folder."""
    from importlib.util import find_spec

    assert REPO in [Path(p).resolve() for p in sys.path if p]  # the folder is where Python looks (conftest)
    assert (REPO / "nbgrader").is_dir() and not (REPO / "nbgrader" / "__init__.py").exists()
    assert Path(find_spec("nbgrader").origin).parent != REPO / "nbgrader"


DIED = ("[AutogradeApp | ERROR] Error occurred while starting new kernel client for kernel 1: "
        "Kernel died before replying to kernel_info")
RAISED = "[AutogradeApp | ERROR] There was an error processing assignment"


@pytest.mark.parametrize("outputs, runs, ok", [
    ([(DIED, 1), ("done", 0)], 2, True),                  # died once: graded again, and it passed
    ([(DIED, 1)] * 3, 3, False),                          # died every time: twice again, then a failure
    ([(RAISED, 1), ("done", 0)], 1, False),               # failed otherwise: not retried
])
def test_a_kernel_that_died_before_any_cell_is_autograded_again_at_most_twice(monkeypatch, tmp_path, outputs, runs,
                                                                             ok):
    """No kernel: nbgrader's runs are stood in for. A kernel that dies before answering kernel_info (its port
    taken by another process: jupyter_client's race) ran none of the learner's code, so its submission is
    autograded again, twice at most; an autograde that fails otherwise is not retried."""
    from autograder.nbgrader import course as cycle
    from distlab.runtime import process

    calls = []

    def fake_run(cmd, *, on_line, **kwargs):
        calls.append(cmd[3:])
        line, returncode = outputs[len(calls) - 1]
        on_line(line)
        return process.Finished(returncode=returncode, timed_out=False, lines=[], wall_s=0.0)

    monkeypatch.setattr(process, "run_contained", fake_run)
    course = cycle.Course(tmp_path)
    assert course.nbgrader("autograde", "ex07_pipeline") is ok
    assert calls == [["autograde", "ex07_pipeline"]] * runs
    assert course.failed == ([] if ok else ["autograde ex07_pipeline"])
