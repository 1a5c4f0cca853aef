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
}
