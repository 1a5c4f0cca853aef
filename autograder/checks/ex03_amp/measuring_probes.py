"""Rank-side instruments of exercise 3's measuring part: the learner's ``compare`` on the simulated workloads (a
virtual clock each, whose truth is known), with a spy on its ``median_seconds`` calls (their settings, the seconds
each measured and returned, the syncs), and on the real model. A workload whose ``compare`` raised leaves the others
measured; where it raised after its two ``median_seconds`` calls returned, their ratio is kept as its speedup
(``Measure.timed_only``). Verdicts: ``measuring``.
"""
from __future__ import annotations

import functools
import inspect
from pathlib import Path

import torch

from distlab.measure.memory import peak_memory
from distlab.measure.timing import SimulatedWorkload, VirtualClock, synchronize
from distlab.models import make_mlp

from ...rank import frames, learner_frame, raised
from ...rank.spies import learner_line
from .observations import Compared, Measure, RealModel, TimingCall
from .workloads import CASES, MIN_RUN_TIME, REAL_MIN_RUN_TIME, WARMUP, Clocks, MixedSaves, SharedViews


def _error(exc: Exception, learner) -> str:
    """The error, and the learner's line it came through (else the innermost line, with its file's name: a
    library's line 275 is not the learner's)."""
    last = learner_frame(exc, learner.__file__) or frames(exc)[-1]
    return f"{raised(exc)} ({Path(last.filename).name} line {last.lineno} in {last.name}: {last.line})"


def _number(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _timing_spy(learner, calls: list[TimingCall], clocks: Clocks):
    """The learner's ``median_seconds``, recording each call's settings (its signature's defaults applied), the
    learner's line it came from (``compare`` must pass on the ``warmup``, ``min_run_time`` and ``sync`` it was given),
    and, on a workload's virtual clock, the calls of compare's sync while it ran, and the seconds from its first
    reading of a clock to its last: the seconds it measured (a warm-up reads no clock; Timer's calibration does)."""
    real, path = learner.median_seconds, Path(learner.__file__).resolve()
    try:
        signature = inspect.signature(real)
    except (TypeError, ValueError):
        return real

    @functools.wraps(real)
    def spy(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            got = {k: _number(bound.arguments.get(k)) for k in ("warmup", "min_run_time")}
            given = list(bound.arguments.values())[1:2]  # the sync it was handed (the contract's second argument)
            got["sync_given"] = clocks.given_sync is not None and bool(given) and given[0] is clocks.given_sync
        except TypeError:  # the call does not fit the signature: the call itself will raise
            got = {"warmup": None, "min_run_time": None}
        found = learner_line(path)
        call = TimingCall(line=f"{Path(found[0]).name}:{found[1]}" if found else "", **got)
        calls.append(call)
        outer, clocks.reads, syncs = clocks.reads, [], clocks.syncs
        try:
            call.returned = _number(result := real(*args, **kwargs))
            return result
        finally:
            if clocks.clock is not None and len(clocks.reads) >= 2:
                call.timed_s = clocks.reads[-1] - clocks.reads[0]
            call.synced = clocks.syncs - syncs if clocks.clock is not None else None
            clocks.reads = outer
    return spy


def _measure(learner, watch, clocks: Clocks) -> Measure:
    out = Measure()
    real_timing = getattr(learner, "median_seconds", None)
    if callable(real_timing):
        learner.median_seconds = _timing_spy(learner, out.timing_calls, clocks)
    # the caller's torch runs 2 threads or more (no real work here: virtual clocks), so that a timer that runs fn
    # with threads of its own (benchmark.Timer's num_threads defaults to 1) shows it
    threads, out.caller_threads = torch.get_num_threads(), max(2, torch.get_num_threads())
    torch.set_num_threads(out.caller_threads)
    try:
        for case, (base_kw, cand_kw) in CASES.items():  # one workload's error leaves the others measured
            try:
                _measure_case(learner, watch, clocks, case, base_kw, cand_kw, out)
            except Exception as exc:  # noqa: BLE001 - the learner's error is feedback, said on its workload's
                out.errors[case] = _error(exc, learner)
                out.error = out.error or out.errors[case]
    finally:
        torch.set_num_threads(threads)
        if callable(real_timing):
            learner.median_seconds = real_timing
        out.clocks = sorted(clocks.read_names)
    return out


class _Threads:
    """A workload that notes torch's thread count at each call (what the code that called it ran fn with)."""

    def __init__(self, fn, seen: list[int]) -> None:
        self.fn, self.seen = fn, seen

    def __call__(self):
        if torch.get_num_threads() not in self.seen:
            self.seen.append(torch.get_num_threads())
        return self.fn()


def _measure_case(learner, watch, clocks: Clocks, case: str, base_kw: dict, cand_kw: dict, out: Measure) -> None:
    clock = VirtualClock()
    base, cand = (SharedViews(clock, **kw) if "storage" in kw else
                  MixedSaves(clock, **{k: v for k, v in kw.items() if k != "mixed"}) if kw.get("mixed") else
                  SimulatedWorkload(clock, **kw) for kw in (base_kw, cand_kw))
    base, cand = _Threads(base, out.fn_threads), _Threads(cand, out.fn_threads)
    before = len(out.timing_calls)
    try:
        with clocks.reading(clock), watch:
            res = learner.compare(base, cand, sync=clocks.counted_sync(clock), warmup=WARMUP,
                                  min_run_time=MIN_RUN_TIME)
    except Exception as exc:  # noqa: BLE001 - after its two timings: they are judged, and the other workloads run
        timed = [c.returned for c in out.timing_calls[before:]]
        if len(timed) != 2 or None in timed or not timed[1]:
            raise  # in median_seconds, or before it: the measuring part's error
        out.errors[case] = _error(exc, learner)
        out.error = out.error or out.errors[case]
        res = {"speedup": timed[0] / timed[1]}
        out.timed_only.append(case)
    finally:
        clocks.given_sync = None
    for call in out.timing_calls[before:]:
        call.case = case
    out.cases[case] = Compared(**{k: float(res[k]) for k in ("speedup", "memory_ratio") if k in res},
                               **{k: _number(res[k]) for k in ("baseline_bytes", "candidate_bytes") if k in res})


def _real(learner, device, watch, cfg: dict) -> RealModel:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(cfg["batch"], cfg["in_features"], generator=g).to(device)
    y = torch.randint(0, 10, (cfg["batch"],), generator=g).to(device)
    steps = {}
    for kind, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        model = make_mlp(seed=0, in_features=cfg["in_features"], hidden=cfg["hidden"], depth=cfg["depth"]).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        steps[kind] = functools.partial(learner.train_step, model, opt, x, y, amp_dtype=dtype)
    with watch:  # the learner's call only: peak_memory below is the grader's own
        res = learner.compare(steps["fp32"], steps["bf16"], sync=lambda: synchronize(device), warmup=WARMUP,
                              min_run_time=REAL_MIN_RUN_TIME)
    (b32, method), (b16, _) = peak_memory(steps["fp32"], device), peak_memory(steps["bf16"], device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} thread(s)"
    sizes = f"MLP {cfg['in_features']}-{cfg['hidden']}x{cfg['depth']}, batch {cfg['batch']}"
    return RealModel(returned={k: float(v) for k, v in res.items()}, peak_ratio=b16 / max(b32, 1), peak_method=method,
                     device=name, model=sizes)
