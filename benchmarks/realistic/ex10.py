"""Exercise 10 (the balanced causal ring by hand, zig-zag layout): mistakes in the forward's blocks, masks and
merges, and in the backward's second ring of dk, dv.

Written blind to the checks: from the exercise's contract (the docstrings of ``solutions/ex10_ring_attention.py``),
notebook 10 and where people go wrong with ring attention (ring-flash-attention's code and issues, FlashAttention's
papers, forum threads), without reading the grader's checks or tests for this exercise. Rewritten for the zig-zag
layout (rank r holds chunks r and 2W - 1 - r); every edit is made against the new solution's text.
"""
from __future__ import annotations

from . import Mistake

# ---- anchors in the forward (ring_attention)
_POS_F = """    pos = torch.cat([torch.arange(rank * c, (rank + 1) * c),
                     torch.arange((2 * world - 1 - rank) * c, (2 * world - rank) * c)]).to(q.device)
"""
_LSE_INIT = '    lse = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=q.dtype, device=q.device)\n'
_POST = """        if step < world - 1:  # post the exchange first: the compute below can overlap it
            buf = torch.empty_like(kv)
            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, (rank + 1) % world),
                                            dist.P2POp(dist.irecv, buf, (rank - 1) % world)])
"""
_EXCHANGE_F = """            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, (rank + 1) % world),
                                            dist.P2POp(dist.irecv, buf, (rank - 1) % world)])
"""
_BLOCKS_F = """        rows, cols = (slice(None), slice(None)) if src == rank else \\
            (slice(None), slice(0, c)) if src < rank else (slice(c, None), slice(None))
"""
_MASK_F = """        if src == rank:
            scores = scores.masked_fill(pos[:, None] < pos[None, :], float("-inf"))
"""
_BLOCK_OUT_F = "        block_out = torch.exp(scores - block_lse) @ kv[1][..., cols, :]\n"
_MERGE_LSE_F = "        new = torch.logaddexp(m, block_lse)\n"
_COPY_LSE_F = "        m.copy_(new)\n"
_WAIT_F = """        if step < world - 1:
            for work in works:
                work.wait()
            kv = buf
"""
# the forward's whole step, from the shard's origin to the merge (for edits that restructure it)
_STEP_F = """        src = (rank - step) % world  # where the shard in hand started
        # Own shard: the diagonal, masked. An earlier rank's: its early chunk is before both of ours, its
        # late chunk after both. A later rank's: both its chunks are before our late chunk, after our early one.
        rows, cols = (slice(None), slice(None)) if src == rank else \\
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
"""
_KPOS_F = """        kpos = torch.cat([torch.arange(src * c, (src + 1) * c),
                          torch.arange((2 * world - 1 - src) * c, (2 * world - src) * c)]).to(q.device)
"""

# ---- anchors in the backward (ring_attention_backward)
_DQ_INIT = "    dq = torch.zeros_like(q)\n"
_MOVING = "    moving = torch.stack([k, v, torch.zeros_like(k), torch.zeros_like(v)])  # a shard and its dk, dv so far\n"
_BLOCKS_B = """        rows, cols = (slice(None), slice(None)) if owner == me else \\
            (slice(None), slice(0, c)) if owner < me else (slice(c, None), slice(None))  # the forward's blocks
"""
_MASK_B = """        if owner == me:
            s = s.masked_fill(pos[:, None] < pos[None, :], float("-inf"))
"""
_P_B = "        p = torch.exp(s - lse[..., rows, :])\n"
_DS_B = "        ds = p * (dout[..., rows, :] @ vb.transpose(-1, -2) - delta[..., rows, :])\n"
_DQ_B = "        dq[..., rows, :] += (ds @ kb) * scale\n"
_DK_B = "        moving[2][..., cols, :] += (ds.transpose(-1, -2) @ q[..., rows, :]) * scale\n"
_DV_B = "        moving[3][..., cols, :] += p.transpose(-1, -2) @ dout[..., rows, :]\n"
_STEP_B = _BLOCKS_B + """        kb, vb = moving[0][..., cols, :], moving[1][..., cols, :]
        s = (q[..., rows, :] @ kb.transpose(-1, -2)) * scale
""" + _MASK_B + _P_B + _DS_B + _DQ_B + _DK_B + _DV_B
_SEND_B = "        send = moving if step < world - 1 else moving[2:].contiguous()  # the last hop takes dk, dv home\n"
_HOPS_B = _SEND_B + """        recv = torch.empty_like(send)
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, (me + 1) % world),
                                            dist.P2POp(dist.irecv, recv, (me - 1) % world)]):
            work.wait()
        moving = recv
    return dq, moving[0], moving[1]
"""
_KPOS_B = """        kpos = torch.cat([torch.arange(owner * c, (owner + 1) * c),
                          torch.arange((2 * world - 1 - owner) * c, (2 * world - owner) * c)]).to(q.device)
"""

