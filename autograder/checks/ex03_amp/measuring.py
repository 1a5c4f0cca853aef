"""Exercise 3's measuring criteria: ``median_seconds``, ``saved_bytes`` and ``compare`` on the simulated workloads
(each with a known truth, on a virtual clock), and the real model's speedup, reported everywhere and required on a
GPU with bf16 tensor cores. A workload where ``compare`` raised after its two ``median_seconds`` calls returned is
judged from those two (``Measure.timed_only``): the timing is ``median_seconds``' own, and a ``saved_bytes`` that
raises costs the memory criterion only.
"""
from __future__ import annotations

from typing import Callable

from ...grader.report import Verdict, criterion, failed, passed
from .causes import (broken, counted_tensors, cpu_clock, fastest_reported, fewer_threads, filtered_kinds, missing,
                     real_missing, timed_too_little, timing_not_passed)
from .observations import Run
from .workloads import CASE_TITLES, CASES_TRUTH, MEMORY_TRUTH

RATIO_TOL = 0.10         # a reported ratio within 10% of the truth
GPU_MIN_SPEEDUP = 1.5    # bf16 over fp32 on the real model, required on a GPU with bf16 tensor cores only
def _ratio_fb(name: str, got: float, truth: float, why: str) -> tuple[bool, str]:
    ok = abs(got / truth - 1) <= RATIO_TOL
    if ok:
        return True, f"{got:.3g} (truth {truth:.3g})"
    if abs(got * truth - 1) <= RATIO_TOL:
        return False, (f"{name}: you reported {got:.3g} where the truth is {truth:.3g}, its inverse: "
                       "speedup = baseline_s / candidate_s and memory_ratio = candidate_bytes / baseline_bytes")
    return False, (f"{name}: you reported {got:.3g} where the truth is {truth:.3g} "
                   f"(more than {RATIO_TOL:.0%} off): {why}")


def _speedup_criterion(case: str) -> Callable:
    """The criterion of one simulated workload: the speedup ``compare`` reported, against its known truth."""
    # trace=False: the workloads are simulated on a virtual clock, and a timing loop of another shape makes other
    # events, not a mistake: the trace's first difference from the reference says nothing of the speedup
    @criterion(f"measuring: {CASE_TITLES[case]}", points=1, trace=False)
    def speedup(run: Run) -> Verdict:
        if run.copied["median_seconds"]:  # the runtime's copy earns none of its criteria
            return failed(run.copied["median_seconds"])
        m = run.obs.measure
        # judged where compare returned on this workload, or (but for the steady one's direction, compare's own
        # arithmetic) where it raised after its two median_seconds calls returned: their ratio
        timed = case in m.timed_only and case != "steady"
        if case not in m.cases or (case in m.timed_only and not timed):
            return failed(broken(m.errors.get(case, m.error), "compare / median_seconds"))
        if gone := missing(m.cases[case].keys(), ("speedup",)):
            return failed(gone)
        truth, why = CASES_TRUTH[case]
        ok, fb = _ratio_fb("speedup", m.cases[case].speedup, truth, why)
        if timed:
            fb += (f" (from the two seconds median_seconds returned: compare raised {m.errors[case]} after them)" if ok
                   else "")
        if ok and case == "outliers" and (short := timed_too_little(m)):  # the median's other half: enough calls
            return failed(short)
        if ok and case == "steady" and (few := fewer_threads(m)):  # the steady step, timed as its caller runs it
            return failed(few)
        return passed(fb) if ok else failed(timing_not_passed(m, case) or cpu_clock(m) or
                                            (case == "outliers" and fastest_reported(m)) or fb)
    speedup.__name__ = speedup.__qualname__ = f"{case}_speedup"
    return speedup


# One criterion per simulated workload, each worth 1.
steady_speedup, warmup_speedup, async_speedup, outliers_speedup = map(_speedup_criterion, (
    "steady", "warmup", "async", "outliers"))


@criterion("measuring: saved-activation bytes and memory ratio", points=0.5)
def memory_ratio(run: Run) -> Verdict:
    if run.copied["saved_bytes"]:
        return failed(run.copied["saved_bytes"])
    m = run.obs.measure
    if "steady" not in m.cases or "steady" in m.timed_only:
        return failed(broken(m.errors.get("steady", m.error), "saved_bytes / compare"))
    steady = m.cases["steady"]
    if gone := missing(steady.keys(), ("memory_ratio",)):
        return failed(gone)
    ok, fb = _ratio_fb("memory_ratio", steady.memory_ratio, MEMORY_TRUTH,
                       "count each storage packed by torch.autograd.graph.saved_tensors_hooks once")
    return passed(fb) if ok else failed(counted_tensors(steady) or filtered_kinds(steady) or fb)


@criterion(f"[cuda] real bf16 speedup at least {GPU_MIN_SPEEDUP}x", points=1)
def gpu_speedup(run: Run) -> Verdict:
    r, copied = run.obs.real, run.copied["median_seconds"]
    got = 0.0 if r.skipped or r.error or real_missing(run) else r.returned["speedup"]
    if got >= GPU_MIN_SPEEDUP and not copied:
        return passed()
    return failed(copied or real_missing(run) or f"your compare() measured {got:.2f}x on the GPU; bf16 tensor cores "
                  f"should give {GPU_MIN_SPEEDUP}x or more on this wide model: is the step under autocast, and is "
                  "time measured with sync() after each call?")
