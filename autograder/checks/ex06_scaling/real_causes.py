"""Exercise 6's mistakes of the real benchmark (see autograder/grader/diagnosis.py): what ``make_ddp_step``'s step
did to the model (``_off_reference``'s and ``_untrained``'s: DDP or not, the forward through the wrapper, the lr,
the gradients cleared, the optimizer stepped), and what the real run counted, which no figure can hide
(``REAL_CAUSES``: the DDP wrappers built, DDP's gradient all-reduces and the learner's own collectives per step,
the steps between the clock reads)."""
from __future__ import annotations

from ...grader.diagnosis import mistake
from ...grader.parity import parity
from .observations import SYNTH, MethodEvent, RankObservation, Run
from .reference import real_reference

RTOL, ATOL = 1e-4, 1e-6  # the real step against one process's SGD: DDP averages in another order than one mean

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


@mistake("the step's optimizer not plain SGD")
def not_plain_sgd(run: Run) -> str | None:
    other = run.ranks[0].opt_other
    if not other:
        return None
    what = f"SGD with {other}" if "=" in other else f"a {other}"
    return (f"the optimizer that stepped was {what}, where make_ddp_step's is torch.optim.SGD(lr=lr), no more: the "
            "benchmark times one plain SGD step, the one its single-process reference takes")


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


@mistake("the loss summed over the batch, not its mean")
def summed_loss(run: Run) -> str | None:
    first = run.ranks[0]
    if not first.real_steps:
        return None
    summed = parity(first.final, real_reference(run, reduction="sum"), rtol=RTOL, atol=ATOL)
    if not summed.ok:
        return None
    n = run.real["batch_size"]
    return (f"at {run.world} worker(s) rank 0's weights after {first.real_steps} calls of step() are those of SGD on "
            f"each batch's summed cross-entropy (max abs difference {summed.max_abs_diff:.2g}): a sum over the "
            f"{n} samples makes every gradient {n}x the mean's, so each step is {n}x as long at the same lr. The "
            "step's loss is the mean cross-entropy (cross_entropy's default reduction)")


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
