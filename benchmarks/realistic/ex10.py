"""Exercise 10 (causal ring attention by hand): mistakes in the forward's masks and merges, and in the
backward's ring of dk, dv."""
from __future__ import annotations

from . import Mistake

# the forward
_Q_POS = "    q_pos = torch.arange(rank * n, (rank + 1) * n, device=q.device)\n"
_K_POS = "            k_pos = torch.arange(src * n, (src + 1) * n, device=q.device)\n"
_SKIP = "        if src <= rank:  # a shard after this one is hidden by the causal mask: nothing to compute\n"
_MASK = '            scores = scores.masked_fill(q_pos[:, None] < k_pos[None, :], float("-inf"))\n'
_MERGE = "                new = torch.logaddexp(lse, block_lse)\n"
_EXCHANGE = """            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, (rank + 1) % world),
                                            dist.P2POp(dist.irecv, buf, (rank - 1) % world)])
"""
# the backward
_OWNER_BLOCK = """        if owner <= me:  # a later rank's keys are hidden from every query here: p = 0, nothing to add
            cols = owner * n + torch.arange(n, device=q.device)
            s = (q @ moving[0].transpose(-1, -2)) * scale
            p = torch.exp(s.masked_fill(cols[None, :] > rows[:, None], float("-inf")) - lse)
            ds = p * (dout @ moving[1].transpose(-1, -2) - delta)
            dq += (ds @ moving[0]) * scale
            moving[2] += (ds.transpose(-1, -2) @ q) * scale
            moving[3] += p.transpose(-1, -2) @ dout
"""
_P = '            p = torch.exp(s.masked_fill(cols[None, :] > rows[:, None], float("-inf")) - lse)\n'
_DS = "            ds = p * (dout @ moving[1].transpose(-1, -2) - delta)\n"
_DQ = "            dq += (ds @ moving[0]) * scale\n"
_DK = "            moving[2] += (ds.transpose(-1, -2) @ q) * scale\n"
_DV = "            moving[3] += p.transpose(-1, -2) @ dout\n"
_HOPS = """        send = moving if step < world - 1 else moving[2:].contiguous()  # the last hop takes dk, dv home
        recv = torch.empty_like(send)
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, (me + 1) % world),
                                            dist.P2POp(dist.irecv, recv, (me - 1) % world)]):
            work.wait()
        moving = recv
    return dq, moving[0], moving[1]
"""

