"""Exercise 10: causal ring attention by hand, with point-to-point sends and receives.

Context parallelism splits the *sequence* across the ranks (Liu et al. 2023, "Ring Attention with
Blockwise Transformers"): rank ``r`` of ``W`` holds positions ``r * n ... (r + 1) * n - 1`` of every
query, key and value (``n = S / W``). Attention needs each query against every earlier key, so the
key/value shards travel round a ring: at step ``i`` rank ``r`` works on the shard that started on
rank ``(r - i) % W``, and passes it on to rank ``(r + 1) % W`` while receiving the next one from rank
``(r - 1) % W``. No rank ever holds the whole sequence.

Each step gives an output normalised over one block of keys only, with that block's log-sum-exp
``lse = logsumexp(scores, -1)``. Notebook 10 merged such partial outputs for the non-causal ring.
Here the mask is causal, and it is a mask by *global* positions: the query at position ``i`` may see
the key at position ``j`` only if ``j <= i``. Some blocks are then entirely hidden, some cut by the
diagonal, some entirely visible: which is which depends on where each shard sits in the sequence.

Autograd does not flow through ``isend``/``irecv``, so the backward is a second ring, written by hand
as FlashAttention's backward is (Dao 2023, "FlashAttention-2", algorithm 2; the ring of Liu et al.
2023): each block's probabilities are recomputed from the saved ``lse``, ``dq`` stays on its rank, and
the gradients of each key/value shard travel round with it and go home at the end.

Check your work from the repository's root with ``make grade`` (every exercise) or
``.venv/bin/python -m autograder grade --exercise 10`` (this one), or with ``check(10)`` in the notebook
``course/10_context_parallel``. The functions raise ``NotImplementedError`` until you fill them in;
each is graded on its own (the backward is given the exact ``out`` and ``lse``), so one can be done first.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """This rank's shard of causal attention over the whole sequence, by a ring of key/value shards.

    Contract (the grader checks each point):

    * The process group is set up with ``W`` ranks. ``q, k, v`` are this rank's shards, each
      ``B x H x n x D`` (``n = S / W``): rank ``r`` holds the contiguous positions ``r * n`` to
      ``(r + 1) * n - 1`` of the sequence.
    * Return ``B x H x n x D``: rows ``r * n ... (r + 1) * n - 1`` of
      ``F.scaled_dot_product_attention(Q, K, V, is_causal=True)`` on the whole sequence (``Q, K, V``
      the ``W`` shards put together), to float32 rounding, with no NaN. Forward only (no autograd).
    * Communication: point-to-point only, round a ring. Each rank sends a key/value shard to one
      neighbour and receives one from the other, ``W - 1`` times, the received shard being the one
      it forwards next (``dist.batch_isend_irecv`` with ``dist.P2POp``, or ``dist.isend``/``dist.irecv``).
      No collective (``all_gather`` would hold the whole sequence on every rank).
    * Merge the partial outputs by their log-sum-exps; mask by global positions.
    """
    ### BEGIN SOLUTION
    rank, world = dist.get_rank(), dist.get_world_size()
    n, scale = q.shape[-2], q.shape[-1] ** -0.5
    q_pos = torch.arange(rank * n, (rank + 1) * n, device=q.device)
    kv = torch.stack([k, v])
    out = lse = None
    for step in range(world):
        if step < world - 1:  # post the exchange first: the compute below can overlap it
            buf = torch.empty_like(kv)
            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, (rank + 1) % world),
                                            dist.P2POp(dist.irecv, buf, (rank - 1) % world)])
        src = (rank - step) % world  # where the shard in hand started
        if src <= rank:  # a shard after this one is hidden by the causal mask: nothing to compute
            k_pos = torch.arange(src * n, (src + 1) * n, device=q.device)
            scores = (q @ kv[0].transpose(-1, -2)) * scale
            scores = scores.masked_fill(q_pos[:, None] < k_pos[None, :], float("-inf"))
            block_lse = torch.logsumexp(scores, dim=-1, keepdim=True)
            block_out = torch.exp(scores - block_lse) @ kv[1]
            if out is None:
                out, lse = block_out, block_lse
            else:
                new = torch.logaddexp(lse, block_lse)
                out = torch.exp(lse - new) * out + torch.exp(block_lse - new) * block_out
                lse = new
        if step < world - 1:
            for work in works:
                work.wait()
            kv = buf
    return out
    ### END SOLUTION


def ring_attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                            lse: torch.Tensor, dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's ``dq, dk, dv`` of causal attention over the whole sequence, by a second ring.

    Contract (the grader checks each point):

    * ``q, k, v`` are this rank's shards, as in :func:`ring_attention`; ``out`` is this rank's rows of the
      output and ``lse`` (``B x H x n x 1``) their log-sum-exp over *every* key they may see (the
      merged ``lse`` the forward ends with); ``dout`` is the loss's gradient with respect to ``out``.
    * Return ``(dq, dk, dv)``, each ``B x H x n x D``: the gradients of this rank's *own* shards of
      ``Q, K, V``, as autograd through ``F.scaled_dot_product_attention(Q, K, V, is_causal=True)`` on
      the whole sequence gives them, to float32 rounding. ``dk`` and ``dv`` get a contribution from the
      queries of every later rank, so they are summed on the way round, not on their owner.
    * The math, per block of keys, with ``scale = 1 / sqrt(head_dim)`` and ``p = exp(scale * q k^T - lse)``
      masked by global positions (the softmax over the whole sequence, cut to the block):
      ``dv += p^T dout``; ``dp = dout v^T``; ``ds = p * (dp - D)`` with ``D = rowsum(dout * out)``, one
      number per query, from the merged output; ``dq += scale * ds k``; ``dk += scale * ds^T q``.
    * Communication: point-to-point only, round the ring of the forward. Each key/value shard travels
      with its ``dk, dv`` accumulators, ``W - 1`` hops, and the accumulators take one hop more, home:
      each rank sends and receives ``(4 W - 2)`` shards' worth of bytes (``k, v, dk, dv`` ``W - 1``
      times, then ``dk, dv``), to and from its neighbours only. No collective.
    """
    ### BEGIN SOLUTION
    me, world = dist.get_rank(), dist.get_world_size()
    n, scale = q.shape[-2], q.shape[-1] ** -0.5
    rows = me * n + torch.arange(n, device=q.device)  # global positions of this rank's queries
    delta = (dout * out).sum(-1, keepdim=True)  # D: sum_j p_j dp_j per query, from the merged output
    dq = torch.zeros_like(q)
    moving = torch.stack([k, v, torch.zeros_like(k), torch.zeros_like(v)])  # a shard and its dk, dv so far
    for step in range(world):
        owner = (me - step) % world  # whose shard is in hand
        if owner <= me:  # a later rank's keys are hidden from every query here: p = 0, nothing to add
            cols = owner * n + torch.arange(n, device=q.device)
            s = (q @ moving[0].transpose(-1, -2)) * scale
            p = torch.exp(s.masked_fill(cols[None, :] > rows[:, None], float("-inf")) - lse)
            ds = p * (dout @ moving[1].transpose(-1, -2) - delta)
            dq += (ds @ moving[0]) * scale
            moving[2] += (ds.transpose(-1, -2) @ q) * scale
            moving[3] += p.transpose(-1, -2) @ dout
        send = moving if step < world - 1 else moving[2:].contiguous()  # the last hop takes dk, dv home
        recv = torch.empty_like(send)
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, (me + 1) % world),
                                            dist.P2POp(dist.irecv, recv, (me - 1) % world)]):
            work.wait()
        moving = recv
    return dq, moving[0], moving[1]
    ### END SOLUTION
