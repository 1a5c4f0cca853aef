"""Exercise 11's observations: one file's MoE step at one world size (what each learner function
returned, what the grader substituted, the output, the gradients, every all-to-all with its stage),
and the single-process MoE's figures to compare with."""
from __future__ import annotations

from dataclasses import dataclass

from .probes import T, reference


@dataclass
class Run:
    """One file's step at one world size: every rank's observation (rank order)."""

    ranks: list[dict]

    @property
    def world(self) -> int:
        return len(self.ranks)

    @property
    def ref(self) -> dict:
        return reference(self.world)

    def rows(self, rank: int) -> slice:
        return slice(rank * T, (rank + 1) * T)

    def slots(self, rank: int) -> dict:
        """Rank ``rank``'s slots in the reference: expert, keep, token, ungated expert output, counts."""
        return self.ref["ranks"][rank]

    def calls(self, rank: int, stage: str | None = None, phase: str | None = None) -> list[dict]:
        return [c for c in self.ranks[rank]["comm"]
                if stage in (None, c["stage"]) and phase in (None, c["phase"])]

    def error(self, stage: str) -> tuple[int, dict] | None:
        """The first rank whose ``stage`` raised, and its error."""
        return next(((o["rank"], o["errors"][stage]) for o in self.ranks if stage in o["errors"]), None)
