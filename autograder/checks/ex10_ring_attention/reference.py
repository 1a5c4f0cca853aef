"""Exercise 10's single-process references: the whole sequence's causal attention (its output, its
log-sum-exp, and autograd's gradients through it), and the ring of each named mistake replayed on one
process (what a rank's output, or its ``dq, dk, dv``, is when its merge, its mask or its backward is
wrong), so that a cause is named only when the learner's result *is* that mistake's, to float rounding."""
from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

from distlab.lab.context_parallel import sharding

BATCH, HEADS, SEQ, HEAD_DIM, SEED = 2, 2, 32, 8, 10
RTOL, ATOL = 1e-4, 1e-5  # parity with the references, in float32
GRADS = ("dq", "dk", "dv")


def whole() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The whole sequence's ``q, k, v`` (``B x H x S x D``), the same in the ranks and here."""
    g = torch.Generator().manual_seed(SEED)
    return tuple(torch.randn(BATCH, HEADS, SEQ, HEAD_DIM, generator=g) for _ in range(3))


def positions(rank: int, world: int) -> torch.Tensor:
    """The global positions rank ``rank`` holds in the zig-zag layout (chunks ``rank`` and ``2W - 1 - rank``)."""
    return sharding.positions("zigzag", SEQ, world, rank)


