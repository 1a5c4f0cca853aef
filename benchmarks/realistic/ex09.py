"""Exercise 9 (find and fix a hang): fixes people write that still hang, or no longer mean the same job."""
from __future__ import annotations

from . import Mistake, solution

_COMMENT = ("        # No branch on this rank's data before a collective: an empty selection gives a loss of 0\n"
            "        # and zero gradients, which is exactly this rank's share of the global sum.\n")
_SHARE = "        # and zero gradients, which is exactly this rank's share of the global sum.\n"
_LOSS = _SHARE + "        loss = nn.functional.cross_entropy(model(x[keep]), y[keep], reduction=\"sum\")\n"
_BACKWARD = "        model.zero_grad()\n        loss.backward()\n"
_GRADS = ("        with torch.no_grad():\n"
          "            for p in model.parameters():\n"
          "                grad = p.grad if p.grad is not None else torch.zeros_like(p)\n")
_STEP = ("                if count > 0:  # the same on every rank: count is the all-reduced, global one\n"
         "                    p -= lr * grad / count\n")
# Part 2 (train_uneven): parts of the reference's loop, by hand
_UNEVEN = ("    params = list(model.parameters())\n"
           "    stream = iter(batches)\n"
           "    while True:\n"
           "        batch = next(stream, None)  # None once this rank has run out\n")
_UNEVEN_EXIT = "        if total == 0:\n            return model\n"
_UNEVEN_UPDATE = ("            offset = 0\n"
                  "            for p in params:\n"
                  "                p -= lr * flat[offset:offset + p.numel()].view_as(p) / total\n"
                  "                offset += p.numel()\n")
# the whole body, read from the reference (the edits of its parts above are checked against it by Mistake.apply)
_UNEVEN_BODY = solution(9).read_text().split("### BEGIN SOLUTION\n")[-1].split("    ### END SOLUTION")[0]


# train_uneven's loop head in the "any rank still has data" style: a flag all-reduced with MAX, then the step
_FLAGGED = _UNEVEN + """        more = torch.tensor(0.0 if batch is None else 1.0)
        dist.all_reduce(more, op=dist.ReduceOp.MAX)  # does any rank still have a batch?
        if more == 0:
            return model
        model.zero_grad()
"""


def _ddp_loop(join: str, forward: str = "ddp") -> str:
    """train_uneven's body as DDP code: ``join``, the context manager's line ("" for none), ``forward``, what the
    loop calls."""
    indent = "        " if join else "    "
    return ("    from torch.nn.parallel import DistributedDataParallel\n"
            "    ddp = DistributedDataParallel(model)\n"
            "    opt = torch.optim.SGD(ddp.parameters(), lr=lr)\n"
            + (f"    {join}\n" if join else "")
            + f"{indent}for x, y in batches:\n"
            f"{indent}    opt.zero_grad()\n"
            f"{indent}    nn.functional.cross_entropy({forward}(x), y).backward()\n"
            f"{indent}    opt.step()\n"
            "    return model\n")

