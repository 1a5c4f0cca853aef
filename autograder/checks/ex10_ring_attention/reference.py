"""Exercise 10's single-process references: the whole sequence's causal attention, and the ring of each
named mistake replayed on one process (what a rank's output is when its merge or its mask is wrong),
so that a cause is named only when the learner's output *is* that mistake's, to float rounding."""
from __future__ import annotations

import torch
import torch.nn.functional as F

BATCH, HEADS, SEQ, HEAD_DIM, SEED = 1, 2, 32, 8, 10


def whole() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The whole sequence's ``q, k, v`` (``B x H x S x D``), the same in the ranks and here."""
    g = torch.Generator().manual_seed(SEED)
    return tuple(torch.randn(BATCH, HEADS, SEQ, HEAD_DIM, generator=g) for _ in range(3))


def shard(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous positions of ``t``."""
    return t.chunk(world, dim=-2)[rank].contiguous()


def causal_reference(world: int) -> list[torch.Tensor]:
    """Each rank's rows of ``F.scaled_dot_product_attention(is_causal=True)`` on the whole sequence."""
    q, k, v = whole()
    return list(F.scaled_dot_product_attention(q, k, v, is_causal=True).chunk(world, dim=-2))


def replay(world: int, *, merge: str = "lse", mask: str = "global") -> list[torch.Tensor]:
    """Each rank's output of a ring that visits the shards in ring order ``r, r - 1, ...``, skips those after
    its own, masks by ``mask`` (``"global"`` positions, ``"local"``: each block's own indices, as
    ``is_causal=True`` per block does) and merges by ``merge`` (``"lse"``; ``"halves"``: ``(out + b) / 2``;
    ``"max"``: ``lse = max(lse, lse_b)`` with no rescale of the sum)."""
    q, k, v = whole()
    n, outs = SEQ // world, []
    for r in range(world):
        qs, out, lse = shard(q, r, world), None, None
        for step in range(world):
            src = (r - step) % world
            if src > r:
                continue
            qp, kp = (torch.arange(n), torch.arange(n)) if mask == "local" else \
                (torch.arange(r * n, (r + 1) * n), torch.arange(src * n, (src + 1) * n))
            s = (qs @ shard(k, src, world).transpose(-1, -2)) * HEAD_DIM ** -0.5
            s = s.masked_fill(qp[:, None] < kp[None, :], float("-inf"))
            b_lse = torch.logsumexp(s, -1, keepdim=True)
            b_out = torch.exp(s - b_lse) @ shard(v, src, world)
            if out is None:
                out, lse = b_out, b_lse
            elif merge == "halves":
                out = (out + b_out) / 2
            else:
                new = torch.logaddexp(lse, b_lse) if merge == "lse" else torch.maximum(lse, b_lse)
                out, lse = torch.exp(lse - new) * out + torch.exp(b_lse - new) * b_out, new
        outs.append(out)
    return outs
