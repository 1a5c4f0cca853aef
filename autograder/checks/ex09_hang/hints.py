"""Three tiers of hints per criterion of exercise 9 (1: the concept, 2: the mechanism, 3: the API)."""
from __future__ import annotations

HINTS: dict[str, tuple[str, str, str]] = {
    "finishes": (
        "A collective completes only when every rank calls it, in the same order, with the same shapes: a rank that "
        "skips one leaves the others waiting, with no error, until a timeout ends the job.",
        "Find the branch that depends on one rank's data and skips a collective there; the stack of each rank "
        "(or TORCH_DISTRIBUTED_DEBUG=DETAIL) shows the two ranks in different collectives.",
        "Remove the early `continue`: `cross_entropy(model(x[keep]), y[keep], reduction='sum')` of an empty "
        "selection is 0 and its backward gives zero gradients, so every rank can run the same `dist.all_reduce`s.",
    ),
    "same_collectives": (
        "Fixing a hang by removing the communication removes what made it one job: the ranks then finish, but each "
        "trains a model of its own, and nothing reports that they differ.",
        "Every rank all-reduces the number of kept samples and each gradient at every step.",
        "`dist.all_reduce` of the kept-sample count, then of every parameter's `.grad` (zeros where nothing was kept), "
        "on every rank at every step.",
    ),
    "matches_reference": (
        "The job means one SGD step on the mean loss over the global batch's kept samples: a rank whose samples are "
        "dropped, or counted twice, changes that mean, and the fix for the hang has changed what is trained.",
        "Sum the losses locally, all-reduce the sums' gradients and the counts, then divide.",
        "Subtract lr times the all-reduced gradient over the all-reduced count; skip the update only where that "
        "global count is 0.",
    ),
    "empty_rank_takes_part": (
        "A rank with nothing to keep still has a share of the sum, zero: if it leaves the collective out, the ranks "
        "that do call it wait for it forever.",
        "It makes the same all-reduces as the others, sending zeros; the others still learn from their samples.",
        "Let the empty rank run the step as usual (zero_grad, a backward of a 0 loss) so p.grad is zero, not stale.",
    ),
    "uneven_finishes": (
        "A data set rarely splits evenly over the ranks, so one rank runs out first; if it leaves its loop, the ranks "
        "that still have data wait for it in the next collective, silently, until the job's timeout ends it.",
        "A rank out of data does not leave: each step it makes the same collectives as the others with nothing to add "
        "(zeros, a count of 0), and every rank learns from one shared number when no rank has a batch left.",
        "By hand: at the top of each step take `next(it, None)`, all-reduce the number of samples this rank has (0 "
        "when none) and return when the sum is 0. With DDP: train through `ddp = DistributedDataParallel(model)` "
        "inside `with ddp.join(...):` (or `Join([ddp], ...)`), whose hooks shadow the others' all-reduces.",
    ),
    "uneven_matches": (
        "The job is one model trained on every sample once, in the order of the global stream: when only some "
        "ranks have data, the step is still the mean over the samples that exist, not shrunk by the ranks without.",
        "At a step where k of W ranks have a batch, the summed gradient is divided by the samples of those k ranks "
        "only; every rank, out of data or not, applies that update or receives the final weights.",
        "Divide by the all-reduced count of the step's samples. With DDP, `join(divide_by_initial_world_size=False)` "
        "averages over the ranks that have not joined instead of the initial world size (every batch holds as many "
        "samples, so that is the same mean).",
    ),
    "uneven_no_batch": (
        "A rank that never gets a single batch is still part of the job: it must join every collective of every step "
        "and end with the same trained weights as the others, or the job hangs or returns different models.",
        "With no batch at all the rank never runs a forward or a backward, so nothing of its own can be all-reduced: "
        "what it sends is zeros shaped like the gradients, and it still applies the others' updates.",
        "Build its zero gradients from the parameters (`torch.zeros_like(p)` where `p.grad is None`), not from a batch "
        "it never had; DDP's `join()` does this for a rank that joins before its first step.",
    ),
    "uneven_equal": (
        "When every rank has as many batches, the uneven machinery must change nothing at all: the job is then "
        "ordinary data-parallel training, one step per batch, exactly what one process computes on the whole batch.",
        "Each step every rank has a batch, so the count is the whole global batch; the stop signal must come after the "
        "last step, not before it and not one round too late.",
        "Check the loop's exit: it returns on the step whose all-reduced count is 0, before any update (0 / 0 would "
        "make every weight NaN).",
    ),
    "uneven_wide": (
        "A job of two ranks cannot tell a sum over every rank from a sum with one partner: with more ranks, each "
        "group that only sums its own trains a model of its own, and the job returns as many models as groups.",
        "Every step's gradients and sample counts are summed over all of the job's ranks, whichever have data, so "
        "that every rank applies the one update of the whole global batch, at any world size.",
        "Use a collective on the default group (`dist.all_reduce(t)` with no `group=`), not `dist.send`/`dist.recv` "
        "with a peer rank or a group from `dist.new_group` of some of the ranks; DDP's gradient all-reduce "
        "covers every rank of its process group.",
    ),
}
