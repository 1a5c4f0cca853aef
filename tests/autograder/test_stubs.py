"""exercises/ is generated from solutions/ (``autograder.grader.stubs``): current, regions stripped at their
indentation, unbalanced ones refused, and only an unchanged stub skips the launch. What every exercise's stub
owes (the interface kept, the solution hidden, 0 without a launch, the CLI on all of them):
``tests/exercises/test_conformance.py``."""
from __future__ import annotations

import subprocess
import sys

import pytest

from autograder.grader.stubs import strip_solutions, untouched
from tests.helpers import EXERCISES, REPO, SOLUTIONS


def test_exercises_are_current_with_the_solutions():
    proc = subprocess.run([sys.executable, "-m", "autograder", "stubs", "--check"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_stripping_replaces_each_region_at_its_indentation():
    src = "def f():\n    '''doc'''\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n"
    assert strip_solutions(src) == "def f():\n    '''doc'''\n    # YOUR CODE HERE\n    raise NotImplementedError\n"


@pytest.mark.parametrize("bad", ["### BEGIN SOLUTION\nx = 1\n", "x = 1\n### END SOLUTION\n"])
def test_unbalanced_regions_are_refused(bad):
    with pytest.raises(ValueError):
        strip_solutions(bad)


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

