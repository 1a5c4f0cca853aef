"""Context parallelism as practised: the all-gather variant beside the ring, and the weights' gradients.

Llama 3 (*The Llama 3 Herd of Models*, 2024, section 3.3.2) does not pass the keys and values round a ring: every
rank **all-gathers** them, attends its own queries to the whole sequence's keys, and in the backward
reduce-scatters their gradients. With grouped-query attention ``k`` and ``v`` are a fraction of ``q``, so the
gather is cheap; it works for any mask (documents packed in a sequence); it cannot overlap a block's transfer
with the block's compute, as the ring does, and it holds the whole sequence's ``k`` and ``v`` at once. PyTorch's
``context_parallel`` all-gathers by default too (``set_rotate_method("alltoall")`` is its ring).

* :func:`allgather_attention`: non-causal, written as the ring of :mod:`.ring` is (an autograd function per
  collective, each rank one contiguous shard), so the two compare like for like; the ring's backward and the
  causal ring are exercise 10's;
* :func:`variants_report`: both against the whole sequence's attention (the ring's forward, the gather's forward
  and ``dq, dk, dv``), the bytes each rank sends (the one recorder, ring algorithms) and the forward's peak bytes;
* :func:`weight_gradients_report`: the weights that make ``q, k, v`` are the same on every rank of the CP group,
  but each rank's gradient covers its positions only; summed over the group (one all-reduce, as over a
  data-parallel group: torchtitan folds ``cp`` into FSDP's mesh) they are one process's.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from distlab.measure.comm import CollectiveRecorder
from distlab.measure.memory import PeakMemory
from distlab.runtime.distributed import device

from .ring import ring_forward
from .sharding import positions, shard


class _GatherKV(torch.autograd.Function):
    """``(k, v)`` packed, all-gathered along the sequence in the forward; their gradients reduce-scattered back
    (each rank's shard of ``dk, dv`` summed over the ranks whose queries used it) in the backward."""

    @staticmethod
    def forward(ctx, kv: torch.Tensor) -> torch.Tensor:
        world = dist.get_world_size()
        gathered = kv.new_empty((world * kv.shape[0], *kv.shape[1:]))  # ranks' tensors one after another
        dist.all_gather_single(gathered, kv.contiguous())  # torch 2.13's all_gather_into_tensor
        return gathered.view(world, *kv.shape)

    @staticmethod
    def backward(ctx, dgathered: torch.Tensor) -> torch.Tensor:
        mine = dgathered.new_empty(dgathered.shape[1:])
        dist.reduce_scatter_single(mine, dgathered.flatten(0, 1).contiguous(), op=dist.ReduceOp.SUM)
        return mine


def allgather_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d)) v`` over the whole sequence, each rank holding one contiguous shard of
    ``q, k, v`` (``B x H x S/W x D``): ``k`` and ``v`` gathered whole, then attention of this rank's queries."""
    gathered = _GatherKV.apply(torch.stack((k, v)))  # W x 2 x B x H x S/W x D, rank order = sequence order
    whole_k, whole_v = (torch.cat(list(gathered[:, i].unbind(0)), dim=-2) for i in (0, 1))
    return F.scaled_dot_product_attention(q, whole_k, whole_v)


def _qkv(seq: int, heads: int, head_dim: int, device) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, heads, seq, head_dim, generator=g).to(device).requires_grad_() for _ in range(3))


def _ring(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return ring_forward(q, k, v)[0]


def variants_report(seq: int = 64, heads: int = 2, head_dim: int = 16) -> dict:
    """The ring and the all-gather variant on this rank's contiguous shard: the largest difference from one
    process's attention (the output, and for the all-gather variant ``dq, dk, dv``), the bytes this rank sends
    forward and backward (``CollectiveRecorder.ring_bytes``) with the kinds of op, and the forward's peak bytes.
    The ring's backward is exercise 10's: its bytes are ``None`` here."""
    rank, world = dist.get_rank(), dist.get_world_size()
    q, k, v = _qkv(seq, heads, head_dim, device())
    full = F.scaled_dot_product_attention(q, k, v)
    dout = torch.randn(full.shape, generator=torch.Generator().manual_seed(1)).to(full.device)
    full.backward(dout)
    pos = positions("contiguous", seq, world, rank)
    out = {}
    for name, attend in (("ring", _ring), ("all-gather", allgather_attention)):
        mine = [shard(t.detach(), pos).requires_grad_(name != "ring") for t in (q, k, v)]
        with torch.no_grad(), PeakMemory(q.device, state=mine) as memory:
            attend(*mine)
        with CollectiveRecorder() as forward:
            o = attend(*mine)
        diffs, backward = [(o - shard(full, pos)).abs().max().item()], None
        if name != "ring":
            with CollectiveRecorder() as backward:
                o.backward(shard(dout, pos))
            diffs += [(m.grad - shard(t.grad, pos)).abs().max().item() for m, t in zip(mine, (q, k, v))]
        out[name] = {"max_diff": max(diffs), "forward_bytes": forward.ring_bytes(world),
                     "backward_bytes": backward.ring_bytes(world) if backward else None, "peak": memory.peak,
                     "ops": sorted({op.kind for rec in (forward, backward) if rec for op in rec.ops}),
                     "shard_bytes": mine[0].nbytes}
    return out


def weight_gradients_report(seq: int = 64, width: int = 32, heads: int = 2) -> dict:
    """A projection ``x -> q, k, v`` (the same weights on every rank) and the all-gather variant's attention on this
    rank's positions (the ring's backward is exercise 10's; the weights' gradients are partial with either):
    the largest difference of this rank's weight gradient from one process's, before and after the sum over
    the CP group."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = device()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, seq, width, generator=g).to(dev)
    dout = torch.randn(1, heads, seq, width // heads, generator=g).to(dev)

    def project(proj: torch.nn.Linear, xs: torch.Tensor) -> list[torch.Tensor]:
        return [t.view(1, xs.shape[1], heads, -1).transpose(1, 2) for t in proj(xs).chunk(3, dim=-1)]

    torch.manual_seed(3)
    reference = torch.nn.Linear(width, 3 * width).to(dev)
    mine = torch.nn.Linear(width, 3 * width).to(dev)
    mine.load_state_dict(reference.state_dict())
    (F.scaled_dot_product_attention(*project(reference, x)) * dout).sum().backward()
    pos = positions("contiguous", seq, world, rank).to(dev)
    (allgather_attention(*project(mine, x[:, pos])) * shard(dout, pos)).sum().backward()
    before = (mine.weight.grad - reference.weight.grad).abs().max().item()
    dist.all_reduce(mine.weight.grad)
    after = (mine.weight.grad - reference.weight.grad).abs().max().item()
    return {"before": before, "after": after, "scale": reference.weight.grad.abs().max().item()}


def practised_job(seq: int = 64) -> dict:
    """Runs on every rank: both reports above (the test's launch; the notebook adds them to its own)."""
    from distlab.runtime.distributed import init_distributed, shutdown

    init_distributed()
    try:
        return {"variants": variants_report(seq=seq), "weights": weight_gradients_report(seq=seq)}
    finally:
        shutdown()
