"""Realistic mistakes for exercise 3 (autocast and GradScaler, honest timing and memory, fp16 accumulation)."""
from __future__ import annotations

from benchmarks.realistic import Mistake

_UNSCALE_CLIP = """\
        scaler.unscale_(optimizer)  # true gradients from here on
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
"""

_STEP_UPDATE = """\
        scaler.step(optimizer)      # skipped when unscale_ found inf/NaN
        scaler.update()             # lower the scale after a skip, raise it after a run of good steps
"""

_TIMER = """\
    timer = benchmark.Timer(stmt="fn(); sync()", globals={"fn": fn, "sync": sync},
                            num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time).median
"""

_IMPORTS = "from typing import Callable, Sequence\n"

_PACK = """\
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())
"""

_ACC_BACKWARD = """\
        scaler.scale(micro_loss / k).backward()  # .grad accumulates the scaled mean over the window
        window_losses.append(micro_loss.detach().float())
"""

_ACC_UNSCALE = "    scaler.unscale_(optimizer)  # once per window, after the last backward: the true mean gradient\n"

MISTAKES: list[Mistake] = [
    # train_step ----------------------------------------------------------------------------------------
    Mistake(
        name="clip_before_unscale",
        what="The gradients are clipped before scaler.unscale_, i.e. the scaled gradients are clipped.",
        source="https://kaijuan.co/qa/54716377 (PyTorch AMP examples: unscale_ first, 'then clips as usual')",
        edits={_UNSCALE_CLIP: """\
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.unscale_(optimizer)
"""},
        key_terms=("unscale",),
    ),
    Mistake(
        name="clip_without_unscale",
        what="scaler.unscale_ is never called, so clip_grad_norm_ clips the gradients still multiplied by the "
             "loss scale.",
        source="https://github.com/audio-visual/Basic_Deep_Learning (GradScaler recipe without unscale_, then "
               "clipping added to it)",
        edits={"        scaler.unscale_(optimizer)  # true gradients from here on\n": ""},
        key_terms=("unscale",),
    ),
    Mistake(
        name="update_before_step",
        what="scaler.update() is called before scaler.step(optimizer).",
        source="known GradScaler pitfall: update() ends the iteration, so step() after it unscales again "
               "(https://github.com/Haian-Jin/LVSM/pull/19)",
        edits={_STEP_UPDATE: "        scaler.update()\n        scaler.step(optimizer)\n"},
        key_terms=("update",),
    ),
    Mistake(
        name="optimizer_step_bypasses_scaler",
        what="optimizer.step() replaces scaler.step(optimizer) 'since the gradients are unscaled already', so a "
             "step with inf/NaN gradients is not skipped.",
        source="forum question 'do I still need scaler.step after unscale_?' (torch.amp docs: step skips on inf)",
        edits={"        scaler.step(optimizer)      # skipped when unscale_ found inf/NaN\n":
               "        optimizer.step()            # the gradients are already unscaled\n"},
        key_terms=("inf",),
    ),
    Mistake(
        name="model_cast_to_half",
        what="The model is cast to amp_dtype (model.to(torch.bfloat16)), so the master weights and their "
             "gradients are no longer float32.",
        source="forum habit 'model.half() for mixed precision'; course/03_mixed_precision.py: the parameters "
               "stay float32 and are the master copy",
        edits={"    optimizer.zero_grad()\n    with torch.autocast(device_type=x.device.type":
               "    optimizer.zero_grad()\n"
               "    if amp_dtype is not None:\n"
               "        model.to(amp_dtype)  # run the whole model in 16 bits\n"
               "    with torch.autocast(device_type=x.device.type"},
        key_terms=("float32",),
    ),
    Mistake(
        name="loss_outside_autocast",
        what="Only the forward is under autocast; cross_entropy runs outside it on the 16-bit logits instead of "
             "in float32 as autocast would run it.",
        source="course/03_mixed_precision.py: autocast runs the losses (cross_entropy) in float32; contract: "
               "forward *and* loss under autocast",
        edits={"        loss = nn.functional.cross_entropy(model(x), y)\n    if scaler is None:":
               "        logits = model(x)\n    loss = nn.functional.cross_entropy(logits, y)\n    if scaler is None:"},
        key_terms=("autocast",),
    ),
    # median_seconds ------------------------------------------------------------------------------------
    Mistake(
        name="no_warmup",
        what="median_seconds times from the first call: no untimed warm-up calls.",
        source="https://www.speechmatics.com/company/articles-and-news/timing-operations-in-pytorch "
               "('Warmup steps')",
        edits={"    for _ in range(warmup):\n        fn()\n        sync()\n    timer = benchmark.Timer(":
               "    timer = benchmark.Timer("},
        key_terms=("warm",),
    ),
    Mistake(
        name="sync_not_in_timed_statement",
        what="The Timer's statement is fn() alone, so asynchronous work is not waited for inside the timing.",
        source="https://www.speechmatics.com/company/articles-and-news/timing-operations-in-pytorch "
               "(host-device synchronisation)",
        edits={'stmt="fn(); sync()"': 'stmt="fn()"'},
        key_terms=("sync",),
    ),
    Mistake(
        name="sync_after_reading_clock",
        what="A hand-written perf_counter loop reads the clock right after fn() and only then calls sync(), "
             "so each call measures the launch, not the work.",
        source="https://www.codegenes.net/blog/pytorch-cuda-async-for-measuring-time (time.time around an "
               "asynchronous CUDA call)",
        edits={
            _IMPORTS: "import statistics\nimport time\n" + _IMPORTS,
            _TIMER: """\
    times = []
    while len(times) < 10 or sum(times) < min_run_time:  # enough calls for a median
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        sync()  # wait for the device before the next call
    return statistics.median(times)
""",
        },
        key_terms=("sync",),
    ),
    Mistake(
        name="timeit_fixed_number",
        what="Timer.timeit(number=10) replaces blocked_autorange: a single block of 10 calls whose 'median' is "
             "their mean, outliers included, and min_run_time is ignored.",
        source="torch.utils.benchmark recipe starts with Timer.timeit(100) "
               "(https://pytorch.org/tutorials/recipes/recipes/benchmark.html)",
        edits={"return timer.blocked_autorange(min_run_time=min_run_time).median":
               "return timer.timeit(number=10).median"},
        key_terms=("median",),
    ),
    # saved_bytes -----------------------------------------------------------------------------------------
    Mistake(
        name="bytes_per_saved_tensor",
        what="saved_bytes adds numel * element_size for every tensor packed, so a storage saved several times "
             "(or as views) is counted several times.",
        source="naive memory count; course/03_mixed_precision.py asks for one count per distinct storage",
        edits={_PACK: """\
    sizes: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        sizes.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(sizes)
"""},
        key_terms=("storage",),
    ),
    Mistake(
        name="storage_bytes_not_deduplicated",
        what="saved_bytes adds the storage's nbytes for every tensor packed, without remembering which storages "
             "were already counted.",
        source="half of the docstring's recipe (untyped_storage().nbytes()) without its 'once per distinct storage'",
        edits={"        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()\n":
               "        storages[len(storages)] = t.untyped_storage().nbytes()\n"},
        key_terms=("storage",),
    ),
    # compare ---------------------------------------------------------------------------------------------
    Mistake(
        name="speedup_inverted",
        what="speedup is candidate_s / baseline_s, the inverse of the contract's baseline_s / candidate_s.",
        source="common ratio slip (time ratio vs speed ratio); course/03 'an inverted ratio fails'",
        edits={'"speedup": baseline_s / candidate_s': '"speedup": candidate_s / baseline_s'},
        key_terms=("speedup",),
    ),
    Mistake(
        name="compare_drops_timing_settings",
        what="compare calls median_seconds with its defaults, ignoring the warmup and min_run_time it was given.",
        source="forgotten keyword forwarding in a wrapper",
        edits={"    baseline_s = median_seconds(baseline, sync, warmup=warmup, min_run_time=min_run_time)\n"
               "    candidate_s = median_seconds(candidate, sync, warmup=warmup, min_run_time=min_run_time)\n":
               "    baseline_s = median_seconds(baseline, sync)\n"
               "    candidate_s = median_seconds(candidate, sync)\n"},
        key_terms=("warmup",),
    ),
    # accumulated_step ------------------------------------------------------------------------------------
    Mistake(
        name="unscale_every_micro_batch",
        what="scaler.unscale_ is called after every micro-batch's backward, which a GradScaler refuses a second "
             "time before update() (and would divide partial sums).",
        source="https://github.com/microsoft/Swin-Transformer/issues/311 ('unscale_() has already been called on "
               "this optimizer since the last update()')",
        edits={"        window_losses.append(micro_loss.detach().float())\n" + _ACC_UNSCALE:
               "        scaler.unscale_(optimizer)\n        window_losses.append(micro_loss.detach().float())\n"},
        key_terms=("unscale",),
    ),
    Mistake(
        name="micro_losses_not_divided_by_k",
        what="Each micro-batch's mean loss is scaled and back-propagated undivided, so .grad holds the sum of the "
             "k micro-batch means, k times the batch mean's gradient.",
        source="https://github.com/karpathy/nanoGPT/issues/206 (loss not divided by the accumulation steps)",
        edits={"scaler.scale(micro_loss / k).backward()": "scaler.scale(micro_loss).backward()"},
        key_terms=("mean",),
    ),
    Mistake(
        name="zero_grad_every_micro_batch",
        what="optimizer.zero_grad() runs before each micro-batch, so only the last micro-batch's gradient "
             "reaches the step.",
        source="copying train_step's zero_grad into the micro-batch loop",
        edits={"    for xs, ys in micro_batches:\n": "    for xs, ys in micro_batches:\n        optimizer.zero_grad()\n"},
        key_terms=("zero_grad",),
    ),
    Mistake(
        name="one_backward_of_summed_losses",
        what="The micro-batch losses are summed and back-propagated once at the end, so every micro-batch's "
             "activations stay alive together (one backward instead of k).",
        source="https://github.com/meta-pytorch/torchtune/pull/1875 (accumulate the losses, then one "
               "loss.backward() at the step)",
        edits={
            _ACC_BACKWARD: "        window_losses.append(micro_loss)\n",
            _ACC_UNSCALE: "    scaler.scale(torch.stack(window_losses).mean()).backward()\n" + _ACC_UNSCALE,
            "    return torch.stack(window_losses).mean()\n":
                "    return torch.stack(window_losses).mean().detach().float()\n",
        },
        key_terms=("backward",),
    ),
    Mistake(
        name="returns_last_micro_loss",
        what="accumulated_step returns the last micro-batch's loss instead of the whole batch's mean.",
        source="returning the loop variable 'loss' from an accumulation loop (nanoGPT-style logging of the last "
               "micro-step)",
        edits={"    return torch.stack(window_losses).mean()\n": "    return micro_loss.detach().float()\n"},
        key_terms=("loss",),
    ),
]

