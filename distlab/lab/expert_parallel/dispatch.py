"""Expert parallelism, GShard's way: one expert per rank, equal splits padded to capacity.

Each of ``W`` ranks holds one expert (and a copy of the router) and routes its own tokens. The
tokens must then travel to their experts' ranks and back: two **all-to-alls** in the forward
(dispatch, combine) and, through their autograd, two in the backward (Lepikhin et al., 2020,
"GShard", sec. 2.2 and 3.2). GShard gives every (rank, expert) pair exactly ``C`` rows: each rank
writes its kept slots at row ``expert * C + position`` of a ``W * C`` buffer, zeros elsewhere, so
every split is ``C`` rows and no rank needs to know the others' counts. The price is the padding:
a rank sends ``W * C`` rows whatever it routed. Exercise 11 sends only the kept slots (uneven splits,
exchanged first) and puts them back with the inverse permutation; this module stops before that,
showing only the exchange of counts that uneven splits need.

The autograd-aware collective is ``torch.distributed._functional_collectives.all_to_all_single_autograd``
(``torch.distributed.nn.functional.all_to_all_single``, its older name, warns it is deprecated in 2.13):
its backward is the all-to-all with the splits swapped. ``dist.all_to_all_single`` has no backward.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import all_to_all_single_autograd

from distlab.measure.comm import CollectiveRecorder

from .moe import MoE, Slots, capacity, load_balancing_loss, seeded_moe


def exchange_counts(send_counts: torch.Tensor) -> torch.Tensor:
    """``recv[j]``: how many rows rank ``j`` will send this rank, given ``send_counts[j]`` rows for rank
    ``j``: one all-to-all of ``W`` integers, the step before any uneven all-to-all."""
    recv = torch.empty_like(send_counts)
    dist.all_to_all_single(recv, send_counts)
    return recv


def padded_dispatch(x: torch.Tensor, slots: Slots, cap: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``W * C`` rows this rank sends (expert ``e``'s at ``e*C ... e*C + C``) and each kept slot's row."""
    kept = slots.keep.nonzero().squeeze(1)
    rows = slots.expert[kept] * cap + slots.position[kept]
    buffer = x.new_zeros(world * cap, x.shape[1]).index_copy(0, rows, x[slots.token[kept]])
    return buffer, rows


def expert_parallel_forward(moe: MoE, x: torch.Tensor, rank: int, world: int,
                            group: dist.ProcessGroup | None = None) -> dict:
    """This rank's share of ``moe`` on its own tokens ``x``: route, the padded dispatch, its expert
    (``moe.experts[rank]``) on the ``W * C`` rows it receives, the combine, the gates. Equal splits.
    ``group``: the expert-parallel group (default: every rank), of ``world`` ranks, this one ``rank`` in it."""
    routing, slots = moe.route(x)
    cap = capacity(x.shape[0], moe.n_experts, moe.router.top_k, moe.capacity_factor)
    buffer, rows = padded_dispatch(x, slots, cap, world)
    group = group or dist.group.WORLD
    received = all_to_all_single_autograd(buffer, None, None, group)  # C rows from every rank
    back = all_to_all_single_autograd(moe.experts[rank](received), None, None, group)
    kept = slots.keep.nonzero().squeeze(1)
    y = torch.zeros_like(x).index_add(0, slots.token[kept], slots.gate[kept, None] * back[rows])
    return {"y": y, "slots": slots, "aux_loss": load_balancing_loss(routing, moe.n_experts), "capacity": cap,
            "padding_rows": world * cap - len(kept)}


def _grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}


def ep_report(*, tokens: int = 64, hidden: int = 16, ffn: int = 32, top_k: int = 1,
              capacity_factor: float = 1.25, seed: int = 0) -> dict:
    """Runs on every rank (the process group already up): the padded expert-parallel MoE on this rank's
    ``tokens`` against the single-process MoE on every rank's tokens (``groups=W``), forward and gradients;
    the counts exchange; and the bytes of its all-to-alls against the all-reduce of a replicated MoE's gradients."""
    rank, world = dist.get_rank(), dist.get_world_size()
    kwargs = dict(hidden=hidden, ffn=ffn, n_experts=world, top_k=top_k, capacity_factor=capacity_factor)
    moe, ref = seeded_moe(seed, **kwargs), seeded_moe(seed, **kwargs)
    gen = torch.Generator().manual_seed(seed + 1)
    x_all, grad_all = torch.randn(world * tokens, hidden, generator=gen), torch.randn(world * tokens, hidden,
                                                                                      generator=gen)
    x_all.requires_grad_()
    out_ref = ref(x_all, groups=world)
    out_ref.y.backward(grad_all)
    x = x_all.detach()[rank * tokens:(rank + 1) * tokens].clone().requires_grad_()
    with CollectiveRecorder(world) as a2a:
        out = expert_parallel_forward(moe, x, rank, world)
        out["y"].backward(grad_all[rank * tokens:(rank + 1) * tokens])
    send = torch.bincount(out["slots"].expert[out["slots"].keep], minlength=world)
    with CollectiveRecorder(world) as counts:
        recv = exchange_counts(send)
    with CollectiveRecorder(world) as dense:   # data parallelism over a replicated MoE: every expert's grads
        dist.all_reduce(torch.zeros(sum(p.numel() for p in ref.parameters())))
    router_ref = ref.router.gate.weight.grad
    router_grad = moe.router.gate.weight.grad.clone()
    dist.all_reduce(router_grad)   # the replicated router's gradient: the sum of the ranks' parts
    rows = slice(rank * tokens, (rank + 1) * tokens)
    return {"rank": rank, "world": world, "capacity": out["capacity"], "padding_rows": out["padding_rows"],
            "dropped": out["slots"].dropped, "send_counts": send.tolist(), "recv_counts": recv.tolist(),
            "y_diff": (out["y"] - out_ref.y[rows]).abs().max().item(),
            "x_grad_diff": (x.grad - x_all.grad[rows]).abs().max().item(),
            "expert_grad_diff": max((g - _grads(ref.experts[rank])[n]).abs().max().item()
                                    for n, g in _grads(moe.experts[rank]).items()),
            "router_grad_diff": (router_grad - router_ref).abs().max().item(),
            "a2a": a2a.totals(), "a2a_counts": a2a.counts(), "count_exchange": counts.totals(),
            "dense_all_reduce": dense.totals(), "moe_parameters": sum(p.numel() for p in ref.parameters())}


def ep_job(**kwargs) -> dict:
    """Runs on every rank: :func:`ep_report` in a job of its own (initialises and shuts down)."""
    from distlab.runtime.distributed import init_distributed, shutdown

    init_distributed()
    try:
        return ep_report(**kwargs)
    finally:
        shutdown()


def run_ep_job(nprocs: int, timeout: float = 120, **kwargs) -> list[dict]:
    """Launch :func:`ep_job` on ``nprocs`` ranks; every rank's figures, in rank order."""
    from distlab.runtime.launch import torchrun

    return torchrun(ep_job, nprocs, kwargs=kwargs, timeout=timeout).results
