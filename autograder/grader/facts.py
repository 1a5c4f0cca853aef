"""Facts only: a message must not state, of the learner's run, what the run or the file contradicts.

:mod:`autograder.grader.advice` holds the feedback's *advice* to the trace ("call set_epoch" where it was
called). This module holds its *statements of fact* (issue 37: "every sentence is a fact of the run"):

* **a call said not to have happened**: "scaler.update() was never called", "did not call
  destroy_process_group()", "without zero_grad()". Where the trace records calls of that name
  (:data:`autograder.rank.trace.CALLS`, the optimizer's steps, ``backward``, saves, loads, collectives) and
  shows one, the statement is false: the call happened, elsewhere or at another moment, and the message
  should say where and when instead;
* **a line quoted with its code**: "at ex01_ddp.py:126 (loss.backward())", "(ex05_checkpoint.py:88:
  `scheduler.step()`)", "ex01_ddp.py line 126 in train_ddp: loss.backward()". The quoted code must be
  what that line of the learner's file holds.

:func:`contradictions` lists each such statement of a report; ``benchmarks/bench_feedback.py`` counts them
per exercise beside the advice violations (the goal: none).
"""
from __future__ import annotations

import re
from typing import Iterable, Sequence

# "X() was never called", "never called X()", "did not call X()", "without calling X()", "without X()"
NOT_CALLED = [re.compile(p) for p in (
    r"`?([A-Za-z_][\w.]*)\(\)`? (?:was|is|were) (?:never|not) called",
    r"\b(?:never|not|no longer) call(?:ed|s|ing)? `?([A-Za-z_][\w.]*)\(",
    r"\bwithout (?:calling |a call to )?`?([A-Za-z_][\w.]*)\(\)",
    r"\bno `?([A-Za-z_][\w.]*)\(\)`? call",
)]
# "FILE:N (code)", "(FILE:N: `code`)", "FILE line N in function: code"
QUOTED_LINE = [re.compile(p) for p in (
    r"(?P<file>[\w.-]+\.py):(?P<line>\d+)(?: in \w+)? \((?P<code>[^()\n]*(?:\([^()\n]*\)[^()\n]*)*)\)",
    r"\((?P<file>[\w.-]+\.py):(?P<line>\d+): `(?P<code>[^`\n]+)`\)",
    r"(?P<file>[\w.-]+\.py) line (?P<line>\d+) in \w+: (?P<code>[^\n]+)",
)]
RECEIVERS = ("dist.", "torch.distributed.")


def _event_name(call: str, recorded: set[str]) -> str | None:
    """The trace's event for a call as a message writes it, if the trace records such calls."""
    for prefix in RECEIVERS:
        call = call.removeprefix(prefix)
    if call in recorded:
        return call
    last = call.rsplit(".", 1)[-1]
    # a method the trace records by its name alone (sampler.set_epoch -> set_epoch), but not a "step" of any
    # object: optimizer.step is an event, a scheduler's or a scaler's step is not the same call
    return last if "." in call and last in recorded and "." not in last and last != "step" else None


def _events(traces: Iterable[Sequence[dict]]) -> list[dict]:
    return [e for rank in traces for e in rank if isinstance(e, dict)]


def said_not_called(text: str) -> list[str]:
    return [m.group(1) for pattern in NOT_CALLED for m in pattern.finditer(text)]


def quoted_lines(text: str) -> list[tuple[str, int, str]]:
    return [(m["file"], int(m["line"]), m["code"].strip().strip("`")) for pattern in QUOTED_LINE
            for m in pattern.finditer(text)]


def contradictions(report, traces: Sequence, source: str | None = None, filename: str | None = None) -> list[str]:
    """Each statement of ``report``'s feedback that ``traces`` (the file's, per launch, per rank) or the learner's
    ``source`` (its file ``filename``) contradicts: ``"criterion: says X() was not called, but your code called
    it (file:line)"``, ``"criterion: quotes line N as `code`, but line N is `...`"``."""
    events = _events(rank for launch in traces for rank in launch)
    recorded = {e.get("event") for e in events if isinstance(e.get("event"), str)}
    lines = source.splitlines() if source is not None else None
    out = []
    for c in report.criteria:
        if c.earned >= c.points and not c.feedback:
            continue
        for call in said_not_called(c.feedback):
            name = _event_name(call, recorded)
            if name and (e := next((e for e in events if e.get("event") == name), None)):
                where = f" ({e['file']}:{e['line']})" if "line" in e else ""
                out.append(f"{c.name}: says {call}() was not called, but your code called it{where}")
        if lines is None:
            continue
        for file, n, code in quoted_lines(c.feedback):
            if filename and file != filename:
                continue
            held = lines[n - 1].strip() if 0 < n <= len(lines) else None
            code = code.removesuffix("...").removesuffix("…").strip()  # a long line is quoted cut short
            if held is None or (code and (not held or (code not in held and held not in code))):
                out.append(f"{c.name}: quotes {file}:{n} as `{code}`, but that line is `{held}`")
    return out
