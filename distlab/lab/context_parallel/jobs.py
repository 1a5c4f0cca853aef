"""What notebook 10 runs on every rank (the process group already up): the non-causal ring's forward against
the whole sequence's attention, the causal work of each rank by layout, memory per rank against sequence length,
and the bytes each rank sends."""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from distlab.measure.comm import CollectiveRecorder
from distlab.measure.memory import PeakMemory
from distlab.measure.timing import distributed_median_seconds, median_seconds, synchronize
from distlab.runtime.distributed import device

from .ring import block_attention, merge, ring_forward
from .sharding import block_kind, chunks, positions, shard


def qkv(seq: int, *, batch: int = 1, heads: int = 2, head_dim: int = 16, seed: int = 0,
        requires_grad: bool = False) -> tuple[torch.Tensor, ...]:
    """The whole sequence's ``q, k, v`` (``batch x heads x seq x head_dim``), the same on every rank, on this
    rank's device (NCCL sends only GPU tensors)."""
    g, dev = torch.Generator().manual_seed(seed), device()
    return tuple(torch.randn(batch, heads, seq, head_dim, generator=g).to(dev).requires_grad_(requires_grad)
                 for _ in range(3))


def parity_report(seq: int = 64, **shape) -> dict:
    """Non-causal ring attention on this rank's contiguous shard against SDPA on the whole sequence: the largest
    difference of the output, and what the ring sent (``CollectiveRecorder``: sends and their bytes, and any
    other op, which should be none). Forward only: the ring's backward is exercise 10."""
    rank, world = dist.get_rank(), dist.get_world_size()
    q, k, v = qkv(seq, **shape)
    full = F.scaled_dot_product_attention(q, k, v)
    pos = positions("contiguous", seq, world, rank)
    mine = [shard(t, pos) for t in (q, k, v)]
    with torch.no_grad(), CollectiveRecorder() as forward:
        out, _ = ring_forward(*mine)
    sent = forward.totals().get("send", {"calls": 0, "bytes": 0})
    return {"out": (out - shard(full, pos)).abs().max().item(), "sends": sent["calls"], "bytes": sent["bytes"],
            "other_ops": sorted({op.kind for op in forward.ops} - {"send", "recv"}), "shard_bytes": mine[0].nbytes}


def causal_blocks(q, k, v, q_pos, k_pos, size: int) -> int:
    """The score blocks of a causal blockwise kernel: each ``size x size`` block of queries and keys
    computed unless it is empty (every key after every query), masked where the diagonal cuts it.
    The *work* only (what a ring would compute here over all its steps); the merge is exercise 10's."""
    done = 0
    for qi, qc in zip(q.split(size, -2), chunks(q_pos, size)):
        for ki, vi, kc in zip(k.split(size, -2), v.split(size, -2), chunks(k_pos, size)):
            kind = block_kind(qc, kc)
            if kind != "empty":
                block_attention(qi, ki, vi, (qc[:, None] >= kc[None, :]) if kind == "diagonal" else None)
                done += 1
    return done


def work_report(layout: str, seq: int = 512, **shape) -> dict:
    """This rank's causal work under ``layout``: blocks computed and their median time (every key shard at
    hand: the compute of the ring's ``W`` steps, without the communication), the ranks timed one at a time."""
    rank, world = dist.get_rank(), dist.get_world_size()
    q, k, v = qkv(seq, **shape)
    mine = positions(layout, seq, world, rank).to(q.device)
    size = seq // (2 * world)
    qs = shard(q, mine)

    def work() -> int:
        return causal_blocks(qs, k, v, mine, torch.arange(seq, device=q.device), size)

    seconds = None
    for r in range(world):  # one rank timed at a time: the others would share its cores (2 here)
        dist.barrier()
        if r == rank:
            seconds = median_seconds(work, lambda: synchronize(q.device), min_run_time=0.05)
    dist.barrier()
    return {"layout": layout, "blocks": work(), "seconds": seconds}


def memory_report(seqs: list[int], **shape) -> list[dict]:
    """Per sequence length: this rank's peak bytes in the ring's forward (its shard), and in one process's
    attention of the whole sequence computed the same way (its ``S x S`` scores materialised)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    for seq in seqs:
        q, k, v = qkv(seq, **shape)
        pos = positions("contiguous", seq, world, rank)
        mine = [shard(t, pos) for t in (q, k, v)]
        with torch.no_grad(), PeakMemory(q.device, state=mine) as ring:
            ring_forward(*mine)
        with torch.no_grad(), PeakMemory(q.device, state=(q, k, v)) as whole:
            block_attention(q, k, v)
        rows.append({"seq": seq, "ring_peak": ring.peak, "whole_peak": whole.peak})
    return rows


def overlap_report(seq: int = 256, **shape) -> dict:
    """The non-causal ring's median time, and the same blocks and merges with no communication: what the ring
    would cost if every transfer were hidden behind the compute (the overlap the exchange is posted for)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    pos = positions("contiguous", seq, world, rank)
    q, k, v = (shard(t, pos) for t in qkv(seq, **shape))

    def compute_only() -> None:
        out, lse = block_attention(q, k, v)
        for _ in range(world - 1):
            out, lse = merge(out, lse, *block_attention(q, k, v))

    with torch.no_grad():
        # the same number of calls on every rank (the ring's sends must pair up), the slowest rank's time
        ring = distributed_median_seconds(lambda: ring_forward(q, k, v), calls=5, repeats=5, warmup=2)
        alone = distributed_median_seconds(compute_only, calls=5, repeats=5, warmup=2)
    return {"ring_s": ring, "compute_s": alone}


def cp_job(*, seq: int = 1024, memory_seqs: tuple[int, ...] = (256, 512, 1024), heads: int = 4,
           head_dim: int = 32) -> dict:
    """Runs on every rank: every report above at one size; what the benchmark launches."""
    from distlab.runtime.distributed import init_distributed, shutdown

    init_distributed()
    try:
        shape = dict(heads=heads, head_dim=head_dim)
        return {"parity": parity_report(seq=64), "memory": memory_report(list(memory_seqs), **shape),
                "work": {lay: work_report(lay, seq=seq, **shape) for lay in ("contiguous", "zigzag")},
                "overlap": overlap_report(seq=seq, **shape)}
    finally:
        shutdown()


def run_cp_job(nprocs: int, timeout: float = 300, **kwargs) -> list[dict]:
    """Launch :func:`cp_job` on ``nprocs`` ranks; every rank's figures, in rank order."""
    from distlab.runtime.launch import torchrun

    return torchrun(cp_job, nprocs, kwargs=kwargs, timeout=timeout).results