MISTAKES = [
    Mistake(
        name="gradients_still_skipped",
        what="The count is all-reduced on every rank, but a rank with nothing to keep still skips the "
             "gradient all-reduces, so its next count meets its peer's gradients: still a hang (or a mismatch).",
        source="course/09_communication.py: 'the signature of a skipped collective: a branch on one rank's own "
               "data in front of a collective'; moving the branch below the first collective only is the half-fix",
        edits={"        dist.all_reduce(count)\n" + _GRADS: "        dist.all_reduce(count)\n"
               "        if not keep.any():\n"
               "            continue  # the count is shared; nothing of ours to add to the gradients\n" + _GRADS},
        key_terms=("collective",),
    ),
    Mistake(
        name="skip_step_on_every_rank",
        what="The ranks agree (one all-reduce of a flag) to skip the whole step whenever any rank has nothing "
             "to keep: no hang, but the other ranks' samples of that step are never learnt from.",
        source="course/09_communication.py: 'skipping the step everywhere drops them'; the consensus skip is "
               "the fix suggested for DDP jobs with an empty batch on one rank",
        edits={_COMMENT: "        empty = torch.tensor(float(not keep.any()))\n"
                         "        dist.all_reduce(empty)  # every rank learns whether some rank has nothing\n"
                         "        if empty > 0:\n"
                         "            continue  # skip the step everywhere: the same collectives on every rank\n"},
        key_terms=("samples",),
    ),
    Mistake(
        name="mean_of_rank_means",
        what="Each rank backpropagates its own mean loss (a zero loss when it keeps nothing) and the summed "
             "gradients are divided by the world size, as DDP does: the mean of per-rank means, not the mean "
             "over the global batch's kept samples.",
        source="https://github.com/facebookresearch/fairseq/issues/494 (DDP averages over workers; the "
               "per-sample normalisation must use the global sample count instead)",
        edits={_LOSS: _SHARE + "        if keep.any():\n"
                      "            loss = nn.functional.cross_entropy(model(x[keep]), y[keep])\n"
                      "        else:  # a zero loss that still gives every parameter a (zero) gradient\n"
                      "            loss = sum(p.sum() for p in model.parameters()) * 0.0\n",
               _STEP: "                p -= lr * grad / dist.get_world_size()  # average over the ranks, as DDP does\n"},
        key_terms=("mean",),
    ),
    Mistake(
        name="stale_gradient_on_empty_rank",
        what="Only a rank with samples to keep runs zero_grad and backward; an empty rank then all-reduces "
             "the gradient left over from its previous step instead of zeros.",
        source="course/09_communication.py: 'a rank with nothing to keep takes part, with a zero gradient'; "
               "guarding the local compute (zero_grad included) but not the collectives is the half-right fix",
        edits={_LOSS + _BACKWARD: _SHARE + "        if keep.any():  # nothing to backpropagate on an empty batch\n"
                                  "            loss = nn.functional.cross_entropy(model(x[keep]), y[keep], reduction=\"sum\")\n"
                                  "            model.zero_grad()\n"
                                  "            loss.backward()\n"},
        key_terms=("zero gradient",),
    ),
    Mistake(
        name="update_guarded_by_local_data",
        what="The SGD update is guarded by this rank's own keep.any() instead of the global count, so a rank "
             "with nothing to keep does not step and its weights drift from the others'.",
        source="course/09_communication.py: 'a rank with nothing to keep takes part'; the guard copied from "
               "train_broken's `if not keep.any()` into the update",
        edits={_STEP: "                if keep.any():  # nothing kept here: nothing to update\n"
                      "                    p -= lr * grad / count\n"},
        key_terms=("weights",),
    ),
    Mistake(
        name="no_guard_for_global_empty_step",
        what="The update divides by the global count without checking it, so a step where no rank keeps "
             "anything divides 0 by 0 and every weight becomes NaN.",
        source="exercises/ex09_hang.py contract: 'a step with no kept sample on any rank changes nothing'",
        edits={_STEP: "                p -= lr * grad / count\n"},
        key_terms=("NaN",),
    ),
    Mistake(
        name="count_not_all_reduced",
        what="The gradients are all-reduced but the count is not: each rank divides the global gradient sum "
             "by its own count, and an empty rank does not update at all.",
        source="https://chris-santiago.github.io/imbalanced-losses/explanation/ddp-all-gather/ (a local "
               "normaliser under DDP inflates or deflates the loss when samples are uneven across ranks)",
        edits={"        dist.all_reduce(count)\n" + _GRADS: _GRADS},
        key_terms=("count",),
    ),
    Mistake(
        name="barrier_instead_of_collectives",
        what="A rank with nothing to keep waits in dist.barrier() and skips the step, as if a barrier could "
             "stand in for the all-reduces its peer is waiting in: still a hang.",
        source="course/09_communication.py part 4: ranks waiting in different collectives (a barrier against "
               "an all-reduce) is the signature of a skipped one; 'sync the ranks with a barrier' is the reflex",
        edits={_COMMENT: "        if not keep.any():\n"
                         "            dist.barrier()  # let the other ranks catch up, then skip\n"
                         "            continue\n"},
        key_terms=("collective",),
    ),
    Mistake(
        name="divides_by_world_size_too",
        what="The update divides the summed gradient by the global count and again by the world size: the "
             "step is 1/W of SGD's.",
        source="https://github.com/facebookresearch/fairseq/issues/494 (normalising by the sample size and by "
               "the workers: one division too many)",
        edits={"                    p -= lr * grad / count\n":
               "                    p -= lr * grad / count / dist.get_world_size()\n"},
        key_terms=("mean",),
    ),
    Mistake(
        name="uneven_rank_leaves_when_its_data_ends",
        what="train_uneven written as a single-process loop around DDP: the rank with fewer batches leaves the loop "
             "and returns while the others wait in DDP's gradient all-reduce of their next step.",
        source="PyTorch's 'Distributed Training with Uneven Inputs Using the Join Context Manager' tutorial: "
               "without join(), the rank with fewer inputs leaves and the others hang in the all-reduce",
        edits={_UNEVEN_BODY: _ddp_loop("")},
        key_terms=("hangs", "left its loop"),
    ),
    Mistake(
        name="uneven_max_flag_wrong_count",
        what="A flag all-reduced with MAX keeps every rank in the loop while any rank has data, but each rank "
             "backpropagates its mean loss and the summed gradients are divided by the world size, so a step "
             "where a rank has no batch moves by a fraction of one process's.",
        source="the 'all_reduce a done flag with MAX' recipe for uneven DDP data (PyTorch forums, 'DDP with "
               "uneven inputs'), combined with DDP's own division by the world size",
        edits={_UNEVEN_BODY: _FLAGGED + """        if batch is not None:
            x, y = batch
            nn.functional.cross_entropy(model(x), y).backward()
        with torch.no_grad():
            for p in params:
                g = torch.zeros_like(p) if p.grad is None else p.grad
                dist.all_reduce(g)
                p -= lr * g / dist.get_world_size()  # the mean over the ranks, as DDP does
"""},
        key_terms=("divided by the 2 ranks",),
    ),
    Mistake(
        name="uneven_join_on_the_bare_model",
        what="DDP's join() called on the model itself, which is not wrapped: nn.Module has no join(), and the "
             "loop trains without any gradient all-reduce.",
        source="the DDP join() documentation's example read as a method of the model (model.join()), where its "
               "model is the DDP wrapper",
        edits={_UNEVEN_BODY: """    opt = torch.optim.SGD(model.parameters(), lr=lr)
    with model.join():
        for x, y in batches:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    return model
"""},
        key_terms=("join()", "DistributedDataParallel"),
    ),
    Mistake(
        name="uneven_join_forward_bypasses_ddp",
        what="A DDP wrapper is made for its join() only: the loop calls the model itself, so DDP's hooks never "
             "all-reduce a gradient and each rank trains on its own batches.",
        source="the pattern 'wrap for the feature, keep calling the module' (DDP's forward is what prepares the "
               "gradient all-reduce; model.module(x) and model(x) bypass it)",
        edits={_UNEVEN_BODY: _ddp_loop("with ddp.join(divide_by_initial_world_size=False):", forward="model")},
        key_terms=("wrapper",),
    ),
    Mistake(
        name="uneven_join_default_division",
        what="DDP under join() with its defaults: at a step where a rank has joined, DDP still divides the summed "
             "gradient by the initial world size, so the step is k/W of one process's on the samples there.",
        source="torch.nn.parallel.DistributedDataParallel.join(divide_by_initial_world_size=True), the default, "
               "documented as 'the effective global batch size' being kept, not the mean over what exists",
        edits={_UNEVEN_BODY: _ddp_loop("with ddp.join():")},
        key_terms=("divide_by_initial_world_size",),
    ),
    Mistake(
        name="uneven_stop_when_any_rank_runs_out",
        what="The ranks agree to stop as soon as one of them runs out (an all-reduce MIN of 'I have a batch'): no "
             "hang, but the batches the longer ranks still hold are never learnt from.",
        source="the drop-the-remainder advice for uneven data (DistributedSampler(drop_last=True), 'stop every "
               "rank when the first one finishes')",
        edits={_UNEVEN_EXIT: "        have = torch.tensor(float(batch is not None))\n"
                             "        dist.all_reduce(have, op=dist.ReduceOp.MIN)  # stop with the shortest rank\n"
                             "        if have == 0:\n"
                             "            return model\n"},
        key_terms=("stopped",),
    ),
    Mistake(
        name="uneven_own_flag_checked_after_the_collectives",
        what="Each rank takes part in the step's all-reduce, then leaves when its own batch was None: it shadows "
             "one step, not every step until the longest rank's last, and the others hang one step later.",
        source="course/09_communication.py: 'no branch on a rank's own data before a collective'; moving the "
               "branch after the step's collectives only is the half-fix",
        edits={_UNEVEN_EXIT + "        with torch.no_grad():\n" + _UNEVEN_UPDATE:
               "        if total > 0:\n"
               "            with torch.no_grad():\n"
               "                offset = 0\n"
               "                for p in params:\n"
               "                    p -= lr * flat[offset:offset + p.numel()].view_as(p) / total\n"
               "                    offset += p.numel()\n"
               "        if batch is None:\n"
               "            return model  # this rank took part in the step; it has nothing more\n"},
        key_terms=("hangs",),
    ),
    Mistake(
        name="uneven_exit_test_after_the_update",
        what="The loop's exit test (the global count is 0) comes after the update, so the last round, in which no "
             "rank has a batch, divides 0 by 0 and every weight becomes NaN.",
        source="a do-while reading of 'stop when no rank has data': the step first, the test at the bottom",
        edits={_UNEVEN_EXIT: "", "                offset += p.numel()\n":
               "                offset += p.numel()\n" + _UNEVEN_EXIT},
        key_terms=("NaN",),
    ),
    Mistake(
        name="uneven_zeros_from_the_last_batch",
        what="A rank out of data runs its last batch again with the loss multiplied by 0 to get zero gradients; "
             "a rank that never had a batch has no last batch, and raises.",
        source="the 'dummy forward with loss * 0' workaround for DDP ranks without data (PyTorch forums, 'DDP "
               "uneven inputs dummy batch')",
        edits={"        if batch is not None:  # local work only: no collective under a branch on this rank's data\n"
               "            x, y = batch\n"
               "            nn.functional.cross_entropy(model(x), y, reduction=\"sum\").backward()\n"
               "            samples += len(y)\n":
               "        if batch is not None:\n"
               "            last = batch\n"
               "            samples += len(batch[1])\n"
               "        x, y = batch if batch is not None else last  # out of data: the last batch, weighted 0\n"
               "        (nn.functional.cross_entropy(model(x), y, reduction=\"sum\") * (batch is not None)).backward()\n"},
        key_terms=("0 and 2",),
    ),
    # Part 2 entries below (to the end of MISTAKES) were written blind to the checks by a second tester.
    Mistake(
        name="uneven_none_gradients_skipped",
        what="Hand-written all-reduce of each parameter's gradient guarded by `if p.grad is not None`: zero_grad() "
             "sets the gradients to None, so a rank out of data skips every gradient all-reduce of the step while "
             "the others wait in them (a mismatch or a hang).",
        source="PyTorch tutorial 'Writing Distributed Applications with PyTorch' (average_gradients by hand) with "
               "the usual None guard for unused parameters; Optimizer.zero_grad(set_to_none=True) is the default",
        edits={_UNEVEN_BODY: _FLAGGED + """        count = torch.zeros(())
        if batch is not None:
            x, y = batch
            nn.functional.cross_entropy(model(x), y, reduction="sum").backward()
            count += len(y)
        dist.all_reduce(count)
        with torch.no_grad():
            for p in params:
                if p.grad is None:
                    continue  # no gradient on this rank: nothing to add
                dist.all_reduce(p.grad)
                p -= lr * p.grad / count
"""},
        key_terms=("collective",),
    ),
    Mistake(
        name="uneven_flag_before_on_idle_after_on_busy",
        what="A rank out of data all-reduces the 'any rank has a batch' flag first and then zeros, while a rank with "
             "data all-reduces its count and gradients first and the flag last: the ranks' collectives meet in a "
             "different order as soon as one runs out (mixed values, then mismatched shapes).",
        source="torch.distributed docs: collectives must be called by every rank in the same order; "
               "course/09_communication.py part 4 (mismatched order)",
        edits={_UNEVEN_BODY: _UNEVEN + """        model.zero_grad()
        if batch is None:  # out of data: first ask whether any rank still has a batch, then add zeros
            more = torch.zeros(())
            dist.all_reduce(more, op=dist.ReduceOp.MAX)
            if more == 0:
                return model
            count = torch.zeros(())
            dist.all_reduce(count)
            grads = [torch.zeros_like(p) for p in params]
        else:
            x, y = batch
            nn.functional.cross_entropy(model(x), y, reduction="sum").backward()
            count = torch.tensor(float(len(y)))
            dist.all_reduce(count)
            grads = [p.grad for p in params]
        with torch.no_grad():
            for p, g in zip(params, grads):
                dist.all_reduce(g)
                p -= lr * g / count
        if batch is not None:  # tell the ranks that have run out that this one is still going
            more = torch.ones(())
            dist.all_reduce(more, op=dist.ReduceOp.MAX)
"""},
        key_terms=("order",),
    ),
    Mistake(
        name="uneven_count_int64_on_busy_float_on_idle",
        what="The sample count is torch.tensor(len(y)) (int64) on a rank with a batch and torch.tensor(0.0) (float32) "
             "on a rank out of data: the all-reduce of the count gets different dtypes on the ranks.",
        source="torch.tensor(int) gives int64 (PyTorch tensor docs); TORCH_DISTRIBUTED_DEBUG=DETAIL's 'mismatch "
               "between collectives' names dtypes among what must match",
        edits={_UNEVEN_BODY: _FLAGGED + """        if batch is not None:
            x, y = batch
            nn.functional.cross_entropy(model(x), y, reduction="sum").backward()
            count = torch.tensor(len(y))
        else:
            count = torch.tensor(0.0)  # nothing here
        dist.all_reduce(count)
        with torch.no_grad():
            for p in params:
                g = torch.zeros_like(p) if p.grad is None else p.grad
                dist.all_reduce(g)
                p -= lr * g / count
"""},
        key_terms=("dtype",),
    ),
    Mistake(
        name="uneven_zero_loss_without_graph",
        what="A rank out of data backpropagates torch.zeros((), requires_grad=True), a zero loss not connected to "
             "the model, believing it fills the gradients with zeros; they stay None and flattening them raises.",
        source="PyTorch forums, 'element 0 of tensors does not require grad and does not have a grad_fn': the "
               "requires_grad=True 'fix' on a constant loss",
        edits={"        if batch is not None:  # local work only: no collective under a branch on this rank's data\n"
               "            x, y = batch\n"
               "            nn.functional.cross_entropy(model(x), y, reduction=\"sum\").backward()\n"
               "            samples += len(y)\n":
               "        if batch is not None:\n"
               "            x, y = batch\n"
               "            loss = nn.functional.cross_entropy(model(x), y, reduction=\"sum\")\n"
               "            samples += len(y)\n"
               "        else:  # out of data: a zero loss, so that backward gives zero gradients\n"
               "            loss = torch.zeros((), requires_grad=True)\n"
               "        loss.backward()\n",
               "        flat = torch.cat([(torch.zeros_like(p) if p.grad is None else p.grad).flatten() for p in params]"
               " + [samples])\n":
               "        flat = torch.cat([p.grad.flatten() for p in params] + [samples])\n"},
        key_terms=("None",),
    ),
    Mistake(
        name="uneven_len_of_the_stream",
        what="The number of steps is the all-reduced MAX of len(batches), as with a DataLoader over a "
             "DistributedSampler; the batches are a stream with no len(), so every rank raises TypeError.",
        source="exercises/ex09_hang.py contract: 'A stream, as a data loader gives: it has no len()'; the "
               "`len(loader)` habit of map-style loaders",
        edits={_UNEVEN: "    params = list(model.parameters())\n"
                        "    steps = torch.tensor(float(len(batches)))  # this rank's number of batches\n"
                        "    dist.all_reduce(steps, op=dist.ReduceOp.MAX)  # the longest rank's\n"
                        "    stream = iter(batches)\n"
                        "    for _ in range(int(steps)):\n"
                        "        batch = next(stream, None)  # None once this rank has run out\n",
               "                offset += p.numel()\n": "                offset += p.numel()\n    return model\n"},
        key_terms=("len",),
    ),
    Mistake(
        name="uneven_pad_by_repeating_batches",
        what="A rank out of data repeats its earlier batches to keep pace (as DistributedSampler pads by repeating "
             "samples) until no rank has a new one: no hang, but the repeats are learnt from twice.",
        source="torch.utils.data.DistributedSampler docs: with drop_last=False the data is padded by repeating "
               "samples so that it divides evenly (notebook 01 shows what that costs a metric)",
        edits={_UNEVEN: _UNEVEN + """        fresh = torch.tensor(0.0 if batch is None else 1.0)
        dist.all_reduce(fresh, op=dist.ReduceOp.MAX)  # does any rank still have a new batch?
        if fresh == 0:
            return model
        if batch is not None:
            seen.append(batch)
        elif seen:  # out of data: repeat an earlier batch, as DistributedSampler pads
            batch = seen[len(seen) - 1 - step % len(seen)]
        step += 1
""", "    stream = iter(batches)\n": "    stream = iter(batches)\n    seen, step = [], 0\n"},
        key_terms=("twice",),
    ),
    Mistake(
        name="uneven_idle_rank_does_not_step",
        what="A rank out of data takes part in every all-reduce but skips the SGD update ('nothing of mine to "
             "learn'), so its weights stop where its data ended and differ from the other ranks'.",
        source="course/09_communication.py part 1's update_guarded_by_local_data in part 2's form: guarding the "
               "local update by this rank's own data instead of the global count",
        edits={_UNEVEN_EXIT: _UNEVEN_EXIT + "        if batch is None:\n"
                                            "            continue  # out of data: nothing of ours to learn\n"},
        key_terms=("same weights",),
    ),
    Mistake(
        name="uneven_stale_gradient_after_running_out",
        what="zero_grad() is called only for a rank that has a batch, so a rank out of data all-reduces the "
             "gradient of its last batch again at every later step instead of zeros.",
        source="the 'zero_grad next to backward' habit of single-process loops, moved into the `if batch` branch; "
               "contract: 'A rank out of data adds no sample to the step (a zero gradient and a count of 0)'",
        edits={"        model.zero_grad()  # .grad None: a rank out of data sends zeros below\n": "",
               "            x, y = batch\n": "            x, y = batch\n            model.zero_grad()\n"},
        key_terms=("zero gradient",),
    ),
    Mistake(
        name="uneven_join_throw_on_early_termination_caught",
        what="DDP's join(throw_on_early_termination=True), the exception caught to end training on every rank: "
             "training stops when the first rank runs out, and the longer ranks' remaining batches are dropped.",
        source="DistributedDataParallel.join docs: 'throw_on_early_termination: ... If True, will throw upon the "
               "first rank reaching end of data' (meant for loops with their own collectives)",
        edits={_UNEVEN_BODY: """    from torch.nn.parallel import DistributedDataParallel
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    try:
        with ddp.join(throw_on_early_termination=True):
            for x, y in batches:
                opt.zero_grad()
                nn.functional.cross_entropy(ddp(x), y).backward()
                opt.step()
    except RuntimeError:
        pass  # a rank ran out of data: every rank stops here, together
    return model
"""},
        key_terms=("stopped",),
    ),
    Mistake(
        name="uneven_mean_loss_divided_by_samples",
        what="The default mean-reduced cross-entropy is backpropagated and the summed gradients are still divided "
             "by the global number of samples: each step is 1/B of one process's.",
        source="torch.nn.functional.cross_entropy docs (reduction='mean' by default); the sum-vs-mean "
               "normalisation mix-up of fairseq issue 494",
        edits={'cross_entropy(model(x), y, reduction="sum").backward()': "cross_entropy(model(x), y).backward()"},
        key_terms=("mean",),
    ),
]

