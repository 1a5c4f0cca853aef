"""Exercise 5's mistakes that both of the learner's runs share: the uninterrupted run against the single-process
reference of the contract (``reference``), step by step (``CONTRACT``), and the order of save and ``on_step``."""
from __future__ import annotations

import re

from ...grader.diagnosis import mistake
from ...grader.parity import parity
from .causes import LOADER_ADVICE, exact, loader_drew
from .observations import WORLD, Run, StepRecord
from .probes import DATA_SIZE
from .reference import BATCH_SIZE, ReferenceStep, contract_batch, reference_run


def _near(a: float, b: float) -> bool:
    """Sums over every shard: equal but for the order FSDP's reduce-scatter adds the ranks' gradients in."""
    return abs(a - b) <= 1e-6 * (1 + abs(b))


@mistake("scheduler stepped before the optimizer")
def scheduler_first(run: Run, xs: list[StepRecord], a: ReferenceStep, refs: list[ReferenceStep]) -> str | None:
    lr, want = xs[0].pre.lr, a.pre.lr
    if lr == want or a.step >= len(refs) or abs(lr - refs[a.step].pre.lr) > 1e-12 * want:
        return None
    return (f"step {a.step} trained with a learning rate of {lr:.6g}, the schedule's value for step "
            f"{a.step + 1}, where the reference's is {want:.6g}: scheduler.step() ran before optimizer.step(), "
            "so every step used the next step's rate. Call optimizer.step(), then scheduler.step()")


@mistake("a DataLoader without a generator draws from the global RNG")
def loader_rng(run: Run, xs: list[StepRecord], a: ReferenceStep, refs: list[ReferenceStep]) -> str | None:
    if not exact(WORLD):
        return None
    bad = [r for r, x in enumerate(xs) if x.pre.rng != a.pre.rng[r] and loader_drew(run, "A", r, after_step=0)]
    if not bad:
        return None
    return (f"rank {bad[0]}'s RNG state at step {a.step} is not the reference's, so dropout drew other masks: your "
            f"DataLoader, iterated at {loader_drew(run, 'A', bad[0], after_step=0)}, has no generator=, so "
            + LOADER_ADVICE)


@mistake("every rank's RNG not seeded with seed + rank")
def rng_not_per_rank(run: Run, xs: list[StepRecord], a: ReferenceStep, refs: list[ReferenceStep]) -> str | None:
    if not exact(WORLD) or loader_rng(run, xs, a, refs):  # NCCL: dropout draws from CUDA's, which the reference
        return None                                             # does not play
    bad = [r for r, x in enumerate(xs) if x.pre.rng != a.pre.rng[r]]
    if not bad:
        return None
    alike = len({x.pre.rng for x in xs}) == 1
    return (f"rank {bad[0]}'s RNG state at step {a.step} is not torch.manual_seed(seed + {bad[0]})'s"
            + (" (every rank's is the same: each was seeded alike)" if alike else "")
            + ", so dropout drew other masks than the reference's: seed each rank with "
            "torch.manual_seed(seed + rank), after build() and before load_checkpoint()")


@mistake("samples not the contract's sampler")
def samples_not_contract(run: Run, xs: list[StepRecord], a: ReferenceStep, refs: list[ReferenceStep]) -> str | None:
    bad = [r for r, x in enumerate(xs) if x.data != a.data[r]]
    if not bad:
        return None
    r, s, got = bad[0], a.step, xs[bad[0]].data
    epoch_0 = [ref for ref in refs if ref.data[r] == got]
    per_epoch = DATA_SIZE // WORLD // BATCH_SIZE
    found, (epoch, batch) = contract_batch(r, got), divmod(s - 1, per_epoch)
    if epoch_0 and epoch_0[0].step < s:
        advice = (f"the samples of step {epoch_0[0].step}, in the first epoch: call sampler.set_epoch(epoch) at "
                  "the start of every epoch")
    elif len(got) != BATCH_SIZE:  # the sampler may well be the contract's: the batch is not
        advice = (f"a batch of {len(got)} samples, not BATCH_SIZE={BATCH_SIZE}: a batch is BATCH_SIZE consecutive "
                  "indices of the sampler's order")
    elif found and s > 1 and batch == per_epoch - 1 and found == (epoch + 1, 0):  # the epoch's last batch skipped
        advice = (f"the contract sampler's batch 0 of epoch {epoch + 1}, where step {s} is batch {batch} of epoch "
                  f"{epoch}, its last: the epoch's last full batch was skipped. A rank's share of an epoch holds "
                  f"{per_epoch} batches of {BATCH_SIZE} ({DATA_SIZE // WORLD} indices): a loop that stops before "
                  "len - BATCH_SIZE leaves the last one out; it runs while offset + BATCH_SIZE <= len")
    elif found and s > 1:  # at step 1 another seed looks the same (seed + 1's epoch 0 is seed's epoch 1)
        advice = (f"the contract sampler's batch {found[1]} of epoch {found[0]}, where step {s} is batch {batch} of "
                  f"epoch {epoch}: the data position (epoch, offset) moved wrongly; the next batch is offset + 1, "
                  "and after the epoch's last batch, batch 0 of the next epoch")
    else:
        advice = ("use DistributedSampler(dataset, shuffle=True, seed=seed, drop_last=True) and batches of "
                  "BATCH_SIZE consecutive indices of it")
    return (f"rank {r} read samples {xs[r].data[:3]}... at step {s} where the contract's gives "
            f"{a.data[r][:3]}...: {advice}")


