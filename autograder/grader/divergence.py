"""The first divergence from the reference: feedback for a mistake no check anticipated.

A check names the causes it anticipated (:func:`autograder.grader.diagnosis.mistake`); a mistake outside its
list used to fall to the symptom ("weights differ"). Here the grader compares the learner's trace
(:mod:`autograder.rank.trace`, recorded in the ranks) with the reference solution's, recorded by
the same recorder on the same inputs, and reports the first event where they differ, what each side
held, and the learner's line: record-and-compare localisation, as in delta debugging's "isolating
failure-inducing differences" (Zeller, *Why Programs Fail*, ch. 14) and the differential
testing of compilers (McKeeman 1998). A named cause, where one applies, still comes first:
:func:`annotate` adds the divergence only to failing criteria whose feedback names none. Launches are paired
with the reference's by world size (:func:`paired`): launches that run side by side finish in any order.
"""
from __future__ import annotations

import functools
import hashlib
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .diagnosis import named

# Fields compared exactly, per event; the numeric ones (below) within a relative tolerance.
EXACT = {"event", "kind", "shape", "peer", "group", "module", "epoch"}
NUMERIC = {"lr", "params", "value", "held", "returned", "args"}  # (lists of) numbers within RTOL, the rest exactly
RTOL = 1e-5  # a correct solution may sum in another order: float32 checksums agree to about 1e-6
FIELD_WORDS = {"lr": "learning rate", "params": "the parameters' sum after the step",
               "value": "the sum of what it sent",
               "shape": "shape", "peer": "peer", "module": "module", "kind": "kind", "group": "group size",
               "epoch": "epoch", "rng": "RNG state", "held": "what it held", "returned": "what it returned",
               "args": "its arguments"}
# The events of calls recorded by name (rank.trace.CALLS), as the learner wrote them.
CALLED = {"init_process_group": "dist.init_process_group", "destroy_process_group": "dist.destroy_process_group",
          "DistributedDataParallel": "DistributedDataParallel", "DistributedSampler": "DistributedSampler",
          "zero_grad": "zero_grad", "set_epoch": "sampler.set_epoch", "commit": "commit", "prune": "prune"}


def _close(a, b) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):  # a NaN where the reference has one: the same
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=RTOL, abs_tol=1e-9)
    return a == b


def differing(ref: dict, got: dict, rng: bool = True, measured: frozenset[str] = frozenset()) -> list[str]:
    """The fields in which two events differ ("event" first, and for a return the function it returns from: then
    nothing else is compared); ``rng``: the RNG state too. ``measured``: the functions that measure time (a
    throughput), whose values no two runs share: what their events hold, send or return is not compared."""
    if ref.get("event") != got.get("event") or (ref.get("event") == "return" and
                                                  ref.get("function") != got.get("function")):
        return ["event"]  # a return from another function is another act, not another value
    numeric = NUMERIC - {"returned", "held", "value"} if ref.get("function") in measured else NUMERIC
    fields = [k for k in sorted(EXACT - {"event"}) if ref.get(k) != got.get(k)]
    fields += [k for k in sorted(numeric) if not _close(ref.get(k), got.get(k))]
    if rng and not fields and ref.get("rng") != got.get("rng"):
        fields.append("rng")
    return fields


def _same_start(ref: Sequence[dict], got: Sequence[dict]) -> bool:
    """Whether both runs' RNG states agree at their first optimizer step. Where the check does not seed each
    file (exercise 1), the state there depends on the files graded before in the same process: then the
    RNG states say nothing about the learner's code, and are not compared."""
    first = [next((e.get("rng") for e in t if e.get("event") == "optimizer.step"), None) for t in (ref, got)]
    return first[0] == first[1]


@dataclass(frozen=True)
class Divergence:
    """The first event at which two traces differ: its index, both events (``None``: a trace ended), the fields."""

    index: int
    rank: int
    ref: dict | None
    got: dict | None
    fields: tuple[str, ...]
    later: str = ""  # where the learner's code does what the reference did here, if it does at all
    stepping: bool = True  # whether the reference's run steps an optimizer at all (else no step count is said)

    def message(self) -> str:
        return describe(self)


