"""Exercise 6's likely mistakes, tested against what the ranks observed (see autograder/grader/diagnosis.py).

The method's causes and the real step's each take the :class:`~.observations.Run`
of one world size. The method's test the clock reads and collectives rank 0 made in
``measure_throughput`` first, and the figure's ratio to the truth only where those are missing; the
real run's (``REAL_CAUSES``) what was counted there, which no figure can hide: the DDP wrappers
built, DDP's gradient all-reduces and the learner's own collectives per step, the steps called and
those between the clock reads; the efficiency's takes the throughputs and what
``scaling_efficiency`` returned. The check's criteria ask for them, most specific first.
"""
from __future__ import annotations

from ...grader.diagnosis import KnownError, mistake
from ...grader.parity import parity
from .observations import SYNTH, MethodEvent, RankObservation, Run
from .probes import TOL
from .reference import real_reference

RTOL, ATOL = 1e-4, 1e-6  # the real step against one process's SGD: DDP averages in another order than one mean


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


def _real(run: Run) -> RankObservation:
    return run.ranks[0]


@mistake("the DDP wrapper rebuilt in every step")
def wrapper_per_step(run: Run) -> str | None:
    r = _real(run)
    if not r.ddp_built_in_step:
        return None
    return (f"at {run.world} worker(s) step() built a new DistributedDataParallel in {r.ddp_built_in_step} of "
            f"its {r.real_steps} calls: each construction broadcasts rank 0's weights and checks every "
            "parameter's shape across the ranks (collectives, and a new bucket layout), which the timed window "
            "then counts as DDP's cost. Build the wrapper and the optimizer once, in make_ddp_step, and let "
            "step() run only the forward, backward and optimizer.step()")


@mistake("not one DDP wrapper built by make_ddp_step")
def wrappers_made(run: Run) -> str | None:
    n = _real(run).ddp_built_in_make
    if n == 1:
        return None
    return (f"at {run.world} worker(s) make_ddp_step built {n} DistributedDataParallel wrappers: wrap the model "
            "once (a wrapper around a wrapper all-reduces every gradient twice)")


@mistake("gradients not all-reduced once per step")
def grad_rounds(run: Run) -> str | None:
    r = _real(run)
    rounds, steps = r.ddp_rounds, r.real_steps or 0
    if rounds is None or not steps or rounds == steps:
        return None
    if rounds < steps:
        return (f"at {run.world} worker(s) DDP all-reduced the gradients {rounds} times in {steps} steps: every "
                "backward must sync them (do not run the step under no_sync(), and call the wrapper, not .module)")
    return (f"at {run.world} worker(s) DDP all-reduced the gradients {rounds} times in {steps} steps, "
            f"{rounds / steps:.3g} per step: run one forward and one backward per step")


@mistake("a collective of your own in every step")
def collectives_in_step(run: Run) -> str | None:
    r = _real(run)
    inside = [e.name for e in r.real_method if e.kind == "collective" and e.in_step]
    if not inside:
        return None
    names = ", ".join(f"dist.{n}" for n in dict.fromkeys(inside))
    return (f"at {run.world} worker(s) step() itself called {names} ({len(inside)} calls in {r.real_steps} "
            "steps), on top of DDP's gradient all-reduce: the timed window then measures those collectives "
            "too. DDP already averages the gradients; synchronise or log outside the timed steps")


def _timed(events: list[MethodEvent], k: int, n: int) -> tuple[int | None, bool]:
    """From the clock reads outside a step: the steps done when the clock started (the last read after at
    most ``k``), and whether it was read after the last of the ``k + n`` steps."""
    reads = [e.steps for e in events if e.kind == "clock" and not e.in_step]
    return max((s for s in reads if s <= k), default=None), k + n in reads


@mistake("the real run timed other steps than the iters after the warm-up")
def timed_other_steps(run: Run) -> str | None:
    r, k, n = _real(run), run.real["warmup"], run.real["iters"]
    if len(r.times) != SYNTH["warmup"] + SYNTH["iters"]:
        return None  # the synthetic step's count is wrong too: its criterion named it
    if r.real_steps not in (None, k + n):
        return (f"at {run.world} worker(s) measure_throughput called the real step {r.real_steps} times; "
                f"expected warmup + iters = {k + n} (warmup={k}, iters={n})")
    events = r.real_method
    if not any(e.kind == "clock" for e in events):
        return None  # a clock the spies do not see (CUDA events): the synthetic step judged the method
    start, stopped = _timed(events, k, n)
    synth_start, synth_stopped = _timed(run.events(), SYNTH["warmup"], SYNTH["iters"])
    if (start == k) == (synth_start == SYNTH["warmup"]) and stopped == synth_stopped:
        return None  # timed as on the synthetic step: its criterion judged (and named) the method
    if start != k:
        return (f"on the real model your clock started after {start} steps, so the window timed "
                f"{k + n - (start or 0)} steps where the {n} after the {k} warm-up steps count"
                if start is not None else f"on the real model no clock was read after the {k} warm-up steps")
    if not stopped:
        return f"on the real model the clock was not read after the last of the {k + n} steps"
    return None


