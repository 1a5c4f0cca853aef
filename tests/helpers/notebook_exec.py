"""Executing the course's notebooks in tests: nbclient, without its lost wake-up, and with a diagnosis.

The lost wake-up (issue 24)
---------------------------
nbclient answers an ipywidgets ``Output`` widget the way a browser would: when a cell's output
is captured by one (``widgets.interactive`` puts its output in one), nbclient's mimic
(``nbclient.output_widget.OutputWidget``) sends the new outputs back to the kernel as a
``comm_msg`` **on the shell channel, while the same client is awaiting the cell's
``execute_reply`` on that channel**. jupyter_client's ``Session.send`` (since 7.4.2) writes to an
asyncio socket through a *blocking shadow* of it (``zmq.Socket.shadow(socket.underlying)``), which
pyzmq's asyncio layer never sees. A ZeroMQ socket's file descriptor is edge-triggered: a send
that processes the socket's pending commands (libzmq does so when it has not in the last ~1 ms)
consumes the "a message arrived" edge. So when the kernel's ``execute_reply`` reaches the socket
just before the mimic sends, the send eats the edge, the event loop is never woken, and the
``poll()`` nbclient awaits sleeps until its timeout with the reply sitting unread in the socket.
The kernel is idle (it has replied and published ``idle``); the client is "waiting" for a reply it
already has. With nbclient's default (no timeout) it waits forever; with ``timeout=600``
(nbconvert's) it wakes after 600 s, finds the reply and carries on as if nothing had happened.
pyzmq's own asyncio send re-checks the socket after sending and wakes a pending poll when a
message is waiting, so a send through it cannot lose the edge: :class:`OutputWidget` sends that way.

The same mechanism, on the kernel's side of the shell channel, is ipykernel's "wedge"
(ipykernel PR #1529, fixed in 7.4.0, which this course pins). The client's side is open in every
release since jupyter_client 7.4.2 up to the newest (8.10.0, with nbclient 0.11.0): nbclient issue
#312 (a cell with an ipywidget sometimes blocks), jupyter_client issue #922 (notebook execution
hangs). Versions without it exist (jupyter_client <= 7.4.1) but not with this course's stack:
jupyter_server 2 needs jupyter_client >= 7.4.4 and ipykernel 7 >= 8.9. So the fix lives here, in
the one code path the tests execute notebooks with, and ``requirements.txt`` says why.

What a hang looks like here
---------------------------
Every cell runs under a per-cell hang guard (:class:`CellHang`). When it fires, before anything
is torn down, the runner collects what the process stacks in the issue had to be dug out for:
the kernel's threads (``faulthandler`` armed at kernel start-up on SIGUSR2, written to a file),
the client's asyncio tasks and threads, which of ``execute_reply`` and the ``idle`` status had
arrived, and whether a reply is sitting unread in the client's shell socket. The report opens
with one line; a lost wake-up, as the stress measured it with nbclient's own mimic, reads::

    03_mixed_precision cell 4 (line 63, 'import ipywidgets as widgets'), kernel 3/10, repetition
    11/40: not complete after 20 s (its hang guard); kernel idle (published status idle; no thread is running a
    cell, the main thread waits in its event loop); client waiting for execute_reply, which is
    sitting unread in its shell socket (execute_reply): a lost wake-up

``python -m tests.helpers.notebook_exec [--stock] [--rounds N] [--repeats N]`` runs the widget stress of
``tests/tiers/test_widget_cells.py`` at any length and prints how many executions hung; ``--stock``
uses nbclient's own Output-widget mimic, to measure the bug the fix removes.
"""
from __future__ import annotations

import argparse
import ast
import asyncio
import contextlib
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import jupytext
import nbclient
import zmq
from jupyter_core.utils import ensure_async
from nbclient.jsonutil import json_clean
from nbclient.output_widget import OutputWidget as StockOutputWidget
from nbformat.v4 import new_code_cell, new_notebook

from distlab.runtime.process import time_scale

REPO = Path(__file__).resolve().parents[2]
COURSE = REPO / "course"
NOTEBOOK_GLOB = "[0-9][0-9]*_*.py"  # 00_why_distribute ... and 00b_collectives, in course order
CELL_MARKER = re.compile(r"# %%( |$)")  # "# %%torchrun" and "# %%time" are cell magics inside a cell
STACK_SIGNAL = signal.SIGUSR2  # not SIGUSR1: the course teaches faulthandler on SIGUSR1 (notebook 09)
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


