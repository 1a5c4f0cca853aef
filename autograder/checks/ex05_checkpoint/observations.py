"""Exercise 5's observations: one file's phases, read back from the records its ranks wrote to disk (each
step's data, lr, RNG and optimizer state, the DCP calls made, the errors raised), and what the launches
raised. Filled in as the launches go.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from distlab import LaunchError
from distlab.checkpoint import complete_checkpoints

from .probes import WORLD


@dataclass
class Run:
    """One file's phases: where the ranks recorded each, and what the launches raised.

    Filled in as the launches go; what a later launch could change (A's directory) is read at once.
    """

    out: Path
    reshard_world: int
    ref: dict = field(default_factory=dict)        # A's final state: the uninterrupted run
    ref_rec: list = field(default_factory=list)    # A's records, per rank
    checkpoints: list[str] = field(default_factory=list)  # what A's directory held after the run
    committed: list[int] = field(default_factory=list)    # the steps of its complete checkpoints
    reached: int = 0               # the last step rank 1 recorded in C before the job stopped
    resume_error: LaunchError | None = None
    reshard_error: LaunchError | None = None

    def load_reference(self) -> bool:
        """Read the uninterrupted run (A) and how far C got before its job stopped; False if A did not finish."""
        if (ref := self.final("A")) is None:
            return False
        self.ref, self.ref_rec = ref, self.records("A")
        saved = (self.out / "A").is_dir()  # a run that never saved made no directory
        self.checkpoints = sorted(p.name for p in (self.out / "A").iterdir()) if saved else []
        self.committed = [s for s, _ in complete_checkpoints(self.out / "A")] if saved else []
        self.reached = max((x["step"] for x in self.records("C", tag="first")[1]), default=0)
        return True

    def records(self, name: str, world: int = WORLD, kind: str = "", **match) -> list[list[dict]]:
        """Per rank, the phase's records (``kind="calls"``: its DCP calls) whose fields equal ``match``."""
        out = []
        for r in range(world):
            f = self.out / f"{name}-{kind + '-' if kind else ''}rank{r}.jsonl"
            lines = [json.loads(ln) for ln in f.read_text().splitlines() if ln.strip()] if f.is_file() else []
            out.append([x for x in lines if all(x.get(k) == v for k, v in match.items())])
        return out

    def ref_at(self, rank: int, step: int) -> dict | None:
        return next((x for x in self.ref_rec[rank] if x["step"] == step), None)

    def final(self, name: str) -> dict | None:
        f = self.out / f"{name}-final.pt"
        return torch.load(f, weights_only=True) if f.is_file() else None

    def attempt_steps(self, attempt: int) -> list[int]:
        """The steps rank 0 trained in B during torchrun attempt ``attempt``."""
        return [x["step"] for x in self.records("B", attempt=attempt)[0]]

    def phase_error(self, name: str, first_attempt: int = 0) -> str:
        """What a phase raised (not a peer's "connection closed" after a kill), as ``attempt A, rank R raised
        ...``, at the learner's line."""
        f = self.out / f"{name}-errors.jsonl"
        errors = [json.loads(ln) for ln in f.read_text().splitlines()] if f.is_file() else []
        errors = [e for e in errors if e["attempt"] >= first_attempt and "Connection" not in e["error"]]
        if not errors:
            return ""
        at = f", at {errors[0]['at']}" if errors[0].get("at") else ""
        return f"attempt {errors[0]['attempt']}, rank {errors[0]['rank']} raised {errors[0]['error']}{at}"
