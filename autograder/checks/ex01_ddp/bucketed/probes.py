"""Rank-side instruments of exercise 1's part 2, ``BucketedDDP`` (DDP's buckets by hand; Li et al., 2020).

Everything here observes; the verdicts are computed in the grading process (``.criteria``) against one process
training the same model on the whole batches. For each cap of :data:`~.observations.CAPS_BYTES` the grader
builds the model from a seed of this rank's own (so that a missing broadcast shows), registers its own
``register_post_accumulate_grad_hook`` on every parameter *before* the learner's (hooks run in the order they
were registered, so a gradient's "ready" is logged before anything the learner's hook starts), wraps the model
in the learner's ``BucketedDDP`` and runs the contract's loop. It records, in order, every gradient accumulated
and every collective started (the one recorder, each tagged with the learner's line), whether each
``dist.all_reduce`` was asynchronous and whether its Work was waited on (or seen completed) before the step
(the ex01 ``AllReduceSpy``'s ``on_call``, handing the learner a :class:`~autograder.rank.Watched` Work), the
first step's gradients as accumulated and as stepped, and the final weights. Then one step of a model with a
parameter the forward never uses. An error is recorded, not raised: part 1 is graded all the same.
"""
from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from distlab.models import cpu_state

from ....rank import LineRecorder, Watched, learner_frame, raised
from .observations import CAPS_BYTES, LR, ROWS, SEED, STEPS, Bucketed, CapRun, Event, batch, make_model

AFTER_ERROR = timedelta(seconds=5)   # how long the grader waits on the learner's pending all-reduces after an error


def observe_bucketed(learner, path: str, spy) -> Bucketed:
    """Part 2 on this rank (``spy``: the file's ``AllReduceSpy``, entered before the learner's file was loaded)."""
    out = Bucketed()
    if not hasattr(learner, "BucketedDDP"):
        out.runs.append(CapRun(CAPS_BYTES[0], error="the file defines no BucketedDDP class"))
        return out
    for cap in CAPS_BYTES:
        out.runs.append(_cap_run(learner, path, spy, cap, STEPS, unused=False))
        if out.runs[-1].error:   # the same code would raise again; the group may hold the broken run's ops
            return out
    out.unused = _cap_run(learner, path, spy, CAPS_BYTES[0], 1, unused=True)
    return out


class _Step:
    """One step's log: the events in order, the Works handed to the learner, the first step's gradients."""

    def __init__(self, names: dict[int, str], keep_local: bool):
        self.names, self.keep_local = names, keep_local
        self.events: list[Event] = []
        self.works: list[tuple[Event, Watched]] = []
        self.local: dict[str, torch.Tensor] = {}
        self.stepped: dict[str, torch.Tensor | None] = {}

    def grad_ready(self, p: torch.Tensor) -> None:
        name = self.names[id(p)]
        self.events.append(Event("grad", name=name))
        if self.keep_local:
            self.local[name] = p.grad.detach().cpu().clone()

    def collective(self, kind: str, numel: int, line: str) -> None:
        if kind == "all_reduce":
            self.events.append(Event("all_reduce", numel=numel, where=line))
        else:
            self.events.append(Event("collective", other=kind, where=line))

    def on_call(self, is_async: bool, result):
        """The spy's ``on_call``: the all-reduce just recorded is marked async, and its Work watched."""
        event = next((e for e in reversed(self.events) if e.kind == "all_reduce"), None)
        if event is None:
            return result
        event.is_async = is_async
        if result is None:
            return result
        watched = Watched(result, [{"waited": False}])
        self.works.append((event, watched))
        return watched

    def at_step(self, model: nn.Module) -> None:
        """As the optimizer is about to step: which Works were waited on, and the gradients it steps with."""
        for event, watched in self.works:
            event.waited = watched.calls[0]["waited"]
        if self.keep_local:
            self.stepped = {n: (p.grad.detach().cpu().clone() if p.grad is not None else None)
                            for n, p in model.named_parameters()}

    def drain(self, timeout: timedelta | None = None) -> None:
        """Wait on every Work handed out, so that no all-reduce is left running in the group. After the learner's
        code raised (``timeout`` given), the other rank may never have started its part: give up after it."""
        for _, watched in self.works:
            try:
                watched.work.wait(timeout) if timeout else watched.work.wait()
            except RuntimeError:
                if timeout is None:
                    raise