# --------------------------------------------------------------------------------------------
# The fix
# --------------------------------------------------------------------------------------------

class OutputWidget(StockOutputWidget):
    """nbclient's Output-widget mimic, its comm messages sent through pyzmq's asyncio socket.

    nbclient's ``_publish_msg`` calls ``shell_channel.send``, i.e. ``Session.send``, which writes
    to the asyncio socket through a blocking shadow and so can consume the read edge of the
    ``execute_reply`` nbclient is awaiting on the same socket (see the module docstring). The
    asyncio socket's ``send_multipart`` re-checks the socket's events after sending and wakes
    the pending ``poll()`` when a message is waiting, so the reply is read when it arrives.
    """

    def _publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys) -> None:
        client = self.kernel_client
        content = json_clean(dict(data={} if data is None else data, comm_id=self.comm_id, **keys))
        msg = client.session.msg(msg_type, content=content, parent=self.parent_header,
                                 metadata={} if metadata is None else metadata)
        frames = client.session.serialize(msg) + list(buffers or [])
        sent = client.shell_channel.socket.send_multipart(frames)
        if isinstance(sent, asyncio.Future):  # done already unless the socket was full; then later
            sent.add_done_callback(_log_send_error)


def _log_send_error(future: asyncio.Future) -> None:
    if not future.cancelled() and future.exception() is not None:
        print(f"notebook_exec: a widget comm_msg was not sent: {future.exception()!r}", file=sys.stderr)


# --------------------------------------------------------------------------------------------
# Which cells
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Cell:
    """A code cell of a course notebook, named as the tests and nbclient number it."""

    notebook: Path  # the jupytext source
    index: int  # in the notebook's cells, markdown included (nbclient's cell_index)
    source: str
    line: int | None = None  # where the cell starts in the jupytext source

    @property
    def first_line(self) -> str:
        return next((ln for ln in self.source.splitlines() if ln.strip()), "")

    def where(self) -> str:
        line = f"line {self.line}, " if self.line else ""
        return f"{self.notebook.stem} cell {self.index} ({line}{self.first_line!r})"


def cell_lines(source: Path, nb) -> list[int | None]:
    """The line of the jupytext source where each cell of ``nb`` starts (None when unknown)."""
    markers = [n for n, ln in enumerate(source.read_text().splitlines(), 1) if CELL_MARKER.match(ln)]
    return markers if len(markers) == len(nb.cells) else [None] * len(nb.cells)


def _python(source: str) -> ast.Module | None:
    """``source`` as Python, magics turned into calls as IPython does (None if it does not parse)."""
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        return ast.parse(TransformerManager().transform_cell(source))
    except SyntaxError:
        return None


def _widget_aliases(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname or a.name for a in node.names if a.name == "ipywidgets"}
    return names


