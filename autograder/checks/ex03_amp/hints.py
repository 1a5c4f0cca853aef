"""Exercise 3's hints, three tiers per criterion (``check(3, hint=k)``; :mod:`autograder.commands.check`).

1: why it matters, 2: the mechanism, 3: the API to use. Plain data, read on its own
(:func:`autograder.grader.registry.hints`): no imports. Mixed precision as Micikevicius et al. (2018) define
it: 16-bit matmuls, float32 master weights, loss scaling for float16.
"""

HINTS: dict[str, tuple[str, str, str]] = {
    "autocast_dtypes": (
        "Mixed precision keeps two copies of the numbers apart: the weights the optimizer updates stay "
        "float32, only the arithmetic of the forward pass is done in 16 bits.",
        "The lower precision is chosen per operation while the forward runs, not stored in the model: "
        "matmuls (nn.Linear) cast their inputs down, losses and reductions stay float32. Casting the model "
        "itself makes the master weights and their gradients 16-bit.",
        "Wrap the forward pass and the loss (not the backward) in a torch.autocast context whose "
        "device_type is the input's device type and whose dtype is amp_dtype; leave the model's .to() alone.",
    ),
    "float32_parity": (
        "With amp_dtype=None the step is an ordinary float32 training step: the grader replays the "
        "contract's order in one process and compares the weights.",
        "Each step starts from empty gradients, computes the mean cross-entropy, backpropagates, limits the "
        "gradients' total norm to max_norm, and only then lets the optimizer update the weights, once.",
        "optimizer.zero_grad, nn.functional.cross_entropy (mean reduction), loss.backward, "
        "torch.nn.utils.clip_grad_norm_ over model.parameters(), optimizer.step: in that order.",
    ),
    "losses_close": (
        "The loss you return is what the learner watches: it must be the same quantity in float32, "
        "bfloat16 and float16, whatever happens to it inside the step.",
        "Return the batch's mean loss as computed by the forward pass, not a sum over the batch and not "
        "the loss after the scaler multiplied it for the backward (that one is larger by the scale).",
        "Keep the unscaled loss tensor, return it detached and as float32 (.detach().float()); use "
        "cross_entropy's default mean reduction.",
    ),
    "scaler_order": (
        "float16's small exponent makes small gradients round to zero; the GradScaler multiplies the loss "
        "up for the backward and divides the gradients back down before anything reads them.",
        "The order is: scale the loss and backpropagate it, unscale the gradients, clip the true gradients, "
        "let the scaler step the optimizer, then update the scale. Clipping before unscaling clips "
        "gradients that are still multiplied by the scale.",
        "GradScaler's scale(loss) (call backward on what it returns), unscale_(optimizer), then "
        "clip_grad_norm_, step(optimizer) instead of optimizer.step(), and update() once per step.",
    ),
    "inf_step_skipped": (
        "With loss scaling an overflow is expected now and then; a scaled step must survive it without "
        "changing the weights.",
        "The scaler finds inf/NaN gradients when it unscales them and then skips the optimizer's step; "
        "update() afterwards lowers the scale so the next step is less likely to overflow.",
        "Step through the scaler's step(optimizer), never optimizer.step() directly, and call the scaler's "
        "update() after every step, skipped or not.",
    ),
    "steady_speedup": (
        "A speedup is a ratio of two times, each of them one call's typical cost: if either time is not typical, the "
        "ratio promises a gain, or a loss, that training will not see.",
        "Time each function the same way, then divide the baseline's time by the candidate's: above 1 means "
        "the candidate is faster.",
        "In compare, speedup is baseline_s / candidate_s, each from your median_seconds with the same sync, "
        "warmup and min_run_time.",
    ),
    "warmup_speedup": (
        "The first calls of a real training step are not typical: memory is allocated, kernels chosen, "
        "caches filled.",
        "Run the function (and its sync) a few times untimed before you start the clock, so the slow first "
        "calls are not in the measurement.",
        "In median_seconds, loop warmup times calling fn() and sync() before any timing.",
    ),
    "async_speedup": (
        "On a GPU a call returns when its work is queued, not when it is done: a host clock read right "
        "after it measures the queueing.",
        "Time the function together with the synchronisation that waits for its work, every call, so the "
        "clock stops when the work has finished.",
        "Time fn() followed by sync() as one statement (a torch.utils.benchmark.Timer stmt, or both between "
        "two time.perf_counter() readings).",
    ),
    "outliers_speedup": (
        "One call interrupted by the machine can be ten times slower than the rest; a summary of many calls "
        "should not move because of it.",
        "The mean is dragged by a single slow call; the median is not. Measure many calls (at least "
        "min_run_time seconds in all) and take the median per-call time.",
        "torch.utils.benchmark.Timer's blocked_autorange(min_run_time=...) returns a Measurement whose "
        ".median is the per-call median; or statistics.median over perf_counter differences.",
    ),
    "memory_ratio": (
        "Autograd keeps tensors for the backward; what costs memory is their storage, and several tensors "
        "(views, the same weight used twice) can share one.",
        "Count each saved tensor's underlying storage once, at its full size, however many saved tensors "
        "point into it; the ratio is the candidate's bytes over the baseline's.",
        "torch.autograd.graph.saved_tensors_hooks(pack, unpack): in pack, key by "
        "t.untyped_storage().data_ptr() and record t.untyped_storage().nbytes(); memory_ratio is "
        "candidate_bytes / baseline_bytes.",
    ),
    "gpu_speedup": (
        "bf16 pays off where the hardware has 16-bit matrix units: the step must really run in bf16 and be "
        "timed honestly.",
        "Check that the forward runs under autocast (the matmuls are bf16) and that each timed call waits "
        "for the GPU's work before the clock stops.",
        "torch.autocast(device_type='cuda', dtype=torch.bfloat16) around the forward and loss, and "
        "torch.cuda.synchronize as the sync in median_seconds.",
    ),
    "accumulation_parity": (
        "A window of k micro-batches must take the step the whole batch would have taken: the optimizer "
        "sees one gradient per window, the mean over all of its samples.",
        "Backward adds into .grad, so k backwards of each micro-batch's mean loss add up k means: the sum is "
        "k times the batch's mean gradient unless each term is weighted. The scale multiplies every term "
        "the same way and comes off once, at the end.",
        "Per micro-batch: the forward and loss under torch.autocast with float16, then backward on the "
        "scaler's scale of that loss divided by k; return the mean of the unscaled micro-losses, detached.",
    ),
    "accumulation_order": (
        "A GradScaler keeps a state per optimizer between two updates: what it has already unscaled, and "
        "whether it found an inf. Ask which of its calls belong to a micro-batch and which to the window.",
        "Unscaling divides whatever .grad holds at that moment, and may happen once before step; clipping "
        "must see the true gradient of the whole window; the scale may change only after the window's step.",
        "After the loop over the micro-batches, not inside it: the scaler's unscale_ on the optimizer, then "
        "clip_grad_norm_ over the model's parameters, then the scaler's step and its update, once each.",
    ),
    "accumulation_overflow": (
        "An overflow in any micro-batch poisons the window's accumulated gradient: the window is one step, "
        "so it is skipped as one.",
        "The scaler checks the accumulated gradients for inf/NaN when it unscales them, skips the step if it "
        "found any, and lowers the scale when it updates: once per window, so the scale halves once.",
        "One call of the scaler's step (given the optimizer) and one of its update per window, after the last "
        "micro-batch's backward; neither the optimizer's own step nor the scaler's update inside the loop.",
    ),
}
