"""Communication made visible: a ``torch.profiler`` trace as per-rank intervals, a Gantt chart, the overlap.

DDP (Li et al., 2020, "PyTorch Distributed: Experiences on Accelerating Data
Parallel Training", VLDB, section 3.2) puts gradients in *buckets*
and starts a bucket's all-reduce as soon as backward has produced its last
gradient, so communication runs while backward still computes the gradients
of earlier layers. This module reads that overlap off the trace the profiler
writes (``export_chrome_trace``, the file a learner opens in Perfetto):

* :func:`profile_steps` profiles a few training steps and writes the trace;
* :func:`trace_spans` reads it back as :class:`Span` s, each *compute*
  (forward, backward, optimizer) or *comm* (a collective);
* :func:`overlap_fraction` is the communication time hidden under compute
  divided by the total communication time, over the union of the spans;
* :func:`gantt` draws every rank's spans, a row for compute and one for comm.

What counts as what. On the CPU (gloo) the collective runs on gloo's own
threads and shows as a ``gloo:all_reduce`` annotation there; compute is every
operator on the thread that runs the training step (the one that holds the
``ProfilerStep#`` annotations), except the short ``c10d::`` calls that only
enqueue a collective. Gaps on that thread are waits (DDP waiting for the last
bucket), not compute. On a GPU both are kernels on the device's streams:
NCCL's kernels are comm, every other kernel is compute.
"""
from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

# A collective's own span: gloo annotates it on its worker thread, NCCL runs it as a kernel.
COMM_NAME = re.compile(r"^(gloo|nccl):|nccl", re.IGNORECASE)
# The host-side calls that only hand a collective to the backend: neither compute nor comm.
ENQUEUE = re.compile(r"^c10d::|^record_param_comms$|^nccl:")
PHASES = (("forward", re.compile(r"DistributedDataParallel\.forward|FSDP.*forward")),
          ("optimizer", re.compile(r"^Optimizer\.(step|zero_grad)")),
          ("backward", re.compile(r"^autograd::engine::evaluate_function")),
          ("bucket copy", re.compile(r"copy_bucket_to_grad")))  # DDP copying reduced buckets into .grad


@dataclass(frozen=True)
class Span:
    """One interval of a trace, in seconds from the rank's first profiled step: ``kind`` is
    ``"compute"`` or ``"comm"``, ``phase`` the part of the step (forward, backward, optimizer,
    other; for comm the collective's name)."""

    kind: str
    phase: str
    start: float
    end: float


def profile_steps(step: Callable[[], object], steps: int, path: str | Path, *, cuda: bool = False) -> Path:
    """Run ``step`` ``1 + steps`` times under ``torch.profiler`` and write the last ``steps`` as a
    Chrome/Perfetto trace at ``path`` (the first step is the profiler's warm-up, discarded)."""
    import os

    from torch.profiler import ProfilerActivity, profile, schedule

    # Kineto logs "USDT: profiler_start/stop" to stderr on every cycle unless its level is above 5.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    path = Path(path)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    # The trace is written when the cycle ends (on_trace_ready): the profiler clears it after that.
    # One cycle, so accumulating events across cycles (acc_events) changes nothing but the warning.
    with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=steps), acc_events=True,
                 on_trace_ready=lambda prof: prof.export_chrome_trace(str(path))) as prof:
        for _ in range(1 + steps):
            step()
            prof.step()  # marks the step boundaries (ProfilerStep#N) the spans are read against
    return path


def _complete_events(path: str | Path) -> list[dict]:
    """The trace's complete events ("ph": "X": a name, a start ``ts`` and a ``dur``, in microseconds)."""
    events = json.loads(Path(path).read_text())["traceEvents"]
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def _phase(event: dict, windows: list[tuple[str, float, float]]) -> str:
    for name, pattern in PHASES:
        if pattern.search(event["name"]):
            return name
    t = event["ts"]
    return next((name for name, a, b in windows if a <= t < b), "other")


