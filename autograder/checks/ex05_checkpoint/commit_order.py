"""Rank side of the contract's second barrier: no rank runs ahead while rank 0 commits (a blind audit's
``save_checkpoint`` without it got full marks: which rank ran faster decided whether anything showed).

In the uninterrupted run, rank 0 holds each of its ``commit`` calls until rank 1 has either entered a barrier
past the ones rank 0 has passed (it waits for rank 0 there: the second barrier) or returned from
``save_checkpoint`` (it went on while rank 0 had not committed). Barriers are collectives, so the ranks'
``k``-th barriers pair: the order of events, not their speed, decides. The first save rank 1 returned from
first is written to ``{phase}-commit-order.json``. The wait is bounded (a learner's other way of waiting,
say a collective of its own after the commit, only delays rank 0 by it, and nothing is recorded).
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from distlab.runtime.launch import time_scale

WAIT_S = 2.0  # at most, per commit, scaled by the machine's time scale


class CommitOrder:
    """One phase's watch (a no-op but in the uninterrupted run, on ranks 0 and 1)."""

    def __init__(self, phase: dict, rank: int, outdir: Path):
        self.active = phase.get("tag") == "ref" and rank in (0, 1)
        self.rank = rank
        self.events = outdir / f"{phase['name']}-rank1-events"  # rank 1's: "barrier" and "returned S" lines
        self.record = outdir / f"{phase['name']}-commit-order.json"
        self.passed = 0  # rank 0: the learner's barriers it has passed
        if self.active and rank == 1:
            self.events.write_text("")

    def barrier(self, entering: bool) -> None:
        """The learner's ``dist.barrier`` is about to run (``entering``) or has returned."""
        if self.active and self.rank == 1 and entering:
            self._tell("barrier")
        elif self.active and self.rank == 0 and not entering:
            self.passed += 1

    def returned(self, step) -> None:
        """Rank 1's ``save_checkpoint(step)`` returned."""
        if self.active and self.rank == 1:
            self._tell(f"returned {step}")

    def before_commit(self, step) -> None:
        """Rank 0's ``commit(root, step)`` is about to run: hold it until rank 1 waits or has gone on."""
        if not (self.active and self.rank == 0) or self.record.exists():
            return
        deadline = time.monotonic() + WAIT_S * time_scale()
        while time.monotonic() < deadline:
            lines = self.events.read_text().splitlines() if self.events.exists() else []
            if lines.count("barrier") > self.passed:
                return  # rank 1 waits in a barrier rank 0 has not reached: it cannot go on
            if f"returned {step}" in lines:
                self.record.write_text(json.dumps({"step": int(step)}))
                return
            time.sleep(0.005)

    def _tell(self, line: str) -> None:
        with open(self.events, "a") as f:
            f.write(line + "\n")


def commit_spy(current: Callable[[], CommitOrder | None]):
    """A stand-in for ``distlab.checkpoint.commit`` that holds it first (:meth:`CommitOrder.before_commit`)."""
    def make(real):
        def commit(root, step, *args, **kwargs):
            if (order := current()) is not None:
                order.before_commit(step)
            return real(root, step, *args, **kwargs)
        return commit
    return make


def watch_saves(learner, current: Callable[[], CommitOrder | None]) -> None:
    """Wrap the learner's ``save_checkpoint`` so that its return is seen (``train`` looks it up in its module)."""
    real = getattr(learner, "save_checkpoint", None)
    if real is None:
        return

    def save_checkpoint(root, step, *args, **kwargs):
        result = real(root, step, *args, **kwargs)
        if (order := current()) is not None:
            order.returned(step)
        return result

    learner.save_checkpoint = save_checkpoint
