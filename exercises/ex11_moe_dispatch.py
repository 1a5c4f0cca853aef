"""Exercise 11: expert parallelism's dispatch and combine, with uneven all-to-alls.

A mixture-of-experts layer sends each token to the expert its router chose (Shazeer et al., 2017).
With expert parallelism each of the ``W`` ranks holds one expert, expert ``r`` on rank ``r``, and
routes its own tokens (Lepikhin et al., 2020, "GShard"). Notebook 11 dispatches GShard's way: every
rank sends every expert ``C`` rows, padded. Here each rank sends only the slots it kept, so the
splits are uneven, and they must be known on both sides before the tokens move:

1. ``sort_by_expert``: put the kept slots in expert order (the all-to-all sends contiguous blocks,
   the block for rank ``j`` first-to-last by ``j``) and count each expert's slots;
2. ``exchange_split_sizes``: tell every rank how many rows it will receive from this one: an
   all-to-all of ``W`` counts;
3. ``dispatch``: the uneven all-to-all of the sorted rows, autograd-aware;
4. ``combine``: the expert's outputs back the same way (the splits swapped), then the inverse
   permutation, so that each slot gets its own row back.

``moe_forward`` (given, not graded) puts them together with the course's router and capacity
(``distlab.lab.expert_parallel``). The grader assembles the layer the same way, one function at a time:
where one returns a wrong result, its own goes on in its place, so that the functions after it are graded on
the right inputs. The backward's gradients and its all-to-alls are graded where the layer ran through your own
dispatch and combine. The process group is set up and every rank is a rank of expert parallelism. Check your
work with ``make grade`` or
``.venv/bin/python -m autograder grade --exercise 11``, or with ``check(11)`` in ``course/11_expert_parallel``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd

from distlab.lab.expert_parallel import MoE


def sort_by_expert(expert: torch.Tensor, keep: torch.Tensor, world_size: int) -> tuple[torch.Tensor, list[int]]:
    """The order the kept slots are sent in, and how many go to each rank.

    Contract (the grader checks each point):

    * ``expert``: ``(S,)`` int64, the expert (= the rank holding it) of each of this rank's ``S`` slots;
      ``keep``: ``(S,)`` bool, False for the slots dropped at capacity (they are not sent).
    * Returns ``perm``, ``(K,)`` int64: the indices of the ``K`` kept slots, ordered by expert (any order
      among one expert's slots), and ``input_split_sizes``: a list of ``world_size`` Python ints, the
      number of kept slots for each expert (they add up to ``K``; an expert with none gets 0).
    * No communication.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def exchange_split_sizes(input_split_sizes: list[int]) -> list[int]:
    """How many rows this rank will receive from each rank: ``output_split_sizes``.

    Contract (the grader checks each point):

    * ``input_split_sizes[j]``: the rows this rank will send rank ``j``.
    * Returns a list of ``W`` Python ints: element ``j`` is ``input_split_sizes[rank]`` *of rank j*.
    * One collective: ``dist.all_to_all_single`` of a tensor of the ``W`` counts (int64).
    """
    # YOUR CODE HERE
    raise NotImplementedError


def dispatch(x_slots: torch.Tensor, perm: torch.Tensor, input_split_sizes: list[int],
             output_split_sizes: list[int]) -> torch.Tensor:
    """Send each kept slot's row to its expert's rank.

    Contract (the grader checks each point):

    * ``x_slots``: ``(S, hidden)``, one row per slot (its token's); ``perm``, ``input_split_sizes``: from
      :func:`sort_by_expert`; ``output_split_sizes``: from :func:`exchange_split_sizes`.
    * Returns ``(sum(output_split_sizes), hidden)``, in ``x_slots``' dtype: the rows this rank's expert must
      process, rank 0's first, then rank 1's... One collective, an all-to-all, in the forward, and one in the backward:
      use the autograd-aware all-to-all, or ``x_slots`` gets no gradient from the expert.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def combine(y_recv: torch.Tensor, perm: torch.Tensor, n_slots: int, input_split_sizes: list[int],
            output_split_sizes: list[int]) -> torch.Tensor:
    """Send the expert's outputs back and put each in its slot's place.

    Contract (the grader checks each point):

    * ``y_recv``: the expert's output for the rows :func:`dispatch` returned, in the same order; the
      other arguments as :func:`dispatch` was given them; ``n_slots``: ``S``.
    * Returns ``(S, hidden)``, in ``y_recv``'s dtype and on its device: row ``i`` is the expert's output for
      slot ``i``, zeros for the dropped slots. One autograd-aware all-to-all (the splits swapped) in the
      forward and one in the backward; then the inverse of ``perm``: the row returned ``k``-th belongs to
      slot ``perm[k]``.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def moe_forward(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """This rank's share of ``moe`` on its own tokens ``x`` (given, not graded).

    ``moe`` is the same on every rank, with one expert per rank; this rank runs ``moe.experts[rank]``
    only. Route, sort, exchange the counts, dispatch, the expert, combine, then add each slot's
    ``gate * output`` into its token: the same as ``moe(x_all, groups=W).y`` on this rank's rows.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    _, slots = moe.route(x)
    perm, send = sort_by_expert(slots.expert, slots.keep, world)
    recv = exchange_split_sizes(send)
    expert: nn.Module = moe.experts[rank]
    y_slots = combine(expert(dispatch(x[slots.token], perm, send, recv)), perm, len(slots.token), send, recv)
    return torch.zeros_like(x).index_add(0, slots.token, slots.gate[:, None] * y_slots)
