"""Exercise 4's hints: three tiers per criterion (1 a nudge towards the concept, 2 the mechanism, 3 the API),
part 1's (ZeRO-1, ``zero1_...``) first.

Keyed by the criterion functions' names in ``ex04_fsdp``; a hint never gives the whole answer.
"""
from __future__ import annotations

HINTS: dict[str, tuple[str, str, str]] = {
    "zero1_shard_range": (
        "A reduce-scatter hands out, and an all-gather collects, W equal pieces: how long is each when W does not "
        "divide the buffer?",
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
        "ZeRO-1 divides the optimizer state W ways: what size should Adam's moments be on one rank?",
        "The optimizer holds only this rank's fp32 shard, never the model's parameters: the all-gather, not the "
        "optimizer, writes the model's weights.",
        "Give torch.optim.Adam a list holding the shard alone, a leaf tensor of ceil(numel / W) elements that "
        "requires grad.",
    ),
    "zero1_collectives": (
        "An all-reduce is a reduce-scatter followed by an all-gather: ZeRO-1 puts the optimizer step between them.",
        "Once per step: reduce-scatter the whole padded flat gradient, step the shard, all-gather the updated "
        "shards; no per-parameter calls and no all-reduce.",
        "dist.reduce_scatter_single and dist.all_gather_single (torch 2.13's names for reduce_scatter_tensor and "
        "all_gather_into_tensor), each on one flat buffer of W * c elements.",
    ),
    "sharded_on_dim0": (
        "After sharding, no rank should hold any parameter whole.",
        "Each block is its own unit, and the root takes what is left (the input layer and the head).",
        "fully_shard(block) for each block in model.blocks, then fully_shard(model).",
    ),
    "optimizer_after_sharding": (
        "Which tensors does an optimizer hold: the ones it was given when it was built.",
        "fully_shard replaces every nn.Parameter with a new DTensor parameter.",
        "Build torch.optim.Adam(model.parameters(), ...) after shard(model) returns.",
    ),
    "holds_its_share": (
        "ZeRO-3 splits parameters, gradients and optimizer state W ways: what does one rank keep?",
        "A parameter left outside every fully_shard unit is whole on every rank, and so are its gradient and "
        "its Adam state.",
        "Check that every parameter is a DTensor with placements (Shard(0),) before building the optimizer.",
    ),
    "peak_within_bound": (
        "Peak memory depends on how much of the model is unsharded at the same moment.",
        "One unit per block means one block is all-gathered at a time, and freed after its forward.",
        "fully_shard each block with the default reshard_after_forward=True, before the root.",
    ),
    "matches_reference": (
        "W ranks on W micro-batches must take the step one process takes on the whole batch.",
        "Every step starts from zero gradients, runs one backward (FSDP averages over ranks) and one step.",
        "The optimizer's zero_grad, the loss's backward, the optimizer's step: in that order, once per batch.",
    ),
    "exports_once": (
        "Gathering a full state dict is a collective; saving a file is not.",
        "Every rank takes part in the gather; with CPU offload only rank 0 receives the tensors and saves them.",
        "get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)) on every "
        "rank, torch.save on rank 0 only.",
    ),
}
