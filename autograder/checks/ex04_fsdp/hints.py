"""Exercise 4's hints: three tiers per criterion (1 a nudge towards the concept, 2 the mechanism, 3 the API).

Keyed by the criterion functions' names in ``ex04_fsdp``; a hint never gives the whole answer.
"""
from __future__ import annotations

HINTS: dict[str, tuple[str, str, str]] = {
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
