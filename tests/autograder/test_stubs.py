"""exercises/ is generated from solutions/: same names, signatures and docstrings; no solution leaks."""
from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from autograder.commands.stubs import strip_solutions, untouched
from tests.helpers import EXERCISES, REPO, SOLUTIONS

SOLUTION_FILES = sorted(p.name for p in SOLUTIONS.glob("ex*.py"))


def test_exercises_are_current_with_the_solutions():
    proc = subprocess.run([sys.executable, "-m", "autograder.commands.stubs", "--check"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


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


@pytest.mark.parametrize("name", SOLUTION_FILES)
def test_stub_keeps_the_interface_and_hides_the_solution(name):
    stub, solution = EXERCISES / name, SOLUTIONS / name
    assert _interface(stub) == _interface(solution)
    text = stub.read_text()
    assert "### BEGIN SOLUTION" not in text and "raise NotImplementedError" in text


def test_stripping_replaces_each_region_at_its_indentation():
    src = "def f():\n    '''doc'''\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n"
    assert strip_solutions(src) == "def f():\n    '''doc'''\n    # YOUR CODE HERE\n    raise NotImplementedError\n"


@pytest.mark.parametrize("bad", ["### BEGIN SOLUTION\nx = 1\n", "x = 1\n### END SOLUTION\n"])
def test_unbalanced_regions_are_refused(bad):
    with pytest.raises(ValueError):
        strip_solutions(bad)


@pytest.mark.parametrize("name", SOLUTION_FILES)
def test_an_untouched_stub_is_recognised_without_running_it(name):
    line = untouched(EXERCISES / name, SOLUTIONS / name)
    assert line.startswith(f"not implemented yet ({name} line ") and "still to write: " in line
    assert untouched(SOLUTIONS / name, SOLUTIONS / name) is None


def test_only_an_unchanged_stub_skips_the_launch(tmp_path):
    stub = (EXERCISES / "ex01_ddp.py").read_text()
    edited = tmp_path / "comments.py"
    edited.write_text("# my notes\n" + stub.replace("# YOUR CODE HERE", "# TODO, soon"))
    assert untouched(edited, SOLUTIONS / "ex01_ddp.py") is not None  # comments are not code
    started = tmp_path / "started.py"
    started.write_text(stub.replace("    raise NotImplementedError\n", "    return None\n", 1))
    assert untouched(started, SOLUTIONS / "ex01_ddp.py") is None  # one function written: graded by running it
    broken = tmp_path / "broken.py"
    broken.write_text(stub + "\ndef (:\n")
    assert untouched(broken, SOLUTIONS / "ex01_ddp.py") is None  # the launch names the SyntaxError


def test_the_cli_grades_every_untouched_stub_at_once():
    proc = subprocess.run([sys.executable, "-m", "autograder", str(EXERCISES)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stdout.count("FAIL runs: not implemented yet (") == len(SOLUTION_FILES), proc.stdout
