"""What a grade is: criteria with points and feedback, gathered per exercise.

A report is plain data (``to_dict``/``from_dict``) so it crosses the process
boundary between the per-exercise grading subprocess and the CLI as JSON.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Criterion:
    name: str
    points: float
    earned: float
    feedback: str = ""


@dataclass
class ExerciseReport:
    """One exercise's grade. ``feedback`` is what the learner reads; ``measurements`` are numbers."""

    exercise: int
    name: str
    max_score: float
    criteria: list[Criterion] = field(default_factory=list)
    measurements: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def score(self) -> float:
        return round(sum(c.earned for c in self.criteria), 2)

    @property
    def passed(self) -> bool:
        return self.score >= self.max_score - 1e-9

    @property
    def feedback(self) -> str:
        lines = [f"{'ok ' if c.earned >= c.points else 'FAIL'} {c.name}"
                 + (f": {c.feedback}" if c.feedback else "") for c in self.criteria]
        return "\n".join(lines + self.notes)

    def check(self, name: str, points: float, ok: bool, feedback: str = "", *, pass_note: str = "") -> bool:
        """Add a criterion worth ``points``: full marks if ``ok``, else 0 with ``feedback``."""
        self.criteria.append(Criterion(name, points, points if ok else 0.0, pass_note if ok else feedback))
        return ok

    def fail_all(self, message: str) -> "ExerciseReport":
        """Score 0 with one message (not implemented, crashed, timed out...)."""
        self.criteria = [Criterion("runs", self.max_score, 0.0, message)]
        return self

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(score=self.score, passed=self.passed, feedback=self.feedback)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ExerciseReport":
        crits = [Criterion(**c) for c in d.get("criteria", [])]
        return cls(d["exercise"], d["name"], d["max_score"], crits,
                   d.get("measurements", {}), d.get("notes", []))


def table(reports: list[ExerciseReport]) -> str:
    """A readable summary table followed by each exercise's feedback."""
    rows = [("exercise", "score", "result")]
    rows += [(f"{r.exercise} {r.name}", f"{r.score:g}/{r.max_score:g}", "pass" if r.passed else "FAIL")
             for r in reports]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
    out.insert(1, "  ".join("-" * w for w in widths))
    for r in reports:
        out += ["", f"== exercise {r.exercise} ({r.name}): {r.score:g}/{r.max_score:g}", r.feedback]
    return "\n".join(out)


def write_json(reports: list[ExerciseReport], path: str | Path) -> None:
    total = sum(r.score for r in reports)
    doc = {"score": total, "max_score": sum(r.max_score for r in reports),
           "exercises": [r.to_dict() for r in reports]}
    Path(path).write_text(json.dumps(doc, indent=2))
