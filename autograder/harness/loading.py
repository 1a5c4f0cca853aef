"""Instruments the grader places around a learner's code inside each rank.

They observe; they never decide. Each rank returns what they saw (plain
tensors, lists, strings) and the verdict is computed in the grading process.
"""
from __future__ import annotations

import contextlib
import gc
import importlib.abc
import io
import os
import sys
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Callable, Mapping

import torch
import torch.distributed as dist

from distlab.runtime.importing import import_path


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


def load_learner(path: str | Path):
    """Import the learner's exercise file by path (never from ``sys.path``).

    Every :class:`Replace` entered now also covers the names the module bound at its import, and
    every one entered later covers them as well, until it exits.
    """
    if not any(isinstance(f, _NoSolutions) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoSolutions())
        for name in [m for m in sys.modules if m == "solutions" or m.startswith("solutions.")]:
            del sys.modules[name]
    return watched(import_path(path, name=f"learner_{Path(path).stem}"))


def watched(module: ModuleType) -> ModuleType:
    """Count ``module`` as the learner's: every :class:`Replace` entered now or later covers its names."""
    _LEARNERS.append(module)
    for replacement in _ACTIVE:
        replacement.cover(module)
    return module


_LEARNERS: list[ModuleType] = []   # every learner module this process imported, in order
_ACTIVE: list["Replace"] = []      # the replacements entered now, outermost first
_MISSING = object()


class Replace(contextlib.AbstractContextManager):
    """Library functions replaced by an instrument's stand-ins, wherever the learner's code reaches them.

    ``Replace({(time, "perf_counter"): make, (timeit, "default_timer"): make, ...})``: while entered,
    ``owner.name`` is ``make(real)`` (``real``: what it was on entry), and so is every global of a
    learner module (:func:`load_learner`) that *is* ``real``. A module binds what it imports once,
    when it is imported: ``from time import perf_counter``, ``from timeit import default_timer as
    clock`` or a default argument ``clock=time.perf_counter`` keep the real function after a plain
    ``setattr(time, ...)``, and would measure something else than ``time.perf_counter()``. So:

    * enter it *before* ``load_learner``: the module binds the stand-ins themselves (names, default
      arguments, closures, class attributes alike);
    * and for a module imported before it was entered, its globals that are the real function are
      replaced too, for the duration (``import X as Y`` and ``X.name`` need nothing more).

    On exit everything is put back, in reverse order, so replacements nest. A name the module bound
    to a stand-in at import keeps it afterwards: a stand-in must behave as the real function
    whenever its instrument is not observing. ``real[(owner, name)]`` is the replaced function.
    """

    def __init__(self, targets: Mapping[tuple[object, str], Callable[[Callable], Callable]]):
        self.targets = dict(targets)
        self.real: dict[tuple[object, str], Callable] = {}
        self._stand_ins: dict[int, Callable] = {}  # id(real) -> its stand-in
        self._undo: list[tuple[object, str, object]] = []

    def __enter__(self) -> "Replace":
        stand_ins: dict = {}
        for (owner, name), make in self.targets.items():
            real = getattr(owner, name)
            self.real[(owner, name)] = real
            if id(real) not in stand_ins:  # aliases of one function (torch.save, serialization.save) share one
                stand_ins[id(real)] = make(real)
            self._set(owner, name, stand_ins[id(real)])
        self._stand_ins = stand_ins
        _ACTIVE.append(self)
        for module in _LEARNERS:
            self.cover(module)
        return self

    def _set(self, owner: object, name: str, value: object) -> None:
        self._undo.append((owner, name, vars(owner).get(name, _MISSING)))
        setattr(owner, name, value)

    def cover(self, module: ModuleType) -> None:
        """Replace the names ``module`` bound to a replaced function (``from X import name``), until exit."""
        reals = {id(real): real for real in self.real.values()}
        for key, value in list(vars(module).items()):
            if id(value) in reals and value is reals[id(value)] and not key.startswith("__"):
                self._set(module, key, self._stand_ins[id(value)])

    def __exit__(self, *exc) -> bool:
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        for owner, name, old in reversed(self._undo):
            if old is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, old)
        self._undo.clear()
        return False


class CapturedPrints(contextlib.AbstractContextManager):
    """Captures what the learner's code prints on this rank (stdout and stderr)."""

    def __init__(self):
        self.buffer = io.StringIO()
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


class SaveSpy(Replace):
    """Records the path of every ``torch.save`` call on this rank (and still performs them).

    Enter it *before* importing the learner's module (see :class:`Replace`): ``from torch import
    save`` and ``torch.serialization.save`` are seen too.
    """

    def __init__(self):
        self.paths: list[str] = []
        super().__init__({(torch, "save"): self._spy, (torch.serialization, "save"): self._spy})

    def _spy(self, real):
        def save(obj, f, *args, **kwargs):
            self.paths.append(str(f))
            return real(obj, f, *args, **kwargs)
        return save


def echo(lines: list[str]) -> None:
    """Show captured learner output in the job log, so a learner debugging sees it."""
    for ln in lines:
        print(ln, file=sys.stdout)


def grad_norm(params) -> float:
    """The total 2-norm of the ``.grad`` of ``params`` that have one (a DTensor's: this rank's shard); 0.0
    when none has."""
    norms = [getattr(p.grad, "_local_tensor", p.grad).detach().float().norm() for p in params if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack(norms)).item() if norms else 0.0


def on_backward_start(model: torch.nn.Module, callback) -> torch.utils.hooks.RemovableHandle:
    """Call ``callback()`` each time a backward through ``model``'s output begins (before any ``.grad`` of
    that backward is written: what ``.grad`` holds then is what ``zero_grad`` should have cleared)."""
    def on_forward(mod, args, out) -> None:  # None: the output is not replaced
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda grad: callback())
    return model.register_forward_hook(on_forward)


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
    try:
        yield
    finally:
        os.environ["MASTER_PORT"] = agent_port
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()
        agent.set(f"{key}/done/{rank}", "1")
        if server is not None:  # rank 0 keeps the store up until every rank is done with it
            agent.wait([f"{key}/done/{r}" for r in range(world)])
