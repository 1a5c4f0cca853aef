"""JupyterLab served as ``make lab`` serves it, and Chromium driving it as a learner would: shared by
``tests/tiers/test_browser.py`` and the container tier (``tests/tiers/test_containers.py``, which serves it
from the learner image). The tests' own description is in ``tests/tiers/test_browser.py``."""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from distlab.runtime.launch import time_scale
from tests.helpers import EXERCISES, REPO

NOTEBOOK_SOURCE = REPO / "course" / "01_ddp.py"
SOURCES = {p.name for p in (REPO / "course").glob("[0-9]*.py")}  # the notebooks' jupytext sources
EXERCISE = EXERCISES / "ex01_ddp.py"
CHECK_CALL = re.compile(r"\bcheck\(\s*1\b")
AS_ROOT = os.geteuid() == 0
# What JupyterLab (or a kernel) would leave in the folders it serves if its state were not kept in tmp_path.
ARTEFACTS = (".ipynb_checkpoints", ".virtual_documents", ".jupyter", ".ipython", ".local")


def find_chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        reason = "needs Debian's chromium: apt-get install chromium"
        if os.environ.get("DISTLAB_REQUIRE_BROWSER") == "1":
            pytest.fail(f"DISTLAB_REQUIRE_BROWSER=1 but chromium is not on PATH; {reason}")
        pytest.skip(reason)
    return path


