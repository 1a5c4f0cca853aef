"""Three tiers of hints for each of exercise 10's criteria (1: the concept, 2: the mechanism, 3: the API).
None of them is the answer."""
HINTS: dict[str, tuple[str, str, str]] = {
    "output_matches": (
        "Each block of keys gives an output normalised over that block only. How much should a block count "
        "in the softmax over all keys? And which keys may a query see when its shard is rank r's?",
        "Keep a running (out, lse). A new block weighs exp(lse_block - lse_total) and the old ones "
        "exp(lse - lse_total), lse_total being the log of the sum of both exps. Positions are global: "
        "rank r's query i is at r * n + i. A block whose keys all come after your queries has nothing to add.",
        "torch.logsumexp(scores, -1, keepdim=True), torch.logaddexp(a, b), scores.masked_fill(mask, "
        "float('-inf')); compare with F.scaled_dot_product_attention(Q, K, V, is_causal=True) on one process."),
    "ring_communication": (
        "Every rank needs every earlier shard, but holds only its own: pass shards along, one hop per step.",
        "At step i you hold the shard that started on rank (r - i) % W. Send it to (r + 1) % W while "
        "receiving the next from (r - 1) % W, W - 1 times. Both ranks of a pair must not wait in a blocking "
        "send at once.",
        "dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, next), dist.P2POp(dist.irecv, buf, prev)]) returns "
        "works: call .wait() on each before you use buf. torch.stack([k, v]) makes one message of both."),
}
