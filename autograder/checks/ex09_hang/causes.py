"""The named mistakes of exercise 9: each tests one file's observations and returns its message, or
``None`` when it does not explain them (``autograder/grader/diagnosis.py``)."""
from __future__ import annotations

import math

from ...grader.diagnosis import mistake
from ...grader.parity import parity
from .observations import Collective, Run
from .partings import Fingerprint
from .probes import ATOL, RTOL, STEPS
from .uneven.causes import UNEVEN_ERRORS

KNOWN_ERRORS: list = [*UNEVEN_ERRORS]  # part 2's: what grader.main.explain translates too


def _where(op: Fingerprint) -> str:
    return f"{op.kind} (step {op.step}) at {op.at or 'a line outside your file'}"


def parted(run: Run) -> str | None:
    """Where the ranks' collectives parted: each rank's op and line (the words of the other causes)."""
    m = run.mismatch
    if m is None:
        return None
    mine, peer = m.mine, m.peer
    if m.theirs is not None:
        return (f"rank {m.rank}'s collective {mine.n} is {_where(mine)}, rank {peer}'s is "
                f"{_where(m.theirs)}")
    if m.peer_done is None:
        return f"rank {m.rank} waits in {_where(mine)}; rank {peer} never reached its collective {mine.n}"
    return (f"rank {m.rank} waits in {_where(mine)}, its collective {mine.n}; rank {peer} returned from "
            f"train after {m.peer_done} collectives")


@mistake("collectives skipped on a rank with nothing to keep")
def skipped_on_empty(run: Run) -> str | None:
    m = run.mismatch
    if m is None:
        return None
    steps = [(r, s) for r, s in run.empty_steps() if not run.at_step(r, s) and _went_past(run, r, s)]
    kinds = {m.mine.kind, (m.theirs or m.mine).kind}
    if not steps or kinds != {"all_reduce"}:
        return None
    rank, step = steps[0]
    return (f"the job hangs: {parted(run)}. Rank {rank} kept no sample at step {step} and made none of that "
            f"step's all-reduces, then went on: "
            "every rank must make every collective, so do not branch on a rank's own data before one; an empty "
            "selection gives a loss of 0 and zero gradients, which is that rank's share of the sum")


@mistake("gradient all-reduces skipped on a rank with nothing to keep")
def grads_skipped_on_empty(run: Run) -> str | None:
    """A rank with nothing to keep made some of the step's all-reduces (a count's) and went on, where its peer made
    more (the gradients'): the common reason is a ``.grad`` of ``None``, skipped."""
    m = run.mismatch
    if m is None or {m.mine.kind, (m.theirs or m.mine).kind} != {"all_reduce"}:
        return None
    for rank, step in run.empty_steps():
        made, other = run.at_step(rank, step), (rank + 1) % run.world
        stuck = run.ranks[other].mismatch
        waits = stuck is not None and stuck.mine.step == step
        theirs = len(run.at_step(other, step))
        if not made or len(made) >= theirs + waits or not _went_past(run, rank, step):
            continue
        lines = ", ".join(sorted({c.at.split(" ")[0] for c in made if c.at})) or "outside your file"
        ran = ("it ran no backward at that step, so its .grad is None after zero_grad() (set_to_none=True, the "
               "default): if that is why it skipped them, " if not run.backwards(rank, step) else "")
        return (f"the job hangs: {parted(run)}. Rank {rank} kept no sample at step {step}, made {len(made)} "
                f"all-reduce(s) at that step ({lines}) and went on; rank {other} made {theirs} at that step"
                f"{' and waits in one more' if waits else ''}: every rank must make every collective; {ran}all-reduce "
                "torch.zeros_like(p) in place of a missing gradient, which is that rank's share of the sum")
    return None


def _went_past(run: Run, rank: int, step: int) -> bool:
    """Whether ``rank`` went on beyond ``step``: it returned from train, or parted from its peer later."""
    r = run.ranks[rank]
    if r.mismatch is None:
        return r.error is None
    return r.mismatch.mine.step is not None and r.mismatch.mine.step > step


