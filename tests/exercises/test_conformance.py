"""What every exercise owes the course, one test each, parametrised by the registry
(``autograder.grader.registry``): a new ``autograder/checks/exNN_name/`` package is held to all of it
without a line added here.

Nothing here launches ranks: what needs a launch is asserted in the exercise's own module
(``tests/exercises/test_exNN_name.py``), from the one launch that grades the reference, the independent
solution and the mutants together; the last test below holds every exercise to having that module.

- the stub keeps the reference's interface and hides its solution;
- the untouched stub is recognised without running it and scores 0 (the supervisor starts no job),
  and the CLI grades every untouched stub at once, each 0 with its line;
- the check package has the one shape (``EXERCISE``, ``probes.rank_main``, ``grade(paths, ...)``,
  ``@criterion``s) and a docstring table of every declared mistake;
- every criterion has hints in three tiers that do not quote the solution, tier 1 saying in words why it
  matters, and the criteria a package lists (``CRITERIA``, ``METHOD_CRITERIA``, ...) are the ones with hints;
- an independent correct solution exists (``tests/exercises/independent/``), and the exercise's module
  grades it in its launch and asserts its full marks, as it does the reference's.
"""
from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
from types import ModuleType

import pytest

from autograder.grader.stubs import untouched
from autograder.grader.diagnosis import declared_mistakes
from autograder.grader.registry import check_modules, exercises, hints
from autograder.grader.supervise import grade_one
from tests.exercises import independent
from tests.helpers import EXERCISES, REPO, SOLUTIONS

NUMBERS = sorted(exercises())
IDS = [exercises()[n].filename.removesuffix(".py") for n in NUMBERS]
MIN_QUOTE = 20  # a solution line longer than this, found verbatim in a hint, is the answer given away
# Criteria judged apart from the package's lists: ex03's real speedup, graded only on a GPU with bf16 tensor cores.
JUDGED_APART = {3: {"gpu_speedup"}}

by_exercise = pytest.mark.parametrize("number", NUMBERS, ids=IDS)


# -- the stub ------------------------------------------------------------------------------------------
def _interface(path):
    """Module-level functions and classes (and their methods): signature and docstring.

    Helpers nested inside a solution region are the learner's business, not the interface.
    """
    out = {}

    def visit(body, prefix=""):
        for node in body:
            if isinstance(node, ast.FunctionDef):
                out[prefix + node.name] = (ast.unparse(node.args), ast.get_docstring(node))
            elif isinstance(node, ast.ClassDef):
                out[prefix + node.name] = ("", ast.get_docstring(node))
                visit(node.body, prefix + node.name + ".")

    visit(ast.parse(path.read_text()).body)
    return out


def test_every_solution_is_an_exercise():
    assert sorted(p.name for p in SOLUTIONS.glob("ex*.py")) == sorted(ex.filename for ex in exercises().values())


@by_exercise
def test_the_stub_keeps_the_interface_and_hides_the_solution(number):
    name = exercises()[number].filename
    stub, solution = EXERCISES / name, SOLUTIONS / name
    assert _interface(stub) == _interface(solution)
    text = stub.read_text()
    assert "### BEGIN SOLUTION" not in text and "raise NotImplementedError" in text


@by_exercise
def test_the_untouched_stub_scores_zero_without_a_launch(number):
    ex = exercises()[number]
    line = untouched(EXERCISES / ex.filename, SOLUTIONS / ex.filename)
    assert line.startswith(f"not implemented yet ({ex.filename} line ") and "still to write: " in line
    assert untouched(SOLUTIONS / ex.filename, SOLUTIONS / ex.filename) is None
    report = grade_one(ex, EXERCISES)  # the supervisor: no job started for the released stub
    assert (report.score, report.ran) == (0, False)
    assert f"not implemented yet ({ex.filename} line " in report.feedback, report.feedback


def test_the_cli_grades_every_untouched_stub_at_once():
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(EXERCISES)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stdout.count("FAIL runs: not implemented yet (") == len(NUMBERS), proc.stdout
    for ex in exercises().values():
        assert f"== exercise {ex.number} ({ex.name}): 0/{ex.max_score:g}\n" \
               f"FAIL runs: not implemented yet ({ex.filename} line " in proc.stdout, proc.stdout


# -- the check package ----------------------------------------------------------------------------------
@by_exercise
def test_every_check_has_the_one_shape(number):
    module = check_modules()[number]
    assert module.EXERCISE.number == number
    assert callable(module.probes.rank_main) and callable(module.grade)  # the rank side, and the grading
    first = next(iter(inspect.signature(module.grade).parameters))
    assert first == "paths", f"{module.__name__}.grade must take the list of paths first"
    rules = [fn for fn in vars(module).values() if callable(fn) and hasattr(fn, "rule")]
    assert rules, f"{module.__name__} declares no @criterion"


