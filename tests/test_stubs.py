"""exercises/ is generated from solutions/: same names, signatures and docstrings; no solution leaks."""
from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from autograder.stubs import strip_solutions
from tests.helpers import EXERCISES, REPO, SOLUTIONS

SOLUTION_FILES = sorted(p.name for p in SOLUTIONS.glob("ex*.py"))


def test_exercises_are_current_with_the_solutions():
    proc = subprocess.run([sys.executable, "-m", "autograder.stubs", "--check"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def _interface(path):
    tree = ast.parse(path.read_text())
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            args = ast.unparse(node.args) if isinstance(node, ast.FunctionDef) else ""
            out[node.name] = (args, ast.get_docstring(node))
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
