"""What a grade is: criteria with points and feedback, gathered per exercise.

A check module declares each criterion where it is defined, with its points
(otter-grader's style)::

    @criterion("[W={world}] same parameters on every rank", points=2)
    def same_parameters(run: Run) -> Verdict:
        ...
        return passed() if ok else failed(f"rank 0 and rank {r} ended ... (max abs difference {d:.3g})")

and :meth:`ExerciseReport.judge` runs a list of them on what the ranks
observed. A report is plain data (``to_dict``/``from_dict``) so it crosses
the process boundary between the per-exercise grading subprocess and the
CLI as JSON.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

# The one criterion of a report whose exercise did not run at all (not implemented, raised, timed
# out, not found): its feedback line reads "FAIL runs: <why>" (nbgrader's notes look for it).
DID_NOT_RUN = "runs"
# How the feedback of an exercise that was not graded begins (after "FAIL runs: ").
NOT_GRADED = "not graded"


@dataclass(frozen=True)
class Verdict:
    """One criterion's outcome: ``feedback`` names the cause of a failure, or adds a note to a pass."""

    ok: bool
    feedback: str = ""
    measurements: dict = field(default_factory=dict)


def passed(note: str = "", **measurements: Any) -> Verdict:
    return Verdict(True, note, measurements)


def failed(cause: str, **measurements: Any) -> Verdict:
    return Verdict(False, cause, measurements)


@dataclass(frozen=True)
class Rule:
    """A criterion as declared: its name (a ``str.format`` template), its points, what it needs first."""

    name: str
    points: float
    requires: tuple[Callable, ...] = ()
    trace: bool = True


def criterion(name: str, points: float, *, requires: Sequence[Callable] = (), trace: bool = True) -> Callable:
    """Declare the decorated function ``f(*subject) -> Verdict`` a criterion worth ``points``.

    ``requires``: criteria that must pass first; if one did not, this one scores 0 with
    "not checked: needs ... first" instead of a second message about the same cause.
    ``trace=False``: a failure it leaves unnamed gets no first divergence of the whole run's trace
    (:mod:`.divergence`): for a graded part run after others, whose first difference from the reference's
    trace may lie in an earlier part written correctly in another style.
    """
    def declare(fn: Callable) -> Callable:
        fn.rule = Rule(name, points, tuple(requires), trace)
        return fn
    return declare


def total_points(criteria: Sequence[Callable]) -> float:
    return sum(fn.rule.points for fn in criteria)


@dataclass
class Criterion:
    name: str
    points: float
    earned: float
    feedback: str = ""
    key: str = ""  # the criterion function's name: what hints.py's HINTS are keyed by (empty: not a declared one)

    @property
    def line(self) -> str:
        """The criterion's line of the feedback: ``ok name: note`` or ``FAIL name: cause``."""
        return f"{'ok ' if self.earned >= self.points else 'FAIL'} {self.name}" + (
            f": {self.feedback}" if self.feedback else "")


