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
]
