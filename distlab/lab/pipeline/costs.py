"""What a pipeline's measurements need beyond a timeline: the per-message cost and the saved-tensor bytes.

* :func:`message_cost` runs on two ranks: a ``send``/``recv`` ping-pong per
  message size, the median round trip. Half of it, ``c``, is what every
  micro-batch pays per stage boundary and direction, a cost the bubble formula
  ``(p - 1) / (m + p - 1)`` of GPipe (Huang et al., 2019) and 1F1B
  (PipeDream-Flush: Narayanan et al., 2021) ignores. With ``m`` micro-batches
  a step sends ``2 m`` messages per boundary, so the measured bubble is about
  ``formula + m (p - 1) c / step_time`` (:func:`bubble_with_messages`).
* :class:`SavedBytes` wraps a stage's module and counts, with the one saved-tensor
  counter (:class:`distlab.measure.memory.SavedTensors`), the bytes autograd keeps for
  the backward: live now and at the peak. GPipe's stage 0 keeps all ``m``
  micro-batches' before its first backward, 1F1B's at most ``p``.
"""
from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from distlab.measure.memory import SavedTensors


def message_cost(sizes: list[int], reps: int = 30, warmup: int = 5) -> list[dict]:
    """Runs on every rank (2 ranks; the process group left open): the median ``send``/``recv``
    round trip between ranks 0 and 1 for messages of ``sizes`` float32 elements.

    Rank 0 sends, rank 1 receives and sends the same tensor back; ``warmup``
    untimed round trips first (gloo connects lazily), then ``reps`` timed ones,
    the median kept (one descheduled round trip does not move it). Returns, on
    every rank, ``[{"bytes": .., "round_trip_s": ..}, ...]``.
    """
    import torch.distributed as dist

    rank = dist.get_rank()
    out = []
    for n in sizes:
        buf = torch.zeros(n)
        times = []
        for i in range(warmup + reps):
            start = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            if i >= warmup:
                times.append(time.perf_counter() - start)
        t = torch.tensor([statistics.median(times)], dtype=torch.float64)
        dist.broadcast(t, 0)  # rank 0's clock saw the whole round trip
        out.append({"bytes": 4 * n, "round_trip_s": t.item()})
    return out


def message_cost_job(sizes: list[int], reps: int = 30) -> list[dict]:
    """Runs on every rank: :func:`message_cost` in a job of its own (initialises and shuts down)."""
    from distlab.runtime.distributed import init_distributed, shutdown

    init_distributed()
    try:
        return message_cost(sizes, reps)
    finally:
        shutdown()


def one_way_cost(costs: list[dict], nbytes: int) -> float:
    """Half the round trip for a message of ``nbytes``, interpolated linearly between the measured sizes."""
    pts = sorted((c["bytes"], c["round_trip_s"] / 2) for c in costs)
    if nbytes <= pts[0][0]:
        return pts[0][1]
    for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
        if nbytes <= b1:
            return t0 + (t1 - t0) * (nbytes - b0) / (b1 - b0)
    (b0, t0), (b1, t1) = pts[-2], pts[-1]
    return t1 + (t1 - t0) * (nbytes - b1) / (b1 - b0)


def bubble_with_messages(p: int, m: int, c: float, step_s: float, v: int = 1) -> float:
    """The bubble formula plus the messages: ``(p-1)/(v m + p-1) + m (p-1) c / step_s``.

    Each of the ``m`` micro-batches crosses each of the ``p - 1`` boundaries
    forward and backward; a stage waits ``c`` for each message it receives, and
    the ``2 m`` waits of one boundary are shared by its two stages, ``m c`` each,
    so the idle share of ``p x step_s`` grows by ``m (p - 1) c / step_s``.
    """
    return (p - 1) / (v * m + p - 1) + m * (p - 1) * c / step_s


def stage_costs(events: list, p: int) -> dict:
    """What one GPipe run measured of each stage, for :func:`bubble_model`: the median forward ``f``
    and backward ``b`` per micro-batch of every stage, and the per-action overhead ``o``.

    ``o`` is the median idle gap between two consecutive actions that wait for no message: stage
    0's forwards (its input is local) and the last stage's backwards (its gradient comes from its
    own loss). It is the schedule's own work between two computations (Python in
    ``torch.distributed.pipelining``: the chunk, the send and receive ops, the loss), which no
    message explains.
    """
    def of(stage: int, kind: str) -> list:
        return sorted((e for e in events if e.stage == stage and e.kind == kind), key=lambda e: e.mb)

    free = [b.start - a.end for s, kind in ((0, "F"), (p - 1, "B")) for a, b in zip(of(s, kind), of(s, kind)[1:])]
    return {"f": [statistics.median(e.end - e.start for e in of(s, "F")) for s in range(p)],
            "b": [statistics.median(e.end - e.start for e in of(s, "B")) for s in range(p)],
            "o": statistics.median(free) if free else 0.0}


def bubble_model(f: list[float], b: list[float], m: int, o: float = 0.0, c: float = 0.0) -> float:
    """GPipe's (and 1F1B's) bubble from measured costs, not from equal stages and free messages.

    Every action of stage ``s`` occupies a slot of its compute (``f[s]`` forward, ``b[s]``
    backward), the overhead ``o`` and the wait ``c`` for its message. The forwards stream through
    the stages as a pipeline whose throughput is set by the slowest slot: they take
    ``sum(slots) + (m - 1) max(slots)``, and so do the backwards. The bubble is the share of
    ``p x step`` in which no stage computes. With equal stages and ``o = c = 0`` it is the formula
    ``(p-1)/(m+p-1)`` of Huang et al. (2019).
    """
    p = len(f)
    fwd, bwd = [x + o + c for x in f], [x + o + c for x in b]
    step = sum(fwd) + (m - 1) * max(fwd) + sum(bwd) + (m - 1) * max(bwd)
    return 1.0 - m * (sum(f) + sum(b)) / (p * step)


class SavedBytes(nn.Module):
    """Runs ``module`` and counts the bytes autograd saves for its backward: ``live`` and ``peak``
    (:class:`distlab.measure.memory.SavedTensors`, the one counter).

    A storage saved twice (a ReLU's output is also the next Linear's input) counts once; a saved
    view counts as its own bytes (``views_apart``): stage 0's micro-batches are views of one
    batch, and each holds only its rows. The count falls when autograd frees a micro-batch's graph
    after its backward. Parameters (a Linear saves its weight) are left out: they are not activations.
    """

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.saved = SavedTensors(exclude=module.parameters(), views_apart=True)

    @property
    def live(self) -> int:
        return self.saved.live

    @property
    def peak(self) -> int:
        return self.saved.peak

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "meta":  # shape inference, not work
            return self.module(x)
        with self.saved:
            return self.module(x)

    def reset(self) -> None:
        """Count from zero again (after a warm-up step): tensors saved before are no longer counted
        (the library may still hold the last micro-batch's graph of the step before)."""
        self.saved.reset()
