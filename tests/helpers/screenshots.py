"""The README's two screenshots, taken as a learner would see them: ``.venv/bin/python -m tests.helpers.screenshots``
(root or not; Debian's chromium). Maintainers run it again when JupyterLab's look or the feedback changes.

- ``docs/img/jupyterlab.png``: ``make lab``'s JupyterLab on ``course/``, notebook 01 open;
- ``docs/img/feedback.png``: ``check(1, hint=1)`` in that notebook, on exercise 1 with one realistic mistake
  (``sampler.set_epoch(epoch)`` left out), graded for real.

The mistake is written into ``exercises/ex01_ddp.py`` for the run and the file is put back afterwards.
"""
from __future__ import annotations

import contextlib
import re
import sys
import tempfile
from pathlib import Path

from tests.conftest import _wait_for
from tests.helpers import REPO, SOLUTIONS
from tests.helpers.browser import AS_ROOT, EXERCISE, built_notebook, find_chromium, jupyterlab

IMAGES = REPO / "docs" / "img"
MISTAKE = ("        sampler.set_epoch(epoch)  # without it every epoch repeats epoch 0's shuffle\n", "")


@contextlib.contextmanager
def exercise_with_a_mistake():
    before = EXERCISE.read_bytes()
    text = (SOLUTIONS / EXERCISE.name).read_text()
    assert MISTAKE[0] in text, "the solution changed: update MISTAKE"
    EXERCISE.write_text(text.replace(*MISTAKE))
    try:
        yield
    finally:
        EXERCISE.write_bytes(before)


def take(tmp: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    IMAGES.mkdir(parents=True, exist_ok=True)
    with exercise_with_a_mistake(), built_notebook() as notebook, jupyterlab(tmp, _wait_for) as (base, token, _):
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=find_chromium(), args=["--no-sandbox"] if AS_ROOT else [])
            page = browser.new_page(viewport={"width": 1280, "height": 760})
            page.set_default_timeout(120_000)
            page.goto(f"{base}/?token={token}")
            listing = page.locator("#filebrowser .jp-DirListing-content")
            listing.locator(".jp-DirListing-item").filter(
                has=page.locator(".jp-DirListing-itemText", has_text=re.compile(f"^{notebook.name}$"))).dblclick()
            panel = page.locator(".jp-NotebookPanel:visible")
            panel.locator(".jp-Notebook .jp-MarkdownCell h1").first.wait_for()
            page.locator(".jp-StatusBar-TextItem", has_text="| Idle").first.wait_for()
            page.screenshot(path=str(IMAGES / "jupyterlab.png"))

            cell = panel.locator(".jp-CodeCell").filter(has_text=re.compile(r"\bcheck\(\s*1\b")).first
            cell.scroll_into_view_if_needed()
            cell.locator(".jp-InputArea-editor").click()
            page.keyboard.press("Shift+Enter")
            cell.locator("table.distlab-feedback").wait_for(timeout=300_000)
            # the next tier right after a grading of the unchanged file: shown again, not graded again
            page.keyboard.press("Escape")
            page.keyboard.press("b")
            page.keyboard.press("Enter")
            page.keyboard.type("check(1, hint=1)")
            page.keyboard.press("Shift+Enter")
            # the last such cell: the first one's output names check(1, hint=1) too
            hinted = panel.locator(".jp-CodeCell").filter(has_text="check(1, hint=1)").last
            hinted.locator("table.distlab-feedback").wait_for()
            page.set_viewport_size({"width": 1280, "height": 1500})
            hinted.scroll_into_view_if_needed()
            hinted.locator(".jp-OutputArea").screenshot(path=str(IMAGES / "feedback.png"))
            browser.close()
    return [IMAGES / "jupyterlab.png", IMAGES / "feedback.png"]


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        for shot in take(Path(tmp)):
            print(shot.relative_to(REPO))
    sys.exit(0)
