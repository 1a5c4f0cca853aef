"""Where the learner's code runs inside a rank: its file imported (never the reference solutions), what
it prints captured, and the process group it makes given a store of its own.

The instruments (:mod:`.spies`) observe; they never decide. Each rank returns what they saw (plain
tensors, lists, strings) and the verdict is computed in the grading process.
"""
from __future__ import annotations

import builtins
import contextlib
import gc
import importlib.abc
import io
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Iterator

import torch.distributed as dist

from distlab.runtime import heartbeat
from distlab.runtime.importing import import_path

from . import trace
from .replace import watched


class _NoSolutions(importlib.abc.MetaPathFinder):
    """Refuses ``import solutions...`` in a rank that grades a learner's file.

    Outside Docker the repo's ``solutions/`` sits on the path; this stops the
    naive copy (``from solutions.ex01_ddp import *``). The grading image also
    makes ``solutions/`` unreadable to the learner's user.
    """

    def find_spec(self, name, path=None, target=None):
        if name == "solutions" or name.startswith("solutions."):
            raise ImportError("the reference solutions cannot be imported while grading")
        return None


# The grader's own code, which the ranks have imported already (so no finder sees a second import of it): its
# checks hold a reference for many a graded function (a sort, a step, Adam on a flat shard).
_GRADERS = ("autograder.checks", "autograder.grader", "autograder.rank")
_LEARNER = "learner_"  # the prefix of a learner module's name (load_learner's)