def is_widget_cell(source: str) -> bool:
    """A cell that shows something interactive: it calls ``display``, ``interact(ive)`` or builds
    an ``ipywidgets`` widget."""
    tree = _python(source)
    if tree is None:
        return False
    aliases = _widget_aliases(tree) | {"widgets", "ipywidgets"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in ("display", "interact", "interactive"):
                return True
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in aliases:
                return True
    return False


def prelude(cells: list[str]) -> str:
    """The top-level imports of ``cells``: what a cell extracted from below them needs to run."""
    lines = []
    for source in cells:
        tree = _python(source)
        for node in tree.body if tree else []:
            if isinstance(node, (ast.Import, ast.ImportFrom)) and ast.unparse(node) not in lines:
                lines.append(ast.unparse(node))
    return "\n".join(lines)


@dataclass(frozen=True)
class WidgetCell(Cell):
    prelude: str = ""  # the imports of the code cells above it


def widget_cells(source: Path) -> list[WidgetCell]:
    """Every interactive/display cell of one notebook, with the imports of the cells above it."""
    nb = jupytext.read(source)
    lines = cell_lines(source, nb)
    found, above = [], []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if is_widget_cell(cell.source):
            found.append(WidgetCell(source, index, cell.source, lines[index], prelude(above)))
        above.append(cell.source)
    return found


def course_widget_cells() -> list[WidgetCell]:
    return [c for source in sorted(COURSE.glob(NOTEBOOK_GLOB)) for c in widget_cells(source)]


# --------------------------------------------------------------------------------------------
# The runner
# --------------------------------------------------------------------------------------------

class CellHang(AssertionError):
    """A cell did not complete within its hang guard; ``str()`` is the diagnosis."""

    def __init__(self, diagnosis: Diagnosis):
        super().__init__(str(diagnosis))
        self.diagnosis = diagnosis


@dataclass
class Diagnosis:
    where: str
    guard: float
    kernel: str  # "idle (...)", "running the cell", "dead", "unknown (...)"
    client: str
    lost_wakeup: bool  # an execute_reply was sitting unread in the client's shell socket
    kernel_stacks: str = ""
    client_stacks: str = ""
    messages: dict = field(default_factory=dict)

    def headline(self) -> str:
        return (f"{self.where}: not complete after {self.guard:g} s (its hang guard); "
                f"kernel {self.kernel}; client {self.client}")

    def __str__(self) -> str:
        return (f"{self.headline()}\nwhat had arrived for this cell: {self.messages or 'nothing'}\n"
                f"--- kernel threads (faulthandler) ---\n{self.kernel_stacks or '(none)'}\n"
                f"--- client (asyncio tasks, then threads) ---\n{self.client_stacks}")


def _await_chain(task: asyncio.Task) -> str:
    """Where a task is suspended: its chain of awaited coroutines, innermost last."""
    parts, coro = [], task.get_coro()
    while coro is not None and hasattr(coro, "cr_frame"):
        frame = coro.cr_frame
        if frame is not None:
            parts.append(f"{coro.cr_code.co_name} ({Path(frame.f_code.co_filename).name}:{frame.f_lineno})")
        coro = coro.cr_await
    waiter = getattr(task, "_fut_waiter", None)
    if waiter is not None:
        parts.append(f"<{type(waiter).__name__} {'done' if waiter.done() else 'pending'}>")
    return " -> ".join(parts) or repr(task)


def _thread_stacks() -> str:
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame, limit=12))
        out.append(f"Thread {names.get(ident, ident)}:\n{stack}")
    return "\n".join(out)


def _kernel_state(stacks: str, messages: dict) -> str:
    if not stacks:
        return "unknown (no stacks)"
    if " in run_code" in stacks or " in run_ast_nodes" in stacks:
        return "running the cell (a thread is in IPython's run_code)"
    if "iopub.status.idle" in messages:
        said = "published status idle"
    elif "iopub.status.busy" in messages:
        said = "published busy for this request, not yet idle"
    else:
        said = "never published busy for this request: it may not have received it"
    return f"idle ({said}; no thread is running a cell, the main thread waits in its event loop)"


