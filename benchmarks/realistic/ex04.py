"""Realistic mistakes for exercise 4 (ZeRO-1 by hand, then FSDP2 with fully_shard), and legal other styles."""
from __future__ import annotations

from benchmarks.realistic import Mistake

_REDUCE_SCATTER = """\
    shard.grad = torch.empty_like(shard)
    dist.reduce_scatter_single(shard.grad, grads, op=dist.ReduceOp.AVG)  # mean gradient, this rank's slice
"""

_EXPORT_TAIL = """\
    state = get_model_state_dict(model, options=options)  # a collective: all ranks call it
    if dist.get_rank() != 0:
        return None
    torch.save(state, path)
    return state
"""

MISTAKES: list[Mistake] = [
    # Part 1: ZeRO-1 by hand ------------------------------------------------------------------------------
    Mistake(
        name="shard_size_floor",
        what="shard_range cuts numel // world elements per rank, so the last numel % world elements belong to "
             "no shard (and are never stepped).",
        source="course/04_fsdp.py asks 'how long is each piece, and where do the extra elements go?' (the grader's "
               "model has an odd number of parameters)",
        edits={"    size = -(-numel // world)  # ceil: the last slices are padded\n": "    size = numel // world\n"},
        key_terms=("ceil",),
    ),
    Mistake(
        name="shard_range_clamped_to_numel",
        what="shard_range clamps the slices to numel, so the last slice is shorter than the others instead of "
             "padded to the common length c.",
        source="'do not run past the end' habit (np.array_split / torch.chunk give unequal pieces); contract: "
               "every slice has the same length",
        edits={"    return rank * size, (rank + 1) * size\n":
               "    return min(rank * size, numel), min((rank + 1) * size, numel)\n"},
        key_terms=("pad",),
    ),
    Mistake(
        name="master_shard_is_a_view",
        what="The master shard is a slice of the padded flat buffer (no clone), so each rank keeps the whole "
             "W * c flat copy alive behind a view instead of its own c elements.",
        source="contract: 'a copy (not a view)'; a slice of a tensor shares its storage (torch docs, Tensor Views)",
        edits={"shard = flat[start:stop].clone().float().requires_grad_()":
               "shard = flat[start:stop].float().requires_grad_()"},
        key_terms=("view",),
    ),
    Mistake(
        name="adam_over_model_parameters",
        what="The ZeRO-1 optimizer is Adam over model.parameters(), not over the shard: full optimizer state on "
             "every rank, and the shard it gathers back never changes.",
        source="habit 'optimizer = torch.optim.Adam(model.parameters())'; course/04_fsdp.py: Adam over that slice "
               "alone",
        edits={"    return shard, torch.optim.Adam([shard], lr=lr)\n":
               "    return shard, torch.optim.Adam(model.parameters(), lr=lr)\n"},
        key_terms=("shard",),
    ),
    Mistake(
        name="all_reduce_then_slice",
        what="zero1_step all-reduces the whole flat gradient and keeps its own slice, instead of one "
             "reduce-scatter: every rank holds the whole averaged gradient.",
        source="DDP habit (dist.all_reduce(p.grad), course/01_ddp.py) carried into ZeRO; contract: no all-reduce",
        edits={_REDUCE_SCATTER: """\
    dist.all_reduce(grads)
    grads /= world
    rank = dist.get_rank()
    shard.grad = grads[rank * shard.numel():(rank + 1) * shard.numel()].clone()
"""},
        key_terms=("all-reduce",),
    ),
    Mistake(
        name="reduce_scatter_sum_not_mean",
        what="The reduce-scatter uses its default SUM and nothing divides by W: shard.grad is W times the mean "
             "gradient (Adam hides most of it).",
        source="torch.distributed docs: reduce_scatter's op defaults to ReduceOp.SUM (the ex04 docstring says so)",
        edits={"dist.reduce_scatter_single(shard.grad, grads, op=dist.ReduceOp.AVG)":
               "dist.reduce_scatter_single(shard.grad, grads)"},
        key_terms=("mean",),
    ),
    Mistake(
        name="local_gradient_slice_no_reduce",
        what="shard.grad is this rank's own slice of its local gradient, never averaged over the ranks "
             "(no reduce-scatter), so each rank steps on its own micro-batch only.",
        source="forgetting that without DDP nothing averages the gradients (course/04_fsdp.py: 'the ranks must end "
               "up with the mean gradient of their own slice')",
        edits={_REDUCE_SCATTER: """\
    rank = dist.get_rank()
    shard.grad = grads[rank * shard.numel():(rank + 1) * shard.numel()].clone()  # this rank's slice
"""},
        key_terms=("reduce-scatter",),
    ),
    Mistake(
        name="gather_before_step",
        what="The shards are all-gathered into the model before optimizer.step(), so the model always holds the "
             "previous step's parameters.",
        source="course/04_fsdp.py: 'where would the optimizer step go between the two?' (order of reduce-scatter, "
               "step, all-gather)",
        edits={
            "    optimizer.step()\n    full = torch.empty(": "    full = torch.empty(",
            "            p.copy_(new.view_as(p))\n": "            p.copy_(new.view_as(p))\n    optimizer.step()\n",
        },
        key_terms=("step",),
    ),
    # Part 2: FSDP2 ---------------------------------------------------------------------------------------
    Mistake(
        name="root_only_fully_shard",
        what="Only the root is fully_shard-ed, so forward all-gathers the whole model at once and the peak is "
             "back to unsharded.",
        source="course/04_fsdp.py: 'if the whole model is one unit, step 1 gathers the whole model and the peak is "
               "back to unsharded'",
        edits={"    for block in model.blocks:\n"
               "        fully_shard(block)  # one unit per block: only one block is unsharded at a time\n": ""},
        key_terms=("block",),
    ),
    Mistake(
        name="optimizer_before_shard",
        what="train_fsdp builds the optimizer before shard(), so it holds the replaced, unsharded parameters "
             "that never receive a gradient.",
        source="https://github.com/huggingface/accelerate/issues/3256 (optimizer initialised before wrapping with "
               "FSDP: training stalls)",
        edits={"    model = shard(model)\n    optimizer = make_optimizer(model, lr)\n":
               "    optimizer = make_optimizer(model, lr)\n    model = shard(model)\n"},
        key_terms=("optimizer",),
    ),
    Mistake(
        name="zero_grad_after_step",
        what="train_step zeroes the gradients after optimizer.step() (set to None), so no gradient is left in "
             "place after the step.",
        source="habit 'step(); zero_grad()' at the end of the loop; contract: leave the gradients in place after "
               "the step",
        edits={"    optimizer.zero_grad()\n    loss = nn.functional.cross_entropy(model(x), y)\n"
               "    loss.backward()\n    optimizer.step()\n":
               "    loss = nn.functional.cross_entropy(model(x), y)\n"
               "    loss.backward()\n    optimizer.step()\n    optimizer.zero_grad()\n"},
        key_terms=("zero_grad",),
    ),
    Mistake(
        name="full_state_dict_on_rank0_only",
        what="Only rank 0 calls get_model_state_dict, a collective every rank must join: the export hangs.",
        source="https://github.com/deepspeedai/DeepSpeed/pull/801 (save_checkpoint called on rank 0 only hangs)",
        edits={_EXPORT_TAIL: """\
    if dist.get_rank() != 0:
        return None
    state = get_model_state_dict(model, options=options)
    torch.save(state, path)
    return state
"""},
        key_terms=("every rank",),
    ),
    Mistake(
        name="export_sharded_state_dict",
        what="export_full_state_dict saves model.state_dict(), the DTensor shards, instead of the gathered full "
             "state dict.",
        source="FSDP habit of torch.save(model.state_dict()); course/04_fsdp.py's table: the full state dict is "
               "get_model_state_dict(..., full_state_dict=True)",
        edits={"    state = get_model_state_dict(model, options=options)  # a collective: all ranks call it\n":
               "    state = model.state_dict()\n"},
        key_terms=("full",),
    ),
    Mistake(
        name="export_saved_on_every_rank",
        what="Every rank torch.saves to the same path; with cpu_offload the other ranks hold an empty dict and "
             "can overwrite rank 0's file.",
        source="PyTorch DDP tutorial warning to save on one process only",
        edits={"    if dist.get_rank() != 0:\n        return None\n    torch.save(state, path)\n    return state\n":
               "    torch.save(state, path)\n    return state if dist.get_rank() == 0 else None\n"},
        key_terms=("rank 0",),
    ),
]

