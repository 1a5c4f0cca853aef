"""The learner's path in a real browser: ``make lab``'s JupyterLab, driven in headless Chromium.

As a learner would: JupyterLab opens on ``course/``; open notebook 01 from the
file browser; go up to the repository root and open ``exercises/ex01_ddp.py``
(the notebook says "Open exercises/ex01_ddp.py"); back in the notebook, run the
check cell of exercise 1 and see the feedback table. The repository's
``exercises/ex01_ddp.py`` is the untouched stub, which the grader reports as
"not implemented yet" without a launch, so the check takes seconds.

JupyterLab is started with the arguments of ``make lab`` (read with ``make -n
lab``), plus a free port, a token and this test's own Jupyter directories and
settings, so nothing reaches the repository or the home directory. Chromium is
Debian's ``chromium`` package: the test skips without it, unless
``DISTLAB_REQUIRE_BROWSER=1`` (CI), where a missing browser fails.

The second test runs every interactive/display cell of the course (the cells
``tests/tiers/test_widget_cells.py`` stresses under nbclient, each after the imports of
the cells above it) in JupyterLab, from a notebook written next to the course's
for the test, and sees each one complete with its widget drawn (issue 24).
"""
from __future__ import annotations

import contextlib
import re
import secrets
from pathlib import Path

import pytest

from distlab.runtime.launch import time_scale
from tests.helpers.browser import (AS_ROOT, NOTEBOOK_SOURCE, artefacts, find_chromium, jupyterlab,
                                   learner_opens_the_exercise_and_checks_it, log_tail)
from tests.helpers.notebook_exec import course_widget_cells

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]


def test_learner_opens_the_exercise_and_checks_it_in_jupyterlab(tmp_path, wait_for, leftover_processes):
    learner_opens_the_exercise_and_checks_it(tmp_path, wait_for, leftover_processes)


@contextlib.contextmanager
def widget_cells_notebooks():
    """One notebook in ``course/`` per course notebook with widget cells: the imports above them,
    then the cells, each under a heading naming where it comes from. One kernel each, as in the
    course: two notebooks' cells in one kernel would call each other's functions (04 and 08 both
    define ``describe``). Yields ``[(path, cells, indices of the widget cells)]``; removed after."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    by_source: dict[Path, list] = {}
    for cell in course_widget_cells():
        by_source.setdefault(cell.notebook, []).append(cell)
    token, books = secrets.token_hex(4), []
    try:
        for source, widget_cells in by_source.items():
            cells, indices = [], []
            if widget_cells[-1].prelude:
                cells.append(new_code_cell(widget_cells[-1].prelude))  # the imports above the last one
            for cell in widget_cells:
                cells.append(new_markdown_cell(cell.where()))
                indices.append(len(cells))
                cells.append(new_code_cell(cell.source))
            nb = new_notebook(cells=cells, metadata={"kernelspec": {
                "name": "python3", "display_name": "Python 3", "language": "python"}})
            path = NOTEBOOK_SOURCE.parent / f"widget-cells-{token}-{source.stem}.ipynb"
            nbformat.write(nb, path)
            books.append((path, cells, indices))
        yield books
    finally:
        for path, _, _ in books:
            path.unlink(missing_ok=True)


def _run_all(page, first_prompt, ms, tries: int = 3) -> None:
    """Run > Run All Cells, once the notebook's kernel is connected. A run asked for while JupyterLab
    is still attaching the new kernel is silently dropped (every prompt stays "[ ]:"; queued cells
    show "[*]:" at once), so that precondition is checked after each try and the run retried."""
    for attempt in range(1, tries + 1):
        page.locator(".jp-StatusBar-Widget", has_text=re.compile(r"\|\s*Idle")).first.wait_for(timeout=ms(60))
        page.locator(".lm-MenuBar-item", has_text=re.compile(r"^Run$")).click()
        page.locator(".lm-Menu-item:visible", has_text=re.compile(r"^Run All Cells")).first.click()
        try:
            page.wait_for_function(r"el => el.innerText.trim() !== '[ ]:'", arg=first_prompt.element_handle(),
                                   timeout=ms(10))
            return
        except Exception:
            if attempt == tries:
                raise


def test_every_widget_cell_of_the_course_completes_in_jupyterlab(tmp_path, wait_for, leftover_processes):
    chromium = find_chromium()
    from playwright.sync_api import sync_playwright

    scale = time_scale()
    ms = lambda seconds: seconds * scale * 1000  # noqa: E731
    artefacts_before = artefacts()

    with widget_cells_notebooks() as books, jupyterlab(tmp_path, wait_for) as (base, token, log):
        assert books, "no widget cell found in the course"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"] if AS_ROOT else [])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(ms(30))
            step = "open JupyterLab"
            try:
                page.goto(f"{base}/?token={token}", timeout=ms(60))
                listing = page.locator("#filebrowser .jp-DirListing-content")
                for notebook, cells, widget_indices in books:
                    step = f"open {notebook.name} from the file browser"
                    listing.locator(".jp-DirListing-item").filter(has=page.locator(
                        ".jp-DirListing-itemText", has_text=re.compile(f"^{re.escape(notebook.name)}$"))
                    ).dblclick(timeout=ms(60))
                    tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current")
                    tab.filter(has_text=notebook.name).wait_for()
                    panel = page.locator(".jp-NotebookPanel:visible")
                    nb_cells = panel.locator(".jp-Notebook .jp-Cell")
                    page.wait_for_function("([el, n]) => el.querySelectorAll('.jp-Notebook .jp-Cell').length === n",
                                           arg=[panel.element_handle(), len(cells)], timeout=ms(60))
                    step = f"{notebook.name}: Run > Run All Cells"
                    _run_all(page, nb_cells.first.locator(".jp-InputPrompt"), ms)

                    for index, cell in enumerate(cells):
                        if cell.cell_type != "code":
                            continue
                        first = next(ln for ln in cell.source.splitlines() if ln.strip())
                        step = f"{notebook.name}: cell {index} ({first!r}) completes"
                        view = nb_cells.nth(index)
                        view.scroll_into_view_if_needed()
                        # "[*]:" while queued or running, "[n]:" once its execute_reply came back
                        page.wait_for_function(r"el => /^\[\d+\]:$/.test(el.innerText.trim())",
                                               arg=view.locator(".jp-InputPrompt").element_handle(), timeout=ms(60))
                        errors = view.locator(
                            ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
                        assert errors.count() == 0, errors.all_inner_texts()
                        if index in widget_indices:
                            step = f"{notebook.name}: cell {index} ({first!r}) draws its widget"
                            view.locator(".jp-OutputArea-output .widget-interact").first.wait_for(timeout=ms(30))
            except Exception as exc:
                shot = tmp_path / "jupyterlab.png"
                with contextlib.suppress(Exception):
                    page.screenshot(path=str(shot), full_page=True)
                raise AssertionError(f"{step}: {type(exc).__name__}: {exc}\nscreenshot: {shot}\n"
                                     f"--- JupyterLab log (end) ---\n{log_tail(log)}") from exc
            finally:
                browser.close()

    left = leftover_processes()
    for process in left:
        with contextlib.suppress(Exception):
            process.kill()
    assert not left, f"left running: {[(p.pid, p.name()) for p in left]}"
    assert artefacts() <= artefacts_before, f"JupyterLab wrote into the repository: {artefacts() - artefacts_before}"
