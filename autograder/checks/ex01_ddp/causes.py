"""Exercise 1's likely mistakes, tested against what the ranks observed (see autograder/grader/diagnosis.py).

Each takes the :class:`~.observations.Run` of one world size; the check's criteria ask
for them in four groups (ranks apart, shards, shuffle, step), most specific first.
"""
from __future__ import annotations

import torch
from torch.utils.data.distributed import DistributedSampler

from distlab.data import digits

from distlab.measure.comm import label

from ...grader.diagnosis import KnownError, mistake
from ...grader.parity import parity
from .observations import Run
from .probes import ATOL, CONFIG, EVAL


KNOWN_ERRORS = [
    KnownError("DataLoader given a sampler and shuffle=True", r"sampler option is mutually exclusive with shuffle",
               "a DataLoader takes either sampler= or shuffle=True, not both: the DistributedSampler shuffles "
               "(DistributedSampler(dataset, shuffle=True, seed=seed)); drop shuffle=True from the DataLoader"),
    KnownError("device_ids given for a CPU model", r"device_ids and output_device arguments only work with",
               "device_ids=[...] is for a model on one GPU: on the CPU build DistributedDataParallel(model) "
               "without it, and on a GPU pass the local device's index (not the global rank)"),
    KnownError("init_process_group called twice", r"initialize the default process group twice",
               "the process group was initialised twice: setup() makes it, once; train_ddp must not call "
               "setup() or init_process_group() again"),
]


# Causes: each tests what the ranks observed and returns the message, or None.

@mistake("forward called on model.module")
def inner_forward(run: Run) -> str | None:
    r0 = run.ranks[0]
    inner = sum(not f.through_ddp for f in r0.forwards)
    if not (r0.ddp_built and inner):
        return None
    count = f"all {inner}" if inner == len(r0.forwards) else f"{inner} of {len(r0.forwards)}"
    return (f"{count} forward passes called model.module(x), bypassing DDP's gradient all-reduce: the model was "
            "wrapped, but only a forward through the wrapper (ddp_model(x)) makes its backward average the gradients")


@mistake("ranks not synchronised at the start")
def not_synchronised(run: Run) -> str | None:
    r0 = run.ranks[0]
    for r in run.ranks[1:] if r0.at_first_forward is not None else []:
        start = parity(r.at_first_forward, r0.at_first_forward, rtol=0, atol=0)
        moved = {n: (r.final[n] - r.at_first_forward[n]) - (r0.final[n] - r0.at_first_forward[n])
                 for n in r0.final}
        if not start and parity(moved, {n: torch.zeros_like(t) for n, t in moved.items()}, rtol=0, atol=ATOL):
            how = ("DDP was built with init_sync=False, which skips that broadcast" if False in r0.ddp_built
                   else "nothing broadcast rank 0's weights: wrap the model in DistributedDataParallel, which does "
                   "when it is built (or dist.broadcast every parameter from rank 0 first)")
            return (f"the ranks made the same updates but started from different weights (rank {r.rank} and rank "
                    f"0 differed by {start.max_abs_diff:.3g} in '{start.worst}' at the first forward): {how}")
    return None


@mistake("model not wrapped in DDP")
def not_wrapped(run: Run) -> str | None:
    r0 = run.ranks[0]
    if r0.ddp_built or r0.grad_all_reduces:
        return None
    return ("the model was never wrapped in DistributedDataParallel: each rank trained alone on its own data, from "
            "its own initial weights; wrap it, so it broadcasts rank 0's weights and averages the gradients")


@mistake("no DistributedSampler")
def no_sampler(run: Run) -> str | None:
    n, per_epoch = len(digits()), len(run.ranks[0].accessed) / CONFIG["epochs"]
    if per_epoch != n:
        return None
    read = f"every rank read all {n} samples in each epoch (rank 0 read {per_epoch:g} per epoch, not its " \
           f"{run.samples_per_rank})"
    if built := run.ranks[0].samplers_built:
        return (f"{read}, although train_ddp built {built} DistributedSampler(s): a DataLoader reads through the "
                "sampler it is given, and it was not given that one; give it to the DataLoader as sampler=...")
    return f"{read}: pass a DistributedSampler to the DataLoader (sampler=...) so each rank reads only its shard"


@mistake("samplers seeded differently on each rank")
def seeded_apart(run: Run) -> str | None:
    local, shards = run.samples_per_rank, [set(run.epoch(r, 0)) for r in range(run.world)]
    overlap = len(shards[0] & shards[1])
    if not overlap or any(len(s) != local for s in shards):
        return None
    return (f"ranks 0 and 1 shared {overlap} samples in epoch 0 although each read its {local} once: their "
            "DistributedSamplers shuffled with different seeds; give every rank the same seed (seed=seed), and the "
            "sampler hands each rank a different slice of one permutation")


