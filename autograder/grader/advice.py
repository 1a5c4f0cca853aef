"""Advice only about what was observed: a message must not tell the learner to take a step the run shows
they took.

A failing criterion's feedback often ends with a step to take ("call sampler.set_epoch(epoch) every
epoch", "wrap it in DistributedDataParallel", "save scheduler.state_dict()"). Where the learner did take
that step, at the wrong moment or on another object, such advice sends them to fix what is not broken
(issue 25's "wrong advice" class). This module reads the steps a message advises, each by a pattern of
its imperative (:data:`STEPS`), and looks for them in the learner's trace (:mod:`autograder.rank.trace`: the
events of the run, each at the learner's line). :func:`violations` lists every message that advises a
step the trace shows was taken; ``benchmarks.bench_feedback`` counts them per exercise (the goal: none).

A step with literal keyword arguments in the advice (``DistributedSampler(..., shuffle=True)``) counts as
taken only where the trace's event had those values; a step of two calls in an order ("call
optimizer.step(), then scheduler.step()") only where every first one was followed by the second.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence


@dataclass(frozen=True)
class Step:
    """A step a message can advise: ``pattern`` finds the imperative (its group 1, if any, holds the call's
    arguments as written), ``taken`` tells from a trace's event whether the run took it."""

    name: str
    pattern: str
    taken: Callable[[dict], bool]


def _event(*names: str) -> Callable[[dict], bool]:
    return lambda e: e.get("event") in names


def _saved(key: str) -> Callable[[dict], bool]:
    """A save (``torch.save`` or ``dcp.save``) of a dict holding ``key`` (``scheduler``, ``rng``...)."""
    return lambda e: e.get("event") in ("save", "dcp.save") and isinstance(e.get("held"), list) and any(
        h == key or h.startswith(f"{key}.") for h in e["held"])


def _returned_from(function: str) -> Callable[[dict], bool]:
    return lambda e: e.get("event") == "return" and e.get("function") == function


STEPS = [
    Step("dist.destroy_process_group()", r"\bcall (?:dist\.)?destroy_process_group\(", _event("destroy_process_group")),
    Step("dist.init_process_group()", r"\bcall (?:dist\.)?init_process_group\(", _event("init_process_group")),
    Step("sampler.set_epoch(epoch)", r"\bcall (?:\w+\.)?set_epoch\(", _event("set_epoch")),
    Step("a DistributedDataParallel wrapper", r"\bwrap (?:it|the model)\b(?:[^.;:]*DistributedDataParallel)?",
         _event("DistributedDataParallel")),
    Step("a DistributedSampler", r"\b(?:pass|use) (?:a )?DistributedSampler\(?([^)]*)\)?"
         r"|DistributedSampler[^;.]*; build it with ([^;.]*)", _event("DistributedSampler")),
    Step("optimizer.zero_grad()", r"\bcall (?:optimizer\.)?zero_grad\(", _event("zero_grad")),
    Step("backward(grad) of a non-scalar output", r"\bcall \w+\.backward\(\w",  # a stage's output, not a loss
         lambda e: e.get("event") == "backward" and e.get("shape") not in ([], None)),
    Step("backward()", r"\bcall (?:\w+\.)?backward\(\)", _event("backward")),
    Step("prune(root, keep)", r"\bcall prune\(", _event("prune")),
    Step("commit(root, step)", r"\bcommit\(\) on rank 0", _event("commit")),
    Step("save_checkpoint", r"\bcall save_checkpoint\b", _returned_from("save_checkpoint")),
    Step("a torch.save of the model", r"\bsave [\w.]+\.state_dict\(\) (?:with torch\.save )?to checkpoint_path",
         _event("save")),
    Step("a saved scheduler state", r"\bsave scheduler\.state_dict\(\)", _saved("scheduler")),
    Step("a saved data position", r"\bsave the data position\b", _saved("data")),
]
# "call X(), then Y()": the order of two steps, each a trace's event of that name ("optimizer.step").
ORDER = re.compile(r"\b[Cc]all ([\w.]+)\(\), then ([\w.]+)\(\)")


def _literals(text: str) -> dict:
    """The literal keyword arguments of a call as the advice writes them (``shuffle=True, seed=seed``)."""
    out = {}
    for key, value in re.findall(r"(\w+)=([^,)]+)", text or ""):
        try:
            out[key] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            continue  # a name (seed=seed): not checked
    return out


def _matches(event: dict, literals: dict) -> bool:
    args = event.get("args", {})
    return all(args.get(k, v) == v for k, v in literals.items())


def _in_order(events: Sequence[dict], first: str, then: str) -> bool:
    """Every ``first`` event of the trace followed by a ``then`` before the next ``first``."""
    seq = [e["event"] for e in events if e.get("event") in (first, then)]
    firsts = [i for i, k in enumerate(seq) if k == first]
    return bool(firsts) and all(i + 1 < len(seq) and seq[i + 1] == then for i in firsts)


def advised(message: str) -> list[tuple[Step, dict]]:
    """The steps ``message`` advises, each with the literal arguments it gives them."""
    out = []
    for step in STEPS:
        if m := re.search(step.pattern, message):
            out.append((step, _literals(next((g for g in m.groups() if g), ""))))
    return out


def taken(step: Step, literals: dict, traces: Iterable[Sequence[dict]]) -> dict | None:
    """The first event of ``traces`` (one per rank and launch) showing ``step`` taken, or ``None``."""
    for events in traces:
        for e in events:
            if step.taken(e) and _matches(e, literals):
                return e
    return None


def _ranks(traces: Sequence) -> list[Sequence[dict]]:
    """A file's traces as a flat list of event lists: per launch, per rank."""
    return [rank for launch in traces for rank in launch]


def violations(report, traces: Sequence) -> list[str]:
    """Each failing criterion of ``report`` whose feedback advises a step that ``traces`` (that file's, per
    launch, per rank: ``grading.TRACES[path]``) show was taken: ``"criterion: advises X, but your code did it
    (file:line)"``."""
    ranks, out = _ranks(traces), []
    for c in report.criteria:
        if c.earned >= c.points or c.feedback.startswith("not checked"):
            continue
        for step, literals in advised(c.feedback):
            if e := taken(step, literals, ranks):
                where = f" ({e['file']}:{e['line']})" if "line" in e else ""
                out.append(f"{c.name}: advises {step.name}, but your code did it{where}")
        for first, then in ORDER.findall(c.feedback):
            if ranks and all(_in_order(r, first, then) for r in ranks):
                out.append(f"{c.name}: advises {first}() then {then}(), the order your code already has")
    return out
