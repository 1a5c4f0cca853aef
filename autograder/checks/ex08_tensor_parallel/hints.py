"""Exercise 8's hints: three tiers per criterion (1 why it matters, 2 the mechanism, 3 the API).

Keyed by the criterion functions' names in ``ex08_tensor_parallel``; a hint never gives the whole answer.
"""
from __future__ import annotations

HINTS: dict[str, tuple[str, str, str]] = {
    "holds_its_shard": (
        "Each rank keeps 1/W of each weight matrix, and which axis it cuts decides what each rank's product is, and "
        "so which collective makes it whole. Which axis of nn.Linear's (out, in) weight is 'output features', and "
        "which is 'input features'?",
        "The column layer keeps a block of rows (and the matching bias elements); the row layer keeps a block "
        "of columns and the whole bias. The block is the rank's own, at offset rank*k, and it must be a tensor "
        "of its own, not a window onto the unsplit one.",
        "Tensor.chunk(world_size, dim=...)[rank] or narrow(dim, rank*k, k), then .clone(), wrapped in "
        "nn.Parameter; keep no attribute that points at `linear`.",
    ),
    "output_matches": (
        "Each rank's row layer sees only k of the hidden features: its product is a part of the output. How do "
        "W parts become the whole?",
        "The parts add up (they are partial sums over disjoint hidden features), and every rank must end with "
        "the sum; the column layer needs the whole input on every rank, so nothing may split it. That input is "
        "(..., in): any leading dimensions, as a transformer's (batch, sequence, features).",
        "dist.all_reduce with ReduceOp.SUM (the default), inside ReduceFromParallelRegion.forward.",
    ),
    "bias_once": (
        "A sum over W ranks counts anything every rank adds W times: the output is then off by a term that grows "
        "with the number of ranks, so it looks right on one GPU and wrong on eight.",
        "The row layer's bias belongs to the whole output, not to any rank's partial sum: add it where it is "
        "counted once.",
        "Call F.linear(x, self.weight) without the bias for the partial sum; add self.bias to g's result.",
    ),
    "forward_communication": (
        "Tensor parallelism pays a collective inside every layer, on the critical path of every step: each byte more "
        "than needed is paid in every forward of every layer.",
        "The column layer already has everything it needs (the whole input); only the row layer's partial "
        "sums need combining, once.",
        "Exactly one dist.all_reduce in the forward, in ReduceFromParallelRegion.forward; CopyToParallelRegion"
        ".forward returns its input.",
    ),
    "input_grad_matches": (
        "The input fed every rank's shard of the column layer, so its gradient collects a contribution from each: a "
        "rank that keeps only its own trains every layer below the block on a partial gradient.",
        "Each rank's backward through its rows gives one part of dL/dx; the true gradient is the sum of the "
        "parts, and every rank must hold it (the layers before the block are replicated).",
        "dist.all_reduce the incoming gradient in CopyToParallelRegion.backward (on a copy: autograd may hold it).",
    ),
    "shard_grads_match": (
        "Each shard's gradient is a slice of the unsplit layer's gradient: any other slice, or a scaled one, updates "
        "each shard as if it were another part of the matrix. Which slice?",
        "With the forward right, autograd computes the shards' gradients locally; they go wrong only when the "
        "forward's or the backward's reduction is missing, doubled or averaged, or the shard is not the rank's.",
        "Check g's backward returns the gradient unchanged and f's backward sums (ReduceOp.SUM), not averages.",
    ),
    "backward_communication": (
        "In the backward, one tensor's gradient is incomplete on each rank: the backward pays a collective in every "
        "layer too, so it must be exactly the one that completes it.",
        "Only the block input's gradient needs combining; the row layer's output gradient is already whole on "
        "every rank, so g's backward moves nothing.",
        "One dist.all_reduce, in CopyToParallelRegion.backward; ReduceFromParallelRegion.backward returns grad.",
    ),
}
