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
    "evaluates_without_autograd": (
        "A forward that autograd records keeps what each layer saves for a backward; evaluation never calls one, so "
        "that memory is held for nothing, batch after batch.",
        "Whether autograd records is a mode of the thread: switch it off around the whole evaluation loop.",
        "torch.no_grad() or torch.inference_mode(), as a context manager around the loop over the DataLoader.",
    ),
    "teardown_destroys": (
        "Every rank joins one process group before its first collective, with the backend its machine has (gloo on "
        "CPUs, NCCL on GPUs); the group holds sockets and threads (on GPUs, communicators) until it is closed: a job "
        "that leaves it open can hang at exit, or leak it into the next run in the same process, as a notebook's "
        "kernel does.",
        "setup() joins with the backend distlab.backend() picks; teardown() leaves the group setup() joined.",
        "torch.distributed's init_process_group(backend=distlab.backend(), timeout=...) and destroy_process_group, "
        "with no arguments.",
    ),
    "bucketed_matches": (
        "A data-parallel step is only one process's step if every rank starts from the same weights and steps with "
        "the same gradient, the mean of the ranks' own: anything else trains W models, or one with the wrong step.",
        "Broadcast the weights once from rank 0; then all-reduce sums, so divide by W, and the reduced values must end "
        "up in each parameter's .grad before the optimizer reads them, not in a copy nobody reads.",
        "dist.broadcast(tensor, src=0); a Work from dist.all_reduce(..., async_op=True) finishes at its wait(); "
        "torch.Tensor.split and copy_ move a flat buffer's pieces back.",
    ),
    "bucketed_buckets": (
        "One collective costs a fixed latency whatever its size: thousands of small all-reduces pay it thousands of "
        "times, one huge one cannot start before the last gradient; buckets of about bucket_cap_mb are the trade.",
        "Walk the parameters in the order the backward produces their gradients (the reverse of registration), "
        "adding each to the current bucket; the bucket is full once its bytes reach the cap.",
        "bucket_cap_mb is in MiB (2**20 bytes), as in DistributedDataParallel; a tensor's bytes are numel() * "
        "element_size().",
    ),
    "bucketed_overlap": (
        "The point of buckets is to communicate while the backward is still computing the earlier layers' gradients: "
        "an all-reduce that waits for the end of the backward, or blocks it, hides nothing.",
        "A bucket can go as soon as its own last gradient is accumulated; start it then, without waiting for it, and "
        "wait only when the optimizer needs the result.",
        "Tensor.register_post_accumulate_grad_hook(hook) runs hook(param) once param.grad is accumulated; "
        "dist.all_reduce(t, async_op=True) returns a Work.",
    ),
    "bucketed_unused": (
        "Real models have branches a batch does not take: a parameter with no gradient never calls its hook, and a "
        "bucket that waits for it never goes, so the other parameters in it are never averaged (DDP's "
        "find_unused_parameters exists for this).",
        "After the backward, some buckets may not have gone: either send them anyway, counting the missing gradient "
        "as zeros, or stop with an error that says which parameter had none.",
        "A parameter without a gradient has .grad None; module.named_parameters() gives the names.",
    ),
}
