"""Exercise 11 (MoE dispatch and combine with uneven all-to-alls): mistakes with capacity drops, split sizes
and the inverse permutation."""
from __future__ import annotations

from . import Mistake

_PERM = "    perm = kept[torch.argsort(expert[kept], stable=True)]\n"
_COUNTS = "    return perm, torch.bincount(expert[kept], minlength=world_size).tolist()\n"
_EXCHANGE = """    send = torch.tensor(input_split_sizes, dtype=torch.int64)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)  # rank j's element `rank` lands at recv[j]
    return recv.tolist()
"""
_DISPATCH = ("    return all_to_all_single_autograd(x_slots[perm], output_split_sizes, input_split_sizes, "
             "dist.group.WORLD)\n")
_COMBINE_A2A = ("    back = all_to_all_single_autograd(y_recv, input_split_sizes, output_split_sizes, "
                "dist.group.WORLD)\n")
_UNPERMUTE = "    return back.new_zeros(n_slots, back.shape[1]).index_copy(0, perm, back)\n"

MISTAKES = [
    Mistake(
        name="dropped_slots_sent",
        what="sort_by_expert orders and counts every slot, the ones dropped at capacity too, so the dropped "
             "slots are sent, processed by the expert and come back with an output instead of zeros.",
        source="GShard (Lepikhin et al. 2020) sec. 2.2: tokens over capacity are dropped; "
               "distlab/lab/expert_parallel/moe.py: 'Dropped slots add nothing'",
        edits={_PERM: "    perm = torch.argsort(expert, stable=True)\n",
               _COUNTS: "    return perm, torch.bincount(expert, minlength=world_size).tolist()\n"},
        key_terms=("dropped",),
    ),
    Mistake(
        name="bincount_without_minlength",
        what="The split sizes come from torch.bincount without minlength, so when the last experts get no "
             "slot the list is shorter than world_size instead of ending in zeros.",
        source="exercises/ex11_moe_dispatch.py: 'an expert with none gets 0'; bincount's output length is "
               "max + 1 unless minlength is given",
        edits={_COUNTS: "    return perm, torch.bincount(expert[kept]).tolist()\n"},
        key_terms=("world_size",),
    ),
    Mistake(
        name="perm_indexes_the_kept_subset",
        what="perm is argsort(expert[keep]): positions within the kept slots, not slot indices, so once a slot "
             "is dropped the wrong rows are sent and put back in the wrong places.",
        source="exercises/ex11_moe_dispatch.py: 'perm: the indices of the K kept slots'; argsort of a "
               "boolean-masked tensor indexes the masked tensor",
        edits={_PERM: "    perm = torch.argsort(expert[keep], stable=True)\n"},
        key_terms=("perm",),
    ),
    Mistake(
        name="split_sizes_not_exchanged",
        what="exchange_split_sizes returns this rank's own input_split_sizes, as if every rank sent it what it "
             "sends them: right only when the routing is symmetric.",
        source="https://github.com/pytorch/pytorch/pull/32361 (review: 'output_splits should be transpose of "
               "input_splits ... we have no way of ensuring that user had specified correct splits')",
        edits={_EXCHANGE: "    return list(input_split_sizes)  # what I send rank j, rank j sends me\n"},
        key_terms=("exchange_split_sizes",),
    ),
    Mistake(
        name="dispatch_split_sizes_swapped",
        what="dispatch passes input_split_sizes where all_to_all_single_autograd expects output_split_sizes "
             "(its order is output first, then input): right only when the splits are even.",
        source="torch.distributed._functional_collectives.all_to_all_single_autograd(self, output_split_sizes, "
               "input_split_sizes, group): the reverse of the order people say them in",
        edits={_DISPATCH: "    return all_to_all_single_autograd(x_slots[perm], input_split_sizes, output_split_sizes, "
                          "dist.group.WORLD)\n"},
        key_terms=("split",),
    ),
    Mistake(
        name="combine_split_sizes_not_swapped",
        what="combine sends the expert's outputs back with dispatch's splits unchanged, instead of swapped.",
        source="exercises/ex11_moe_dispatch.py: 'One autograd-aware all-to-all (the splits swapped)'; "
               "https://github.com/pytorch/torchtitan/pull/941 (output_splits reused as the second shuffle's input_splits)",
        edits={_COMBINE_A2A: "    back = all_to_all_single_autograd(y_recv, output_split_sizes, input_split_sizes, "
                             "dist.group.WORLD)\n"},
        key_terms=("split",),
    ),
    Mistake(
        name="kept_order_not_restored",
        what="combine writes the returned rows into the kept slots in slot order, without the inverse of perm: "
             "the rows stay in expert order and land in other slots.",
        source="https://github.com/sgl-project/sglang-jax/pull/1451 (the unpermute must scatter with the "
               "inverse of the routing permutation)",
        edits={_UNPERMUTE: "    out = back.new_zeros(n_slots, back.shape[1])\n"
                           "    out[perm.sort().values] = back  # the kept slots get their rows back\n"
                           "    return out\n"},
        key_terms=("inverse",),
    ),
    Mistake(
        name="inverse_applied_twice",
        what="combine both scatters with perm and gathers with argsort(perm), so the permutation is undone "
             "twice: row k goes to slot perm[k] only when perm is its own inverse.",
        source="https://github.com/hiyouga/LlamaFactory/pull/10734 (argsort().argsort() and the scatter "
               "inverse: which direction a permutation goes is easy to get backwards)",
        edits={_UNPERMUTE: "    out = back.new_zeros(n_slots, back.shape[1])\n"
                           "    out[perm] = back[torch.argsort(perm)]  # undo the sort\n"
                           "    return out\n"},
        key_terms=("inverse",),
    ),
    Mistake(
        name="dispatch_not_autograd_aware",
        what="dispatch uses the in-place dist.all_to_all_single into a new buffer, which autograd does not "
             "see: the forward is right but x_slots gets no gradient through the expert.",
        source="course/11_expert_parallel.py: 'The all-to-all must be autograd-aware ... or no gradient "
               "reaches the experts'",
        edits={_DISPATCH: """    out = x_slots.new_empty(sum(output_split_sizes), x_slots.shape[1])
    dist.all_to_all_single(out, x_slots[perm].contiguous(), output_split_sizes, input_split_sizes)
    return out
"""},
        key_terms=("gradient",),
    ),
]

