"""Rank side of the restart scenario's second kill: inside the next checkpoint's ``save_checkpoint``, after
DCP's save has returned and before the rest of the checkpoint is in place (issue 37: a checkpoint written
in place, or committed before every rank's files are in it, passed every other kill).

In attempt 1 of the phase, once ``on_step`` has reported step ``after`` (the contract saves after step s,
then reports it), each rank watches its next ``dcp.save``. After it returned, at the rank's next
``torch.save`` or ``dist.barrier`` from the learner's file:

* rank 0 leaves a marker when it enters the barrier (it waits there in a correct solution);
* rank 1 waits, at most :data:`WAIT_S` seconds (scaled), until rank 0 is in that barrier or the
  checkpoint already looks complete to ``latest_complete`` (rank 0 committed without waiting), writes
  what it saw to ``{phase}-commit-kill.json`` and SIGKILLs itself: its own files (its RNG state, in the
  contract) are not written. The wait makes the kill land after rank 0's choice, so the grade does not
  depend on which rank ran faster.

A rank 1 that never reaches such a call after its save (the RNG saved inside DCP's state, another way of
waiting) is killed when it reports the next step instead, where the checkpoint is complete by right.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from distlab.checkpoint import latest_complete
from distlab.runtime.launch import time_scale

from .observations import CommitKillRecord

WAIT_S = 5.0  # at most, for rank 0 to reach its barrier or commit; scaled by the machine's time scale


def die() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class CommitKill:
    """One phase's watch (a no-op unless the phase kills inside a commit in this attempt)."""

    def __init__(self, phase: dict, rank: int, attempt: int, outdir: Path):
        self.after = phase.get("kill_commit", {}).get(str(attempt))
        self.rank, self.root = rank, Path(phase["dir"])
        self.record = outdir / f"{phase['name']}-commit-kill.json"
        self.marker = outdir / f"{phase['name']}-commit-rank0-waits"
        self.armed = self.saved = False

    def reported(self, step: int) -> None:
        """``on_step`` reported ``step``: arm after ``after``; past it, a rank 1 not yet killed dies here."""
        if self.after is None:
            return
        if step == self.after:
            self.armed = True
        elif step > self.after and self.armed and self.rank == 1:
            self._kill("step", None)

    def dcp_saved(self) -> None:
        if self.armed:
            self.saved = True

    def reached(self, call: str, line: str | None) -> None:
        """The learner's ``torch.save`` or ``dist.barrier`` is about to run."""
        if not (self.armed and self.saved):
            return
        if self.rank == 0:
            if call == "dist.barrier":
                self.marker.touch()
            return
        if self.rank == 1:
            deadline = time.monotonic() + WAIT_S * time_scale()
            while not (self.marker.exists() or self._complete_past()) and time.monotonic() < deadline:
                time.sleep(0.01)
            self._kill(call, line)

    def _complete_past(self) -> bool:
        found = latest_complete(self.root)
        return found is not None and found[0] > self.after

    def _kill(self, at: str, line: str | None) -> None:
        found = latest_complete(self.root)
        self.armed = False
        self.record.write_text(json.dumps(CommitKillRecord(at=at, line=line, complete=found[0] if found else None,
                                                           after=self.after).to_wire()))
        die()