class Runner(nbclient.NotebookClient):
    """``nbclient.NotebookClient`` with the lost-wake-up fix, a per-cell hang guard and a diagnosis.

    ``cell_timeout(cell, index)`` (seconds, before ``DISTLAB_TIME_SCALE``) bounds each cell; nbclient's
    own timeout is off, since on expiry nbclient re-polls, finds a reply that was stranded by a lost
    wake-up and carries on, which would hide the hang. ``name`` names the notebook in reports and
    ``label(index)`` a cell. ``fix=False`` keeps nbclient's own Output-widget mimic (to measure the bug).
    """

    def __init__(self, nb, *, name: str, cell_timeout, label=None, fix: bool = True, workdir: Path,
                 **kwargs):
        self._stacks_file = Path(workdir) / "kernel-stacks.txt"
        arm = (f"__import__('faulthandler').register({int(STACK_SIGNAL)}, "
               f"file=open({str(self._stacks_file)!r}, 'w'), all_threads=True)")
        kwargs.setdefault("kernel_name", "python3")
        kwargs.setdefault("startup_timeout", int(60 * time_scale()))
        super().__init__(nb, timeout=None, extra_arguments=[f"--IPKernelApp.exec_lines={arm}"], **kwargs)
        self.name = name
        self.cell_timeout = cell_timeout
        self.label = label or (lambda index: f"{name} cell {index}")
        if fix:
            self.widget_registry["@jupyter-widgets/output"] = {"OutputModel": OutputWidget}

    async def async_wait_for_reply(self, msg_id, cell=None):  # only used for kernel_info here
        return await self._guarded(super().async_wait_for_reply(msg_id, cell), None, None,
                                   60 * time_scale())

    async def async_execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
        if cell.cell_type != "code":
            return await super().async_execute_cell(cell, cell_index, execution_count, store_history)
        guard = self.cell_timeout(cell, cell_index) * time_scale()
        return await self._guarded(super().async_execute_cell(cell, cell_index, execution_count, store_history),
                                   cell, cell_index, guard)

    async def _guarded(self, coro, cell, index, guard: float):
        task = asyncio.ensure_future(coro)
        done, _ = await asyncio.wait({task}, timeout=guard)
        if done:
            return task.result()
        diagnosis = await self._diagnose(cell, index, guard)  # before anything is cancelled or torn down
        for other in asyncio.all_tasks():  # nbclient's pollers of this cell (its kernel-alive poll too)
            if other is not asyncio.current_task() and "_async_poll" in _await_chain(other):
                other.cancel()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        raise CellHang(diagnosis)

    async def _diagnose(self, cell, index, guard: float) -> Diagnosis:
        where = self.label(index) if index is not None else f"{self.name} (kernel_info at start-up)"
        messages = dict(cell.metadata.get("execution", {})) if cell is not None else {}
        tasks = "\n".join(f"task {_await_chain(t)}" for t in asyncio.all_tasks())
        client_stacks = f"{tasks}\n\n{_thread_stacks()}"
        alive = bool(self.km is not None and await ensure_async(self.km.is_alive()))
        stacks = await self._kernel_stacks() if alive else ""
        unread = self._unread_shell_messages()
        lost = any(m["msg_type"].endswith("_reply") for m in unread)
        if not alive:
            kernel = "dead"
        else:
            kernel = _kernel_state(stacks, messages)
        if "shell.execute_reply" in messages:
            client = "had the execute_reply, waiting for the cell's status idle on iopub"
        elif lost:
            client = ("waiting for execute_reply, which is sitting unread in its shell socket "
                      f"({', '.join(m['msg_type'] for m in unread)}): a lost wake-up")
        else:
            client = "waiting for execute_reply on the shell channel (none has arrived)"
        return Diagnosis(where, guard, kernel, client, lost, stacks, client_stacks, messages)

    async def _kernel_stacks(self) -> str:
        """The kernel's threads, from the faulthandler it armed at start-up (polled, bounded)."""
        pid = getattr(getattr(self.km, "provisioner", None), "pid", None)
        if pid is None:
            return ""
        with contextlib.suppress(OSError):
            self._stacks_file.write_text("")
        try:
            os.kill(pid, STACK_SIGNAL)
        except OSError:
            return ""
        deadline, last = time.monotonic() + 10 * time_scale(), ""
        while time.monotonic() < deadline:
            await asyncio.sleep(0.1)  # polling the file, not a guess at how long the dump takes
            text = self._stacks_file.read_text(errors="replace") if self._stacks_file.exists() else ""
            if text and text == last and "Current thread" in text:
                return text
            last = text
        return last

    def _unread_shell_messages(self) -> list[dict]:
        """Messages waiting in the client's shell socket that its pending poll was not woken for."""
        if self.kc is None or self.kc.shell_channel.socket is None:
            return []
        socket = zmq.Socket.shadow(self.kc.shell_channel.socket.underlying)
        found = []
        while socket.poll(0) and len(found) < 20:
            _, msg = self.kc.session.recv(socket, mode=zmq.NOBLOCK)
            if msg is None:
                break
            found.append(msg)
        return found