MISTAKES = [
    # ---- ring_attention (the forward)
    Mistake(
        name="diagonal_mask_on_every_block",
        what="The causal mask is built from local positions (0..n-1 for queries and keys), so every visible "
             "block gets the diagonal block's triangle and the earlier shards are half hidden.",
        source="course/10_context_parallel.py: 'the mask is by global positions (rank r's query i is at "
               "position r n + i)'; is_causal=True on each block is the shortcut people take",
        edits={_Q_POS: "    q_pos = torch.arange(n, device=q.device)\n",
               _K_POS: "            k_pos = torch.arange(n, device=q.device)\n"},
        key_terms=("global",),
    ),
    Mistake(
        name="hidden_block_not_skipped",
        what="Every block is computed, including the shards of later ranks that the causal mask hides "
             "entirely: their rows are all -inf, their lse is -inf, and exp(-inf - -inf) puts NaN in the output.",
        source="https://github.com/tracel-ai/burn/pull/4697 (a fully masked softmax row gives -inf - (-inf) = NaN)",
        edits={_SKIP: "        if True:  # every block: the mask hides what must be hidden\n"},
        key_terms=("NaN",),
    ),
    Mistake(
        name="lse_merge_without_max",
        what="The log-sum-exps are merged as log(exp(lse_a) + exp(lse_b)) without subtracting the max first, "
             "which overflows to inf (and NaN) once a row's scores pass ~88.",
        source="https://github.com/flashinfer-ai/flashinfer/pull/4401 (online-softmax merges must be taken "
               "relative to the running max); Milakov & Gimelshein 2018, online softmax",
        edits={_MERGE: "                new = torch.log(torch.exp(lse) + torch.exp(block_lse))\n"},
        key_terms=("log-sum-exp",),
    ),
    Mistake(
        name="lse_not_carried",
        what="The merged output is updated but the running lse is not, so the third block onwards is weighed "
             "against the first block's lse alone (right at W = 2, wrong from W = 3 on).",
        source="FlashAttention (Dao et al. 2022) alg. 1 updates the output and the normaliser together; "
               "course/10_context_parallel.py's merge returns both (merged, lse), and the new lse is easy to drop",
        edits={"                lse = new\n": ""},
        key_terms=("log-sum-exp",),
    ),
    Mistake(
        name="mask_hides_the_diagonal",
        what="The mask uses <= instead of <, so a query may not see its own key: the first query of the "
             "sequence sees no key at all (NaN) and every other row loses its diagonal term.",
        source="exercises/ex10_ring_attention.py: 'the query at position i may see the key at position j only "
               "if j <= i'; strict and non-strict mixed up when the condition is inverted for masked_fill",
        edits={_MASK: '            scores = scores.masked_fill(q_pos[:, None] <= k_pos[None, :], float("-inf"))\n'},
        key_terms=("mask",),
    ),
    Mistake(
        name="ring_direction_mixed_up",
        what="The shard in hand at step i is taken to come from rank (r + i) % W although it travels from "
             "r - 1 to r + 1, so it is masked at the wrong positions (invisible at W = 2, wrong at W = 4).",
        source="Liu et al. 2023 (Ring Attention): at step i rank r holds the shard of rank (r - i) % W; "
               "exercises/ex10_ring_attention.py says so",
        edits={"        src = (rank - step) % world  # where the shard in hand started\n":
               "        src = (rank + step) % world  # where the shard in hand started\n"},
        key_terms=("shard",),
    ),
    Mistake(
        name="own_shard_sent_every_step",
        what="Each step sends this rank's own k, v again instead of forwarding the shard just received, so "
             "from W = 3 on a rank sees its left neighbour's shard W - 1 times and never the others.",
        source="exercises/ex10_ring_attention.py: 'the received shard being the one it forwards next'",
        edits={_EXCHANGE: """            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.stack([k, v]), (rank + 1) % world),
                                            dist.P2POp(dist.irecv, buf, (rank - 1) % world)])
"""},
        key_terms=("received",),
    ),
    Mistake(
        name="accumulators_start_at_zero",
        what="The running output and lse start at 0 instead of 'no block yet' (lse = -inf), which merges a "
             "phantom block of weight e^0 = 1 with output 0 into every row.",
        source="https://github.com/flashinfer-ai/flashinfer/pull/4401 (a merge state initialised to the wrong "
               "sentinel); zeros are the reflex for accumulators",
        edits={"    out = lse = None\n": "    out = torch.zeros_like(q)\n"
                                         "    lse = torch.zeros(*q.shape[:-1], 1, dtype=q.dtype, device=q.device)\n"},
        key_terms=("log-sum-exp",),
    ),
    Mistake(
        name="all_gather_instead_of_ring",
        what="Every rank all-gathers the whole sequence's keys and values and attends to them at once: the "
             "right numbers, but a collective, and every rank holds the whole sequence.",
        source="exercises/ex10_ring_attention.py: 'No collective (all_gather would hold the whole sequence "
               "on every rank)'",
        edits={_Q_POS: _Q_POS + """    ks, vs = [torch.empty_like(k) for _ in range(world)], [torch.empty_like(v) for _ in range(world)]
    dist.all_gather(ks, k.contiguous())
    dist.all_gather(vs, v.contiguous())
    keys, values = torch.cat(ks, dim=-2), torch.cat(vs, dim=-2)
    every = torch.arange(world * n, device=q.device)
    scores = (q @ keys.transpose(-1, -2)) * scale
    scores = scores.masked_fill(q_pos[:, None] < every[None, :], float("-inf"))
    return torch.softmax(scores, dim=-1) @ values
"""},
        key_terms=("collective",),
    ),
    # ---- ring_attention_backward
    Mistake(
        name="dk_dv_never_go_home",
        what="The ring stops after W - 1 hops and returns the dk, dv accumulators in hand, which belong to the "
             "next rank's shard, not this rank's.",
        source="course/10_context_parallel.py: 'each block's dk, dv travelling round with it and arriving home "
               "on the W-th send'",
        edits={_HOPS: """        if step < world - 1:
            recv = torch.empty_like(moving)
            for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, moving, (me + 1) % world),
                                                dist.P2POp(dist.irecv, recv, (me - 1) % world)]):
                work.wait()
            moving = recv
    return dq, moving[2], moving[3]
"""},
        key_terms=("home",),
    ),
    Mistake(
        name="dk_dv_kept_by_the_visited_rank",
        what="dk and dv are accumulated in local tensors, like dq, so each rank sums the gradients of the "
             "visiting shards' keys into its own dk, dv instead of sending them round with their shard.",
        source="exercises/ex10_ring_attention.py: 'dk and dv get a contribution from the queries of every later "
               "rank, so they are summed on the way round, not on their owner'",
        edits={"    dq = torch.zeros_like(q)\n": "    dq = torch.zeros_like(q)\n"
                                               "    dk, dv = torch.zeros_like(k), torch.zeros_like(v)\n",
               _DK: "            dk += (ds.transpose(-1, -2) @ q) * scale\n",
               _DV: "            dv += p.transpose(-1, -2) @ dout\n",
               "    return dq, moving[0], moving[1]\n": "    return dq, dk, dv\n"},
        key_terms=("dk",),
    ),
    Mistake(
        name="delta_from_the_block",
        what="D is computed per block as rowsum(p * dp) over that block's keys only, instead of once per "
             "query as rowsum(dout * out) from the merged output.",
        source="https://github.com/huggingface/picotron/issues/37 (ring attention backward: rowsum(dP * P) "
               "taken for rowsum(dO * O))",
        edits={_DS: "            dp = dout @ moving[1].transpose(-1, -2)\n"
                    "            ds = p * (dp - (p * dp).sum(-1, keepdim=True))  # D = sum_j p_j dp_j\n"},
        key_terms=("dq",),
    ),
    Mistake(
        name="probabilities_renormalised_per_block",
        what="Each block's probabilities are recomputed with a softmax over that block, not from the saved "
             "lse, so they are normalised over one block of keys instead of the whole row.",
        source="course/10_context_parallel.py: 'l is the merged lse of the whole row (so P is the softmax over "
               "the whole sequence, cut to the block)'",
        edits={_P: '            p = torch.softmax(s.masked_fill(cols[None, :] > rows[:, None], float("-inf")), dim=-1)\n'},
        key_terms=("lse",),
    ),
    Mistake(
        name="scale_dropped_in_dq_dk",
        what="dq and dk omit the softmax scale 1/sqrt(head_dim) of the chain rule through scale * q k^T.",
        source="FlashAttention-2 (Dao 2023) alg. 2: dQ += scale * dS K, dK += scale * dS^T Q; the scale is "
               "the factor hand-written backwards forget",
        edits={_DQ: "            dq += ds @ moving[0]\n",
               _DK: "            moving[2] += ds.transpose(-1, -2) @ q\n"},
        key_terms=("scale",),
    ),
    Mistake(
        name="dk_without_transpose",
        what="dk accumulates ds @ q instead of ds^T @ q; the blocks are square, so the shapes agree and "
             "nothing raises.",
        source="FlashAttention-2 (Dao 2023) alg. 2: dK = dS^T Q; a square n x n block hides the missing transpose",
        edits={_DK: "            moving[2] += (ds @ q) * scale\n"},
        key_terms=("dk",),
    ),
    Mistake(
        name="last_hop_sends_k_v_too",
        what="The last hop home sends the whole (k, v, dk, dv) stack instead of dk, dv only: the gradients are "
             "right, but each rank sends 4W shards' worth of bytes, not 4W - 2.",
        source="exercises/ex10_ring_attention.py: 'each rank sends and receives (4 W - 2) shards' worth of bytes'",
        edits={_HOPS: """        recv = torch.empty_like(moving)
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, moving, (me + 1) % world),
                                            dist.P2POp(dist.irecv, recv, (me - 1) % world)]):
            work.wait()
        moving = recv
    return dq, moving[2], moving[3]
"""},
        key_terms=("bytes",),
    ),
]

