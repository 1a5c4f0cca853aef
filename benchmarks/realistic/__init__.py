"""The realistic family of mutants (issue 37): mistakes people make, one module per exercise (``exNN.py``).

Written from the exercises' contracts (the stubs' docstrings), the course's notebooks and where learners
are known to go wrong (a tutorial's habit, a forum question, a notebook's own warning, an anchor course's
pitfall list), by someone who had not read the checks: so the family measures the checks rather than
echoing them. Each module defines

* ``MISTAKES``: wrong solutions, each of which must lose marks, with its source in one line;
* ``LEGAL``: correct solutions in another legal style, each of which must keep full marks.

Both are edits of ``solutions/exNN_name.py``: ``{old: new}``, each ``old`` found exactly once.
``benchmarks/bench_feedback.py`` grades them (``DISTLAB_BENCH_FAMILY=realistic`` for this family only).
Do not tune a check to a mistake here without saying so in the note that reports its figures.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path

SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"


@dataclass(frozen=True)
class Mistake:
    """One edit of a reference solution: wrong (in ``MISTAKES``) or a correct other style (in ``LEGAL``)."""

    name: str                 # a short id: "no_set_epoch"
    what: str                 # the mistake (or the style) in one sentence, as a reviewer would name it
    source: str               # where learners make it, in one line
    edits: dict[str, str]     # old text -> new text in the solution file; each old occurs exactly once
    key_terms: tuple[str, ...] = field(default=())  # words a message that names the mistake would contain

    def apply(self, solution: str) -> str:
        text = solution
        for old, new in self.edits.items():
            count = text.count(old)
            if count != 1:
                raise ValueError(f"{self.name}: {old!r} occurs {count} times in the solution, not once")
            text = text.replace(old, new)
        return text


def family() -> dict[int, tuple[list[Mistake], list[Mistake]]]:
    """exercise number -> (its MISTAKES, its LEGAL), from every ``exNN.py`` here."""
    out = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("ex") and info.name[2:].isdigit():
            module = importlib.import_module(f"{__name__}.{info.name}")
            out[int(info.name[2:])] = (list(getattr(module, "MISTAKES", [])), list(getattr(module, "LEGAL", [])))
    return dict(sorted(out.items()))


def solution(number: int) -> Path:
    (path,) = SOLUTIONS.glob(f"ex{number:02d}_*.py")
    return path