def lab_command(*make_args: str) -> tuple[dict[str, str], list[str]]:
    """The environment and the arguments ``make lab`` gives ``jupyter lab``, so this test serves what learners
    get: on this machine only, on the port the OS picks when the server binds (``PORT=0``), with
    ``--allow-root`` as root, and the role's configuration (``JUPYTER_CONFIG_PATH``)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "JUPYTER_CONFIG_PATH")}
    dry = subprocess.run(["make", "--no-print-directory", "-n", "lab", "PORT=0", "IP=127.0.0.1", *make_args],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, f"make -n lab failed:\n{dry.stdout}{dry.stderr}"
    for line in dry.stdout.splitlines():
        words = shlex.split(line)
        assignments = {}
        while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
            name, _, value = words.pop(0).partition("=")
            assignments[name] = value
        if len(words) >= 2 and words[0].endswith("/jupyter") and words[1] == "lab":
            return assignments, words[2:]
    raise AssertionError(f"no `jupyter lab` command in `make -n lab`:\n{dry.stdout}")


def notebook_cells(notebook: Path) -> list[str]:
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in json.loads(notebook.read_text())["cells"]]


def artefacts() -> set[Path]:
    return {REPO / d / name for d in (".", "course", "exercises") for name in ARTEFACTS
            if (REPO / d / name).exists()}


def user_settings(directory: Path) -> None:
    """JupyterLab settings for a deterministic run: every cell in the DOM, no autosave. (No news pop-up is the
    project's own configuration, ``jupyter/common``, which the tests check rather than set.)"""
    settings = {
        "notebook-extension/tracker": {"windowingMode": "none"},
        "docmanager-extension/plugin": {"autosave": False},
    }
    for plugin, values in settings.items():
        path = directory / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


def log_tail(log: Path, lines: int = 40) -> str:
    text = log.read_text(errors="replace") if log.exists() else "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read()
    except (urllib.error.URLError, OSError):
        return None


@contextlib.contextmanager
def jupyterlab(tmp_path: Path, wait_for, *make_args: str):
    """Start ``make lab``'s JupyterLab (``make_args``: ``ROLE=instructor``, say) on a free port; yield
    ``(base_url, token, log)``; always end it."""
    state = tmp_path / "jupyter"
    env = dict(os.environ,
               HOME=str(state / "home"),
               IPYTHONDIR=str(state / "ipython"),
               JUPYTER_CONFIG_DIR=str(state / "config"),
               JUPYTER_DATA_DIR=str(state / "data"),
               JUPYTER_RUNTIME_DIR=str(state / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(state / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(state / "workspaces"))
    for key in ("HOME", "IPYTHONDIR", "JUPYTER_RUNTIME_DIR"):
        Path(env[key]).mkdir(parents=True, exist_ok=True)
    user_settings(Path(env["JUPYTERLAB_SETTINGS_DIR"]))
    token = secrets.token_hex(16)
    # port 0 (make lab's PORT=0): the OS picks a free port when the server binds; the server writes it to
    # jpserver-<pid>.json. make lab passes --allow-root itself where this runs as root.
    assignments, arguments = lab_command(*make_args)
    env.update(assignments)
    command = [sys.executable, "-m", "jupyterlab", *arguments, "--no-browser", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={token}",
               # JupyterLab checkpoints every file it opens; an absolute directory keeps them out of the repo
               f"--FileCheckpoints.checkpoint_dir={state / 'checkpoints'}"]
    log = tmp_path / "jupyterlab.log"
    with log.open("w") as out:
        server = subprocess.Popen(command, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    base = None
    try:
        info = Path(env["JUPYTER_RUNTIME_DIR"]) / f"jpserver-{server.pid}.json"

        def ready():
            if server.poll() is not None:
                return "exited"
            if info.exists():
                with contextlib.suppress(ValueError, OSError):
                    url = f"http://127.0.0.1:{json.loads(info.read_text())['port']}"
                    if get(f"{url}/api/status?token={token}") is not None:
                        return url
            return None

        base = wait_for(ready, timeout=60, interval=0.2)
        why = f"exited with {server.returncode}" if base == "exited" else "timed out" if not base else None
        assert why is None, f"JupyterLab did not start ({why}):\n{log_tail(log)}"
        yield base, token, log
    finally:
        stop(server, base, token)


def stop(server: subprocess.Popen, base: str | None, token: str) -> None:
    """Shut down the kernels (they run in sessions of their own), then the server's process group."""
    if base and server.poll() is None:
        kernels = json.loads(get(f"{base}/api/kernels?token={token}") or b"[]")
        for kernel in kernels:
            request = urllib.request.Request(f"{base}/api/kernels/{kernel['id']}?token={token}", method="DELETE")
            with contextlib.suppress(urllib.error.URLError, OSError):
                urllib.request.urlopen(request, timeout=30).close()
    for sig, grace in ((signal.SIGTERM, 20 * time_scale()), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, sig)
        try:
            server.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue


@contextlib.contextmanager
def built_notebook():
    """``course/01_ddp.ipynb`` as ``make notebooks`` builds it; built (and removed after) when missing."""
    notebook = NOTEBOOK_SOURCE.with_suffix(".ipynb")
    if notebook.exists():
        before = notebook.read_bytes()
        yield notebook
        assert notebook.read_bytes() == before, f"{notebook} was changed (saved?) by the test"
        return
    from distlab.lab.build_notebooks import build, kernel_metadata

    build(NOTEBOOK_SOURCE, kernel_metadata())
    try:
        yield notebook
    finally:
        notebook.unlink(missing_ok=True)


def learner_opens_the_exercise_and_checks_it(tmp_path: Path, wait_for, leftover_processes, lab=None) -> None:
    """As a learner: open notebook 01 and exercises/ex01_ddp.py from JupyterLab's file browser, run the check
    cell of exercise 1 and see the feedback table; nothing left running, nothing written into the repository.
    ``lab(tmp_path, wait_for)`` serves JupyterLab (default :func:`jupyterlab`, ``make lab``'s; the container
    tier passes the learner image's)."""
    chromium = find_chromium()
    from playwright.sync_api import sync_playwright

    scale = time_scale()
    ms = lambda seconds: seconds * scale * 1000  # noqa: E731  (Playwright's timeouts are in ms)
    first_line = EXERCISE.read_text().splitlines()[0].strip()
    artefacts_before = artefacts()

    with built_notebook() as notebook, (lab or jupyterlab)(tmp_path, wait_for) as (base, token, log):
        check_cells = [s for s in notebook_cells(notebook) if CHECK_CALL.search(s)]
        assert check_cells, f"no cell of {notebook.name} calls check(1)"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"] if AS_ROOT else [])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(ms(30))
            step = "open JupyterLab"

            try:
                page.goto(f"{base}/?token={token}", timeout=ms(60))
                # make lab opens on course/: the landing page's file browser lists the notebooks
                browser_panel = page.locator("#filebrowser")
                listing = browser_panel.locator(".jp-DirListing-content")

                def item(name):
                    return listing.locator(".jp-DirListing-item").filter(
                        has=page.locator(".jp-DirListing-itemText", has_text=re.compile(f"^{re.escape(name)}$")))

                step = "see each notebook listed once in course/"
                item(notebook.name).wait_for(timeout=ms(60))
                listed = set(listing.locator(".jp-DirListing-itemText").all_inner_texts())
                assert not listed & SOURCES, f"jupytext sources listed beside their notebooks: {listed & SOURCES}"

                step = "open course/01_ddp.ipynb from the file browser"
                item(notebook.name).dblclick(timeout=ms(60))
                panel = page.locator(".jp-NotebookPanel:visible")
                panel.locator(".jp-Notebook .jp-Cell").first.wait_for()
                notebook_tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=notebook.name)
                # the kernel has started and answered (JupyterLab writes its metadata into the notebook then)
                panel.locator(".jp-Notebook-ExecutionIndicator[data-status=idle]").wait_for(timeout=ms(60))

                step = "open exercises/ex01_ddp.py from the file browser"
                browser_panel.locator(".jp-BreadCrumbs-home").click()
                item("exercises").dblclick()
                item(EXERCISE.name).dblclick()
                editor = page.locator(".jp-FileEditor:visible .cm-content")
                editor.wait_for()
                tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current")
                assert tab.inner_text().strip() == EXERCISE.name
                page.wait_for_function("([el, line]) => el.innerText.includes(line)",
                                       arg=[editor.element_handle(), first_line], timeout=ms(30))

                step = "see the notebook unmodified and no pop-up, before running anything"
                assert "jp-mod-dirty" not in (notebook_tab.get_attribute("class") or ""), \
                    f"{notebook.name} shows as modified although nothing was run or edited"
                toasts = page.locator(".Toastify__toast").all_inner_texts()
                assert not toasts, f"pop-ups over the page: {toasts}"

                step = "run the check cell of exercise 1 in the notebook"
                notebook_tab.click()
                cell = panel.locator(".jp-CodeCell").filter(has_text=CHECK_CALL).first
                cell.scroll_into_view_if_needed()
                # an existing notebook may keep the outputs of an earlier run: only a new output counts
                cell.evaluate("c => c.querySelectorAll('.jp-OutputArea-output').forEach(o => o.dataset.old = '1')")
                cell.locator(".jp-InputArea-editor").click()
                page.keyboard.press("Shift+Enter")

                step = "see the feedback table"
                table = cell.locator(".jp-OutputArea-output:not([data-old]) table.distlab-feedback")
                table.wait_for(timeout=ms(120))
                assert "not implemented" in table.inner_text()
            except Exception as exc:
                shot = tmp_path / "jupyterlab.png"
                with contextlib.suppress(Exception):
                    page.screenshot(path=str(shot), full_page=True)
                raise AssertionError(f"{step}: {type(exc).__name__}: {exc}\nscreenshot: {shot}\n"
                                     f"--- JupyterLab log (end) ---\n{log_tail(log)}") from exc
            finally:
                browser.close()

    left = leftover_processes()
    for process in left:  # this session's, so ours to end (the failure below still reports them)
        with contextlib.suppress(Exception):
            process.kill()
    assert not left, f"left running: {[(p.pid, p.name()) for p in left]}"
    assert artefacts() <= artefacts_before, f"JupyterLab wrote into the repository: {artefacts() - artefacts_before}"
