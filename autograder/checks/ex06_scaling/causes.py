"""Exercise 6's likely mistakes of the method (see autograder/grader/diagnosis.py): each takes the
:class:`~.observations.Run` of one world size and tests the clock reads and collectives rank 0 made in
``measure_throughput`` first, and the figure's ratio to the truth only where those are missing. The real
benchmark's are :mod:`.real_causes`', the α-β part's :mod:`.alphabeta.causes`'. The check's criteria ask for
them, most specific first.
"""
from __future__ import annotations

from ...grader.diagnosis import KnownError, mistake
from .observations import SYNTH, MethodEvent, Run
from .probes import TOL

KNOWN_ERRORS = [
    KnownError("a Python float passed to a collective", r"Expected parameter `tensor` of type torch\.Tensor",
               "collectives work on tensors: put the elapsed time in one (torch.tensor(elapsed, dtype=torch.float64, "
               "device=distlab.device())), all-reduce or broadcast it, then read it back with .item()"),
    KnownError("the process group initialised again in the benchmark",
               r"trying to initialize the default process group twice",
               "the grader (and bench_rank) already made the process group: measure_throughput and make_ddp_step "
               "use it, they do not call init_process_group"),
    KnownError("a CPU tensor in an NCCL collective", r"No backend type associated with device type cpu",
               "under NCCL a collective's tensor must be on the rank's GPU: create it with device=distlab.device()"),
]


def _near(a: float, b: float, rel: float = TOL / 2) -> bool:
    return abs(a - b) <= rel * abs(b)


def _window(run: Run) -> float:
    return run.window()


@mistake("CPU time measured instead of wall-clock time")
def cpu_clock(run: Run) -> str | None:
    cpu = sorted({e.name for e in run.events("clock")} & {"process_time", "process_time_ns", "thread_time",
                                                              "thread_time_ns"})
    if cpu and run.ratio() > 1 + TOL:
        return (f"you timed with time.{cpu[0]}(), which counts this process's CPU time ({_window(run):.3f} s), not "
                f"the {run.truth().window:.3f} s of wall-clock time the steps took (waiting for a GPU, the "
                "network or the other ranks uses no CPU): use time.perf_counter()")
    return None


@mistake("the ranks' elapsed times summed (all_reduce's default SUM)")
def summed_clocks(run: Run) -> str | None:
    summed = [e for e in run.events("collective") if e.name == "all_reduce" and e.op == "SUM"]
    # The SUM all-reduce was seen: the ratio only has to be about 1/W (load makes a summed clock noisy).
    if run.world > 1 and summed and _near(run.own_ratio() * run.world, 1, rel=0.25):
        return (f"you all-reduced the elapsed time with SUM (all_reduce's default), adding the {run.world} ranks' "
                f"clocks: a window of {_window(run):.3f} s for steps that took {run.truth().window:.3f} s. "
                "Pass op=dist.ReduceOp.MAX (the slowest rank's time), or broadcast rank 0's")
    return None


@mistake("counted one rank's samples")
def one_rank_samples(run: Run) -> str | None:
    if run.world > 1 and _near(run.own_ratio() * run.world, 1):
        return (f"you counted one rank's samples: the {run.world} ranks trained {run.truth().samples} "
                "(world_size * batch_size * iters): multiply by the world size (every rank trains its own batch)")
    return None


def _start_read(run: Run) -> MethodEvent | None:
    """The clock read of rank 0's that started the window its figure implies: the earlier read of the last pair
    whose readings, each between its ``before`` and ``after``, can differ by that window (a file may read the
    clock more than twice: each warm-up step timed for a log). The first read where no pair fits (or where the
    reads were not bracketed)."""
    reads, window = run.events("clock"), _window(run)
    for j in range(len(reads) - 1, 0, -1):
        b = reads[j]
        for a in reversed(reads[:j]):
            if None in (a.before, a.after, b.before, b.after):
                continue
            if (b.before - a.after) * (1 - TOL) <= window <= (b.after - a.before) * (1 + TOL):
                return a
    return reads[0] if reads else None


@mistake("warm-up steps timed")
def warmup_timed(run: Run) -> str | None:
    t, start, k = run.truth(), _start_read(run), SYNTH["warmup"]
    started = start.steps if start else None
    looks_so = _near(run.ranks[0].reported, t.samples / t.with_warmup, TOL)
    if run.ratio() < 1 - TOL and (started is not None and started < k or started is None and looks_so):
        slow = k - (started or 0)
        return (f"your window ({_window(run):.3f} s) includes the {slow} slow warm-up steps"
                + (f" (you read the clock after {started} of the {k})" if started else "")
                + ": start the clock after the warm-up, behind a barrier")
    return None


@mistake("warm-up steps' samples counted")
def warmup_samples(run: Run) -> str | None:
    k, n = SYNTH["warmup"], SYNTH["iters"]
    if _near(run.own_ratio(), (k + n) / n, 0.04):
        return (f"that is ({k} + {n}) / {n}: you counted the samples of the {k} warm-up steps too, but did not "
                "time them: count world_size * batch_size * iters")
    return None