REAL_CAUSES = [wrapper_per_step, wrappers_made, grad_rounds, collectives_in_step, timed_other_steps]


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


def _apart(run: Run) -> tuple[int, float] | None:
    """The first rank whose parameters differ from rank 0's after the real benchmark, and by how much."""
    for r in run.ranks[1:]:
        diff = parity(r.final, run.ranks[0].final, rtol=0, atol=0).max_abs_diff
        if diff > 0:
            return r.rank, diff
    return None


@mistake("the step does not use DDP")
def no_ddp(run: Run) -> str | None:
    apart = _apart(run)
    if apart and not run.ranks[0].ddp_wrapped:
        return (f"at {run.world} workers rank {apart[0]}'s parameters differ from rank 0's by up to {apart[1]:.3g} "
                "(they started from different weights, and no DistributedDataParallel was made): wrap the model in "
                "DistributedDataParallel, which broadcasts rank 0's weights and averages every step's gradients")
    return None


@mistake("forward called on the inner module, bypassing DDP")
def inner_forward(run: Run) -> str | None:
    apart, first = _apart(run), run.ranks[0]
    if apart and first.ddp_wrapped and not first.ddp_forwards:
        return (f"at {run.world} workers rank {apart[0]}'s parameters differ from rank 0's by up to {apart[1]:.3g}: "
                "the model was wrapped in DistributedDataParallel, but no forward went through the wrapper "
                "(ddp.module(x) skips the gradient all-reduce): call ddp(x)")
    return None


@mistake("make_ddp_step returned no step function")
def no_step_function(run: Run) -> str | None:
    first = run.ranks[0]
    if first.step_error or first.real_steps is not None:
        return None
    return ("make_ddp_step returned None, not a function, so the benchmark had no step to run and the model was "
            "never trained: end make_ddp_step with `return step`, the inner function itself (not its result)")


@mistake("the lr given to make_ddp_step not used")
def lr_not_used(run: Run) -> str | None:
    first, given = run.ranks[0], run.real["lr"]
    if first.opt_lr is None or abs(first.opt_lr - given) <= 1e-12 * given:
        return None
    return (f"the optimizer stepped with lr={first.opt_lr:g}, where make_ddp_step was given lr={given:g}: build "
            "the optimizer with the lr argument (the benchmark's callers pass their own)")


@mistake("gradients never cleared in the step")
def grads_accumulate(run: Run) -> str | None:
    first = run.ranks[0]
    if not first.real_steps or first.real_steps < 2:
        return None
    kept = parity(first.final, real_reference(run, zero_grad=False), rtol=RTOL, atol=ATOL)
    if not kept.ok:
        return None
    return (f"at {run.world} worker(s) rank 0's weights after {first.real_steps} calls of step() are those that "
            f"steps whose gradients are never cleared leave (max abs difference {kept.max_abs_diff:.2g}): .grad "
            "adds each backward to what it holds until zero_grad() clears it, so every step after the first "
            "stepped with the sum of all the gradients so far. In each step: zero_grad(), then loss.backward(), "
            "then opt.step()")


@mistake("the optimizer stepped with no gradient (before backward, or after zero_grad)")
def stepped_without_grad(run: Run) -> str | None:
    first = run.ranks[0]
    n, empty, rounds = first.opt_steps or 0, first.opt_steps_without_grad, first.ddp_rounds or 0
    if not n or empty < n:
        return None
    return (f"opt.step() ran {n} times in {first.real_steps or 0} calls of step(), and every time the parameters "
            "held no gradient (.grad None or zero)" + (f", though DDP all-reduced gradients {rounds} times" if rounds
                                                       else "") +
            ": it ran before loss.backward() made them, or after zero_grad() cleared them. In each step: "
            "zero_grad(), then loss.backward(), then opt.step()")


@mistake("optimizer.step() not called in the step")
def no_optimizer_step(run: Run) -> str | None:
    first = run.ranks[0]
    if first.opt_steps is None or first.opt_steps or not first.real_steps:
        return None
    rounds = first.ddp_rounds or 0
    return (f"in {first.real_steps} calls of step() no optimizer stepped" +
            (f" (DDP all-reduced the gradients {rounds} times, so the backward ran)" if rounds else "") +
            ": call opt.step() after loss.backward()")