def first_divergence(ref: Sequence[dict], got: Sequence[dict], rank: int = 0,
                     measured: frozenset[str] = frozenset()) -> Divergence | None:
    """The first event where ``got`` (the learner's trace) differs from ``ref`` (the reference's); ``measured``:
    as :func:`differing`'s."""
    rng = _same_start(ref, got)
    stepping = any(e.get("event") == "optimizer.step" for e in ref)
    for i, (r, g) in enumerate(zip(ref, got)):
        if fields := differing(r, g, rng, measured):
            return Divergence(i, rank, r, g, tuple(fields), _later(r, got[i + 1:]) if fields == ["event"] else "",
                              stepping)
    if len(ref) != len(got):
        i = min(len(ref), len(got))
        return Divergence(i, rank, ref[i] if i < len(ref) else None, got[i] if i < len(got) else None, ("event",),
                          stepping=stepping)
    return None


# What makes two events the same act, where the event has it: a collective of one kind on one shape in one group,
# a send to one peer of one shape, a forward of one module (not: the step, the line, the values it held)
IDENTITY = ("event", "kind", "shape", "group", "peer", "module")


def _later(ref: dict, rest: Sequence[dict]) -> str:
    """Where, after the divergence, the learner's code does what the reference did there (the same act:
    :data:`IDENTITY`, so DDP's all-reduce of the gradients is not a count's all-reduce of one number)."""
    same = IDENTITY + (("function",) if ref.get("event") == "return" else ())
    j = next((j for j, e in enumerate(rest) if all(e.get(f) == ref.get(f) for f in same if f in ref)), None)
    if j is None:
        return "; your code never does"
    return f"; yours does that {j + 1} event(s) later{_at(rest[j])}"


def first_of_ranks(ref: Sequence[Sequence[dict]], got: Sequence[Sequence[dict]],
                   measured: frozenset[str] = frozenset()) -> Divergence | None:
    """The earliest divergence over the ranks (rank order breaks ties)."""
    found = [d for rank, (r, g) in enumerate(zip(ref, got)) if (d := first_divergence(r, g, rank, measured))]
    return min(found, key=lambda d: (d.index, d.rank)) if found else None


def action(event: dict | None) -> str:
    """What an event did, in words: "stepped the optimizer (lr 0.1)", "sent a [16, 64] tensor to rank 1"."""
    if event is None:
        return "did nothing more"
    kind = event["event"]
    lr = ", ".join(f"{x:.6g}" for x in event.get("lr", []))
    if kind == "optimizer.step":
        return f"stepped the optimizer (lr {lr})"
    if kind == "scheduler.step":
        return f"stepped the LR scheduler (to lr {lr})"
    if kind in ("send", "recv"):
        to = "to" if kind == "send" else "from"
        return f"{'sent' if kind == 'send' else 'received'} a {event.get('shape')} tensor {to} rank {event.get('peer')}"
    if kind == "collective":
        held = f" holding {_shown(event['held'])}" if "held" in event else ""
        return f"called {event.get('kind')} on a {event.get('shape')} tensor{held} (group of {event.get('group')})"
    if kind == "forward":
        return f"ran a forward of {event.get('module')}"
    if kind == "backward":
        return f"called backward() on a {event.get('shape')} tensor"
    if kind in ("save", "load"):
        return f"called {event.get('api', kind)} of {event.get('held')}"
    if kind in ("dcp.save", "dcp.load"):
        return f"called {kind} of {event.get('held')}"
    if kind in CALLED:
        shown = {"set_epoch": ("epoch",), "DistributedSampler": ("shuffle", "seed", "drop_last"),
                 "prune": ("keep",), "commit": ("step",)}.get(kind, ())
        args = ", ".join(f"{k}={event['args'][k]!r}" for k in shown if k in event.get("args", {}))
        return f"called {CALLED[kind]}({args})"
    if kind == "return":
        return f"returned {_shown(event.get('returned'))} from {event.get('function')}()"
    return kind


def _shown(value) -> str:
    if isinstance(value, list):
        return "(" + ", ".join(_shown(v) for v in value) + ")"
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _at(event: dict | None) -> str:
    if not event or "line" not in event:
        return ""
    return f" ({event['file']}:{event['line']}: `{event['code']}`)"


def _value(event: dict, name: str) -> str:
    v = event.get(name)
    if isinstance(v, list) and v and isinstance(v[0], float):
        return "[" + ", ".join(f"{x:.6g}" for x in v) + "]"
    if isinstance(v, list):
        return _shown(v)
    return f"{v:.8g}" if isinstance(v, float) else str(v)


