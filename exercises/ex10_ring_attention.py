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
    # YOUR CODE HERE
    raise NotImplementedError


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
    # YOUR CODE HERE
    raise NotImplementedError