@mistake("clock stopped without a barrier (rank 0's own time)")
def no_barrier(run: Run) -> str | None:
    t, events = run.truth(), run.events()
    reads = [i for i, e in enumerate(events) if e.kind == "clock"]
    total = SYNTH["warmup"] + SYNTH["iters"]
    if run.world == 1 or run.ratio() <= 1 + TOL:
        return None
    if reads:  # evidence: nothing synchronised the ranks between rank 0's last step and its last clock read
        if any(e.kind == "collective" and e.steps == total for e in events[:reads[-1]]):
            return None
    elif not _near(run.ranks[0].reported, t.samples / t.rank0_alone, TOL):
        return None
    return (f"that is rank 0's own time ({t.rank0_alone:.3f} s) while the slowest rank took {t.window:.3f} s"
            + (": rank 0 read the clock after its last step with no barrier in between" if reads else "")
            + ": call dist.barrier() (and torch.cuda.synchronize() on a GPU) before starting and before stopping "
            "the clock, so the window covers every rank's steps")


@mistake("clock started before the barrier that lines the ranks up")
def clock_before_barrier(run: Run) -> str | None:
    """Rank 0 read its clock after the warm-up, then waited in a collective before its first timed step: the wait
    for the ranks still warming up is in its window (the grader's clock around each event says how long)."""
    k, events = SYNTH["warmup"], run.events()
    if run.world == 1 or run.ratio() >= 1 - TOL:
        return None
    reads = [i for i, e in enumerate(events) if e.kind == "clock" and e.steps == k]
    waits = [e for e in events[reads[0] + 1:] if e.kind == "collective" and e.steps == k] if reads else []
    if not waits or any(e.kind == "collective" and e.steps == k for e in events[:reads[0]]):
        return None
    start, wait = events[reads[0]], waits[0]
    if start.after is None or wait.after is None:
        return None
    return (f"rank 0 read the clock ({start.name}) when its warm-up ended, then called dist.{wait.name}(), which "
            f"returned {wait.after - start.after:.3f} s later, once every rank had reached it: your window "
            f"({_window(run):.3f} s) includes that wait, while the timed steps took {run.truth().window:.3f} s. Start "
            "the clock after the barrier returns")


@mistake("clock started without a barrier (a rank still warming up)")
def no_start_barrier(run: Run) -> str | None:
    k, events = SYNTH["warmup"], run.events()
    if run.world == 1 or run.ratio() >= 1 - TOL:
        return None
    starts = [r.times[k, 0].item() for r in run.ranks]  # when each rank began its first timed step
    late = max(range(run.world), key=starts.__getitem__)
    gap = starts[late] - starts[0]
    if gap <= 0:
        return None
    reads = [i for i, e in enumerate(events) if e.kind == "clock" and e.steps == k]
    if reads:  # evidence: nothing synchronised the ranks between rank 0's warm-up and its clock's start
        if any(e.kind == "collective" and e.steps == k for e in events[:reads[0]]):
            return None
    elif not _near(run.ranks[0].reported, run.truth().samples / (run.truth().window + gap), TOL):
        return None
    return (f"rank 0 started the clock when its own warm-up ended, {gap:.3f} s before rank {late} finished "
            f"its warm-up: your window ({_window(run):.3f} s) includes that wait, while the timed steps took "
            f"{run.truth().window:.3f} s. Call dist.barrier() after the warm-up (after "
            "torch.cuda.synchronize() on a GPU), then start the clock")



@mistake("the figure returned as a tensor, not a float")
def figure_not_float(run: Run) -> str | None:
    r = next((r for r in run.ranks if r.reported_type), None)
    if r is None:
        return None
    return (f"measure_throughput returned a {r.reported_type} on rank {r.rank}, where its contract returns a float: "
            "its callers print it, compare it, and write it to a JSON report, which a tensor does not go into; "
            "return float(...) (or .item())")


@mistake("no figure returned")
def no_figure(run: Run) -> str | None:
    silent = next((r for r in run.ranks if r.reported is None), None)
    if silent is None:
        return None
    return (f"measure_throughput returned None on rank {silent.rank}, so there is no figure to judge: every path "
            "through it must end in return the samples per second (world_size * batch_size * iters / elapsed)")


@mistake("a different figure on every rank")
def figure_per_rank(run: Run) -> str | None:
    got, apart = run.ranks[0].reported, [r for r in run.ranks[1:] if r.reported != run.ranks[0].reported]
    if apart:
        return (f"rank {apart[0].rank} returned {apart[0].reported:,.1f} samples/s but rank 0 returned "
                f"{got:,.1f}: return the same figure on every rank (broadcast rank 0's elapsed time, or all-reduce "
                "it with MAX, before dividing)")
    return None