CONTRACT = [scheduler_first, samples_not_contract, loader_rng, rng_not_per_rank]


def _step_symptom(xs: list[StepRecord], a: ReferenceStep) -> str:
    p, q, s = sum(x.pre.fp for x in xs), a.pre, a.step
    if xs[0].pre.adam_step != q.adam_step:
        return (f"before step {s} Adam had stepped {xs[0].pre.adam_step:g} times where the reference had "
                f"{q.adam_step:g}: one optimizer.step() per step")
    if xs[0].pre.lr != q.lr or xs[0].lr != a.lr:
        return (f"step {s} trained with a learning rate of {xs[0].pre.lr:.6g} and set {xs[0].lr:.6g} for "
                f"the next, where build()'s CosineAnnealingLR gives {q.lr:.6g} and {a.lr:.6g}")
    if not _near(p, q.fp):
        return (f"step {s} started from other weights than the reference's (sum {p:.9g} vs {q.fp:.9g})"
                + (": train the model build(steps, seed) made" if s == 1 else ""))
    got = sum(x.fp for x in xs)
    return (f"step {s} started from the reference's weights, samples, learning rate, Adam state and RNG state, "
            f"but ended with other weights (sum {got:.9g} vs {a.fp:.9g}): each step is zero_grad, the mean "
            "cross-entropy, backward, optimizer.step(), scheduler.step()")


@mistake("on_step called before the step's checkpoint is saved")
def reported_before_save(run: Run) -> str | None:
    """A save step ``s`` whose first DCP save ran after ``on_step(s)`` had reported it (the contract: save, then
    on_step); a save of the same step again later (after the run, say) is not the step's first."""
    first: dict[int, int] = {}  # step saved -> the last step reported when its first dcp.save ran
    for call in run.calls("A")[0]:
        name = re.search(r"(\d+)$", call.checkpoint or "") if call.call in ("dcp.save", "dcp.async_save") else None
        if name:
            first.setdefault(int(name.group(1)), call.after_step)
    late = sorted(s for s, reported in first.items() if reported >= s)
    if not late:
        return None
    return (f"on_step({late[0]}) ran before step {late[0]}'s save_checkpoint (its dcp.save began after the report): "
            f"after step s, save first, then call on_step(s), so that whatever on_step does (a job stopped or killed "
            "there, as the grader's are) finds step s's checkpoint")


@mistake("steps not reported to on_step as numbered")
def steps_not_reported(run: Run, step: int) -> str | None:
    """No rank called ``on_step``, or the first step it reported is not step 1."""
    if not any(run.ref_rec):
        return ("train finished without calling on_step(step, optimizer) once: call it after every step (after "
                "that step's checkpoint, if any), with the number of steps done")
    first = min(rank[0].step for rank in run.ref_rec if rank)
    if step == 1 and first != 1:
        return (f"the first step the uninterrupted run reported to on_step was step {first}, not 1: start from "
                "step = 0 (the steps done) and count each step after it ran, so the first is step 1")
    return None


def against_reference(run: Run) -> str:
    """'' if the uninterrupted run (A) is the reference's, else what differs at the first step it does."""
    refs, final = reference_run(WORLD)
    recs = run.ref_rec
    for i, a in enumerate(refs):
        xs = [rank[i] if i < len(rank) else None for rank in recs]
        if any(x is None or x.step != a.step for x in xs):
            return steps_not_reported(run, a.step) or \
                f"the uninterrupted run's records stop or skip before step {a.step}"
        if any(x.pre is None for x in xs):
            return f"step {a.step} made no optimizer.step() before on_step: step the optimizer once per step"
        found = {cause: m for cause in CONTRACT if (m := cause(run, xs, a, refs))}
        if samples_not_contract in found and "every rank's is the same" not in found.get(rng_not_per_rank, "x"):
            # more samples, more dropout draws: unless the ranks were seeded alike, the samples explain the RNG
            if rng_not_per_rank in found:  # (the seeding advice would name a step the learner may well have taken)
                found[rng_not_per_rank] = "the RNG state differs too (other samples draw other dropout masks)"
        parts = list(found.values())
        if parts:
            return "; ".join(parts)
        p, q = xs[0].pre, a.pre
        fp_ok = not exact(WORLD) or (_near(sum(x.pre.fp for x in xs), q.fp)
                                     and _near(sum(x.fp for x in xs), a.fp))
        if p.adam_step != q.adam_step or p.lr != q.lr or xs[0].lr != a.lr or not fp_ok:
            return _step_symptom(xs, a)
    same = parity(run.ref.model, final) if exact(WORLD) else None
    if same is not None and not same.ok:
        return (f"after the last step the weights differ from the reference's (max abs difference "
                f"{same.max_abs_diff:.3g} in {same.worst})")
    return reported_before_save(run) or ""
