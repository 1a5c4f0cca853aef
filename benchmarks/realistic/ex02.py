"""Realistic mistakes for exercise 2 (gradient accumulation under DDP), and legal other styles."""
from __future__ import annotations

from benchmarks.realistic import Mistake

_SCALED = "                loss = summed * (world / count.item())\n"

_MICRO_STEP = """\
            context = contextlib.nullcontext() if boundary else model.no_sync()
            with context:
                logits = model(x)
                summed = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                                     ignore_index=IGNORE_INDEX, reduction="sum")
                # DDP divides the ranks' summed gradients by world: multiply it back.
                loss = summed * (world / count.item())
                loss.backward()
"""

_LOOP = """\
    losses = []
    for window in windows(len(micro_batches), accumulation_steps):
        # N: the window's non-padding labels on every rank, known before the first backward.
        count = sum((micro_batches[i][1] != IGNORE_INDEX).sum() for i in window)
        count = torch.as_tensor(count, dtype=torch.float64, device=micro_batches[window[0]][1].device)
        dist.all_reduce(count)
        window_loss = 0.0
        for i in window:
            x, y = micro_batches[i]
            boundary = i == window[-1]
            # Skip DDP's all-reduce until the last micro-batch of the window.
""" + _MICRO_STEP + """\
            window_loss += summed.item() / count.item()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(window_loss)
    return losses
"""

MISTAKES: list[Mistake] = [
    Mistake(
        name="mean_loss_divided_by_accumulation_steps",
        what="Each micro-batch's mean loss is divided by accumulation_steps: wrong for unequal micro-batches, "
             "padded sequences and the short last window.",
        source="tutorial habit 'loss = loss / args.gradient_accumulation_steps' "
               "(https://github.com/karpathy/nanoGPT/issues/206)",
        edits={_SCALED: """\
                loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                                   ignore_index=IGNORE_INDEX) / accumulation_steps
"""},
        key_terms=("mean",),
    ),
    Mistake(
        name="mean_of_micro_batch_means",
        what="Each micro-batch's mean loss is divided by the window's length, a mean of means that "
             "over-weights small micro-batches and short sequences.",
        source="course/02_gradient_accumulation.py warns 'a mean of their means is not that mean'; "
               "https://github.com/huggingface/transformers/pull/34191",
        edits={_SCALED: """\
                loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                                   ignore_index=IGNORE_INDEX) / len(window)
"""},
        key_terms=("mean",),
    ),
    Mistake(
        name="count_includes_padding",
        what="N counts every label, the IGNORE_INDEX padding included, so padded windows are under-weighted.",
        source="https://github.com/karpathy/nanochat/pull/59 (normalise by the non-padding token count)",
        edits={"count = sum((micro_batches[i][1] != IGNORE_INDEX).sum() for i in window)":
               "count = sum(micro_batches[i][1].numel() for i in window)"},
        key_terms=("padding",),
    ),
    Mistake(
        name="local_token_count_only",
        what="Each rank normalises by its own token count and relies on DDP's average, giving the mean of the "
             "ranks' means instead of the mean over all ranks' tokens.",
        source="course/02_gradient_accumulation.py: 'N counts the tokens of all ranks, while each rank can count "
               "only its own'",
        edits={
            "        dist.all_reduce(count)\n": "",
            _SCALED: "                loss = summed / count.item()  # this rank's token mean; DDP averages the ranks\n",
        },
        key_terms=("rank",),
    ),
    Mistake(
        name="missing_world_factor",
        what="The loss is divided by the global count N but not multiplied by the world size, so DDP's average "
             "leaves the gradient W times too small.",
        source="course/02_gradient_accumulation.py asks 'what does DDP's average over the ranks do to a loss you "
               "normalised by a global count?'",
        edits={_SCALED: "                loss = summed / count.item()  # the window's global token mean\n"},
        key_terms=("world",),
    ),
    Mistake(
        name="no_sync_around_backward_only",
        what="Only loss.backward() is inside model.no_sync(); the forward ran outside it, so DDP still "
             "all-reduces after every micro-batch.",
        source="torch DDP.no_sync docs: 'The forward pass should be included inside the context manager, or "
               "else gradients will still be synchronized'",
        edits={_MICRO_STEP: """\
            logits = model(x)
            summed = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                                 ignore_index=IGNORE_INDEX, reduction="sum")
            # DDP divides the ranks' summed gradients by world: multiply it back.
            loss = summed * (world / count.item())
            context = contextlib.nullcontext() if boundary else model.no_sync()
            with context:
                loss.backward()
"""},
        key_terms=("no_sync",),
    ),
    Mistake(
        name="never_no_sync",
        what="No micro-step runs inside model.no_sync(), so DDP all-reduces after every micro-batch instead of "
             "once per optimizer step.",
        source="https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html#no_sync "
               "(accumulation loops that never use it)",
        edits={"            context = contextlib.nullcontext() if boundary else model.no_sync()\n":
               "            context = contextlib.nullcontext()\n"},
        key_terms=("no_sync",),
    ),
    Mistake(
        name="no_sync_on_every_micro_step",
        what="The last micro-batch of the window also runs inside no_sync, so the gradients are never "
             "all-reduced and the replicas drift apart.",
        source="forum question 'DDP gradient accumulation: ranks diverge with no_sync'",
        edits={"            context = contextlib.nullcontext() if boundary else model.no_sync()\n":
               "            context = model.no_sync()\n"},
        key_terms=("no_sync",),
    ),
    Mistake(
        name="zero_grad_every_micro_batch",
        what="optimizer.zero_grad() is called before every micro-batch, wiping the accumulated gradients so "
             "only the last micro-batch reaches the step.",
        source="copying the standard zero_grad/backward/step loop into an accumulation loop "
               "(https://github.com/huggingface/accelerate/issues/641)",
        edits={"            x, y = micro_batches[i]\n": "            optimizer.zero_grad()\n            x, y = micro_batches[i]\n"},
        key_terms=("zero_grad",),
    ),
    Mistake(
        name="modulo_boundary_skips_short_window",
        what="The step happens when (i + 1) % accumulation_steps == 0, the tutorial pattern, so a final window "
             "shorter than accumulation_steps never steps (and never synchronises).",
        source="tutorial pattern 'if (i + 1) % accumulation_steps == 0: optimizer.step()'; "
               "https://github.com/huggingface/transformers/issues/24840 (last partial accumulation window)",
        edits={_LOOP: """\
    losses = []
    window_loss, count = 0.0, None
    for i, (x, y) in enumerate(micro_batches):
        if i % accumulation_steps == 0:
            window = range(i, min(i + accumulation_steps, len(micro_batches)))
            count = sum((micro_batches[j][1] != IGNORE_INDEX).sum() for j in window)
            count = torch.as_tensor(count, dtype=torch.float64, device=y.device)
            dist.all_reduce(count)
            window_loss = 0.0
        boundary = (i + 1) % accumulation_steps == 0
        context = contextlib.nullcontext() if boundary else model.no_sync()
        with context:
            logits = model(x)
            summed = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                                 ignore_index=IGNORE_INDEX, reduction="sum")
            (summed * (world / count.item())).backward()
        window_loss += summed.item() / count.item()
        if boundary:
            optimizer.step()
            optimizer.zero_grad()
            losses.append(window_loss)
    return losses
"""},
        key_terms=("last",),
    ),
]