@mistake("a barrier where the peers all-reduce")
def barrier_for_all_reduce(run: Run) -> str | None:
    m = run.mismatch
    if m is None or m.theirs is None or "barrier" not in {m.mine.kind, m.theirs.kind}:
        return None
    return (f"the job hangs: {parted(run)}. A barrier does not match an all-reduce (with DETAIL PyTorch "
            "reports 'Detected mismatch between collectives'; without it gloo waits or pairs them wrongly): a rank "
            "with nothing to keep must make the same all-reduces as the others, with a zero gradient and a count of 0")


@mistake("gradients never all-reduced")
def no_all_reduce(run: Run) -> str | None:
    counts = [r.counts.get("all-reduce", 0) for r in run.ranks]
    if any(counts):
        return None
    return (f"no rank made an all-reduce in {STEPS} steps ({run.ranks[0].counts or 'no collective at all'} on "
            "rank 0): each rank stepped on its own gradient divided by its own count, so the ranks trained apart "
            "and nothing hangs only because nothing is shared. Keep the all-reduces of the count and of every "
            "gradient, on every rank, at every step")


@mistake("the step skipped on every rank")
def skipped_everywhere(run: Run) -> str | None:
    params = max(len(run.grad_reduces(r, s)) for r in range(run.world) for s in range(STEPS))
    for step in range(STEPS):
        kept = [run.kept(r, step) for r in range(run.world)]
        if any(kept) and params > 0 and not any(run.grad_reduces(r, step) for r in range(run.world)):
            who = next(r for r in range(run.world) if kept[r])
            return (f"at step {step} no rank all-reduced its gradients ({params} all-reduces of gradients at "
                    f"other steps) although rank {who} kept {kept[who]} samples: the step was skipped on "
                    "every rank because one had nothing, which drops the other ranks' samples. Only the empty rank "
                    "has nothing to add: it takes part with a zero gradient")
    return None


@mistake("an empty rank sends a non-zero gradient")
def stale_gradient(run: Run) -> str | None:
    for rank, step in run.empty_steps():
        sent = [c.input_abs for c in run.at_step(rank, step)]
        if sent and any(v > 0 for v in sent):
            return (f"rank {rank} kept no sample at step {step} but all-reduced tensors whose |values| sum to "
                    f"{sum(sent):.3g}: its share of the sum is zero (a count of 0 and zero gradients); a gradient "
                    "left from an earlier step, or a count of 1, changes every rank's update")
    return None



def _lines(calls: list[Collective]) -> str:
    """The learner's lines of ``calls``, each once: ``ex09_hang.py:78 (dist.all_reduce(grad))``."""
    return ", ".join(dict.fromkeys(c.at or "a line outside your file" for c in calls))


@mistake("the gradients never all-reduced, the count is")
def grads_not_reduced(run: Run) -> str | None:
    if any(run.grad_reduces(r, s) for r in range(run.world) for s in range(STEPS)):
        return None
    made = run.ranks[0].calls
    if not made:
        return None  # no all-reduce at all: no_all_reduce says so
    shapes = sorted({str(c.shape) for c in made})
    return (f"no rank all-reduced a gradient in {STEPS} steps: rank 0's {len(made)} all-reduces were all of "
            f"{' or '.join(shapes)} tensors ({_lines(made)}), none shaped like a parameter "
            f"({', '.join(map(str, run.param_shapes))}): each rank stepped on the gradient of its own samples "
            "only. Every parameter's gradient is all-reduced too, on every rank, at every step")


@mistake("a step with no kept sample on any rank divided by a count of 0")
def divided_by_zero_count(run: Run) -> str | None:
    for step in range(STEPS - 1):
        if any(run.kept(r, step) for r in range(run.world)):
            continue
        later = run.grad_reduces(0, step + 1)
        if later and any(math.isnan(c.input_abs) for c in later):
            return (f"at step {step} no rank kept a sample (the all-reduced count was 0), and at step {step + 1} "
                    f"rank 0 all-reduced NaN gradients ({_lines(later)}): the update divided by a count of 0 and "
                    "made the weights NaN. A step with no kept sample on any rank changes nothing: leave the weights "
                    "as they are when the global count is 0")
    return None