MISTAKES = [
    # ---- ring_attention (the forward)
    Mistake(
        name="contiguous_rule_skips_later_ranks",
        what="The skip rule of the contiguous ring kept for zig-zag shards: an earlier rank's shard is computed "
             "whole and unmasked, a later rank's skipped, although our late chunk sees every later rank's chunks "
             "and an earlier rank's late chunk is after both of ours (wrong rows, and rank W-1 does W times "
             "rank 0's work).",
        source="https://github.com/zhuzilin/ring-flash-attention/issues/54 (the contiguous ring's causal logic "
               "'device 0: q0k0, device 1: q1k0 + q1k1' carried over); notebook 10 runs the contiguous ring first",
        edits={_STEP_F: """        src = (rank - step) % world  # where the shard in hand started
        if src <= rank:  # a later rank's keys come after ours: hidden by the causal mask, nothing to compute
            scores = (q @ kv[0].transpose(-1, -2)) * scale
            if src == rank:
                scores = scores.masked_fill(pos[:, None] < pos[None, :], float("-inf"))
            block_lse = torch.logsumexp(scores, dim=-1, keepdim=True)
            block_out = torch.exp(scores - block_lse) @ kv[1]
            new = torch.logaddexp(lse, block_lse)
            out.copy_(torch.exp(lse - new) * out + torch.exp(block_lse - new) * block_out)
            lse.copy_(new)
"""},
        key_terms=("later", "mask"),
    ),
    Mistake(
        name="chunk_order_swapped",
        what="The shard is taken to hold chunk 2W-1-r first and chunk r second (the late chunk first), so the "
             "positions, the diagonal mask and the halves kept for other ranks' shards are all for the wrong "
             "half.",
        source="the contract's 'chunks r and 2W-1-r, in that order'; ring-flash-attention's tests build the shard "
               "with torch.cat of chunk r and chunk 2W-1-r, and writing the pair from the far end is an easy slip",
        edits={_POS_F: """    pos = torch.cat([torch.arange((2 * world - 1 - rank) * c, (2 * world - rank) * c),
                     torch.arange(rank * c, (rank + 1) * c)]).to(q.device)  # the late chunk, then the early one
""",
               _BLOCKS_F: """        rows, cols = (slice(None), slice(None)) if src == rank else \\
            (slice(None), slice(c, None)) if src < rank else (slice(0, c), slice(None))
"""},
        key_terms=("order", "chunk"),
    ),
    Mistake(
        name="local_causal_mask_on_every_block",
        what="Every block computed gets a causal triangle in local coordinates (torch.triu on the block), as if "
             "each step were its own causal attention: the other ranks' shards, which are entirely visible in the "
             "kept halves, lose their upper triangle.",
        source="ring-flash-attention passes causal=(step == 0) to flash-attn, only the diagonal block; "
               "https://github.com/zhuzilin/ring-flash-attention/issues/15 (causal applied per block gives 'super "
               "low' accuracy)",
        edits={_MASK_F: """        causal = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(causal, float("-inf"))  # each block is causal
"""},
        key_terms=("mask",),
    ),
    Mistake(
        name="mask_off_by_one_hides_diagonal",
        what="The diagonal block's mask uses <= instead of <, so a query may not see its own key: position 0 "
             "sees no key at all (NaN) and every other row loses its diagonal term.",
        source="the contract: query i sees key j when j <= i; strict and non-strict get mixed up when the "
               "condition is inverted for masked_fill (https://github.com/lucidrains/memory-compressed-attention/issues/2)",
        edits={'            scores = scores.masked_fill(pos[:, None] < pos[None, :], float("-inf"))\n':
               '            scores = scores.masked_fill(pos[:, None] <= pos[None, :], float("-inf"))\n'},
        key_terms=("mask", "diagonal"),
    ),
    Mistake(
        name="every_block_masked_nan",
        what="Every block is computed whole and masked by global zig-zag positions; a later rank's shard hides "
             "every key from our early chunk, so those rows are all -inf, their block lse is -inf and "
             "exp(-inf - -inf) puts NaN in the output.",
        source="https://github.com/tracel-ai/burn/issues/4694 (a fully masked row gives -inf - (-inf) = NaN); "
               "masking everything by global positions is the first generalisation people write",
        edits={_BLOCKS_F: _KPOS_F + "        rows, cols = slice(None), slice(None)  # the whole block: the mask hides what it must\n",
               _MASK_F: '        scores = scores.masked_fill(pos[:, None] < kpos[None, :], float("-inf"))\n'},
        key_terms=("NaN",),
    ),
    Mistake(
        name="every_block_masked_nan_guarded",
        what="Every block is computed whole, masked by global positions, and the NaN of fully masked rows is "
             "zeroed: the output is right, but each rank computes n^2 scores for every shard, half of them for "
             "pairs of chunks the mask hides entirely.",
        source="the contract's Work bullet ('a ring that computes every block masked does more'); "
               "https://github.com/pytorch/pytorch/pull/131060 (_safe_softmax zeroes fully masked rows instead of "
               "skipping them)",
        edits={_BLOCKS_F: _KPOS_F + "        rows, cols = slice(None), slice(None)  # the whole block: the mask hides what it must\n",
               _MASK_F: '        scores = scores.masked_fill(pos[:, None] < kpos[None, :], float("-inf"))\n',
               _BLOCK_OUT_F: "        block_out = torch.nan_to_num(torch.exp(scores - block_lse)) @ kv[1][..., cols, :]  "
                             "# fully masked rows: 0\n"},
        key_terms=("work", "skip"),
    ),
    Mistake(
        name="skips_on_one_side_only",
        what="Only a later rank's shard is cut to the rows that see it; an earlier rank's shard is computed whole "
             "and masked by global positions (right output), so rank W-1 computes far more scores than rank 0.",
        source="notebook 10 section 3 (the ring runs at the speed of its busiest rank); ring-flash-attention's "
               "zigzag forward has two cut cases, step <= rank (k0 only) and step > rank (q1 only), and only one is "
               "written",
        edits={_BLOCKS_F: """        rows, cols = (slice(c, None), slice(None)) if src > rank else (slice(None), slice(None))
""",
               _MASK_F: """        if src <= rank:  # the whole block, masked by global positions
            kpos = torch.cat([torch.arange(src * c, (src + 1) * c),
                              torch.arange((2 * world - 1 - src) * c, (2 * world - src) * c)]).to(q.device)
            scores = scores.masked_fill(pos[:, None] < kpos[None, :], float("-inf"))
"""},
        key_terms=("work", "balance"),
    ),
    Mistake(
        name="merge_without_max",
        what="The log-sum-exps are merged as log(exp(lse_a) + exp(lse_b)), which overflows to inf (then NaN) "
             "once a row's scores pass ~88.",
        source="https://github.com/jzhang38/EasyContext/issues/14 (ring attention's lse update overflowed in "
               "torch.exp; fixed with a log-sigmoid form)",
        edits={_MERGE_LSE_F: "        new = torch.log(torch.exp(m) + torch.exp(block_lse))\n"},
        key_terms=("overflow", "log"),
    ),
    Mistake(
        name="lse_rebound_not_written",
        what="The merged lse is assigned to the local name (m = new) instead of written into the view of the "
             "running lse, which stays -inf: each block then replaces the rows' output instead of merging.",
        source="the solution's own comment ('views: the merge writes through them'); rebinding a name never "
               "writes into the tensor it named (https://nedbatchelder.com/text/names.html)",
        edits={_COPY_LSE_F: "        m = new\n"},
        key_terms=("lse", "in place"),
    ),
    Mistake(
        name="own_shard_sent_every_step",
        what="Each step sends this rank's own k, v again instead of forwarding the shard just received, so from "
             "W = 3 on a rank sees its left neighbour's shard W-1 times and never the others.",
        source="the contract: 'the received shard being the one it forwards next'; Liu et al. 2023 (Ring "
               "Attention) fig. 2",
        edits={_EXCHANGE_F: """            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.stack([k, v]), (rank + 1) % world),
                                            dist.P2POp(dist.irecv, buf, (rank - 1) % world)])
"""},
        key_terms=("forward", "received"),
    ),
    Mistake(
        name="exchanges_every_step",
        what="The shard is passed on at every one of the W steps, the last one bringing it home for nothing: the "
             "output is right, but each rank sends W shards, not W - 1.",
        source="the original ring attention (forhaoliu/ringattention) rotates k, v with ppermute inside a scan "
               "over all W steps; the contract counts W - 1 sends",
        edits={_POST: """        buf = torch.empty_like(kv)  # pass the shard on; after the last step it is back home
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, (rank + 1) % world),
                                        dist.P2POp(dist.irecv, buf, (rank - 1) % world)])
""",
               _WAIT_F: """        for work in works:
            work.wait()
        kv = buf
"""},
        key_terms=("W - 1", "send"),
    ),
    Mistake(
        name="recv_buffer_read_before_wait",
        what="The received shard is used at the next step without waiting on the receive (kv = buf right after "
             "the compute): the buffer is torch.empty's until the transfer lands, so the blocks read garbage, and "
             "the unwaited Works leave the ring out of step.",
        source="https://github.com/pytorch/pytorch/issues/149177 (isend/irecv results used without a completed "
               "wait); torch.distributed docs: a Work's tensor is valid only after wait()",
        edits={_WAIT_F: """        if step < world - 1:
            kv = buf  # the receive was posted at the top of the step
"""},
        key_terms=("wait",),
    ),
    Mistake(
        name="all_gather_instead_of_ring",
        what="Every rank all-gathers the whole sequence's keys and values and attends to them at once, masked by "
             "global zig-zag positions: the right numbers, but a collective, and the whole sequence on every rank.",
        source="the contract: 'No collective (all_gather would hold the whole sequence on every rank)'; Llama 3 "
               "and PyTorch's context_parallel all-gather by default (notebook 10, section 6)",
        edits={_POS_F: _POS_F + """    kvs = [torch.empty_like(torch.stack([k, v])) for _ in range(world)]
    dist.all_gather(kvs, torch.stack([k, v]))
    every = torch.cat([torch.cat([torch.arange(s * c, (s + 1) * c), torch.arange((2 * world - 1 - s) * c,
                                  (2 * world - s) * c)]) for s in range(world)]).to(q.device)
    keys, values = torch.cat([x[0] for x in kvs], dim=-2), torch.cat([x[1] for x in kvs], dim=-2)
    scores = (q @ keys.transpose(-1, -2)) * scale
    scores = scores.masked_fill(pos[:, None] < every[None, :], float("-inf"))
    return torch.softmax(scores, dim=-1) @ values
"""},
        key_terms=("collective", "all_gather"),
    ),
    # ---- ring_attention_backward
    Mistake(
        name="dk_dv_never_go_home",
        what="The backward ring stops after W - 1 hops and returns the dk, dv accumulators in hand, which belong "
             "to the next rank's shard, not this rank's.",
        source="notebook 10: 'each block's dk, dv travelling round with it and arriving home on the W-th send'; "
               "ring-flash-attention's backward ends with a last send_recv of dk, dv",
        edits={_HOPS_B: """        if step < world - 1:
            recv = torch.empty_like(moving)
            for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, moving, (me + 1) % world),
                                                dist.P2POp(dist.irecv, recv, (me - 1) % world)]):
                work.wait()
            moving = recv
    return dq, moving[2], moving[3]
"""},
        key_terms=("home", "hop"),
    ),
    Mistake(
        name="last_hop_sends_k_v_too",
        what="The last hop home sends the whole (k, v, dk, dv) stack, not dk, dv only: the gradients are right, "
             "but each rank sends 4W shards' worth of bytes, not 4W - 2.",
        source="the contract: '(4 W - 2) shards' worth of bytes'; sending the same stack every hop is the "
               "uniform loop people write first",
        edits={_SEND_B: "        send = moving  # the shard and its dk, dv, home at the end\n",
               "    return dq, moving[0], moving[1]\n": "    return dq, moving[2], moving[3]\n"},
        key_terms=("bytes",),
    ),
    Mistake(
        name="dk_dv_kept_by_the_visited_rank",
        what="dk and dv are accumulated in local tensors like dq, so each rank sums the gradients of the "
             "visiting shards' keys into its own dk, dv instead of sending them round with their shard.",
        source="the contract: 'dk and dv get a contribution from the queries of other ranks, so they are summed "
               "on the way round, not on their owner'; https://github.com/huggingface/diffusers/issues/14265 "
               "(ring backward gradients computed against the wrong shard)",
        edits={_DQ_INIT: _DQ_INIT + "    dk, dv = torch.zeros_like(k), torch.zeros_like(v)\n",
               _DK_B: "        dk[..., cols, :] += (ds.transpose(-1, -2) @ q[..., rows, :]) * scale\n",
               _DV_B: "        dv[..., cols, :] += p.transpose(-1, -2) @ dout[..., rows, :]\n",
               "    return dq, moving[0], moving[1]\n": "    return dq, dk, dv\n"},
        key_terms=("dk", "travel"),
    ),
    Mistake(
        name="dk_dv_accumulated_into_a_copy",
        what="The accumulators of the block's keys are taken with .contiguous() (a habit for NCCL buffers): for a "
             "half-shard block the slice is not contiguous, so the += goes into a copy and the shard's dk, dv "
             "never get the early chunk's contributions.",
        source="PyTorch docs, Tensor.contiguous: 'If self tensor is already in the specified memory format, this "
               "function returns the self tensor', else a copy; NCCL's 'Tensors must be contiguous' error teaches the habit",
        edits={_DK_B: "        dk_b, dv_b = moving[2][..., cols, :].contiguous(), moving[3][..., cols, :].contiguous()\n"
                      "        dk_b += (ds.transpose(-1, -2) @ q[..., rows, :]) * scale\n",
               _DV_B: "        dv_b += p.transpose(-1, -2) @ dout[..., rows, :]\n"},
        key_terms=("dk", "copy"),
    ),
    Mistake(
        name="delta_from_the_block",
        what="D is computed per block as rowsum(p * dp) over that block's keys only, instead of once per query "
             "as rowsum(dout * out) from the merged output.",
        source="FlashAttention-2 (Dao 2023) alg. 2 line 4: D_i = rowsum(dO_i * O_i) with the final O; the "
               "softmax-backward identity sum_j p_j dp_j holds only over the whole row",
        edits={_DS_B: "        dp = dout[..., rows, :] @ vb.transpose(-1, -2)\n"
                      "        ds = p * (dp - (p * dp).sum(-1, keepdim=True))  # D = sum_j p_j dp_j\n"},
        key_terms=("D", "merged"),
    ),
    Mistake(
        name="backward_diagonal_unmasked",
        what="The backward recomputes the diagonal block's probabilities from the lse without the causal mask, "
             "trusting the saved lse to zero what the forward hid: the hidden pairs get p = exp(s - lse) > 0.",
        source="the contract: 'p = exp(scale * q k^T - lse) masked by global positions'; FlashAttention-2 alg. 2 "
               "recomputes S and applies the mask again",
        edits={_MASK_B: ""},
        key_terms=("mask",),
    ),
    Mistake(
        name="backward_computes_every_block",
        what="The backward computes every block whole, masked by global positions (p is exactly 0 where hidden): "
             "the gradients are right, but every rank computes n^2 scores per shard, not the forward's blocks.",
        source="the contract: 'Work: every rank computes the same number of scores ... as in the forward'; "
               "ring-flash-attention's zigzag backward cuts the same halves as its forward",
        edits={_BLOCKS_B: _KPOS_B + "        rows, cols = slice(None), slice(None)  # every block: p is 0 where the mask hides\n",
               _MASK_B: '        s = s.masked_fill(pos[:, None] < kpos[None, :], float("-inf"))\n'},
        key_terms=("work",),
    ),
    Mistake(
        name="backward_contiguous_rule",
        what="The backward skips a later rank's shard and computes an earlier rank's whole and unmasked (the "
             "contiguous ring's rule), so dq misses our late chunk's keys and dk, dv get hidden pairs.",
        source="https://github.com/zhuzilin/ring-flash-attention/issues/54 (contiguous causal logic carried into "
               "the ring); the backward written from the non-causal ring of notebook 10",
        edits={_STEP_B: """        if owner <= me:  # a later rank's keys are hidden from every query here: nothing to add
            kb, vb = moving[0], moving[1]
            s = (q @ kb.transpose(-1, -2)) * scale
            if owner == me:
                s = s.masked_fill(pos[:, None] < pos[None, :], float("-inf"))
            p = torch.exp(s - lse)
            ds = p * (dout @ vb.transpose(-1, -2) - delta)
            dq += (ds @ kb) * scale
            moving[2] += (ds.transpose(-1, -2) @ q) * scale
            moving[3] += p.transpose(-1, -2) @ dout
"""},
        key_terms=("later", "mask"),
    ),
]

