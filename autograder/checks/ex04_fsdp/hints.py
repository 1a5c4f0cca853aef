"""Exercise 4's hints: three tiers per criterion (1 why it matters, 2 the mechanism, 3 the API),
part 1's (ZeRO-1, ``zero1_...``) first.

Keyed by the criterion functions' names in ``ex04_fsdp``; a hint never gives the whole answer.
"""
from __future__ import annotations

HINTS: dict[str, tuple[str, str, str]] = {
    "zero1_shard_range": (
        "A reduce-scatter hands out, and an all-gather collects, W equal pieces: pieces of different lengths make "
        "one rank wait for elements another never sends, and a piece past the end drops or repeats parameters.",
        "Round the slice length up; the buffer then ends in a few zeros of padding that belong to no parameter, "
        "and the slices are contiguous, in rank order.",
        "c = ceil(numel / W), in integers -(-numel // W); rank r owns [r * c, (r + 1) * c).",
    ),
    "zero1_matches_reference": (
        "W ranks, each on its own micro-batch, must take the Adam step one process takes on the whole global batch.",
        "Each rank's shard starts as its own slice of the flat parameters, is stepped with the mean (not the sum) of "
        "the ranks' gradients of that slice, and every rank receives every updated slice afterwards.",
        "torch.nn.utils.parameters_to_vector flattens in model.parameters() order; ReduceOp.AVG averages; copy the "
        "gathered values back into the parameters in place, under torch.no_grad().",
    ),
    "zero1_state_sharded": (
        "ZeRO-1 saves memory only on the optimizer state: Adam's two moments are twice the model, so a rank that "
        "keeps them whole saves nothing at all.",
        "The optimizer holds only this rank's fp32 shard, never the model's parameters: the all-gather, not the "
        "optimizer, writes the model's weights.",
        "Give torch.optim.Adam a list holding the shard alone, a leaf tensor of ceil(numel / W) elements that "
        "requires grad.",
    ),
    "zero1_collectives": (
        "An all-reduce is a reduce-scatter followed by an all-gather: ZeRO-1 costs DDP's bytes, and no more, only "
        "when its optimizer step sits between those two halves.",
        "Once per step: reduce-scatter the whole padded flat gradient, step the shard, all-gather the updated "
        "shards; no per-parameter calls and no all-reduce.",
        "dist.reduce_scatter_single and dist.all_gather_single (torch 2.13's names for reduce_scatter_tensor and "
        "all_gather_into_tensor), each on one flat buffer of W * c elements.",
    ),
    "zero1_mixed": (
        "In mixed precision the model computes in bf16 while the optimizer keeps an fp32 master copy: an update "
        "smaller than a bf16 weight's rounding step would otherwise be lost at every step.",
        "The master shard is fp32 whatever the model's dtype; the gradient reaches it as fp32, and the gathered "
        "fp32 values are written into the bf16 parameters, which stay bf16.",
        "Cast the copy and the flat gradient with .float(); write back with p.copy_(...) under torch.no_grad(), "
        "which casts to p's dtype, rather than rebinding p.data.",
    ),
    "sharded_on_dim0": (
        "After sharding, no rank should hold any parameter whole: one layer left whole costs every rank its full "
        "size, often on the layer that is largest.",
        "Each block is its own unit, and the root takes what is left (the input layer and the head).",
        "fully_shard(block) for each block in model.blocks, then fully_shard(model).",
    ),
    "optimizer_after_sharding": (
        "An optimizer holds the tensors it was given when it was built: built before sharding, it updates tensors "
        "the model no longer computes with, and the model never learns.",
        "fully_shard replaces every nn.Parameter with a new DTensor parameter.",
        "Build torch.optim.Adam(model.parameters(), ...) after shard(model) returns.",
    ),
    "holds_its_share": (
        "ZeRO-3 splits parameters, gradients and optimizer state W ways: a rank that keeps more than its share of "
        "any of them pays the memory FSDP was used to save.",
        "A parameter left outside every fully_shard unit is whole on every rank, and so are its gradient and "
        "its Adam state.",
        "Check that every parameter is a DTensor with placements (Shard(0),) before building the optimizer.",
    ),
    "peak_within_bound": (
        "Peak memory depends on how much of the model is unsharded at the same moment: a model gathered whole for "
        "the whole step peaks like DDP, and FSDP's saving is gone where it matters.",
        "One unit per block means one block is all-gathered at a time, and freed after its forward.",
        "fully_shard each block with the default reshard_after_forward=True, before the root.",
    ),
    "matches_reference": (
        "W ranks on W micro-batches must take the step one process takes on the whole batch: sharding is a way to "
        "save memory, and a step that differs from the unsharded one means it changed what is trained.",
        "Every step starts from zero gradients, runs one backward (FSDP averages over ranks) and one step.",
        "The optimizer's zero_grad, the loss's backward, the optimizer's step: in that order, once per batch.",
    ),
    "loop_kept": (
        "W ranks that each log the same line make W lines of noise, and a step that hands back its autograd graph "
        "lets the caller keep that graph alive.",
        "Each step ends with a value the caller may keep; the rank that logs is the one rank of the group that "
        "speaks for it.",
        "return loss.detach() from train_step; guard the print with if dist.get_rank() == 0.",
    ),
    "exports_once": (
        "Gathering a full state dict is a collective, so every rank must take part or the job hangs; saving the file "
        "is not, and W ranks writing one file race each other.",
        "Every rank takes part in the gather; with CPU offload only rank 0 receives the tensors and saves them.",
        "get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)) on every "
        "rank, torch.save on rank 0 only.",
    ),
}
