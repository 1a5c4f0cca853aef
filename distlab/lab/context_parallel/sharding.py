"""Which positions of the sequence each rank holds, and the attention work that gives each rank.

Context parallelism (Liu et al. 2023, "Ring Attention with Blockwise Transformers") cuts the sequence
into one shard per rank. With a causal mask, query ``i`` attends to keys ``j <= i`` only, so with
*contiguous* shards rank 0 (the first positions) has almost nothing to compute and the last rank
the most: the ring runs at the speed of the last rank. The *zig-zag* layout (Llama 3's context
parallelism, "The Llama 3 Herd of Models" 2024, section 3.3.2, and ring-flash-attention's ``zigzag_ring``)
cuts the sequence into ``2W`` chunks and gives rank ``r`` chunks ``r`` and ``2W - 1 - r``: an early and a
late chunk, so every rank has the same number of unmasked scores. (Striped attention, Brandon et al. 2023,
interleaves single positions instead: PyTorch's round-robin.)
"""
from __future__ import annotations

import torch

LAYOUTS = ("contiguous", "zigzag")


def positions(layout: str, seq: int, world: int, rank: int) -> torch.Tensor:
    """The global positions rank ``rank`` holds, in the order it holds them (``seq`` a multiple of ``2 world``)."""
    if seq % (2 * world):
        raise ValueError(f"seq {seq} is not a multiple of 2 x world = {2 * world}")
    if layout == "contiguous":
        n = seq // world
        return torch.arange(rank * n, (rank + 1) * n)
    if layout == "zigzag":
        c = seq // (2 * world)
        return torch.cat([torch.arange(rank * c, (rank + 1) * c),
                          torch.arange((2 * world - 1 - rank) * c, (2 * world - rank) * c)])
    raise ValueError(f"layout {layout!r} is not one of {LAYOUTS}")


def shard(x: torch.Tensor, pos: torch.Tensor, dim: int = -2) -> torch.Tensor:
    """This rank's rows of ``x`` along the sequence dimension ``dim``."""
    return x.index_select(dim, pos.to(x.device)).contiguous()


def unshard(parts: list[torch.Tensor], pos: list[torch.Tensor], dim: int = -2) -> torch.Tensor:
    """The whole sequence from every rank's shard (``parts[r]`` holds positions ``pos[r]``)."""
    out = torch.cat(parts, dim)
    order = torch.cat(pos).argsort().to(out.device)
    return out.index_select(dim, order)


def chunks(pos: torch.Tensor, size: int) -> list[torch.Tensor]:
    """``pos`` cut into runs of ``size`` positions: the blocks a blockwise kernel computes one by one."""
    return list(pos.split(size))


def block_kind(q_pos: torch.Tensor, k_pos: torch.Tensor) -> str:
    """``"full"`` (every key is at or before every query), ``"empty"`` (every key is after every query:
    nothing to compute) or ``"diagonal"`` (the mask cuts the block)."""
    if q_pos.min() >= k_pos.max():
        return "full"
    if q_pos.max() < k_pos.min():
        return "empty"
    return "diagonal"


def work_per_rank(layout: str, seq: int, world: int) -> list[dict]:
    """Per rank, for a causal ring: the unmasked scores (query-key pairs) it computes over the whole ring, and
    the blocks of ``seq / 2W`` queries x ``seq / 2W`` keys a blockwise kernel computes (an empty block is
    skipped, a diagonal one costs as much as a full one)."""
    c = seq // (2 * world)
    every = [positions(layout, seq, world, r) for r in range(world)]
    out = []
    for r in range(world):
        q = every[r]
        pairs = sum(int((q[:, None] >= k[None, :]).sum()) for k in every)
        kinds = [block_kind(qc, kc) for k in every for qc in chunks(q, c) for kc in chunks(k, c)]
        out.append({"rank": r, "pairs": pairs, "blocks": sum(k != "empty" for k in kinds),
                    "diagonal": kinds.count("diagonal")})
    return out


def attention_flops(pairs: int, head_dim: int, heads: int = 1, batch: int = 1) -> int:
    """Forward FLOPs of ``pairs`` scores: ``q.k`` and ``p.v``, a multiply and an add per element each."""
    return 4 * pairs * head_dim * heads * batch


def imbalance(work: list[dict], key: str = "pairs") -> float:
    """The busiest rank's work over the mean: the ring's slowdown from an unbalanced split (1 is balanced)."""
    values = [w[key] for w in work]
    return max(values) / (sum(values) / len(values))
