"""Exercise 7's observations: the typed record each rank returns for each part of one file
(:class:`RankObservation`, GPipe's and 1F1B's, each kept apart: ``rank.parts``; rank = stage; its forwards and
backwards with their times, every send and recv, the returned loss, the gradients, the activations it held),
and one file's step of one part on both ranks with the unsplit model's figures (:class:`Run`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...rank.observation import Observation
from ...rank.spies import P2PCall  # the spy's record of one send or receive, shared with exercise 10


@dataclass
class StageEvent(Observation):
    """One forward or backward the grader's ``TimedStage`` ran (``distlab.lab.pipeline.timeline.Event``)."""

    stage: int    # the stage that ran it (= the rank)
    kind: str     # "F" (forward) or "B" (backward)
    mb: int       # the micro-batch: the stage's forwards numbered in order, from 0
    start: float  # when it started, time.perf_counter() seconds
    end: float    # when it ended, same clock
    rows: int = 0  # the forward's batch size (0 for a backward)


@dataclass
class RankObservation(Observation):
    """What one rank (= stage) observed of one file's ``gpipe_step`` or ``one_f_one_b_step``."""

    rank: int
    events: list[StageEvent] = field(default_factory=list)  # the stage's forwards and backwards, as logged
    error: str | None = None  # what the step raised ("Type: message"; None: nothing)
    where: str | None = None  # the learner's line it raised at, with the tensors on it ("": outside the file)
    p2p: list[P2PCall] = field(default_factory=list)  # every send and recv, in the order they were called
    inputs_require_grad: list[bool] = field(default_factory=list)  # each forward's: did its input require grad?
    out_grads: dict[int, torch.Tensor] = field(default_factory=dict)  # forward -> the gradient that reached its output
    grads: list[torch.Tensor | None] = field(default_factory=list)  # the stage's parameters' .grad, in order
    loss: torch.Tensor | None = None  # what the step returned, as a float64 tensor (None: not a tensor or float)
    loss_grad_fn: str = ""  # the returned tensor's grad_fn, where it still required grad ("": detached, or none)
    loss_type: str = ""  # the type of what the step returned, where it is not a tensor ("float"; "": a tensor)
    not_implemented: bool = False  # the step raised NotImplementedError (``error`` and ``where`` say where)
    saved_peak: int = 0      # 1F1B: the most bytes of activations the stage held saved for backward at once
    saved_per_microbatch: int = 0  # 1F1B: what one micro-batch's forward saves, measured by the grader first


@dataclass
class Run:
    """One file's GPipe step: both ranks' observations (rank = stage), and the unsplit model's figures."""

    ranks: list[RankObservation]
    ref_loss: torch.Tensor
    ref_grads: list[list[torch.Tensor]]
    ref_micro: list[float]
    # 1F1B's step again at 4 stages (None: not run; a str: how it ended its launch, in the learner's terms)
    deeper: Run | str | None = None

    def events(self, stage: int, kind: str) -> list[StageEvent]:
        """The stage's logged forwards (``"F"``) or backwards (``"B"``), in the order they started."""
        return sorted((e for e in self.ranks[stage].events if e.kind == kind), key=lambda e: e.start)

    def p2p(self, rank: int, op: str, done: bool = True) -> list[P2PCall]:
        """The rank's sends or recvs to or from the other rank (only those that returned, if ``done``)."""
        return [c for c in self.ranks[rank].p2p if c.op == op and c.peer == 1 - rank
                and (c.t1 is not None or not done)]

    def pending(self, rank: int) -> P2PCall | None:
        """The send or recv the rank was waiting in when its step failed."""
        calls = self.ranks[rank].p2p
        return calls[-1] if calls and calls[-1].t1 is None and not calls[-1].is_async else None

    def ratio(self, part: str) -> float | None:
        """The returned loss, or a stage's gradients, over the unsplit model's (a least-squares scale)."""
        if part == "loss":
            loss = self.ranks[1].loss
            return loss.item() / self.ref_loss.item() if loss is not None and loss.numel() == 1 else None
        stage = int(part[-1])
        grads, ref = self.ranks[stage].grads, self.ref_grads[stage]
        if any(g is None for g in grads):
            return None
        dot = sum((g * r).sum().item() for g, r in zip(grads, ref))
        return dot / max(sum((r * r).sum().item() for r in ref), 1e-30)
