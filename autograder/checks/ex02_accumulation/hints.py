"""Exercise 2's hints: for each criterion (its function's name), three tiers, 1 why it matters, 2
the mechanism, 3 the API; none gives the whole answer."""
from __future__ import annotations

HINTS: dict[str, tuple[str, str, str]] = {
    "first_window_gradient": (
        "Accumulation must be invisible to the optimizer: after a window, .grad should hold exactly what one "
        "backward of the whole window's batch would leave, or the step that follows is a different step.",
        "backward() adds into .grad; the mean over N samples is a weighted sum of the micro-batches' means.",
        "Scale what you back-propagate so each sample's loss is weighted by 1/N; the optimizer steps once.",
    ),
    "equal_parameters": (
        "An error in one window compounds: every later step starts from weights the reference never had, so every "
        "window, not only the first, must be the step of its big batch.",
        "What is left in .grad when the next window starts is added to its gradients.",
        "The optimizer's step, then its zero_grad, once per window, after the window's last backward.",
    ),
    "step_per_window": (
        "Stepping after every micro-batch takes k small steps where the big batch takes one: more updates, each on a "
        "noisier gradient, and the run no longer trains like the big batch it stands for.",
        "Zeroing inside a window throws away micro-batches; zeroing before the step throws away all of them.",
        "Use windows(len(micro_batches), accumulation_steps) to find the last micro-batch of each window.",
    ),
    "allreduce_per_window": (
        "Accumulation exists to communicate once per window: averaging over the ranks after every micro-batch sends "
        "k times the bytes for the same result.",
        "DDP all-reduces at the end of every backward unless told not to; the last backward must sync.",
        "model.no_sync() is a context manager of the DistributedDataParallel wrapper.",
    ),
    "differ_inside_window": (
        "If the ranks already agree in the middle of a window, they communicated in the middle of it: the all-reduce "
        "that accumulation is meant to save was paid anyway.",
        "If the ranks' gradients already agree mid-window, DDP averaged them: one all-reduce too many.",
        "Put the forward and the backward of every micro-step but the last inside model.no_sync().",
    ),
    "unequal_parameters": (
        "A micro-batch of 12 samples carries three times the weight of one of 4 in the big batch's mean; treating "
        "the micro-batches as equals over-weights every sample of the small one.",
        "Dividing each mean by the number of micro-batches is right only when they are all the same size.",
        "Weight each micro-batch by its share of the window's samples, or sum and divide once by N.",
    ),
    "short_window_parameters": (
        "The last window may hold fewer micro-batches than accumulation_steps; it still deserves a step, or its "
        "samples are dropped from the epoch, and scaling it as a full window shrinks that step.",
        "Its normaliser is its own number of samples, not what a full window would hold.",
        "Compute N from the window's micro-batches themselves rather than from accumulation_steps.",
    ),
    "token_parameters": (
        "The big batch's loss is a mean over tokens, all of the window's tokens on all ranks: a mean of "
        "per-micro-batch means weights a token of a short sequence more than one of a long sequence.",
        "A rank sees only its own tokens, and DDP divides the ranks' summed gradients by the world size.",
        "cross_entropy(..., reduction='sum') ignores label -100; dist.all_reduce sums a count over the ranks.",
    ),
    "four_rank_token_parameters": (
        "The same code runs on 2 GPUs, on 8, and on several machines: a loop that is right only at the world size "
        "it was written for trains a different model the day the job grows.",
        "DDP divides the ranks' summed gradients by the number of ranks in the process group, not by the number "
        "of processes or GPUs on one machine.",
        "torch.distributed tells each rank the size of its process group; torchrun's LOCAL_* variables describe "
        "one node only.",
    ),
}