def shard(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s positions of ``t``, in the order it holds them."""
    return sharding.shard(t, positions(rank, world))


def owners(world: int) -> torch.Tensor:
    """The rank that holds each position of the sequence (``SEQ``)."""
    out = torch.empty(SEQ, dtype=torch.long)
    for r in range(world):
        out[positions(r, world)] = r
    return out


def computed(world: int) -> torch.Tensor:
    """``SEQ x SEQ``: the (query, key) pairs a ring that skips what the mask hides computes, the reference
    solution's blocks: its own shard whole (the diagonal, masked), an earlier rank's early chunk for every
    query here, a later rank's two chunks for the late chunk of queries here only."""
    c, own = SEQ // (2 * world), owners(world)
    early = (torch.arange(SEQ) // c) < world  # each position's chunk is one of the first W: its rank's early one
    q_own, k_own = own[:, None], own[None, :]
    return (q_own == k_own) | ((k_own < q_own) & early[None, :]) | ((k_own > q_own) & ~early[:, None])


def grad_output() -> torch.Tensor:
    """The loss's gradient with respect to the whole sequence's output (``dout``), seeded apart from ``q, k, v``."""
    return torch.randn(BATCH, HEADS, SEQ, HEAD_DIM, generator=torch.Generator().manual_seed(SEED + 1))


def _scores(q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
            mask: bool = True) -> torch.Tensor:
    s = (q @ k.transpose(-1, -2)) * HEAD_DIM ** -0.5
    return s.masked_fill(q_pos[:, None] < k_pos[None, :], float("-inf")) if mask else s


@lru_cache(maxsize=1)
def _whole_backward() -> dict[str, torch.Tensor]:
    q, k, v = whole()
    pos = torch.arange(SEQ)
    return {"q": q, "k": k, "v": v, "out": F.scaled_dot_product_attention(q, k, v, is_causal=True),
            "lse": torch.logsumexp(_scores(q, k, pos, pos), -1, keepdim=True), "dout": grad_output()}


def backward_inputs(rank: int, world: int) -> dict[str, torch.Tensor]:
    """What ``ring_attention_backward`` is given on ``rank``: its shards of ``q, k, v``, of the causal output,
    of its log-sum-exp over the whole sequence (``B x H x n x 1``) and of ``dout``."""
    return {name: shard(t, rank, world) for name, t in _whole_backward().items()}


@lru_cache(maxsize=4)
def grad_reference(world: int) -> list[dict[str, torch.Tensor]]:
    """Each rank's shards of autograd's ``dq, dk, dv`` through ``F.scaled_dot_product_attention(is_causal=True)``
    on the whole sequence, for the loss whose gradient is ``grad_output()``."""
    q, k, v = (t.clone().requires_grad_() for t in whole())
    F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad_output())
    return [{g: shard(t.grad, r, world) for g, t in zip(GRADS, (q, k, v))} for r in range(world)]


# The queries of a second forward ring, scaled so that scores pass float32's exp range (~88): real attention
# logits get there (a saturated softmax), and a log-sum-exp merged without subtracting the max overflows.
LARGE = 40.0


def causal_reference(world: int, q_scale: float = 1.0) -> list[torch.Tensor]:
    """Each rank's rows of ``F.scaled_dot_product_attention(is_causal=True)`` on the whole sequence (its queries
    times ``q_scale``), in the order it holds them."""
    q, k, v = whole()
    full = F.scaled_dot_product_attention(q * q_scale, k, v, is_causal=True)
    return [shard(full, r, world) for r in range(world)]


def _merge(out, lse, has, b_out, b_lse, vis, merge: str):
    """One block merged into the running ``(out, lse)`` on the rows that see a key of it (``vis``); ``has``: the
    rows that already hold a block (the others take this one as it is)."""
    first, later = vis & ~has, vis & has
    if merge == "halves":
        new_out, new_lse = (out + b_out) / 2, lse
    elif merge == "lse unset":  # the running lse left at its initial -inf: each block's weight exp(0) = 1, the old 0
        new_out, new_lse = b_out, lse
    else:
        new = torch.maximum(lse, b_lse) if merge == "max" else torch.logaddexp(lse, b_lse)
        old = new if merge == "lse first" else lse
        new_out = torch.exp(old - new) * out + torch.exp(b_lse - new) * b_out
        new_lse = lse if merge == "lse kept" else new
    out = torch.where(first, b_out, torch.where(later, new_out, out))
    lse = torch.where(first, b_lse, torch.where(later, new_lse, lse))
    return out, lse, has | vis


@lru_cache(maxsize=16)  # as replay_backward's
def replay(world: int, *, merge: str = "lse", mask: str = "global", skip_later: bool = False,
           scale: float = HEAD_DIM ** -0.5) -> list[torch.Tensor]:
    """Each rank's output of a ring that visits the shards in ring order ``r, r - 1, ...``, masks each ``n x n``
    block by ``mask`` (``"global"`` positions; ``"local"``: each block's own indices, as ``is_causal=True`` per
    block does; ``"contiguous"``: the positions a contiguous layout would give, ``r n + i``), merges only the
    rows that see a key of the block, and merges by ``merge`` (``"lse"``; ``"halves"``: ``(out + b) / 2``;
    ``"max"``: ``lse = max(lse, lse_b)`` with no rescale of the sum; ``"lse first"``: ``lse`` replaced by the
    merged one before ``out`` is rescaled by it; ``"lse kept"``: the merged ``lse`` never kept, the first block's
    staying; ``"lse unset"``: never kept, the initial ``-inf`` staying, so each block replaces the output).
    ``skip_later``: the shards of later ranks skipped whole (a contiguous layout's rule); ``scale``: what the scores
    are multiplied by (``1``: not scaled)."""
    q, k, v = whole()
    n, outs = SEQ // world, []
    where = {"global": lambda r: positions(r, world), "local": lambda r: torch.arange(n),
             "contiguous": lambda r: torch.arange(r * n, (r + 1) * n)}[mask]
    for r in range(world):
        qs = shard(q, r, world)
        out, lse = torch.zeros_like(qs), torch.zeros(*qs.shape[:-1], 1)
        has = torch.zeros(n, 1, dtype=torch.bool)
        for step in range(world):
            src = (r - step) % world
            if skip_later and src > r:
                continue
            hidden = where(r)[:, None] < where(src)[None, :]
            s = ((qs @ shard(k, src, world).transpose(-1, -2)) * scale).masked_fill(hidden, float("-inf"))
            vis = ~hidden.all(-1, keepdim=True)
            b_lse = torch.logsumexp(s, -1, keepdim=True)
            b_out = torch.exp(s - b_lse.masked_fill(~vis, 0.0)) @ shard(v, src, world)
            out, lse, has = _merge(out, lse, has, b_out, b_lse, vis, merge)
        outs.append(out)
    return outs


@lru_cache(maxsize=4)
def replay_sliced(world: int, *, mask: str = "global", swapped: bool = False, later_early_only: bool = False,
                  mislabelled: bool = False) -> list[torch.Tensor]:
    """Each rank's output of the reference's ring, blocks and all (its own shard whole, an earlier rank's early
    chunk for every query, a later rank's shard for the late chunk of queries), merged by log-sum-exp, with
    ``mask="local"``: a causal triangle on every block computed, in the block's own indices; ``swapped``: the
    shard taken to hold its late chunk first (the positions, and the halves kept, the other way round);
    ``later_early_only``: of a later rank's shard, its early chunk alone (its late chunk left out); ``mislabelled``:
    the shard in hand at step ``s`` (rank ``r - s``'s) cut and masked as rank ``r + s``'s, the other direction."""
    q, k, v = whole()
    c, outs = SEQ // (2 * world), []
    early, late = slice(0, c), slice(c, None)
    if swapped:
        early, late = late, early
    for r in range(world):
        pos = positions(r, world)
        pos = torch.cat([pos[c:], pos[:c]]) if swapped else pos
        qs = shard(q, r, world)
        out, lse = torch.zeros_like(qs), torch.full((*qs.shape[:-1], 1), float("-inf"))
        for step in range(world):
            held = (r - step) % world  # whose shard is in hand
            src = (r + step) % world if mislabelled else held  # whose the code takes it for
            rows, cols = (slice(None), slice(None)) if src == r else (slice(None), early) if src < r else \
                (late, early if later_early_only else slice(None))
            s = (qs[..., rows, :] @ shard(k, held, world)[..., cols, :].transpose(-1, -2)) * HEAD_DIM ** -0.5
            if mask == "local":
                s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
            elif src == r:
                s = s.masked_fill(pos[:, None] < pos[None, :], float("-inf"))
            b_lse = torch.logsumexp(s, -1, keepdim=True)
            new = torch.logaddexp(lse[..., rows, :], b_lse)
            b_out = torch.exp(s - b_lse) @ shard(v, held, world)[..., cols, :]
            out[..., rows, :] = torch.exp(lse[..., rows, :] - new) * out[..., rows, :] + torch.exp(b_lse - new) * b_out
            lse[..., rows, :] = new
        outs.append(out)
    return outs


def _per_block(s: torch.Tensor, keys: torch.Tensor, seen: torch.Tensor, world: int, fn) -> torch.Tensor:
    """``fn(scores of one block)`` for each rank's block of keys (``owners``), put back in the keys' places:
    each ring step's block, normalised or summed on its own."""
    out = torch.zeros_like(s)
    for b in range(world):
        cols = (keys == b).nonzero().flatten()
        out[..., cols] = fn(s[..., cols], cols)
    return out.masked_fill(~seen, 0.0)


@lru_cache(maxsize=32)  # each mutant's diagnosis asks again: computed once per launch (read, never written)
def replay_backward(world: int, *, delta: str = "merged", lse: str = "merged", mask: bool = True,
                    skip: bool = True, scale: bool = True) -> list[dict[str, torch.Tensor]]:
    """Each rank's ``dq, dk, dv`` (``dk, dv`` home on their owner) from a backward ring that computes ``D`` from
    the ``"merged"`` output or per ``"block"`` (``rowsum(dout * p v)`` of that block's ``p``), recomputes ``p``
    with the ``"merged"`` lse or the ``"block"``'s own, masks by global positions or not (``mask``), skips the
    pairs of chunks the mask hides entirely as the reference solution does (``skip``: :func:`computed`), and
    scales ``dq, dk`` by ``1 / sqrt(D)`` or not (``scale``). All the ring's blocks at once: the ``S x S``
    scores cut into each rank's block of keys."""
    x = _whole_backward()
    q, k, v, out, dout = x["q"], x["k"], x["v"], x["out"], x["dout"]
    c, pos, keys = HEAD_DIM ** -0.5 if scale else 1.0, torch.arange(SEQ), owners(world)
    seen = computed(world) if skip else torch.ones(SEQ, SEQ, dtype=torch.bool)
    s = _scores(q, k, pos, pos, mask).masked_fill(~seen, float("-inf"))  # a skipped block adds nothing
    if lse == "merged":
        p = torch.exp(s - x["lse"])
    else:  # each block normalised over its own keys (a hidden one, visited anyway, is NaN: as the ring's)
        p = _per_block(s, keys, seen, world, lambda b, _: torch.exp(b - torch.logsumexp(b, -1, keepdim=True)))
    if delta == "merged":
        d = (dout * out).sum(-1, keepdim=True)
    else:  # rowsum(dout * p_b v_b) for each block b, spread over that block's keys
        d = _per_block(p, keys, torch.ones_like(seen), world,
                       lambda b, cols: (dout * (b @ v[..., cols, :])).sum(-1, keepdim=True).expand_as(b))
    ds = p * (dout @ v.transpose(-1, -2) - d)
    grads = {"dq": c * ds @ k, "dk": c * ds.transpose(-1, -2) @ q, "dv": p.transpose(-1, -2) @ dout}
    return [{g: shard(t, r, world) for g, t in grads.items()} for r in range(world)]


@lru_cache(maxsize=4)
def key_sources(world: int) -> dict[bytes, int]:
    """Each rank's key shard, as bytes, to the rank: a received message's pieces are looked up, not compared."""
    return {shard(whole()[1], s, world).numpy().tobytes(): s for s in range(world)}


@lru_cache(maxsize=4)
def noncausal(world: int) -> list[torch.Tensor]:
    """Each rank's rows of the whole sequence's attention with no mask (what a ring that masks nothing gives)."""
    q, k, v = whole()
    full = F.scaled_dot_product_attention(q, k, v)
    return [shard(full, r, world) for r in range(world)]
