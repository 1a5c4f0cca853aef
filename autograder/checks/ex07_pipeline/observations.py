"""Exercise 7's observations: one file's GPipe step on both ranks (rank = stage: its forwards and backwards
with their times, every send and recv, the returned loss, the gradients), and the unsplit model's figures.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Run:
    """One file's GPipe step: both ranks' observations (rank = stage), and the unsplit model's figures."""

    ranks: list[dict]
    ref_loss: torch.Tensor
    ref_grads: list[list[torch.Tensor]]
    ref_micro: list[float]

    def events(self, stage: int, kind: str) -> list[dict]:
        """The stage's logged forwards (``"F"``) or backwards (``"B"``), in the order they started."""
        return sorted((e for e in self.ranks[stage]["events"] if e["kind"] == kind), key=lambda e: e["start"])

    def p2p(self, rank: int, op: str, done: bool = True) -> list[dict]:
        """The rank's sends or recvs to or from the other rank (only those that returned, if ``done``)."""
        return [c for c in self.ranks[rank]["p2p"] if c["op"] == op and c["peer"] == 1 - rank
                and (c["t1"] is not None or not done)]

    def pending(self, rank: int) -> dict | None:
        """The send or recv the rank was waiting in when its step failed."""
        calls = self.ranks[rank]["p2p"]
        return calls[-1] if calls and calls[-1]["t1"] is None and not calls[-1]["async"] else None

    def ratio(self, part: str) -> float | None:
        """The returned loss, or a stage's gradients, over the unsplit model's (a least-squares scale)."""
        if part == "loss":
            loss = self.ranks[1]["loss"]
            return loss.item() / self.ref_loss.item() if loss is not None and loss.numel() == 1 else None
        stage = int(part[-1])
        grads, ref = self.ranks[stage]["grads"], self.ref_grads[stage]
        if any(g is None for g in grads):
            return None
        dot = sum((g * r).sum().item() for g, r in zip(grads, ref))
        return dot / max(sum((r * r).sum().item() for r in ref), 1e-30)