@mistake("zero gradients all-reduced by a rank that kept samples")
def zero_gradients(run: Run) -> str | None:
    for rank in range(run.world):
        for step in range(STEPS):
            grads = run.grad_reduces(rank, step)
            kept = run.kept(rank, step)
            # zero means 0.0: NaN gradients (weights already NaN) are not "zero", and say nothing of backward()
            if not kept or not grads or any(c.input_abs != 0 for c in grads):
                continue
            first = min(c.n for c in grads)
            before = [b for b in run.backwards(rank, step) if b.after < first]
            head = (f"rank {rank} kept {kept} samples at step {step}, yet every gradient it all-reduced there "
                    f"({_lines(grads)}) was zero")
            if before and sum(b.grad_abs for b in before) > 0:
                return (head + f": its backward() had given gradients whose |values| sum to "
                        f"{sum(b.grad_abs for b in before):.3g}, and they were cleared before the all-reduce "
                        "(zero_grad(), or .grad set to None, after backward()): clear them before the backward")
            after = [b for b in run.backwards(rank, step) if b.after >= first]
            if after:
                return (head + ": backward() ran at that step only after the gradients' all-reduces: all-reduce "
                        "them once backward() has filled them")
            return (head + ": no backward() reached the parameters at that step, so .grad was empty (None, sent "
                    "as zeros): call loss.backward() before all-reducing the gradients")
    return None


@mistake("the count never all-reduced: each rank divides by its own")
def count_not_reduced(run: Run) -> str | None:
    """No count all-reduced at a step whose gradients were: named at the first such step where the ranks kept
    different counts (where dividing by a rank's own count, or by the world size, is not one process's mean)."""
    steps = [s for s in range(STEPS) if all(run.grad_reduces(r, s) for r in range(run.world))]
    if not steps or any(run.count_reduces(r, s) for s in steps for r in range(run.world)):
        return None
    kept = {s: [run.kept(r, s) for r in range(run.world)] for s in steps}
    step = next((s for s in steps if len(set(kept[s])) > 1), steps[0])
    each = ", ".join(f"rank {r} kept {k}" for r, k in enumerate(kept[step]))
    return (f"at step {step} every all-reduce was of a gradient ({len(run.grad_reduces(0, step))} on rank 0, "
            "shaped like the parameters), none of the count: one process divides the sum of the kept samples' "
            f"gradients by all {sum(kept[step])} of them ({each}), a number only an all-reduce of the counts gives "
            "each rank; a rank's own count, or the world size (the mean of the ranks' means), is that only where "
            "every rank kept as many. All-reduce the count as well, before dividing by it")


@mistake("a rank with no kept sample skips the step's update")
def ranks_disagree(run: Run) -> str | None:
    """The ranks end with different weights, and one of them kept no sample at some step: an update guarded by
    the rank's own data (the all-reduced gradient and count are the same on every rank, the update must be too)."""
    first = run.ranks[0].final
    apart = [(r.rank, parity(r.final, first, rtol=RTOL, atol=ATOL)) for r in run.ranks[1:]]
    apart = [(rank, p) for rank, p in apart if not p.ok]
    empty = run.empty_steps()
    if not apart or not empty:
        return None
    rank, p = apart[0]
    idle = min(r for r, _ in empty)
    steps = [s for r, s in empty if r == idle]
    return (f"the ranks ended with different weights (rank 0's and rank {rank}'s differ by up to {p.max_abs_diff:.3g} "
            f"in '{p.worst}'), and rank {idle} kept no sample at step(s) {steps}. The all-reduced gradient and "
            "count are the same on every rank, so every rank applies every step's update, also where it kept no "
            "sample itself: guard the update with the global count, not with this rank's own data")


@mistake("the weights never updated")
def no_update(run: Run) -> str | None:
    sent = [c.input_abs for r in run.ranks for c in r.calls if c.shape in run.param_shapes]
    if not run.unchanged or not any(v > 0 for v in sent):
        return None
    return (f"after {STEPS} steps every rank's weights are still the initial ones, although the ranks all-reduced "
            f"non-zero gradients ({len(sent)} all-reduces of gradients): no update reached the parameters. It is "
            "made in place, under torch.no_grad(), on the model's own parameters (p -= lr * grad / count; "
            "p = p - ... only rebinds the name)")