@dataclass
class ExerciseReport:
    """One exercise's grade. ``feedback`` is what the learner reads; ``measurements`` are numbers."""

    exercise: int
    name: str
    max_score: float
    criteria: list[Criterion] = field(default_factory=list)
    measurements: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    ran: bool = True
    not_graded: str = ""  # why the code was not scored at all (the machine, not the code): regrade it
    handed_in: str = "file"  # "file"; "missing": no file to grade; "stub": the stub as released, unchanged

    @property
    def score(self) -> float:
        return round(sum(c.earned for c in self.criteria), 2)

    @property
    def passed(self) -> bool:
        return self.score >= self.max_score - 1e-9

    @property
    def feedback(self) -> str:
        return "\n".join([c.line for c in self.criteria] + self.notes)

    def check(self, name: str, points: float, ok: bool, feedback: str = "", *, pass_note: str = "",
              key: str = "") -> bool:
        """Add a criterion worth ``points``: full marks if ``ok``, else 0 with ``feedback``."""
        self.criteria.append(Criterion(name, points, points if ok else 0.0, pass_note if ok else feedback, key))
        return ok

    def judge(self, criteria: Sequence[Callable], *subject: Any, **names: Any) -> None:
        """Run each declared criterion on ``subject`` (what the ranks observed) and add its outcome.

        ``names`` fill the criteria's name templates (``world=2`` makes ``"[W={world}] ..."``
        read ``"[W=2] ..."``). A criterion whose ``requires`` did not pass is not run.
        """
        outcome: dict[Callable, bool] = {}
        for fn in criteria:
            rule: Rule = fn.rule
            missing = [r for r in rule.requires if not outcome.get(r, False)]
            if missing:
                first = missing[0].rule.name.format(**names)
                verdict = failed(f"not checked: needs '{first}' first")
            else:
                verdict = fn(*subject)
            outcome[fn] = verdict.ok
            self.measurements.update(verdict.measurements)
            self.check(rule.name.format(**names), rule.points, verdict.ok, verdict.feedback,
                       pass_note=verdict.feedback, key=fn.__name__)

    def scale_to(self, max_score: float | None = None) -> "ExerciseReport":
        """Rescale every criterion so their points add up to ``max_score`` (default: the exercise's).

        A check that judges the same criteria at two world sizes, or declares points that do not add up
        to the exercise's marks, scales here and nowhere else.
        """
        target = self.max_score if max_score is None else max_score
        total = sum(c.points for c in self.criteria)
        if total > 0:
            for c in self.criteria:
                c.points, c.earned = c.points * target / total, c.earned * target / total
        return self

    def did_not_run(self, message: str) -> "ExerciseReport":
        """Score 0 with one message: the exercise did not run (not implemented, raised, timed out...)."""
        self.criteria = [Criterion(DID_NOT_RUN, self.max_score, 0.0, message)]
        self.ran = False
        return self

    def nothing_handed_in(self, message: str, what: str) -> "ExerciseReport":
        """Score 0 for a file that is ``"missing"`` or still the ``"stub"``: nothing of the learner's to run."""
        self.did_not_run(message)
        self.handed_in = what
        return self

    def machine_too_slow(self, message: str) -> "ExerciseReport":
        """Not graded: the run was still advancing when it ran out of time, so the code is not scored
        (its 0 is a placeholder; ``not_graded`` says why, and nbgrader's cycle lists it for a regrade)."""
        self.did_not_run(f"{NOT_GRADED}: {message}")
        self.not_graded = message
        return self

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(score=self.score, passed=self.passed, feedback=self.feedback)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ExerciseReport":
        crits = [Criterion(**c) for c in d.get("criteria", [])]
        return cls(d["exercise"], d["name"], d["max_score"], crits,
                   d.get("measurements", {}), d.get("notes", []), bool(d.get("ran", True)), d.get("not_graded", ""),
                   d.get("handed_in", "file"))


def table(reports: list[ExerciseReport], feedback: Callable[[ExerciseReport], str] | None = None) -> str:
    """A readable summary table followed by each exercise's feedback (``feedback(report)``: with hints)."""
    rows = [("exercise", "score", "result")]
    rows += [(f"{r.exercise} {r.name}", "-" if r.not_graded else f"{r.score:g}/{r.max_score:g}",
              "NOT GRADED" if r.not_graded else "pass" if r.passed else "FAIL") for r in reports]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
    out.insert(1, "  ".join("-" * w for w in widths))
    for r in reports:
        out += ["", f"== exercise {r.exercise} ({r.name}): {r.score:g}/{r.max_score:g}",
                feedback(r) if feedback else r.feedback]
    return "\n".join(out)


def write_json(reports: list[ExerciseReport], path: str | Path) -> None:
    total = sum(r.score for r in reports)
    doc = {"score": total, "max_score": sum(r.max_score for r in reports),
           "exercises": [r.to_dict() for r in reports]}
    Path(path).write_text(json.dumps(doc, indent=2))
