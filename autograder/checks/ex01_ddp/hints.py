"""Exercise 1's hints: for each criterion (its function's name), three tiers, 1 why it matters, 2
the mechanism, 3 the API; none gives the whole answer."""
from __future__ import annotations

HINTS: dict[str, tuple[str, str, str]] = {
    "same_parameters": (
        "DDP's promise is one model trained on W ranks at once; replicas that start from different weights, or drift "
        "apart, are W different models, and averaging their gradients mixes updates meant for weights no rank holds.",
        "The ranks must start from the same weights and take the same step from the same averaged gradient.",
        "torch.nn.parallel.DistributedDataParallel broadcasts at construction; call forward through the wrapper.",
    ),
    "own_shard": (
        "Ranks that read the same samples compute the same gradient W times: the job costs W times the machines and "
        "learns no faster than one process.",
        "Each rank should read a different 1/W of the samples each epoch, together covering all of them.",
        "torch.utils.data.distributed.DistributedSampler, given to the DataLoader as sampler=, the same seed on all.",
    ),
    "reshuffled": (
        "Without a new permutation every epoch, each rank gets the same shard in the same order every epoch: the "
        "batches repeat exactly, which is not the shuffled training one process does, and the runs part from the "
        "second epoch on.",
        "The sampler derives its permutation from its seed and an epoch number that you must advance.",
        "DistributedSampler.set_epoch, given the epoch number, before the epoch's first batch.",
    ),
    "matches_reference": (
        "Data parallelism is only a speed-up if W ranks of batch_size take exactly the step one process takes on W x "
        "batch_size samples; any extra factor on the loss, the lr or the gradients changes the step size, and "
        "training goes elsewhere.",
        "DDP averages the ranks' gradients: scaling the loss, the lr or the gradients again changes the step.",
        "Plain torch.optim.SGD(lr=lr) on the mean cross-entropy, the DataLoader's batch_size as given.",
    ),
    "only_rank0_logs": (
        "Every rank runs the same script, so an unguarded print appears W times: on 8 GPUs the log is eight "
        "interleaved copies, and the one line that matters gets lost in them.",
        "Only one rank needs to report; the others hold the same model.",
        "dist.get_rank() == 0 guards the print.",
    ),
    "rank0_saves_once": (
        "W ranks writing the same file at once race each other: the file can hold parts of different writes, and it "
        "costs W times the I/O for one copy of the same weights.",
        "Save the unwrapped model's weights, on one rank: the wrapper adds a prefix to every key.",
        "torch.save of the wrapped model's .module state_dict, on the rank whose dist.get_rank() is 0 only.",
    ),
    "evaluates_once": (
        "21 samples do not split evenly over 2 or 4 ranks, yet the sampler gives every rank as many: some samples "
        "are counted twice, and an accuracy with repeats is not the accuracy of the data set.",
        "DistributedSampler pads the index list by repeating its head; a metric is a sum and a count over ranks.",
        "Read DistributedSampler.__iter__ to see which positions are the repeats; dist.all_reduce sums tensors.",
    ),
    "teardown_destroys": (
        "A process group holds sockets and threads (on GPUs, communicators) until it is closed: a job that leaves it "
        "open can hang at exit, or leak it into the next run in the same process, as a notebook's kernel does.",
        "Leave the group you joined in setup().",
        "torch.distributed's destroy_process_group, with no arguments.",
    ),
}