@mistake("the training sampler built with drop_last=True")
def train_drop_last(run: Run) -> str | None:
    if not run.ranks[0].sampler_drop_last:
        return None
    return (f"train_ddp built its DistributedSampler with drop_last=True: on this data set, which {run.world} ranks "
            "divide, the shards are the same, but on one they do not divide it leaves the last len(dataset) % W "
            "samples out of every epoch, where one process trains on all of them. The contract's sampler keeps "
            "them: DistributedSampler(dataset, shuffle=True, seed=seed), whose drop_last=False pads the shards")


@mistake("the DataLoader built with drop_last=True")
def loader_drop_last(run: Run) -> str | None:
    local, bs = run.samples_per_rank, CONFIG["batch_size"]
    kept = local // bs * bs
    if not run.ranks[0].loader_drop_last or len(run.ranks[0].accessed) != CONFIG["epochs"] * kept:
        return None
    return (f"rank 0 read {kept} of its {local} samples in each epoch ({kept // bs} batches of {bs}): train_ddp's "
            f"DataLoader was built with drop_last=True, which leaves out each epoch's last {local - kept} samples, "
            "less than a batch, where one process trains on every sample. Keep the default drop_last=False: an "
            "epoch's last step is then a smaller batch, the same on every rank")


@mistake("DistributedSampler built with shuffle=False")
def unshuffled(run: Run) -> str | None:
    in_order = list(range(len(digits())))[0::run.world][:run.samples_per_rank]
    if not all(run.epoch(0, e) == in_order for e in range(CONFIG["epochs"])):
        return None
    return ("rank 0 read its shard in index order (0, {}, {}, ...) in both epochs: the DistributedSampler was "
            "built with shuffle=False; build it with shuffle=True, seed=seed").format(run.world, 2 * run.world)