LEGAL: list[Mistake] = [
    Mistake(
        name="reduce_scatter_sum_then_divide",
        what="The reduce-scatter sums (its default op) and the shard's gradient is then divided by W.",
        source="torch.distributed docs: reduce_scatter sums by default; ReduceOp.AVG is the other spelling",
        edits={"    dist.reduce_scatter_single(shard.grad, grads, op=dist.ReduceOp.AVG)  # mean gradient, this rank's slice\n":
               "    dist.reduce_scatter_single(shard.grad, grads)  # the sum over ranks of this rank's slice\n"
               "    shard.grad /= world\n"},
    ),
    Mistake(
        name="list_form_all_gather",
        what="The updated shards are gathered with the list-form dist.all_gather into the W chunks of the flat "
             "buffer, instead of all_gather_single.",
        source="torch.distributed docs: all_gather(tensor_list, tensor), the older list form",
        edits={"    dist.all_gather_single(full, shard.detach())  # every rank's updated slice, in rank order\n":
               "    dist.all_gather(list(full.chunk(world)), shard.detach())  # one all-gather, into views of full\n"},
    ),
    Mistake(
        name="hand_written_flatten_and_pad",
        what="make_zero1_optimizer flattens with torch.cat and pads by writing into a zero buffer, and shard_range "
             "uses math.ceil, instead of parameters_to_vector and F.pad.",
        source="a hand-written flatten instead of the helpers",
        edits={
            "    size = -(-numel // world)  # ceil: the last slices are padded\n":
                "    size = math.ceil(numel / world)\n",
            "from pathlib import Path\n": "import math\nfrom pathlib import Path\n",
            """\
    flat = parameters_to_vector(model.parameters()).detach()
    start, stop = shard_range(flat.numel(), world, rank)
    flat = nn.functional.pad(flat, (0, world * (stop - start) - flat.numel()))
    shard = flat[start:stop].clone().float().requires_grad_()  # its own storage: the master copy
""": """\
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    start, stop = shard_range(flat.numel(), world, rank)
    padded = torch.zeros(world * (stop - start), dtype=torch.float32, device=flat.device)
    padded[:flat.numel()] = flat
    shard = padded[start:stop].clone().requires_grad_()
""",
        },
    ),
]