LEGAL = [
    Mistake(
        name="unstable_sort",
        what="The kept slots are sorted with a plain (unstable) argsort: the order among one expert's slots "
             "may change, which the contract allows, and the inverse permutation undoes whatever order it is.",
        source="exercises/ex11_moe_dispatch.py: 'ordered by expert (any order among one expert's slots)'",
        edits={_PERM: "    perm = kept[torch.argsort(expert[kept])]\n"},
    ),
    Mistake(
        name="loop_over_experts",
        what="sort_by_expert gathers each expert's kept slots with a Python loop over the experts and "
             "concatenates them, counting each list's length.",
        source="a loop instead of the vectorised argsort/bincount: fairscale-era MoE code groups tokens per expert",
        edits={"    kept = keep.nonzero().squeeze(1)\n    # stable: among one expert's slots, token order, which makes the run "
                      "reproducible to the bit\n": "",
               _PERM + _COUNTS: "    chosen = [(keep & (expert == e)).nonzero().squeeze(1) for e in range(world_size)]\n"
                                "    return torch.cat(chosen), [len(c) for c in chosen]\n"},
    ),
    Mistake(
        name="unpermute_by_index_assignment",
        what="combine scatters the returned rows into a zero tensor with out[perm] = back (index_put) instead "
             "of index_copy: row k still goes to slot perm[k], with a backward.",
        source="https://github.com/hiyouga/LlamaFactory/pull/10734 (the scatter inverse: inv[perm] = arange)",
        edits={_UNPERMUTE: "    out = back.new_zeros(n_slots, back.shape[1])\n"
                           "    out[perm] = back  # row k belongs to slot perm[k]\n"
                           "    return out\n"},
    ),
]
