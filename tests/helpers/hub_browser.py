"""A learner's (or the instructor's) hands on the class's JupyterHub, in Chromium through Playwright: log in,
nbgrader's Assignments tab (fetch, submit, fetch feedback), the file browser, the editor, a notebook's cells.
Every wait is on something the page shows, bounded and scaled by ``DISTLAB_TIME_SCALE``
(tests/tiers/test_hub.py uses these; tests/helpers/browser.py is the same for ``make lab``'s JupyterLab)."""
from __future__ import annotations

import contextlib
import re
from pathlib import Path

from distlab.runtime.launch import time_scale


def ms(seconds: float) -> float:
    return seconds * time_scale() * 1000  # Playwright's timeouts are in ms


class Learner:
    """One user's browser context (cookies of their own) and page, with screenshots numbered in ``shots``."""

    def __init__(self, browser, base: str, user: str, password: str, shots: Path):
        self.base, self.user, self.password, self.shots = base, user, password, shots
        self.context = browser.new_context(viewport={"width": 1400, "height": 900})
        self.page = self.context.new_page()
        self.page.set_default_timeout(ms(30))
        self.taken: list[Path] = []

    def shot(self, step: str) -> Path:
        path = self.shots / f"{len(list(self.shots.glob('*.png'))) + 1:02d}-{self.user}-{step}.png"
        self.page.screenshot(path=str(path))
        self.taken.append(path)
        return path

    def log_in(self) -> None:
        """The hub's login form (PAM); the hub then starts this user's server, which opens JupyterLab."""
        page = self.page
        page.goto(f"{self.base}/hub/login", timeout=ms(60))
        page.fill("#username_input", self.user)
        page.fill("#password_input", self.password)
        page.click("#login_submit")

    def wait_for_lab(self) -> None:
        self.page.wait_for_url(re.compile(rf".*/user/{re.escape(self.user)}/lab.*"), timeout=ms(120))
        self.page.locator("#filebrowser .jp-DirListing-content").wait_for(timeout=ms(60))

    # nbgrader's Assignments tab (its lab extension's assignment list)
    def assignments(self) -> None:
        page = self.page
        tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=re.compile(r"^Assignments$"))
        if tab.count():
            tab.first.click()
        else:
            page.locator(".lm-MenuBar-item", has_text=re.compile(r"^Nbgrader$")).click()
            page.locator(".lm-Menu-item:visible", has_text="Assignment List").click()
        page.locator("#released_assignments_list").wait_for()

    def row(self, listing: str, assignment: str):
        """The row of ``assignment`` in one of the tab's lists: released, fetched or submitted."""
        return self.page.locator(f"#{listing}_assignments_list > .list_item", has_text=assignment)

    def fetch(self, assignment: str) -> None:
        self.assignments()
        self.row("released", assignment).get_by_role("button", name="Fetch").click()
        self.row("fetched", assignment).wait_for(timeout=ms(60))

    def submit(self, assignment: str, count: int) -> None:
        """Press Submit; wait until the tab lists ``count`` submissions of it."""
        self.assignments()
        self.row("fetched", assignment).get_by_role("button", name="Submit").click()
        # one nested row per submission under the assignment's row (hidden until expanded, still counted)
        self.page.wait_for_function(
            "([sel, n]) => document.querySelectorAll(sel).length >= n",
            arg=["#submitted_assignments_list .nested_list_item", count], timeout=ms(60))

    def fetch_feedback(self, assignment: str) -> None:
        """Press Fetch Feedback; once the tab offers "(view feedback)", follow it (the file browser goes there)."""
        self.assignments()
        row = self.row("submitted", assignment).first
        row.get_by_role("button", name="Fetch Feedback").click()
        # each submission is a line under the assignment's; the one graded gets the link once the list is redrawn
        row.get_by_text("(view feedback)").first.click(timeout=ms(60))

    # JupyterLab: the file browser, the editor, a notebook
    def open(self, *path: str) -> None:
        """Double-click each name in turn, from the home folder."""
        page = self.page
        page.locator("#filebrowser .jp-BreadCrumbs-home").click()
        listing = page.locator("#filebrowser .jp-DirListing-content")
        for name in path:
            listing.locator(".jp-DirListing-item").filter(has=page.locator(
                ".jp-DirListing-itemText", has_text=re.compile(f"^{re.escape(name)}$"))).dblclick(timeout=ms(60))
        page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current", has_text=path[-1]).wait_for()

    def write_in_editor(self, text: str) -> None:
        """Replace the open file's text in JupyterLab's editor, and save it (Ctrl+S)."""
        page = self.page
        editor = page.locator(".jp-FileEditor:visible .cm-content")
        editor.click()
        page.keyboard.press("Control+a")
        page.keyboard.insert_text(text)  # as a paste: no auto-indent of the typed lines
        page.keyboard.press("Control+s")
        page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current:not(.jp-mod-dirty)").wait_for()

    def run_cell(self, contains: str, tries: int = 3):
        """Run (Shift+Enter) the first code cell of the open notebook whose text has ``contains``; return it.

        A run asked for while JupyterLab is still attaching the notebook's new kernel is dropped, or answered
        with its "Select Kernel" dialog (seen on a busy machine, two servers starting kernels at once): the
        dialog is accepted and the run asked for again, until the cell's prompt shows it queued or run."""
        page = self.page
        page.locator(".jp-StatusBar-Widget", has_text=re.compile(r"\|\s*Idle")).first.wait_for(timeout=ms(90))
        cell = page.locator(".jp-NotebookPanel:visible .jp-CodeCell").filter(has_text=contains).first
        dialog = page.locator(".jp-Dialog", has_text="Select Kernel")
        for attempt in range(1, tries + 1):
            cell.scroll_into_view_if_needed()
            cell.locator(".jp-InputArea-editor").click()
            page.keyboard.press("Shift+Enter")
            try:  # "[*]:" once queued, "[n]:" once run
                page.wait_for_function(r"el => el.innerText.trim() !== '[ ]:'",
                                       arg=cell.locator(".jp-InputPrompt").element_handle(), timeout=ms(10))
                return cell
            except Exception:
                if dialog.count():
                    dialog.get_by_role("button", name="Select").click()
                if attempt == tries:
                    raise
        return cell

    def add_cell_below(self, cell, source: str):
        """A new code cell below ``cell`` holding ``source``, run; return it (found by its last line)."""
        page = self.page
        cell.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Escape")
        page.keyboard.press("b")
        page.locator(".jp-NotebookPanel:visible .jp-Cell.jp-mod-selected .jp-InputArea-editor").click()
        page.keyboard.insert_text(source)
        new = page.locator(".jp-NotebookPanel:visible .jp-CodeCell").filter(has_text=source.splitlines()[-1]).first
        page.keyboard.press("Shift+Enter")  # runs it; the selection moves on to a new empty cell
        return new

    def wait_output(self, cell, text: str, timeout_s: float = 180) -> str:
        """The cell's output, once it holds ``text`` (a grading takes its time)."""
        output = cell.locator(".jp-OutputArea")
        output.filter(has_text=text).wait_for(timeout=ms(timeout_s))
        return output.inner_text()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.context.close()