@by_exercise
def test_every_declared_mistake_is_in_the_docstring_table(number):
    module = check_modules()[number]
    rows = [line.split("|")[1].strip() for line in (module.__doc__ or "").splitlines()
            if line.lstrip().startswith("|")]
    missing = [name for name in declared_mistakes(module) if name not in rows]
    assert not missing, f"{module.__name__}'s docstring table 'mistake | message' lacks {missing}"


# -- hints ---------------------------------------------------------------------------------------------
def _criterion_names(check: ModuleType) -> set[str]:
    """The criterion functions a check package declares (``@criterion``), in it and its modules, at any depth."""
    modules, todo = [], [check]
    while todo:
        modules.append(m := todo.pop())
        todo += [sub for sub in vars(m).values() if isinstance(sub, ModuleType) and sub not in modules
                 and sub.__name__.startswith(f"{m.__name__}.")]
    return {fn.__name__ for m in modules for fn in vars(m).values() if callable(fn) and hasattr(fn, "rule")}


def _listed_criteria(check: ModuleType) -> set[str]:
    """The criteria the package lists, in ``CRITERIA`` and its other ``*_CRITERIA`` lists."""
    return {fn.__name__ for name, value in vars(check).items() if name.endswith("CRITERIA")
            and isinstance(value, (list, tuple)) for fn in value}


def _solution_lines(filename: str) -> set[str]:
    """The lines of the solution's function bodies (between the BEGIN/END SOLUTION markers), without
    their comments, longer than ``MIN_QUOTE`` characters."""
    lines, inside = set(), False
    for line in (SOLUTIONS / filename).read_text().splitlines():
        if "### BEGIN SOLUTION" in line or "### END SOLUTION" in line:
            inside = "BEGIN" in line
            continue
        code = re.sub(r"\s+#.*$", "", line).strip()
        if inside and len(code) > MIN_QUOTE:
            lines.add(code)
    return lines


@by_exercise
def test_every_criterion_has_three_tiers_that_do_not_quote_the_solution(number):
    known = hints(number)
    assert known, f"exercise {number}'s check package has no hints.py"
    check = check_modules()[number]
    declared = _criterion_names(check)
    assert set(known) == declared, (f"missing hints: {sorted(declared - set(known))}; "
                                    f"hints of no criterion: {sorted(set(known) - declared)}")
    listed = _listed_criteria(check)
    if listed:  # the lists the package grades from name every criterion with hints (ex05 has none)
        assert listed | JUDGED_APART.get(number, set()) == set(known), sorted(set(known) ^ listed)
    quotes = _solution_lines(exercises()[number].filename)
    for name, tiers in known.items():
        assert isinstance(tiers, tuple) and len(tiers) == 3, name
        assert all(isinstance(t, str) and t.strip() for t in tiers), name
        assert len(set(tiers)) == 3, f"{name}: the tiers repeat each other"
        # tier 1 is why the criterion matters, in words: the feedback above it may already name the fix (the API),
        # so a tier 1 that only nudges ("a shuffle that never changes is an order") says less than the feedback
        why = tiers[0]
        assert len(why.split()) >= 18, f"{name}: tier 1 ({len(why.split())} words) does not say why it matters"
        assert not re.search(r"\w\(|torch\.|`", why), f"{name}: tier 1 names code, which is tier 3's: {why!r}"
        for line in quotes:
            assert not any(line in t for t in tiers), f"{name}'s hint quotes the solution: {line!r}"


# -- the exercise's own module: the launch that grades the reference and the independent solution -------
@by_exercise
def test_the_exercise_has_its_module_and_an_independent_solution_graded_in_its_launch(number):
    """The suite's false-negative check: a correct solution written independently of the reference, in
    another legitimate style, scores full marks. It rides in the launch of the exercise's module that
    grades the reference and the mutants (no launch of its own); that module asserts both full marks."""
    ex = exercises()[number]
    assert independent.FILES[number] == ex.filename and independent.path(number).is_file()
    module = REPO / "tests" / "exercises" / f"test_{ex.filename}"
    assert module.is_file(), f"exercise {number} has no tests/exercises/test_{ex.filename}"
    text = module.read_text()
    assert f"independent.path({number})" in text, f"{module.name} does not grade the independent solution"
    full_marks = [node for node in ast.parse(text).body if isinstance(node, ast.FunctionDef)
                  and node.name.startswith("test_") and "full_marks" in node.name]
    assert any("independent" in "".join(ast.get_source_segment(text, n) for n in [*test.decorator_list, test])
               for test in full_marks), f"no test of {module.name} asserts the independent solution's full marks"