LEGAL = [
    Mistake(
        name="clamped_count",
        what="The update divides by count.clamp(min=1) with no branch: when no rank keeps anything every "
             "gradient is zero, so the step changes nothing, as required.",
        source="the usual 'avoid division by zero' idiom for token-count normalisation",
        edits={_STEP: "                p -= lr * grad / count.clamp(min=1)  # count 0: every gradient is 0 too\n"},
    ),
    Mistake(
        name="one_flat_gradient_all_reduce",
        what="All gradients are flattened into one buffer and all-reduced together (one collective per step "
             "instead of one per parameter), then unflattened for the update; the same on every rank.",
        source="PyTorch DDP's gradient buckets (Li et al., VLDB 2020), written by hand",
        edits={_GRADS + "                dist.all_reduce(grad)\n" + _STEP: """        with torch.no_grad():
            params = list(model.parameters())
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
            dist.all_reduce(flat)  # one bucket: every gradient at once, on every rank
            offset = 0
            for p in params:
                grad = flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
                if count > 0:
                    p -= lr * grad / count
"""},
    ),
    Mistake(
        name="masked_loss_on_whole_batch",
        what="The model runs on the whole local batch and the per-sample losses of the samples not kept are "
             "replaced by 0 with torch.where before the sum, instead of indexing with keep.",
        source="the padding-mask idiom (loss * mask, or torch.where) of sequence models",
        edits={_LOSS: _SHARE + "        losses = nn.functional.cross_entropy(model(x), torch.where(keep, y, torch.zeros_like(y)),\n"
                      "                                             reduction=\"none\")\n"
                      "        loss = torch.where(keep, losses, torch.zeros_like(losses)).sum()\n"},
    ),
    Mistake(
        name="uneven_ddp_join_divided_by_the_ranks_with_data",
        what="DistributedDataParallel under ddp.join(divide_by_initial_world_size=False): DDP's join hooks shadow "
             "the all-reduces of a rank that has run out, and the mean is over the ranks that have a batch.",
        source="PyTorch's 'Distributed Training with Uneven Inputs Using the Join Context Manager' tutorial",
        edits={_UNEVEN_BODY: _ddp_loop("with ddp.join(divide_by_initial_world_size=False):")},
    ),
    Mistake(
        name="uneven_any_flag_then_per_parameter",
        what="An all-reduced 'any rank has a batch' flag (MAX) decides whether to go on; then the count and each "
             "parameter's gradient are all-reduced one by one and divided by the global count.",
        source="the 'all_reduce a done flag' recipe for uneven inputs, written by hand",
        edits={_UNEVEN_BODY: _FLAGGED + """        count = torch.zeros(())
        if batch is not None:
            x, y = batch
            nn.functional.cross_entropy(model(x), y, reduction="sum").backward()
            count += len(y)
        dist.all_reduce(count)
        with torch.no_grad():
            for p in params:
                g = torch.zeros_like(p) if p.grad is None else p.grad
                dist.all_reduce(g)
                p -= lr * g / count
"""},
    ),
    # Part 2 entries below (to the end of LEGAL) were written blind to the checks by a second tester.
    Mistake(
        name="uneven_mean_of_means_over_ranks_with_a_batch",
        what="Each rank backpropagates its mean loss and counts 1 if it has a batch; the summed gradients are "
             "divided by the number of ranks with a batch, which with the same B everywhere is the mean over "
             "their samples.",
        source="exercises/ex09_hang.py contract: 'with the same B everywhere, that is also the mean of the mean "
               "losses of the ranks that have a batch'",
        edits={'cross_entropy(model(x), y, reduction="sum").backward()': "cross_entropy(model(x), y).backward()",
               "            samples += len(y)\n": "            samples += 1  # one more rank with a batch\n"},
    ),
    Mistake(
        name="uneven_join_context_manager_with_ddp",
        what="The generic Join context manager of torch.distributed.algorithms.join around a DDP loop, with "
             "divide_by_initial_world_size=False passed on to DDP's join hook.",
        source="PyTorch tutorial 'Distributed Training with Uneven Inputs Using the Join Context Manager' "
               "(`with Join([model]):`, keyword arguments forwarded to the join hooks)",
        edits={_UNEVEN_BODY: "    from torch.distributed.algorithms.join import Join\n"
                             + _ddp_loop("with Join([ddp], divide_by_initial_world_size=False):")},
    ),
]