def sampler_order(world: int, rank: int, epoch: int, seed: int) -> list[int]:
    """The indices rank ``rank`` reads in ``epoch`` from ``DistributedSampler(dataset, shuffle=True, seed=seed)``
    with ``set_epoch(epoch)``: the contract's order (the sampler needs only the data set's length)."""
    sampler = DistributedSampler(range(len(digits())), num_replicas=world, rank=rank, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


@mistake("sampler not given the seed")
def seed_not_given(run: Run) -> str | None:
    seed = CONFIG["seed"]
    for e in range(CONFIG["epochs"]):
        for r in range(run.world):
            if run.epoch(r, e) == sampler_order(run.world, r, e, 0) != sampler_order(run.world, r, e, seed):
                return (f"rank {r} read epoch {e}'s samples in the order DistributedSampler(dataset, shuffle=True) "
                        f"gives with seed=0, its default, not with seed={seed}, the seed train_ddp was given: pass "
                        "seed=seed, so that a run is shuffled the way its caller asked")
    return None


@mistake("sampler.set_epoch not called")
def no_set_epoch(run: Run) -> str | None:
    if run.epoch(0, 0) != run.epoch(0, 1):
        return None
    return ("epoch 0 and epoch 1 read the samples in the same shuffled order: call sampler.set_epoch(epoch) at "
            "the start of every epoch")


@mistake("batch_size treated as global")
def batch_not_per_rank(run: Run) -> str | None:
    bs, forwards = CONFIG["batch_size"], run.ranks[0].forwards
    if not forwards or forwards[0].rows == bs:
        return None
    return (f"each rank read {forwards[0].rows} samples per step, not batch_size={bs}: batch_size is per rank (the "
            f"global batch is {run.world}x{bs}); give it to the DataLoader unchanged")


@mistake("learning rate changed")
def lr_changed(run: Run) -> str | None:
    step, lr = run.ranks[0].first_step, CONFIG["lr"]
    if not step or abs(step.lr - lr) < 1e-9:
        return None
    return (f"the optimizer's learning rate was {step.lr:g}, {step.lr / lr:.3g}x the lr={lr} given: use it "
            "as given; DDP averages the gradients, so each step is already the step of the global batch")


@mistake("gradients all-reduced by hand on top of DDP")
def double_all_reduce(run: Run) -> str | None:
    step = run.ranks[0].first_step
    calls = step.grad_all_reduces if step else 0
    if not (calls and run.ranks[0].ddp_built and run.ratio_is(run.world)):
        return None
    return (f"the first step's gradient is {run.gradient_ratio:.3g}x the reference's: the gradients were also "
            f"summed by hand ({calls} dist.all_reduce calls on .grad before the first step) on top of DDP, which "
            "had already averaged them in backward; remove the all_reduce")


@mistake("loss multiplied by the world size")
def loss_times_world(run: Run) -> str | None:
    if not run.ratio_is(run.world):
        return None
    return (f"the first step's gradient is {run.gradient_ratio:.3g}x the reference's on the same global batch: "
            f"the loss was multiplied by the world size ({run.world}); DDP averages the gradients over the ranks, "
            "so use the plain mean cross-entropy")


@mistake("loss divided by the world size")
def loss_over_world(run: Run) -> str | None:
    if not run.ratio_is(1 / run.world):
        return None
    return (f"the first step's gradient is {run.gradient_ratio:.3g}x the reference's on the same global batch: "
            f"the loss was divided by the world size ({run.world}); DDP already averages the gradients over the "
            "ranks, so use the plain mean cross-entropy")


@mistake("nothing printed on rank 0")
def silent_rank0(run: Run) -> str | None:
    if run.ranks[0].printed:
        return None
    return "rank 0 printed nothing: print the loss of each epoch on rank 0"


# evaluate_ddp's mistakes: what rank 0 returned, against what each usual mistake would return.

def eval_close(got, want) -> bool:
    return got is not None and all(abs(g - w) <= 1e-5 * max(1.0, abs(w)) for g, w in zip(got, want))


def _returned(run: Run, r: int = 0) -> str:
    loss, acc = run.ranks[r].eval
    return f"rank {r} returned loss {loss:.5f}, accuracy {acc:.4f}"


@mistake("evaluation set read whole on every rank")
def eval_whole_set(run: Run) -> str | None:
    read = len(run.ranks[0].eval_accessed)
    if read < EVAL["n"]:
        return None
    return (f"rank 0 read {read} samples of the {EVAL['n']}-sample evaluation set, the whole of it: give each rank "
            "its shard with DistributedSampler(dataset, shuffle=False) so the ranks split the work")


@mistake("the sampler's padding counted")
def eval_padding_counted(run: Run) -> str | None:
    if not eval_close(run.ranks[0].eval, run.eval_candidates["padding counted"]):
        return None
    dealt = sum(map(len, run.shards()))
    repeats = sorted(i for r, s in enumerate(run.shards()) for j, i in enumerate(s) if j * run.world + r >= EVAL["n"])
    return (f"{_returned(run)}: the mean over the {dealt} samples the samplers dealt out, not over the data set's "
            f"{EVAL['n']}: DistributedSampler pads the shards to equal length by repeating samples (here {repeats}), "
            "and those were counted twice; leave the repeats out of the sums and the count")


@mistake("DistributedSampler built with drop_last=True")
def eval_drop_last(run: Run) -> str | None:
    if not eval_close(run.ranks[0].eval, run.eval_candidates["drop_last=True"]):
        return None
    kept = sum(map(len, run.shards(drop_last=True)))
    return (f"{_returned(run)}: the metric of only {kept} of the {EVAL['n']} samples, as drop_last=True deals them: "
            "an evaluation must see every sample; keep drop_last=False and leave out the repeats it adds instead")


@mistake("metric not all-reduced")
def eval_not_reduced(run: Run) -> str | None:
    got = [r.eval for r in run.ranks]
    if all(eval_close(g, got[0]) for g in got[1:]):
        return None
    own = [r for r in range(run.world) if any(eval_close(got[r], run.eval_candidates[f"rank {r}'s shard{w}"])
                                              for w in ("", " without its repeats"))]
    what = " (each its own shard's)" if len(own) == run.world else ""
    said = f"the ranks returned different metrics{what}: {_returned(run, 0)}, {_returned(run, 1)[5:]}: "
    ops = run.ranks[0].eval_collectives
    rooted = next(((kind, where) for kind, where in ops if kind in ("reduce", "gather")), None)
    if rooted:
        return said + (f"your evaluate_ddp called dist.{rooted[0]} at {rooted[1]}, which leaves the result on its "
                       "dst rank only; dist.all_reduce gives every rank the sums, so every rank returns the data set's")
    if ops:
        made = ", ".join(f"{label(kind)} at {where}" if where else label(kind) for kind, where in ops)
        return said + (f"your evaluate_ddp made {made}, yet the ranks' results differ: reduce every part of the "
                       "metric (the sums and the count) so that every rank returns the data set's")
    return said + ("your evaluate_ddp made no collective, so each rank saw only its shard: all-reduce the sums and "
                   "the count so every rank returns the data set's")


@mistake("the ranks' means averaged")
def eval_mean_of_means(run: Run) -> str | None:
    if not eval_close(run.ranks[0].eval, run.eval_candidates["mean of the ranks' means"]):
        return None
    sizes = [len(s) for s in run.shards()]
    real = [sum(j * run.world + r < EVAL["n"] for j in range(n)) for r, n in enumerate(sizes)]
    return (f"{_returned(run)}, the average of the ranks' means; without the repeats the shards hold {real} samples, "
            "so each rank's mean weighs differently: reduce the sums and the count, and divide once")