LEGAL = [
    Mistake(
        name="isend_irecv_pairs",
        what="The forward's exchange posts a dist.isend and a dist.irecv and waits on both, instead of one "
             "batch_isend_irecv; the sends are posted before the block's compute, as before.",
        source="the contract allows 'dist.isend/dist.irecv'; "
               "https://runebook.dev/en/articles/pytorch/distributed/torch.distributed.send (post both, then wait)",
        edits={_EXCHANGE: """            works = [dist.isend(kv, (rank + 1) % world), dist.irecv(buf, (rank - 1) % world)]
"""},
    ),
    Mistake(
        name="diagonal_only_mask_and_explicit_max",
        what="Only the diagonal block (src == rank) is masked, with torch.where, since earlier shards are "
             "fully visible; the lse merge subtracts the max by hand instead of calling logaddexp.",
        source="FlashAttention (Dao et al. 2022) skips the mask on blocks entirely below the diagonal; online "
               "softmax written out with the running max",
        edits={_MASK: """            if src == rank:  # only the diagonal block is cut; earlier shards are entirely visible
                visible = q_pos[:, None] >= k_pos[None, :]
                scores = torch.where(visible, scores, torch.full_like(scores, float("-inf")))
""",
               _MERGE: """                top = torch.maximum(lse, block_lse)
                new = top + torch.log(torch.exp(lse - top) + torch.exp(block_lse - top))
"""},
    ),
    Mistake(
        name="backward_computes_hidden_blocks",
        what="The backward computes every block, the later ranks' ones too: their p is exp(-inf - lse) = 0, "
             "so they add exactly zero to dq, dk and dv (wasted work, the same result).",
        source="FlashAttention-2 (Dao 2023): masked entries have P = 0 and contribute nothing; skipping them is "
               "an optimisation",
        edits={_OWNER_BLOCK: """        # every block: where the causal mask hides all keys, p is exactly 0 and nothing is added
        cols = owner * n + torch.arange(n, device=q.device)
        s = (q @ moving[0].transpose(-1, -2)) * scale
        p = torch.exp(s.masked_fill(cols[None, :] > rows[:, None], float("-inf")) - lse)
        ds = p * (dout @ moving[1].transpose(-1, -2) - delta)
        dq += (ds @ moving[0]) * scale
        moving[2] += (ds.transpose(-1, -2) @ q) * scale
        moving[3] += p.transpose(-1, -2) @ dout
"""},
    ),
]