def trace_spans(path: str | Path) -> tuple[list[Span], list[tuple[float, float]]]:
    """``(spans, steps)`` of one rank's trace: its compute and comm :class:`Span` s, and the
    ``(start, end)`` of every profiled step, in seconds from the first step's start."""
    events = _complete_events(path)
    step_events = sorted((e for e in events if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
    if not step_events:
        raise ValueError(f"{path}: no ProfilerStep# annotations (profile with distlab.measure.profiling.profile_steps)")
    t0 = step_events[0]["ts"]
    steps = [((e["ts"] - t0) / 1e6, (e["ts"] + e["dur"] - t0) / 1e6) for e in step_events]
    on_gpu = any(e.get("cat") == "kernel" for e in events)
    main = step_events[0]["tid"]
    # Phase annotations (DDP's forward, the optimizer, each backward function) enclose operators
    # (aten::mm ...) that carry no phase in their own names.
    windows = [(name, e["ts"], e["ts"] + e["dur"]) for e in events if e.get("tid") == main
               for name, pattern in PHASES if pattern.search(e["name"])]
    spans = []
    for e in events:
        if on_gpu:
            if e.get("cat") != "kernel":
                continue
            kind = "comm" if COMM_NAME.search(e["name"]) else "compute"
        elif COMM_NAME.search(e["name"]) and e.get("cat") == "user_annotation" and e["tid"] != main:
            kind = "comm"
        elif e["tid"] == main and e.get("cat") == "cpu_op" and not ENQUEUE.search(e["name"]):
            kind = "compute"
        else:
            continue
        # A kernel runs after the host operator that queued it: host windows cannot name its phase.
        phase = e["name"].split(":", 1)[-1] if kind == "comm" else "kernel" if on_gpu else _phase(e, windows)
        spans.append(Span(kind, phase, (e["ts"] - t0) / 1e6, (e["ts"] + e["dur"] - t0) / 1e6))
    return spans, steps


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The disjoint, sorted intervals covering the same time as ``intervals``."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def covered(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by ``intervals`` (overlaps counted once)."""
    return sum(b - a for a, b in union(intervals))


def intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Seconds covered by both ``a`` and ``b``."""
    ua, ub = union(a), union(b)
    total, i, j = 0.0, 0, 0
    while i < len(ua) and j < len(ub):  # a merge of two sorted lists of disjoint intervals
        lo, hi = max(ua[i][0], ub[j][0]), min(ua[i][1], ub[j][1])
        total += max(0.0, hi - lo)
        if ua[i][1] < ub[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlap_fraction(spans: list[Span]) -> float:
    """Communication time hidden under compute / total communication time (0 when there is none)."""
    comm = [(s.start, s.end) for s in spans if s.kind == "comm"]
    compute = [(s.start, s.end) for s in spans if s.kind == "compute"]
    total = covered(comm)
    return intersection(comm, compute) / total if total > 0 else 0.0


def summarize(path: str | Path) -> dict:
    """One rank's figures from its trace: median step time, the overlap fraction, seconds of
    communication, of backward and of compute per step, and how many collectives ran per step."""
    spans, steps = trace_spans(path)
    n = len(steps)
    comm = [(s.start, s.end) for s in spans if s.kind == "comm"]
    return {"step_s": statistics.median(b - a for a, b in steps), "overlap": overlap_fraction(spans),
            "comm_s": covered(comm) / n, "collectives": len(comm) / n,
            "backward_s": covered([(s.start, s.end) for s in spans if s.phase == "backward"]) / n,
            "bucket_copy_s": covered([(s.start, s.end) for s in spans if s.phase == "bucket copy"]) / n,
            "compute_s": covered([(s.start, s.end) for s in spans if s.kind == "compute"]) / n}


COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "bucket copy": "#8172b3", "optimizer": "#55a868",
          "kernel": "#64b5cd", "other": "#8c8c8c", "comm": "#c44e52"}


def gantt(ax, per_rank: list[list[Span]], title: str = "", *, until: float | None = None,
          legend: bool = True) -> None:
    """Draw each rank's spans on ``ax`` (milliseconds): a compute row coloured by phase and a comm
    row with one bar per collective (a DDP bucket's all-reduce), ranks top to bottom; spans that
    start after ``until`` seconds are left out. The legend goes to the right of the axes."""
    from matplotlib.patches import Patch

    labels = []
    for r, spans in enumerate(per_rank):
        for row, kind in ((2 * r, "compute"), (2 * r + 1, "comm")):
            mine = [s for s in spans if s.kind == kind and (until is None or s.start < until)]
            if kind == "comm":  # one bar per collective, edged, so consecutive buckets stay apart
                ax.broken_barh([(s.start * 1e3, (s.end - s.start) * 1e3) for s in mine], (row - 0.35, 0.7),
                               color=COLORS["comm"], edgecolor="white", linewidth=0.8, alpha=0.85)
            for phase in {s.phase for s in mine} if kind == "compute" else ():
                bars = union([(s.start * 1e3, s.end * 1e3) for s in mine if s.phase == phase])
                ax.broken_barh([(a, b - a) for a, b in bars], (row - 0.35, 0.7),
                               color=COLORS.get(phase, COLORS["other"]))
            labels.append(f"rank {r} {kind}")
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("ms from the rank's first profiled step")
    if legend:
        drawn = {s.phase for spans in per_rank for s in spans if s.kind == "compute"} | {"comm"}
        ax.legend(handles=[Patch(color=c, label=k) for k, c in COLORS.items() if k in drawn], fontsize=7,
                  loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if title:
        ax.set_title(title, fontsize=10)