LEGAL = [
    Mistake(
        name="chunk_pair_blocks",
        what="Forward and backward loop over the four (query chunk, key chunk) pairs of each step, by chunk index: "
             "a pair is skipped when the key chunk is after the query chunk and masked with a c x c triangle when "
             "they are the same chunk (3 c^2 scores for the own shard, 2 c^2 for every other one, on every rank).",
        source="blockwise attention as FlashAttention tiles it (Dao et al. 2022), with zig-zag chunk indices as "
               "Llama 3's CP describes them (2024, section 3.3.2)",
        edits={_STEP_F: """        src = (rank - step) % world  # where the shard in hand started
        mine, theirs = (rank, 2 * world - 1 - rank), (src, 2 * world - 1 - src)  # chunk indices, in shard order
        for i, qc in enumerate(mine):
            for j, kc in enumerate(theirs):
                if kc > qc:  # every key of chunk kc is after every query of chunk qc
                    continue
                rows, cols = slice(i * c, (i + 1) * c), slice(j * c, (j + 1) * c)
                scores = (q[..., rows, :] @ kv[0][..., cols, :].transpose(-1, -2)) * scale
                if kc == qc:
                    hidden = torch.ones(c, c, dtype=torch.bool, device=q.device).triu(1)
                    scores = scores.masked_fill(hidden, float("-inf"))
                block_lse = torch.logsumexp(scores, dim=-1, keepdim=True)
                block_out = torch.exp(scores - block_lse) @ kv[1][..., cols, :]
                o, m = out[..., rows, :], lse[..., rows, :]
                new = torch.logaddexp(m, block_lse)
                o.copy_(torch.exp(m - new) * o + torch.exp(block_lse - new) * block_out)
                m.copy_(new)
""",
               _STEP_B: """        mine, theirs = (me, 2 * world - 1 - me), (owner, 2 * world - 1 - owner)
        for i, qc in enumerate(mine):
            for j, kc in enumerate(theirs):
                if kc > qc:
                    continue
                rows, cols = slice(i * c, (i + 1) * c), slice(j * c, (j + 1) * c)
                kb, vb = moving[0][..., cols, :], moving[1][..., cols, :]
                s = (q[..., rows, :] @ kb.transpose(-1, -2)) * scale
                if kc == qc:
                    s = s.masked_fill(torch.ones(c, c, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
                p = torch.exp(s - lse[..., rows, :])
                ds = p * (dout[..., rows, :] @ vb.transpose(-1, -2) - delta[..., rows, :])
                dq[..., rows, :] += (ds @ kb) * scale
                moving[2][..., cols, :] += (ds.transpose(-1, -2) @ q[..., rows, :]) * scale
                moving[3][..., cols, :] += p.transpose(-1, -2) @ dout[..., rows, :]
"""},
    ),
    Mistake(
        name="online_softmax_isend_irecv",
        what="The forward keeps FlashAttention's running max, running sum and unnormalised output per row and "
             "divides once at the end, instead of merging normalised blocks by their lse; the exchange is a "
             "dist.isend and a dist.irecv posted before the compute and waited after it.",
        source="FlashAttention (Dao et al. 2022) alg. 1 / online softmax (Milakov & Gimelshein 2018); the contract "
               "allows 'dist.isend/dist.irecv'",
        edits={_LSE_INIT: """    row_max = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=q.dtype, device=q.device)
    row_sum = torch.zeros((*q.shape[:-1], 1), dtype=q.dtype, device=q.device)
""",
               _EXCHANGE_F: "            works = [dist.isend(kv, (rank + 1) % world), dist.irecv(buf, (rank - 1) % world)]\n",
               """        block_lse = torch.logsumexp(scores, dim=-1, keepdim=True)
        block_out = torch.exp(scores - block_lse) @ kv[1][..., cols, :]
        o, m = out[..., rows, :], lse[..., rows, :]  # views: the merge writes through them
        new = torch.logaddexp(m, block_lse)
        o.copy_(torch.exp(m - new) * o + torch.exp(block_lse - new) * block_out)
        m.copy_(new)
""": """        acc, top, total = out[..., rows, :], row_max[..., rows, :], row_sum[..., rows, :]  # views
        new_top = torch.maximum(top, scores.amax(dim=-1, keepdim=True))  # finite: every row sees a key at step 0
        weights = torch.exp(scores - new_top)
        shrink = torch.exp(top - new_top)
        acc.copy_(acc * shrink + weights @ kv[1][..., cols, :])
        total.copy_(total * shrink + weights.sum(dim=-1, keepdim=True))
        top.copy_(new_top)
""",
               "    return out\n": "    return out / row_sum\n"},
    ),
    Mistake(
        name="backward_kv_sent_early_grads_after",
        what="The backward sends k, v on before the block's compute (they are only read) and dk, dv after it, as "
             "two messages with isend/irecv and distinct tags; the last hop carries dk, dv only, so the bytes are "
             "the same 4 W - 2 shards.",
        source="ring-flash-attention's zigzag backward (kv_comm.send_recv_kv before the compute, d_kv_comm after "
               "it); the contract allows 'dist.isend/dist.irecv'",
        edits={_MOVING: """    kv = torch.stack([k, v])
    grads = torch.zeros_like(kv)  # the dk, dv of the shard in hand
""",
               "        kb, vb = moving[0][..., cols, :], moving[1][..., cols, :]\n":
               """        if step < world - 1:  # the keys and values go on now: the compute only reads them
            kv_next = torch.empty_like(kv)
            kv_works = [dist.isend(kv, (me + 1) % world, tag=0), dist.irecv(kv_next, (me - 1) % world, tag=0)]
        kb, vb = kv[0][..., cols, :], kv[1][..., cols, :]
""",
               _DK_B: "        grads[0][..., cols, :] += (ds.transpose(-1, -2) @ q[..., rows, :]) * scale\n",
               _DV_B: "        grads[1][..., cols, :] += p.transpose(-1, -2) @ dout[..., rows, :]\n",
               _HOPS_B: """        grads_next = torch.empty_like(grads)  # dk, dv follow their shard (the last hop takes them home)
        for work in [dist.isend(grads, (me + 1) % world, tag=1), dist.irecv(grads_next, (me - 1) % world, tag=1)]:
            work.wait()
        grads = grads_next
        if step < world - 1:
            for work in kv_works:
                work.wait()
            kv = kv_next
    return dq, grads[0], grads[1]
"""},
    ),
]