def describe(d: Divergence) -> str:
    """The learner-facing sentence: at which step, what the learner's code did at which line, what the
    reference did, and the values that differ. The reference's code is never shown (only what it did)."""
    ref, got = d.ref, d.got
    step = (got or ref or {}).get("step", 0)
    who = f"rank {d.rank}, " if d.rank else ""
    when = f"after {step} optimizer.step() call(s), " if step else "before any optimizer.step() call, "  # torch.optim's
    when = when if d.stepping else ""  # a file whose functions step no optimizer: no count to give
    # the function it happened in: a step count runs over the whole file, whose parts may each step an optimizer
    fn = (got or ref or {}).get("function")
    within = f", in {fn}()" if fn and (got or ref or {}).get("event") != "return" else ""
    head = f"first difference from the reference ({who}{when}event {d.index + 1}{within}): "
    if d.fields == ("event",):
        if got is None:
            return head + f"your run ended where the reference {action(ref)}"
        return head + f"your code {action(got)}{_at(got)} where the reference {action(ref)}{d.later}"
    values = "; ".join(f"{FIELD_WORDS.get(f, f)} {_value(got, f)} vs the reference's {_value(ref, f)}"
                       for f in d.fields)
    return head + f"your code {action(got)}{_at(got)}: {values}"


def untraced(check) -> set[str]:
    """The criteria of ``check`` (its ``*CRITERIA`` lists) declared ``trace=False``, by function name."""
    return {fn.__name__ for name, value in vars(check).items() if name.endswith("CRITERIA")
            and isinstance(value, (list, tuple)) for fn in value if not getattr(fn.rule, "trace", True)}


def unnamed_failures(report, skip: set[str] = frozenset()) -> list:
    """The failing criteria of ``report`` whose feedback names no cause (a symptom only); ``skip``: by key."""
    if not report.ran or any(c.name == "runs" for c in report.criteria):
        return []
    return [c for c in report.criteria if c.earned < c.points and not named(c.feedback) and c.key not in skip
            and not c.feedback.startswith(("not checked", "not judged")) and " raised " not in c.feedback]  # an error


def _world(name: str, unnamed: int | None = None) -> int | None:
    """The world size a criterion's name says it judged ("[W=2] ..."), or ``unnamed`` where it names none (a
    check's ``UNNAMED_WORLD``: its criteria without a world size all judge one), else ``None`` (all of them)."""
    m = re.match(r"\[W=(\d+)\]", name)
    return int(m.group(1)) if m else unnamed


def annotate(report, traces: Sequence, reference: Sequence, skip: set[str] = frozenset(),
             measured: frozenset[str] = frozenset(), unnamed: int | None = None) -> bool:
    """Add the first divergence of ``traces`` (per launch, per rank) from ``reference`` to the first failing
    criterion of ``report`` that names no cause (and is not in ``skip``) and judged that launch's world size (or
    names none, and ``unnamed`` is ``None``): a launch at 1 worker does not explain a criterion at 2.
    ``measured``: as :func:`differing`'s. Whether it did."""
    failing = unnamed_failures(report, skip)
    for launch_ref, launch_got in paired(reference, traces):
        here = [c for c in failing if _world(c.name, unnamed) in (None, len(launch_got))]
        if here and (d := first_of_ranks(launch_ref, launch_got, measured)):
            here[0].feedback += f"\n  {d.message()}"
            return True
    return False


def paired(reference: Sequence, traces: Sequence) -> list[tuple]:
    """Each launch of ``traces`` with the reference's launch of the same world size (its number of ranks'
    traces), the k-th with the k-th: launches that run side by side finish, and are kept, in any order."""
    out, used = [], set()
    for launch in traces:
        match = next((i for i, ref in enumerate(reference) if i not in used and len(ref) == len(launch)), None)
        if match is not None:
            used.add(match)
            out.append((reference[match], launch))
    return out


_REFERENCE: dict = {}  # (check, its grade's keyword arguments) -> the reference's traces, per launch
STORE_VAR = "DISTLAB_REFERENCE_STORE"  # the folder of the reference traces kept between processes ("0": none)


def solution_path(check):
    """The reference solution of a check's exercise (``solutions/exNN_name.py``)."""
    from distlab.runtime.launch import REPO_ROOT

    return REPO_ROOT / "solutions" / check.EXERCISE.filename


@functools.cache
def _code_digest() -> str | None:
    """What a reference's trace depends on besides the check's arguments: every source the grading and the ranks
    run (the solutions, the checks, the rank side, the course's library), torch's and Python's versions, the GPUs
    seen (NCCL or gloo). ``None`` where a source cannot be read."""
    import sys

    import torch

    from distlab.runtime.launch import REPO_ROOT

    digest = hashlib.sha256(f"{torch.__version__} {sys.version} {torch.cuda.device_count()}".encode())
    try:
        for folder in ("solutions", "autograder", "distlab"):
            for path in sorted((REPO_ROOT / folder).rglob("*.py")):
                digest.update(f"{path.relative_to(REPO_ROOT)}\0".encode() + path.read_bytes() + b"\0")
    except OSError:
        return None
    return digest.hexdigest()


