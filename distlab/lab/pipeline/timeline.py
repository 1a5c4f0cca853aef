"""Pipeline-parallel timelines: record when each stage computes, draw it, measure the bubble.

GPipe (Huang et al., 2019, "GPipe: Efficient Training of Giant Neural
Networks using Pipeline Parallelism") splits a batch into ``m`` micro-batches
and streams them through ``p`` stages: all forwards, then all backwards.
1F1B (PipeDream-Flush: Narayanan et al., 2021, "Memory-Efficient
Pipeline-Parallel DNN Training", ICML; the 2019 PipeDream, without the
flush, updates asynchronously) interleaves one forward and one
backward per stage once the pipeline is full, which keeps at most ``p - s``
micro-batches' activations alive on stage ``s`` instead of ``m``. Both idle
for the same fraction of the step, the *bubble* ``(p - 1) / (m + p - 1)``.

:class:`TimedStage` wraps a stage's module and records, without trusting the
code that drives it, the start and end of every forward and backward it runs
(one event log per rank, returned by the runtime). Times are
``time.perf_counter()``, which on Linux is the system-wide monotonic clock, so
logs from processes on one machine share a time axis. A real run with
``torch.distributed.pipelining``, timed by :class:`TimedStage`, is in
:mod:`distlab.lab.pipeline.run`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class Event:
    """One unit of work on one stage: ``kind`` "F" or "B", micro-batch ``mb``, start/end in seconds."""

    stage: int
    kind: str
    mb: int
    start: float
    end: float
    rows: int = 0  # batch size of the micro-batch (forward only)


def _now(sync: bool) -> float:
    if sync:
        torch.cuda.synchronize()
    return time.perf_counter()


class _Mark(torch.autograd.Function):
    """Identity in forward; calls ``on_backward()`` when the gradient flows through it."""

    @staticmethod
    def forward(ctx, x, anchor, on_backward):
        ctx.on_backward = on_backward
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.on_backward()
        return grad, None, None


class TimedStage(nn.Module):
    """A stage module that logs every forward and backward it runs.

    A backward starts when the gradient reaches the stage's output and ends
    when it has flowed back to the stage's input. An ``anchor`` that requires
    grad makes the input marker fire on the first stage too, whose input
    does not require grad; the anchor is not a parameter of the stage.
    """

    def __init__(self, module: nn.Module, stage: int, sync: bool = False):
        super().__init__()
        self.module, self.stage, self.sync = module, stage, sync
        self.events: list[Event] = []
        self._anchor = torch.zeros((), requires_grad=True)
        self._n_fwd = 0
        self._open: dict[int, float] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "meta":  # shape inference (torch.distributed.pipelining), not work
            return self.module(x)
        mb = self._n_fwd
        self._n_fwd += 1
        if torch.is_grad_enabled():
            x = _Mark.apply(x, self._anchor.to(x.device), lambda: self._end_backward(mb))
        start = _now(self.sync)
        out = self.module(x)
        self.events.append(Event(self.stage, "F", mb, start, _now(self.sync), int(x.shape[0])))
        if torch.is_grad_enabled():
            out = _Mark.apply(out, self._anchor.to(out.device), lambda: self._start_backward(mb))
        return out

    def _start_backward(self, mb: int) -> None:
        self._open[mb] = _now(self.sync)

    def _end_backward(self, mb: int) -> None:
        start = self._open.pop(mb, None)
        end = _now(self.sync)
        self.events.append(Event(self.stage, "B", mb, end if start is None else start, end))

    def reset(self) -> None:
        """Forget the events so far (e.g. a warm-up step's) and number micro-batches from 0 again."""
        self.events.clear()
        self._open.clear()
        self._n_fwd = 0

    def log(self) -> list[dict]:
        """The events as plain dicts (what a rank returns through :func:`distlab.torchrun`)."""
        return [vars(e).copy() for e in self.events]


class Delay(nn.Module):
    """Sleeps ``seconds`` in forward (and ``backward_seconds`` in backward): a stage whose
    duration the caller controls, so a timeline check does not depend on the CPU's speed."""

    def __init__(self, seconds: float, backward_seconds: float = 0.0):
        super().__init__()
        self.seconds, self.backward_seconds = seconds, backward_seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return _Mark.apply(x, x.new_zeros((), requires_grad=True), lambda: time.sleep(self.backward_seconds))


# ---- reading a timeline --------------------------------------------------------------------

def as_events(logs: list[list[dict]]) -> list[Event]:
    """Flatten per-rank logs into events, with time 0 at the earliest start."""
    events = [Event(**e) for log in logs for e in log]
    t0 = min((e.start for e in events), default=0.0)
    return [Event(e.stage, e.kind, e.mb, e.start - t0, e.end - t0, e.rows) for e in events]


def bubble_fraction(events: list[Event]) -> float:
    """Measured bubble: the share of ``stages x makespan`` in which no stage computed."""
    if not events:
        return 0.0
    stages = {e.stage for e in events}
    span = max(e.end for e in events) - min(e.start for e in events)
    busy = sum(e.end - e.start for e in events)
    return 1.0 - busy / (len(stages) * span) if span > 0 else 0.0


def theoretical_bubble(p: int, m: int) -> float:
    """GPipe's and 1F1B's idle fraction with equal stages: ``(p - 1) / (m + p - 1)``."""
    return (p - 1) / (m + p - 1)


def stage_orders(events: list[Event]) -> list[list[tuple[str, int]]]:
    """Per stage, the actions ``("F", mb)`` / ``("B", mb)`` in the order a (measured) timeline ran them."""
    return [[(e.kind, e.mb) for e in sorted((e for e in events if e.stage == s), key=lambda e: e.start)]
            for s in sorted({e.stage for e in events})]


def ideal_schedule(p: int, m: int, schedule: str = "gpipe", backward_cost: float = 2.0,
                   order: list[list[tuple[str, int]]] | None = None) -> list[Event]:
    """The schedule on a perfect machine: forward 1 time unit, backward ``backward_cost``.

    Each stage runs its work in the order the schedule prescribes (or ``order``, e.g. a real run's
    :func:`stage_orders`), as soon as the input (the previous stage's forward, or the next stage's
    backward) is ready. Its :func:`bubble_fraction` is the bubble that order determines, in slots.
    """
    if order is None and schedule not in ("gpipe", "1f1b"):
        raise ValueError(f"schedule must be 'gpipe' or '1f1b', not {schedule!r}")
    if order is None:
        order = schedule_orders(p, m, schedule)
    return _replay(p, order, backward_cost)


def schedule_orders(p: int, m: int, schedule: str) -> list[list[tuple[str, int]]]:
    """Per stage, the actions ``("F", i)`` / ``("B", i)`` in the order ``schedule`` prescribes: GPipe's all
    forwards then all backwards; 1F1B's ``min(p - 1 - s, m)`` warm-up forwards, then one forward and one
    backward in turn, then the remaining backwards (Narayanan et al., 2021)."""
    order: list[list[tuple[str, int]]] = []
    for s in range(p):
        if schedule == "gpipe":
            order.append([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
        else:
            warm = min(p - 1 - s, m)
            seq = [("F", i) for i in range(warm)]
            f, b = warm, 0
            while b < m:
                if f < m:
                    seq.append(("F", f))
                    f += 1
                seq.append(("B", b))
                b += 1
            order.append(seq)
    return order


def _replay(p: int, order: list[list[tuple[str, int]]], backward_cost: float) -> list[Event]:
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * p
    pos = [0] * p
    events: list[Event] = []
    while any(pos[s] < len(order[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            if pos[s] == len(order[s]):
                continue
            kind, i = order[s][pos[s]]
            dep = ("F", s - 1, i) if kind == "F" and s > 0 else ("B", s + 1, i) if kind == "B" and s < p - 1 \
                else ("F", s, i) if kind == "B" else None
            if dep is not None and dep not in done:
                continue
            start = max(free[s], done.get(dep, 0.0)) if dep else free[s]
            end = start + (1.0 if kind == "F" else backward_cost)
            done[(kind, s, i)] = end
            free[s] = end
            events.append(Event(s, kind, i, start, end))
            pos[s] += 1
            progressed = True
        if not progressed:  # pragma: no cover - the orders above never deadlock
            raise RuntimeError("schedule deadlocked")
    return events


def peak_in_flight(events: list[Event]) -> dict[int, int]:
    """Per stage, the most micro-batches whose forward ran but whose backward has not yet ended
    (the activations that stage must keep)."""
    peak: dict[int, int] = {}
    for s in {e.stage for e in events}:
        live = best = 0
        for e in sorted((e for e in events if e.stage == s), key=lambda e: e.start):
            live += 1 if e.kind == "F" else -1
            best = max(best, live)
        peak[s] = best
    return peak


def gantt(ax, events: list[Event], title: str = "") -> None:
    """Draw ``events`` on a matplotlib axis: one row per stage, forwards blue, backwards orange."""
    colors = {"F": "#4c72b0", "B": "#dd8452"}
    stages = sorted({e.stage for e in events})
    for e in events:
        ax.broken_barh([(e.start, e.end - e.start)], (e.stage - 0.4, 0.8), color=colors[e.kind],
                       edgecolor="white", linewidth=0.5)
        if e.end - e.start > 0:
            ax.text((e.start + e.end) / 2, e.stage, f"{e.kind}{e.mb}", ha="center", va="center",
                    fontsize=7, color="white", clip_on=True)
    ax.set_yticks(stages, [f"stage {s}" for s in stages])
    ax.invert_yaxis()
    ax.set_xlabel("time")
    if title:
        ax.set_title(title, fontsize=10)