LEGAL: list[Mistake] = [
    Mistake(
        name="perf_counter_median",
        what="median_seconds is a hand-written loop: warm-up, then time.perf_counter() around fn(); sync() until "
             "min_run_time is measured, and statistics.median of the per-call times.",
        source="the docstring's other option ('or time.perf_counter')",
        edits={
            _IMPORTS: "import statistics\nimport time\n" + _IMPORTS,
            _TIMER: """\
    times = []
    while len(times) < 10 or sum(times) < min_run_time:  # enough calls for a median
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
""",
        },
    ),
    Mistake(
        name="from_time_import_perf_counter",
        what="The same hand-written perf_counter median, with 'from time import perf_counter'.",
        source="common import style for timing code",
        edits={
            _IMPORTS: "import statistics\nfrom time import perf_counter\n" + _IMPORTS,
            _TIMER: """\
    times = []
    while len(times) < 10 or sum(times) < min_run_time:  # enough calls for a median
        start = perf_counter()
        fn()
        sync()
        times.append(perf_counter() - start)
    return statistics.median(times)
""",
        },
    ),
    Mistake(
        name="explicit_autocast_branch",
        what="train_step runs the forward and loss plainly when amp_dtype is None and inside "
             "torch.autocast(..., dtype=amp_dtype) otherwise, instead of one autocast with enabled=.",
        source="PyTorch AMP recipe style (https://pytorch.org/tutorials/recipes/recipes/amp_recipe.html)",
        edits={"""\
    with torch.autocast(device_type=x.device.type, dtype=amp_dtype or torch.bfloat16,
                        enabled=amp_dtype is not None):
        loss = nn.functional.cross_entropy(model(x), y)
""": """\
    if amp_dtype is None:
        loss = nn.functional.cross_entropy(model(x), y)
    else:
        with torch.autocast(device_type=x.device.type, dtype=amp_dtype):
            loss = nn.functional.cross_entropy(model(x), y)
"""},
    ),
]
