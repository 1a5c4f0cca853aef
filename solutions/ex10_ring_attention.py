"""Exercise 10: the balanced causal ring, by hand, with point-to-point sends and receives.

Context parallelism splits the *sequence* across the ranks (Liu et al. 2023, "Ring Attention with
Blockwise Transformers"). Attention needs each query against every earlier key, so the key/value shards
travel round a ring: at step ``i`` rank ``r`` works on the shard that started on rank ``(r - i) % W``,
and passes it on to rank ``(r + 1) % W`` while receiving the next one from rank ``(r - 1) % W``. No rank
ever holds the whole sequence.

With a causal mask, contiguous shards give rank 0 almost nothing to compute and the last rank the most
(notebook 10 measured it): the ring runs at the speed of its busiest rank. So the sequence here is cut
into ``2 W`` chunks of ``c = S / 2W`` positions, and rank ``r`` holds chunks ``r`` and ``2 W - 1 - r``,
an early one and a late one: the *zig-zag* layout of Llama 3's context parallelism ("The Llama 3 Herd of
Models" 2024, section 3.3.2) and of ring-flash-attention's ``zigzag_ring_flash_attn``. Every rank then has
the same work, *if* it skips what the mask hides: which (query chunk, key chunk) pairs are entirely
visible, entirely hidden or cut by the diagonal depends on where each chunk sits in the sequence.

Each block gives an output normalised over its own keys, with its log-sum-exp ``lse = logsumexp(scores,
-1)``; notebook 10 merged such partial outputs for the non-causal ring. Autograd does not flow through
``isend``/``irecv``, so the backward is a second ring, written by hand as FlashAttention's backward is
(Dao 2023, "FlashAttention-2", algorithm 2): each block's probabilities are recomputed from the saved
``lse``, ``dq`` stays on its rank, and the gradients of each key/value shard travel round with it and go
home at the end.

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
      ``B x H x n x D`` with ``n = 2 c`` and ``c = S / 2W``, in the zig-zag layout: rank ``r`` holds
      positions ``r c ... (r + 1) c - 1`` (chunk ``r``) then ``(2W - 1 - r) c ... (2W - r) c - 1``
      (chunk ``2W - 1 - r``), in that order.
    * Return ``B x H x n x D``: the rows of ``F.scaled_dot_product_attention(Q, K, V, is_causal=True)``
      on the whole sequence (``Q, K, V`` the ``W`` shards put back in sequence order) at this rank's
      positions, in the order it holds them, to float32 rounding, with no NaN, also for scores past
      ``exp``'s float32 range (merge in log space). Forward only (no autograd).
    * Communication: point-to-point only, round a ring. Each rank sends a key/value shard to one
      neighbour and receives one from the other, ``W - 1`` times, the received shard being the one
      it forwards next (``dist.batch_isend_irecv`` with ``dist.P2POp``, or ``dist.isend``/``dist.irecv``).
      No collective (``all_gather`` would hold the whole sequence on every rank).
    * Work: every rank computes the same number of scores (entries of ``q k^T``, counted by the matrix
      products' shapes, ``F.scaled_dot_product_attention``'s included), and none for a pair of chunks the
      mask hides entirely: at most ``n^2`` for its own shard and ``n^2 / 2`` for each other one, so at most
      ``(W + 1) n^2 / 2`` in all (a contiguous layout, or a ring that computes every block masked, does more
      on some rank).
    """
    ### BEGIN SOLUTION
    rank, world = dist.get_rank(), dist.get_world_size()
    c, scale = q.shape[-2] // 2, q.shape[-1] ** -0.5
    pos = torch.cat([torch.arange(rank * c, (rank + 1) * c),
                     torch.arange((2 * world - 1 - rank) * c, (2 * world - rank) * c)]).to(q.device)
    out = torch.zeros_like(q)
    lse = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=q.dtype, device=q.device)
    kv = torch.stack([k, v])
    for step in range(world):
        if step < world - 1:  # post the exchange first: the compute below can overlap it
            buf = torch.empty_like(kv)
            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, (rank + 1) % world),
                                            dist.P2POp(dist.irecv, buf, (rank - 1) % world)])
        src = (rank - step) % world  # where the shard in hand started
        # Own shard: the diagonal, masked. An earlier rank's: its early chunk is before both of ours, its
        # late chunk after both. A later rank's: both its chunks are before our late chunk, after our early one.
        rows, cols = (slice(None), slice(None)) if src == rank else \
            (slice(None), slice(0, c)) if src < rank else (slice(c, None), slice(None))
        scores = (q[..., rows, :] @ kv[0][..., cols, :].transpose(-1, -2)) * scale
        if src == rank:
            scores = scores.masked_fill(pos[:, None] < pos[None, :], float("-inf"))
        block_lse = torch.logsumexp(scores, dim=-1, keepdim=True)
        block_out = torch.exp(scores - block_lse) @ kv[1][..., cols, :]
        o, m = out[..., rows, :], lse[..., rows, :]  # views: the merge writes through them
        new = torch.logaddexp(m, block_lse)
        o.copy_(torch.exp(m - new) * o + torch.exp(block_lse - new) * block_out)
        m.copy_(new)
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

    * ``q, k, v`` are this rank's shards, in the zig-zag layout of :func:`ring_attention`; ``out`` is this
      rank's rows of the output and ``lse`` (``B x H x n x 1``) their log-sum-exp over *every* key they may
      see (the merged ``lse`` the forward ends with); ``dout`` is the loss's gradient with respect to ``out``.
    * Return ``(dq, dk, dv)``, each ``B x H x n x D``: the gradients of this rank's *own* shards of
      ``Q, K, V``, as autograd through ``F.scaled_dot_product_attention(Q, K, V, is_causal=True)`` on
      the whole sequence gives them, to float32 rounding. ``dk`` and ``dv`` get a contribution from the
      queries of other ranks, so they are summed on the way round, not on their owner.
    * The math, per block of keys, with ``scale = 1 / sqrt(head_dim)`` and ``p = exp(scale * q k^T - lse)``
      masked by global positions (the softmax over the whole sequence, cut to the block):
      ``dv += p^T dout``; ``dp = dout v^T``; ``ds = p * (dp - D)`` with ``D = rowsum(dout * out)``, one
      number per query, from the merged output; ``dq += scale * ds k``; ``dk += scale * ds^T q``.
    * Communication: point-to-point only, round the ring of the forward. Each key/value shard travels
      with its ``dk, dv`` accumulators, ``W - 1`` hops, and the accumulators take one hop more, home:
      each rank sends and receives ``(4 W - 2)`` shards' worth of bytes (``k, v, dk, dv`` ``W - 1``
      times, then ``dk, dv``), to and from its neighbours only. No collective.
    * Work: as in the forward, every rank computes the same number of scores (the backward recomputes them), and
      none for a pair of chunks the mask hides entirely: counted from the matrix products' shapes, five products
      a block of scores (``q k^T``, ``dout v^T``, ``ds k``, ``ds^T q``, ``p^T dout``), with a quarter's slack for
      other ways of writing the same math.
    """
    ### BEGIN SOLUTION
    me, world = dist.get_rank(), dist.get_world_size()
    c, scale = q.shape[-2] // 2, q.shape[-1] ** -0.5
    pos = torch.cat([torch.arange(me * c, (me + 1) * c),
                     torch.arange((2 * world - 1 - me) * c, (2 * world - me) * c)]).to(q.device)
    delta = (dout * out).sum(-1, keepdim=True)  # D: sum_j p_j dp_j per query, from the merged output
    dq = torch.zeros_like(q)
    moving = torch.stack([k, v, torch.zeros_like(k), torch.zeros_like(v)])  # a shard and its dk, dv so far
    for step in range(world):
        owner = (me - step) % world  # whose shard is in hand
        rows, cols = (slice(None), slice(None)) if owner == me else \
            (slice(None), slice(0, c)) if owner < me else (slice(c, None), slice(None))  # the forward's blocks
        kb, vb = moving[0][..., cols, :], moving[1][..., cols, :]
        s = (q[..., rows, :] @ kb.transpose(-1, -2)) * scale
        if owner == me:
            s = s.masked_fill(pos[:, None] < pos[None, :], float("-inf"))
        p = torch.exp(s - lse[..., rows, :])
        ds = p * (dout[..., rows, :] @ vb.transpose(-1, -2) - delta[..., rows, :])
        dq[..., rows, :] += (ds @ kb) * scale
        moving[2][..., cols, :] += (ds.transpose(-1, -2) @ q[..., rows, :]) * scale
        moving[3][..., cols, :] += p.transpose(-1, -2) @ dout[..., rows, :]
        send = moving if step < world - 1 else moving[2:].contiguous()  # the last hop takes dk, dv home
        recv = torch.empty_like(send)
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, (me + 1) % world),
                                            dist.P2POp(dist.irecv, recv, (me - 1) % world)]):
            work.wait()
        moving = recv
    return dq, moving[0], moving[1]
    ### END SOLUTION
