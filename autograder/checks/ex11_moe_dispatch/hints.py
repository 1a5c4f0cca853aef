"""Exercise 11's hints, three tiers per criterion (``check(11, hint=k)``; :mod:`autograder.commands.check`).

1: why it matters, 2: the mechanism, 3: the API to use. Plain data, read on its own: no
imports. The dispatch is GShard's (Lepikhin et al., 2020) without its padding: uneven splits.
"""

HINTS: dict[str, tuple[str, str, str]] = {
    "split_sizes": (
        "An all-to-all sends one contiguous block of rows to each rank, rank 0's first; a slot dropped at "
        "capacity is not sent at all.",
        "Keep only the slots whose keep is True, order them by their expert, and count how many each expert "
        "gets (zero included).",
        "keep.nonzero(), torch.argsort(..., stable=True) on their experts, and torch.bincount(..., "
        "minlength=world_size).tolist().",
    ),
    "sizes_exchanged": (
        "A rank knows what it sends; what it receives is known only to the senders: a receiver that assumes its "
        "sizes gets rows cut off or padded as soon as the routing is uneven.",
        "Every rank sends each rank the one number 'how many rows you will get from me', and reads the numbers "
        "the others sent it.",
        "`dist.all_to_all_single(output, input)` of one int64 count per rank (your input_split_sizes as a tensor), "
        "into an empty tensor of the same shape; its values are your output_split_sizes.",
    ),
    "dispatch_rows": (
        "Each expert lives on one rank: the rows routed to it must reach that rank, from every rank, as a block "
        "per sender, rank 0's first.",
        "Send x_slots in perm's order, cut by input_split_sizes (block j to rank j); receive output_split_sizes "
        "rows from each rank, in rank order.",
        "all_to_all_single_autograd(x_slots[perm], output_split_sizes, input_split_sizes, group): the output's "
        "sizes come first.",
    ),
    "combine_rows": (
        "The rows come back in the order they were sent, which is not the order of the slots.",
        "combine sends the expert's rows back with the splits swapped; the k-th row it gets back is slot "
        "perm[k]'s, and the dropped slots get zeros.",
        "output_split_sizes and input_split_sizes swap places in combine; new_zeros(n_slots, hidden)"
        ".index_copy(0, perm, rows).",
    ),
    "combine_grads": (
        "The expert's gradient has to travel back to the rank that owns each token: otherwise the layers before the "
        "MoE layer train without the expert's part of their gradient.",
        "An all-to-all whose backward is the all-to-all with the splits swapped carries the gradient; "
        "dist.all_to_all_single writes into a buffer and has no backward.",
        "torch.distributed._functional_collectives.all_to_all_single_autograd(rows, output_split_sizes, "
        "input_split_sizes, group) (torch.distributed.nn.functional.all_to_all_single is deprecated in 2.13).",
    ),
    "dispatch_grads": (
        "The tokens' rows get their gradient back from the expert through dispatch's all-to-all: without it the "
        "layers before the MoE layer see only the router's part of it.",
        "dispatch's all-to-all must be autograd-aware: its backward is the all-to-all with the splits swapped, "
        "which sends each row's gradient back to the rank it came from.",
        "torch.distributed._functional_collectives.all_to_all_single_autograd(x_slots[perm], output_split_sizes, "
        "input_split_sizes, group).",
    ),
    "dispatch_all_to_alls": (
        "Expert parallelism moves tokens, twice each way, in every MoE layer of every step: an exchange more than "
        "that is paid on the critical path, and one less leaves tokens where their expert is not.",
        "One all-to-all in dispatch; autograd runs its backward; nothing else communicates.",
        "One all_to_all_single_autograd call in dispatch, and no other collective.",
    ),
    "combine_all_to_alls": (
        "Expert parallelism moves tokens, twice each way, in every MoE layer of every step: an exchange more than "
        "that is paid on the critical path, and one less leaves rows where their token is not.",
        "One all-to-all in combine; autograd runs its backward; nothing else communicates.",
        "One all_to_all_single_autograd call in combine, with the splits swapped, and no other collective.",
    ),
    "keeps_dtype": (
        "MoE layers train in bf16 on GPUs: a buffer that silently becomes float32 on the CPU breaks the layer the "
        "moment it leaves the float32 CPU run it was written on.",
        "Every tensor a function makes for its result takes its dtype and device from the tensors it was given.",
        "x.new_zeros(n, h) or torch.zeros(n, h, dtype=x.dtype, device=x.device), not torch.zeros(n, h).",
    ),
}