def execute(nb, *, name: str, cell_timeout, cwd: Path, label=None, fix: bool = True,
            workdir: Path | None = None):
    """Execute ``nb`` top to bottom in a fresh kernel started in ``cwd``; raise :class:`CellHang` on
    a hang, nbclient's ``CellExecutionError`` on an error (its output is in ``nb`` then)."""
    own = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="notebook-exec-")) if own else Path(workdir)
    try:
        runner = Runner(nb, name=name, cell_timeout=cell_timeout, label=label, fix=fix, workdir=workdir,
                        resources={"metadata": {"path": str(cwd)}})
        return runner.execute()
    finally:
        if own:
            shutil.rmtree(workdir, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# The widget stress
# --------------------------------------------------------------------------------------------

PRELUDE_TIMEOUT = 90.0  # imports torch and matplotlib in a fresh kernel
WIDGET_TIMEOUT = 20.0  # a widget cell takes well under 2 s


@dataclass
class StressResult:
    cell: WidgetCell
    executions: int = 0
    hangs: list = field(default_factory=list)  # Diagnosis of each hang
    problems: list = field(default_factory=list)  # errors, missing widget views


def _problems(nb, cell: WidgetCell, first: int) -> list[str]:
    out = []
    for i, c in enumerate(nb.cells[first:], first):
        errors = [o for o in c.get("outputs", []) if o.get("output_type") == "error"]
        if errors:
            error = errors[0]
            out.append(f"{cell.where()} repetition {i - first + 1}: {error.get('ename')}: {error.get('evalue')}")
        elif not any(WIDGET_VIEW in o.get("data", {}) for o in c.get("outputs", [])):
            out.append(f"{cell.where()} repetition {i - first + 1}: no widget view in its outputs "
                       f"({[o.get('output_type') for o in c.get('outputs', [])]})")
    return out


def stress_one(cell: WidgetCell, *, rounds: int, repeats: int, fix: bool = True, workdir: Path,
               stop_at_first: bool = False) -> StressResult:
    """``rounds`` fresh kernels, each running the cell's prelude then the cell ``repeats`` times."""
    result = StressResult(cell)
    for r in range(rounds):
        nb = new_notebook(cells=[new_code_cell(cell.prelude), *(new_code_cell(cell.source) for _ in range(repeats))])
        nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}

        def label(index, r=r):
            return (f"{cell.notebook.stem}: the imports above cell {cell.index}" if index == 0 else
                    f"{cell.where()}, kernel {r + 1}/{rounds}, repetition {index}/{repeats}")

        def timeout(c, index):
            return PRELUDE_TIMEOUT if index == 0 else WIDGET_TIMEOUT

        try:
            execute(nb, name=cell.notebook.stem, cell_timeout=timeout, cwd=cell.notebook.parent, label=label,
                    fix=fix, workdir=workdir)
        except CellHang as hang:
            result.hangs.append(hang.diagnosis)
            result.executions += sum(1 for c in nb.cells[1:] if c.get("execution_count"))
            if stop_at_first:
                return result
            continue
        except nbclient.exceptions.CellExecutionError:
            pass  # the error output is in nb; _problems names it
        result.executions += sum(1 for c in nb.cells[1:] if c.get("execution_count"))
        result.problems += _problems(nb, cell, 1)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="fresh kernels per widget cell")
    parser.add_argument("--repeats", type=int, default=10, help="executions of the cell per kernel")
    parser.add_argument("--stock", action="store_true", help="nbclient's own Output-widget mimic (the bug)")
    parser.add_argument("--notebook", action="append", help="only these notebooks (e.g. 03)")
    args = parser.parse_args(argv)
    cells = [c for c in course_widget_cells()
             if not args.notebook or any(c.notebook.stem.startswith(n) for n in args.notebook)]
    total = hung = 0
    with tempfile.TemporaryDirectory() as tmp:
        for cell in cells:
            start = time.monotonic()
            res = stress_one(cell, rounds=args.rounds, repeats=args.repeats, fix=not args.stock, workdir=Path(tmp))
            total += res.executions
            hung += len(res.hangs)
            print(f"{cell.where()}: {res.executions} executions, {len(res.hangs)} hung, "
                  f"{len(res.problems)} problems, {time.monotonic() - start:.0f} s", flush=True)
            for d in res.hangs:
                print(f"  HANG {d.headline()}", flush=True)
            for p in res.problems[:5]:
                print(f"  PROBLEM {p}", flush=True)
    print(f"total: {total} executions, {hung} hung ({'stock nbclient' if args.stock else 'with the fix'})")
    return 1 if hung else 0


if __name__ == "__main__":
    sys.exit(main())
