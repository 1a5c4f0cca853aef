"""Exercise 9 (find and fix a hang): fixes people write that still hang, or no longer mean the same job."""
from __future__ import annotations

from . import Mistake

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
# Part 2 (train_uneven): the reference's loop, by hand, whole, and a part of it
_UNEVEN = ("    params = list(model.parameters())\n"
           "    stream = iter(batches)\n"
           "    while True:\n"
           "        batch = next(stream, None)  # None once this rank has run out\n")
_UNEVEN_EXIT = "        if total == 0:\n            return model\n"
_UNEVEN_UPDATE = ("            offset = 0\n"
                  "            for p in params:\n"
                  "                p -= lr * flat[offset:offset + p.numel()].view_as(p) / total\n"
                  "                offset += p.numel()\n")
_UNEVEN_BODY = (_UNEVEN + """        model.zero_grad()  # .grad None: a rank out of data sends zeros below
        samples = torch.zeros(1, device=params[0].device)  # on the gradients' device: NCCL reduces GPU tensors
        if batch is not None:  # local work only: no collective under a branch on this rank's data
            x, y = batch
            nn.functional.cross_entropy(model(x), y, reduction="sum").backward()
            samples += len(y)
        # One all-reduce a step, on every rank: every gradient and the number of samples, in one buffer (as DDP's
        # bucket does). The global count is 0 exactly when no rank has a batch left, and the same on every rank:
        # every rank leaves at the same step, having taken part in every step before it.
        flat = torch.cat([(torch.zeros_like(p) if p.grad is None else p.grad).flatten() for p in params] + [samples])
        dist.all_reduce(flat)
        total = flat[-1]
""" + _UNEVEN_EXIT + "        with torch.no_grad():\n" + _UNEVEN_UPDATE)


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
        edits={_UNEVEN_BODY: _UNEVEN + """        more = torch.tensor(0.0 if batch is None else 1.0)
        dist.all_reduce(more, op=dist.ReduceOp.MAX)  # does any rank still have a batch?
        if more == 0:
            return model
        model.zero_grad()
        if batch is not None:
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
        edits={_UNEVEN_BODY: _UNEVEN + """        more = torch.tensor(0.0 if batch is None else 1.0)
        dist.all_reduce(more, op=dist.ReduceOp.MAX)  # does any rank still have a batch?
        if more == 0:
            return model
        model.zero_grad()
        count = torch.zeros(())
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
]