def _guarded(real):
    """``builtins.__import__`` that refuses the grader's own modules to code of a learner's module (the naive
    copy, as :class:`_NoSolutions` refuses ``solutions``): an ``import`` the ranks' own code makes is unchanged."""
    def __import__(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and str((globals or {}).get("__name__", "")).startswith(_LEARNER) and \
                any(name == g or name.startswith(g + ".") for g in _GRADERS):
            raise ImportError("the grader's own code cannot be imported while grading")
        return real(name, globals, locals, fromlist, level)
    __import__.guarded = True
    return __import__


def load_learner(path: str | Path):
    """Import the learner's exercise file by path (never from ``sys.path``).

    Every :class:`Replace` entered now also covers the names the module bound at its import, and
    every one entered later covers them as well, until it exits.
    """
    if not any(isinstance(f, _NoSolutions) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoSolutions())
        for name in [m for m in sys.modules if m == "solutions" or m.startswith("solutions.")]:
            del sys.modules[name]
    if not getattr(builtins.__import__, "guarded", False):
        builtins.__import__ = _guarded(builtins.__import__)
    trace.begin(path)  # the tracer around rank_main, if any: this file's events start here
    heartbeat.clear_raised()  # an earlier file's error explains none of this one's waits
    return watched(import_path(path, name=f"learner_{Path(path).stem}"))


class _Located(io.StringIO):
    """A buffer that remembers the learner's line of its first write (``path``'s innermost frame then)."""

    def __init__(self, path: Path | None):
        super().__init__()
        self.path, self.first_at = path, None

    def write(self, s: str) -> int:
        if self.first_at is None and self.path is not None and s.strip():
            from .spies import learner_line  # spies imports this module
            found = learner_line(self.path)
            if found is not None:
                self.first_at = f"{Path(found[0]).name}:{found[1]}"
        return super().write(s)


class CapturedPrints(contextlib.AbstractContextManager):
    """Captures what the learner's code prints on this rank (stdout and stderr); with ``path`` (the learner's
    file), also where in it the first line was printed (:attr:`first_at`, ``"file.py:N"``)."""

    def __init__(self, path: str | Path | None = None):
        self.buffer = _Located(Path(path).resolve() if path else None)
        self._stack = contextlib.ExitStack()

    def __enter__(self):
        self._stack.enter_context(contextlib.redirect_stdout(self.buffer))
        self._stack.enter_context(contextlib.redirect_stderr(self.buffer))
        return self

    def __exit__(self, *exc):
        self._stack.close()
        return False

    @property
    def lines(self) -> list[str]:
        return [ln for ln in self.buffer.getvalue().splitlines() if ln.strip()]

    @property
    def first_at(self) -> str | None:
        return self.buffer.first_at


def echo(lines: list[str]) -> None:
    """Show captured learner output in the job log, so a learner debugging sees it."""
    for ln in lines:
        print(ln, file=sys.stdout)


@contextlib.contextmanager
def own_rendezvous(tag: str, timeout: timedelta = timedelta(seconds=60)):
    """A fresh store for the process group one learner file creates, for the block; every rank enters.

    Under torchrun, ``init_process_group()`` (``env://``) connects every rank to the agent's
    store. A second one in the same process, for the next file graded in the same launch, would
    read the first one's keys (after ``destroy_process_group`` the default group is named "0"
    again) and gloo would connect to stale peers and hang. So rank 0 hosts a new store for each
    file and ``MASTER_PORT`` points at it while the block runs: the learner's code initialises
    as usual. A process group the file left behind is destroyed after the block, after a garbage
    collection on every rank: a DDP or FSDP object of the learner's that outlived the file would
    otherwise be collected at a different moment on each rank, freeing its group out of step with the
    others (the rank that frees it first then waits out the timeout).
    """
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    host, agent_port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    agent = dist.TCPStore(host, int(agent_port), world, is_master=False, timeout=timeout)
    key = f"distlab/grader/{tag}"
    server = None
    if rank == 0:  # port 0: the OS picks a free port, no race with other jobs
        server = dist.TCPStore(host, 0, world, is_master=True, wait_for_workers=False, timeout=timeout)
        agent.set(f"{key}/port", str(server.port))
    os.environ["MASTER_PORT"] = agent.get(f"{key}/port").decode()
    raised = False
    try:
        with heartbeat.torchrun_vars(MASTER_PORT=os.environ["MASTER_PORT"]):  # this move is the grader's
            yield
    except BaseException:
        raised = True
        raise
    finally:
        os.environ["MASTER_PORT"] = agent_port
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()
        agent.set(f"{key}/done/{rank}", "1")
        if server is not None:  # rank 0 keeps the store up until every rank is done with it
            _wait_for_the_others(agent, key, world, timeout, quiet=raised)


def _wait_for_the_others(agent: dist.TCPStore, key: str, world: int, timeout: timedelta, *, quiet: bool) -> None:
    """Rank 0 waits until every rank is done with the file's store. Past ``timeout`` that is the learner's
    ranks still running (in their code, or stuck in it), said in those words: the store and its keys are
    the grader's. ``quiet``: the block already raised, and that error, the learner's, is the one to report."""
    try:
        with heartbeat.waiting_for_peers():
            agent.wait([f"{key}/done/{r}" for r in range(world)])
    except dist.DistStoreError:
        if quiet:
            return
        late = [r for r in range(world) if not agent.check([f"{key}/done/{r}"])]
        raise RuntimeError(f"rank(s) {', '.join(map(str, late))} had not finished the graded code "
                           f"{timeout.total_seconds():g} s after rank 0 had") from None


def every_rank_tells(tag: str, what: str, value: str, timeout: timedelta) -> list[str] | None:
    """Every rank's ``value`` of ``what`` under ``tag``, in rank order, or ``None`` where some rank did not tell it
    within ``timeout``; on the job's store (:func:`own_rendezvous`'s in its block), with no process group: the one
    to make may have failed, and a collective could pair with one a peer still waits in."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                          timeout=timeout)
    key = f"distlab/grader/{tag}/{what}"
    store.set(f"{key}/{rank}", value)
    try:
        store.wait([f"{key}/{r}" for r in range(world)])
    except dist.DistStoreError:
        return None
    return [store.get(f"{key}/{r}").decode() for r in range(world)]


def every_rank_says(tag: str, what: str, timeout: timedelta) -> bool:
    """Whether every rank says ``what`` under ``tag`` within ``timeout`` (each rank that calls this says it)."""
    return every_rank_tells(tag, what, "1", timeout) is not None


@contextlib.contextmanager
def grader_group(tag: str) -> Iterator[None]:
    """The grader's own process group, in a store of its own (:func:`own_rendezvous`), for the block: in place of
    one the learner's setup failed to make on every rank alike, so that its other functions are still graded."""
    from distlab import init_distributed

    with own_rendezvous(f"{tag}/grader-group"):
        init_distributed()
        yield
