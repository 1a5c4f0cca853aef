"""The configuration ``make lab`` gives JupyterLab for each role (``jupyter/README.md``), read from a real server:
its page configuration, its file listing, its formgrader and its log. The browser tier
(``tests/tiers/test_browser.py``) sees the rest in Chromium: no news pop-up, a notebook opened unmodified.

Each test starts ``make lab ROLE=...``'s JupyterLab (about 3 s) and needs no browser, so they run in the fast tier.
"""
from __future__ import annotations

import json
import re

import pytest

from tests.helpers import REPO
from tests.helpers.browser import built_notebook, get, jupyterlab

pytestmark = pytest.mark.timeout(120)

INSTRUCTOR_PLUGINS = {"@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment",
                      "@jupyter/nbgrader:course-list"}
NEWS = "@jupyterlab/apputils-extension:announcements"


def page_config(base: str, token: str) -> dict:
    page = get(f"{base}/lab?token={token}").decode()
    data = re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>', page, re.S)
    assert data, "JupyterLab's page has no jupyter-config-data"
    return json.loads(data.group(1))


@pytest.mark.parametrize("role", ["learner", "instructor"])
def test_each_role_gets_its_tools_one_listing_per_notebook_and_no_nbgrader_warning(tmp_path, wait_for, role):
    with built_notebook() as notebook, jupyterlab(tmp_path, wait_for, f"ROLE={role}") as (base, token, log):
        disabled = set(page_config(base, token)["disabledExtensions"])
        listing = json.loads(get(f"{base}/api/contents/course?token={token}"))["content"]
        formgrader = get(f"{base}/formgrader?token={token}")
        # a paired source is still served (jupytext reads it when the notebook opens): only its listing goes
        source = get(f"{base}/api/contents/course/{notebook.with_suffix('.py').name}?token={token}")
        text = log.read_text()

    names = {entry["name"] for entry in listing}
    sources = {p.name for p in (REPO / "course").glob("[0-9]*.py")}
    assert notebook.name in names
    assert not names & sources, f"jupytext sources listed beside their notebooks: {sorted(names & sources)}"
    assert source is not None
    assert NEWS in disabled, "the Jupyter news pop-up is on"
    assert "nbgrader_config.py" not in text, text
    if role == "learner":
        assert INSTRUCTOR_PLUGINS <= disabled, f"instructor tools shown to learners: {INSTRUCTOR_PLUGINS - disabled}"
        assert formgrader is None, "the formgrader answers in the learner's JupyterLab"
        assert "nbgrader.server_extensions.formgrader | extension was successfully loaded" not in text
    else:
        assert not INSTRUCTOR_PLUGINS & disabled, f"instructor tools hidden: {INSTRUCTOR_PLUGINS & disabled}"
        assert formgrader is not None, "the instructor's JupyterLab has no formgrader"


def test_make_lab_refuses_an_unknown_role_in_one_line():
    import subprocess

    run = subprocess.run(["make", "--no-print-directory", "-n", "lab", "ROLE=teacher"], cwd=REPO,
                         capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(REPO)})
    assert run.returncode != 0
    assert "ROLE=teacher: use ROLE=learner or ROLE=instructor" in run.stderr