class _Recorder(LineRecorder):
    """The one recorder, each collective logged into the current step as it starts."""

    def __init__(self, world: int, path: str, step: _Step):
        super().__init__(world, path)
        self.step = step

    def tag(self, kind: str, tensors: list[torch.Tensor]) -> dict:
        tags = super().tag(kind, tensors)
        self.step.collective(kind, tensors[0].numel() if tensors else 0, tags["at"])
        return tags


def _cap_run(learner, path: str, spy, cap: int, steps: int, *, unused: bool) -> CapRun:
    rank, world = dist.get_rank(), dist.get_world_size()
    run = CapRun(cap_bytes=cap)
    model = make_model(SEED + 1000 + rank, unused=unused)   # a different start on every rank
    names = {id(p): n for n, p in model.named_parameters()}
    current = [_Step(names, keep_local=True)]
    for p in (p for p in model.parameters() if p.requires_grad):  # before the learner's: "ready" is logged first
        p.register_post_accumulate_grad_hook(lambda p: current[0].grad_ready(p))
    try:
        ddp = learner.BucketedDDP(model, cap / 2**20)
        run.start = cpu_state(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        for i in range(steps):
            current[0] = step = _Step(names, keep_local=i == 0)
            _one_step(ddp, optimizer, step, spy, i, rank, world, path)
            step.at_step(model)
            step.drain()
            run.steps.append(step.events)
            if i == 0:
                run.local, run.stepped = step.local, step.stepped
            optimizer.step()
    except Exception as exc:  # noqa: BLE001 - part 2's error costs part 2's marks only
        run.where = str(learner_frame(exc, path) or _hook_defined(model, path) or "")
        run.error = raised(exc) + (f" (at {run.where})" if run.where else "")
        run.not_implemented = isinstance(exc, NotImplementedError)
        current[0].drain(timeout=AFTER_ERROR)
    finally:
        spy.on_call = None
    run.final = cpu_state(model)
    return run


def _hook_defined(model: nn.Module, path: str) -> str | None:
    """Where a hook of the learner's file on one of ``model``'s parameters is defined: an error raised while autograd
    called it (its signature not the hook's, ``hook(param)``) has no frame of the learner's to show."""
    mine = Path(path).resolve()
    for name, p in model.named_parameters():
        for hook in (getattr(p, "_post_accumulate_grad_hooks", None) or {}).values():
            code = getattr(hook, "__code__", None)
            if code is not None and Path(code.co_filename).resolve() == mine:
                return (f"{mine.name} line {code.co_firstlineno}, where the hook {hook.__qualname__} on '{name}' is "
                        "defined (autograd calls it as hook(param))")
    return None


def _one_step(ddp, optimizer, step: _Step, spy, i: int, rank: int, world: int, path: str) -> None:
    """The contract's loop, once: forward through the wrapper, zero_grad, backward, finish."""
    x, y = batch(i, world)
    mine = slice(rank * ROWS, (rank + 1) * ROWS)
    spy.on_call = step.on_call
    try:
        with _Recorder(world, path, step):
            loss = nn.functional.cross_entropy(ddp(x[mine]), y[mine])
            optimizer.zero_grad()
            loss.backward()
            for event, watched in step.works:   # a wait() inside the backward held the backward up
                event.waited_in_backward = watched.blocked
            step.events.append(Event("finish"))
            ddp.finish_gradient_synchronization()
    finally:
        spy.on_call = None