def stored_path(check, key: tuple) -> Path | None:
    """Where the reference traces of ``check`` graded with ``key``'s arguments are kept between processes: a
    file named by the digest of everything they depend on (:func:`_code_digest`), so that a change to any of it
    records them again. In the grader's cache (beside the time scale ``make selftest`` calibrates), which only
    the grader's user can write; ``None`` where none is kept (``DISTLAB_REFERENCE_STORE=0``)."""
    from distlab.runtime.process import CALIBRATION

    folder, code = os.environ.get(STORE_VAR) or str(CALIBRATION.parent / "reference-traces"), _code_digest()
    if folder == "0" or code is None:
        return None
    name = hashlib.sha256(f"{code} {key}".encode()).hexdigest()[:32]
    return Path(folder) / f"{check.EXERCISE.filename.removesuffix('.py')}-{name}.pt"


def _load_stored(check, key: tuple) -> bool:
    """The reference traces kept by an earlier process into :data:`_REFERENCE`, if there are; whether they are."""
    import torch

    if key in _REFERENCE:
        return True
    path = stored_path(check, key)
    try:
        _REFERENCE[key] = torch.load(path, weights_only=True)
    except Exception:  # noqa: BLE001 - none kept, or not readable: graded again
        return False
    return True


def _store(check, key: tuple, traces: list) -> None:
    """Keep a reference's traces for later processes (written whole, then renamed: readers never see half)."""
    import torch

    path = stored_path(check, key)
    if path is None or not traces:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        torch.save(traces, tmp)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache: the next process grades the reference again


def reference_traces(check, **kwargs) -> list:
    """The reference solution's traces, graded by ``check`` as the learner's file was: once per process, and kept
    between processes (:func:`stored_path`); ``[]`` where it cannot be read (the grading image keeps
    ``solutions/`` from the learner's user)."""
    from .launches import TRACES

    key = (check.__name__, repr(sorted(kwargs.items())))  # as grade() keys it
    if not _load_stored(check, key):
        path = solution_path(check)
        TRACES.pop(str(path), None)
        try:
            check.grade([path], **kwargs)
        except Exception:  # noqa: BLE001 - no reference trace: the feedback keeps its symptom
            pass
        _REFERENCE[key] = TRACES.pop(str(path), [])
        _store(check, key, _REFERENCE[key])  # graded alone: its RNG states depend on nothing graded before it
    return _REFERENCE[key]


def grade(check, paths: Sequence, *, localise: bool = False, with_reference: bool = False,
          kept: dict | None = None, **kwargs) -> list:
    """``check.grade(paths, **kwargs)``, and for each failing criterion that names no cause, the first
    divergence of that file's trace from the reference's (graded the same way, only when needed);
    ``localise``: then also which graded function, swapped for the reference's, makes it pass
    (:mod:`.substitute`: one more grading of as many variants as the exercise has graded functions).
    ``with_reference``: grade the reference in the same call (one launch less where a failure is likely).
    ``kept``: a dict that receives each path's traces (``advice.violations`` reads them)."""
    from .launches import TRACES
    from .substitute import localise as swap

    key, solution = (check.__name__, repr(sorted(kwargs.items()))), solution_path(check)
    extra = ([solution] if with_reference and not _load_stored(check, key) and str(solution) not in map(str, paths)
             else [])
    for path in [*paths, *extra]:
        TRACES.pop(str(path), None)
    reports = check.grade([*paths, *extra], **kwargs)[:len(paths)]
    if extra:
        _REFERENCE[key] = TRACES.pop(str(solution), [])
    for path, report in zip(paths, reports):
        traces = TRACES.pop(str(path), [])
        if kept is not None:
            kept[str(path)] = traces
        if not unnamed_failures(report, untraced(check)):
            continue
        if traces:
            annotate(report, traces, reference_traces(check, **kwargs), untraced(check),
                     frozenset(getattr(check, "MEASURED_RETURNS", ())), getattr(check, "UNNAMED_WORLD", None))
        if localise and (where := swap(check, path, report, solution_path(check), **kwargs)):
            report.notes.append(where)
    return reports