LEGAL: list[Mistake] = [
    Mistake(
        name="scale_gradients_at_window_end",
        what="Backward runs on the summed loss and the accumulated .grad is multiplied by world / N once, just "
             "before the step (gradients are linear in the loss).",
        source="https://github.com/karpathy/nanochat/pull/59 style: 'Scale gradients by total token count: "
               "param.grad.div_(num_tokens)'",
        edits={
            _SCALED: "                loss = summed  # normalised in .grad at the end of the window\n",
            "        optimizer.step()\n        optimizer.zero_grad()\n        losses.append(window_loss)\n":
                "        with torch.no_grad():\n"
                "            for p in model.parameters():\n"
                "                if p.grad is not None:\n"
                "                    p.grad.mul_(world / count.item())\n"
                "        optimizer.step()\n        optimizer.zero_grad()\n        losses.append(window_loss)\n",
        },
    ),
    Mistake(
        name="explicit_if_else_no_sync",
        what="The micro-step is a local function called either plainly (the boundary) or inside "
             "'with model.no_sync():', instead of choosing a context object.",
        source="PyTorch DDP.no_sync docs example style (with ddp.no_sync(): ... then one synced step)",
        edits={_MICRO_STEP: """\
            def micro_step(x=x, y=y):
                logits = model(x)
                summed = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                                     ignore_index=IGNORE_INDEX, reduction="sum")
                (summed * (world / count.item())).backward()
                return summed

            if boundary:
                summed = micro_step()
            else:
                with model.no_sync():
                    summed = micro_step()
"""},
    ),
    Mistake(
        name="hand_written_windows",
        what="The windows are sliced by hand with range(start, min(start + k, n)) instead of the windows() helper.",
        source="a hand-written loop instead of the given helper",
        edits={"    for window in windows(len(micro_batches), accumulation_steps):\n":
               "    for start in range(0, len(micro_batches), accumulation_steps):\n"
               "        window = range(start, min(start + accumulation_steps, len(micro_batches)))\n"},
    ),
]
