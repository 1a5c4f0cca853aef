"""The set-up is one command and the same pins everywhere; CI runs the README's test command."""
from __future__ import annotations

import re
import subprocess

from tests.helpers import REPO


def pins(text: str) -> dict[str, str]:
    return dict(re.findall(r"^\s*-?\s*([A-Za-z0-9_.\-]+)==([^\s#]+)", text, flags=re.M))


def test_environment_yml_pins_what_requirements_txt_pins():
    req = pins((REPO / "requirements.txt").read_text())
    env = pins((REPO / "environment.yml").read_text())
    assert req and env == req


def test_torch_is_pinned_to_the_release_the_course_is_written_for():
    assert pins((REPO / "requirements.txt").read_text())["torch"] == "2.13.0"


def test_readme_leads_with_the_two_commands_and_ci_runs_the_test_one():
    readme = (REPO / "README.md").read_text()
    first_block = readme.split("```")[1]
    assert "make lab" in first_block and "make test" in first_block
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_notebooks_are_kept_as_jupytext_sources_only():
    tracked = subprocess.run(["git", "ls-files", "course"], cwd=REPO, capture_output=True, text=True).stdout
    assert not [f for f in tracked.split() if f.endswith(".ipynb")], "commit the py:percent source, not the .ipynb"
    for src in sorted((REPO / "course").glob("[0-9]*.py")):
        head = src.read_text().splitlines()[:12]
        assert any("format_name: percent" in line for line in head), f"{src.name} is not a jupytext percent file"
