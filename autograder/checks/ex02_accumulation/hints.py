"""Exercise 2's hints: for each criterion (its function's name), three tiers, 1 a nudge towards the
concept, 2 the mechanism, 3 the API; none gives the whole answer."""
from __future__ import annotations

HINTS: dict[str, tuple[str, str, str]] = {
    "first_window_gradient": (
        "After a window, .grad should hold exactly what one backward of the whole window's batch would leave.",
        "backward() adds into .grad; the mean over N samples is a weighted sum of the micro-batches' means.",
        "Scale what you back-propagate so each sample's loss is weighted by 1/N; the optimizer steps once.",
    ),
    "equal_parameters": (
        "Every window must be the step of its big batch, not only the first one.",
        "What is left in .grad when the next window starts is added to its gradients.",
        "The optimizer's step, then its zero_grad, once per window, after the window's last backward.",
    ),
    "step_per_window": (
        "One optimizer step stands for a whole window of micro-batches.",
        "Zeroing inside a window throws away micro-batches; zeroing before the step throws away all of them.",
        "Use windows(len(micro_batches), accumulation_steps) to find the last micro-batch of each window.",
    ),
    "allreduce_per_window": (
        "Only the sum at the end of a window needs averaging over the ranks.",
        "DDP all-reduces at the end of every backward unless told not to; the last backward must sync.",
        "model.no_sync() is a context manager of the DistributedDataParallel wrapper.",
    ),
    "differ_inside_window": (
        "In the middle of a window each rank holds only its own partial sum.",
        "If the ranks' gradients already agree mid-window, DDP averaged them: one all-reduce too many.",
        "Put the forward and the backward of every micro-step but the last inside model.no_sync().",
    ),
    "unequal_parameters": (
        "A micro-batch of 12 samples carries three times the weight of one of 4 in the big batch's mean.",
        "Dividing each mean by the number of micro-batches is right only when they are all the same size.",
        "Weight each micro-batch by its share of the window's samples, or sum and divide once by N.",
    ),
    "short_window_parameters": (
        "The last window may hold fewer micro-batches than accumulation_steps; it still deserves a step.",
        "Its normaliser is its own number of samples, not what a full window would hold.",
        "Compute N from the window's micro-batches themselves rather than from accumulation_steps.",
    ),
    "token_parameters": (
        "The big batch's loss is a mean over tokens, all of the window's tokens on all ranks; count them.",
        "A rank sees only its own tokens, and DDP divides the ranks' summed gradients by the world size.",
        "cross_entropy(..., reduction='sum') ignores label -100; dist.all_reduce sums a count over the ranks.",
    ),
}
