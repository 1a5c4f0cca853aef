"""Three tiers of hints for each of exercise 10's criteria (1: the concept, 2: the mechanism, 3: the API).
None of them is the answer."""
HINTS: dict[str, tuple[str, str, str]] = {
    "output_matches": (
        "Each block of keys gives an output normalised over that block only. How much should a block count "
        "in the softmax over all keys? And which keys may a query see, when rank r holds chunk r and chunk "
        "2W - 1 - r of the sequence?",
        "Keep a running (out, lse). A new block weighs exp(lse_block - lse_total) and the old ones "
        "exp(lse - lse_total), lse_total being the log of the sum of both exps. Positions are global: write "
        "down the positions of your two chunks, then of the shard in hand. A query with no visible key in a "
        "block has nothing to add: leave it out of that merge.",
        "torch.logsumexp(scores, -1, keepdim=True), torch.logaddexp(a, b), scores.masked_fill(mask, "
        "float('-inf')); compare with F.scaled_dot_product_attention(Q, K, V, is_causal=True) on one process."),
    "ring_communication": (
        "Every rank needs every earlier shard, but holds only its own: pass shards along, one hop per step.",
        "At step i you hold the shard that started on rank (r - i) % W. Send it to (r + 1) % W while "
        "receiving the next from (r - 1) % W, W - 1 times. Both ranks of a pair must not wait in a blocking "
        "send at once.",
        "dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, next), dist.P2POp(dist.irecv, buf, prev)]) returns "
        "works: call .wait() on each before you use buf. torch.stack([k, v]) makes one message of both."),
    "work_balanced": (
        "Zig-zag gives every rank an early chunk and a late one so that every rank has the same causal work. "
        "That holds only if no rank computes what the mask hides entirely.",
        "Compare the chunks' places: against an earlier rank's shard, which of its two chunks can any of your "
        "queries see? Against a later rank's, which of your two chunks of queries sees anything? Your own "
        "shard is the only one the diagonal cuts.",
        "Slice before the matmul: q[..., rows, :] @ k[..., cols, :].transpose(-1, -2) computes only those scores; "
        "write the result into out[..., rows, :] and lse[..., rows, :] (views: torch.Tensor.copy_)."),
    "backward_work_balanced": (
        "The backward's ring waits for its busiest rank at every step, as the forward's does, so its work too "
        "must be the same on every rank: the blocks the mask leaves visible.",
        "Use the forward's rows and columns at each step; p is 0 on the hidden ones anyway, so computing them "
        "only costs time, and more of it on some ranks than on others.",
        "The same slices as the forward's, on q, dout, lse, D and dq for the rows, and on k, v, dk, dv for the "
        "columns of the shard in hand."),
    "dq_matches": (
        "The backward of softmax attention needs the probabilities again, over the whole sequence, not over one "
        "block. You are given what makes them exact without a second pass: the merged lse and the output.",
        "Per block of keys: p = exp(scale * q k^T - lse), masked by global positions as in the forward; "
        "dp = dout v^T; ds = p * (dp - D) where D is one number per query, the row sum of dout * out; "
        "dq gains scale * ds k. Pairs of chunks the mask hides entirely add nothing.",
        "(dout * out).sum(-1, keepdim=True) once, before the ring; torch.exp(scores - lse) with the lse given; "
        "check one rank's dq against Q.grad from F.scaled_dot_product_attention(..., is_causal=True).backward(dout)."),
    "dk_dv_match": (
        "A key is seen by queries on many ranks (in the zig-zag layout, on every rank), so its gradient is a sum "
        "over ranks. Where can that sum be made without gathering anything?",
        "Carry each shard's dk, dv accumulators round with its k, v: every rank adds its queries' share "
        "(dv += p^T dout, dk += scale * ds^T q) and passes them on. After W - 1 hops they are one hop from the "
        "rank that owns the shard.",
        "torch.stack of k, v and two zeros_like tensors makes one message; add into its last "
        "two slices; send the slices [2:] alone on the last hop, and return what arrives."),
    "backward_ring": (
        "The backward's ring is the forward's: the same neighbours, the same direction, one more hop at the end.",
        "W - 1 exchanges of k, v, dk, dv (four shards each), then one of dk, dv (two shards): 4 W - 2 shards' "
        "worth of bytes per rank, sent to one neighbour and received from the other.",
        "dist.batch_isend_irecv with dist.P2POp(dist.isend, ...) and dist.P2POp(dist.irecv, ...), as in the "
        "forward; .contiguous() on a slice before you send it. No all_gather or all_reduce."),
}
