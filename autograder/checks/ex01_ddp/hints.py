"""Exercise 1's hints: for each criterion (its function's name), three tiers, 1 a nudge towards the
concept, 2 the mechanism, 3 the API; none gives the whole answer."""
from __future__ import annotations

HINTS: dict[str, tuple[str, str, str]] = {
    "same_parameters": (
        "Each rank built its model from its own seed: something must make them start, and stay, equal.",
        "The ranks must start from the same weights and take the same step from the same averaged gradient.",
        "torch.nn.parallel.DistributedDataParallel broadcasts at construction; call forward through the wrapper.",
    ),
    "own_shard": (
        "W processes reading the same data do the same work W times.",
        "Each rank should read a different 1/W of the samples each epoch, together covering all of them.",
        "torch.utils.data.distributed.DistributedSampler, given to the DataLoader as sampler=, the same seed on all.",
    ),
    "reshuffled": (
        "A shuffle that never changes is an order, not a shuffle.",
        "The sampler derives its permutation from its seed and an epoch number that you must advance.",
        "DistributedSampler.set_epoch, given the epoch number, before the epoch's first batch.",
    ),
    "matches_reference": (
        "W ranks of batch_size each are one step of a W x batch_size batch: the same lr, the same loss.",
        "DDP averages the ranks' gradients: scaling the loss, the lr or the gradients again changes the step.",
        "Plain torch.optim.SGD(lr=lr) on the mean cross-entropy, the DataLoader's batch_size as given.",
    ),
    "only_rank0_logs": (
        "Every rank runs the same script: every print appears W times.",
        "Only one rank needs to report; the others hold the same model.",
        "dist.get_rank() == 0 guards the print.",
    ),
    "rank0_saves_once": (
        "W ranks writing the same file race each other for nothing.",
        "Save the unwrapped model's weights, on one rank: the wrapper adds a prefix to every key.",
        "torch.save of the wrapped model's .module state_dict, on the rank whose dist.get_rank() is 0 only.",
    ),
    "evaluates_once": (
        "21 samples do not split evenly over 2 or 4 ranks, yet the sampler gives every rank as many.",
        "DistributedSampler pads the index list by repeating its head; a metric is a sum and a count over ranks.",
        "Read DistributedSampler.__iter__ to see which positions are the repeats; dist.all_reduce sums tensors.",
    ),
    "teardown_destroys": (
        "A process group holds sockets and threads until it is closed.",
        "Leave the group you joined in setup().",
        "torch.distributed's destroy_process_group, with no arguments.",
    ),
}
