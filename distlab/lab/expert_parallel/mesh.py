"""Expert parallelism carved from the data-parallel ranks, on a 2-D device mesh.

A real job does not give each expert ranks of its own: its ``W`` ranks are all data-parallel (each its
own tokens), and the experts are spread over groups of ``ep`` of them. On the mesh ``(dp, ep) =
(W / ep, ep)`` rank ``(d, e)`` holds expert ``e`` (a copy of it is on each of the ``W / ep`` ranks of its
``dp`` column) and routes its own tokens; GShard (Lepikhin et al., 2020) and DeepSeek-V3 run so, and
torchtitan's ``ParallelDims`` takes its ``ep`` degree out of the data-parallel (and cp) ranks the same way.
What travels where:

* the tokens: the dispatch and combine all-to-alls run inside this rank's ``ep`` group only;
* the experts' gradients: all-reduced over the ``dp`` group, the ranks holding the same expert;
* the dense weights (here the router): all-reduced over every rank, as in plain data parallelism.

:func:`ep_mesh_report` runs that on a ``(W / ep, ep)`` mesh and compares output and gradients with one
process running the same MoE on all ``W`` ranks' tokens (capacity per rank's tokens, ``groups=W``).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from distlab.measure.comm import CollectiveRecorder

from .dispatch import expert_parallel_forward
from .moe import seeded_moe


def _flat_grad(module: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in module.parameters()])


def ep_mesh_report(*, ep: int = 2, tokens: int = 32, hidden: int = 16, ffn: int = 32, top_k: int = 2,
                   capacity_factor: float = 1.25, seed: int = 0) -> dict:
    """Runs on every rank (the process group up, ``W`` divisible by ``ep``): the padded expert-parallel
    MoE with ``ep`` experts over the mesh's ``ep`` groups, gradients reduced as a real job reduces them,
    against the single-process MoE on all ``W * tokens`` tokens."""
    from torch.distributed.device_mesh import init_device_mesh

    from distlab.runtime.distributed import device

    dev, world = device(), dist.get_world_size()
    mesh = init_device_mesh(dev.type, (world // ep, ep), mesh_dim_names=("dp", "ep"))
    rank, expert = mesh.get_rank(), mesh["ep"].get_local_rank()
    kwargs = dict(hidden=hidden, ffn=ffn, n_experts=ep, top_k=top_k, capacity_factor=capacity_factor)
    moe, ref = seeded_moe(seed, **kwargs), seeded_moe(seed, **kwargs)
    gen = torch.Generator().manual_seed(seed + 1)
    x_all, g_all = (torch.randn(world * tokens, hidden, generator=gen) for _ in range(2))
    x_all.requires_grad_()
    y_ref = ref(x_all, groups=world).y
    y_ref.backward(g_all)
    mine = slice(rank * tokens, (rank + 1) * tokens)
    x = x_all.detach()[mine].clone().requires_grad_()
    with CollectiveRecorder(ep) as a2a:
        out = expert_parallel_forward(moe, x, expert, ep, group=mesh["ep"].get_group())
        out["y"].backward(g_all[mine])
    expert_grad = _flat_grad(moe.experts[expert])
    with CollectiveRecorder(world // ep) as expert_reduce:
        dist.all_reduce(expert_grad, group=mesh["dp"].get_group())   # the copies of this expert
    router_grad = _flat_grad(moe.router)
    with CollectiveRecorder(world) as dense_reduce:
        dist.all_reduce(router_grad)                                 # every rank's router
    return {"rank": rank, "coordinate": mesh.get_coordinate(), "expert": expert,
            "ep_group": mesh["ep"].mesh.tolist(), "dp_group": mesh["dp"].mesh.tolist(),
            "y_diff": (out["y"] - y_ref[mine]).abs().max().item(),
            "x_grad_diff": (x.grad - x_all.grad[mine]).abs().max().item(),
            "expert_grad_diff": (expert_grad - _flat_grad(ref.experts[expert])).abs().max().item(),
            "router_grad_diff": (router_grad - _flat_grad(ref.router)).abs().max().item(),
            "a2a": a2a.totals(), "expert_reduce": expert_reduce.totals(), "dense_reduce": dense_reduce.totals(),
            "expert_parameters": expert_grad.numel(), "router_parameters": router_grad.numel()}


def ep_scale_job(*, mesh: dict | None = None, imbalance: dict | None = None) -> dict:
    """Runs on every rank: :func:`ep_mesh_report` and the all-to-all's time against imbalance
    (:func:`~distlab.lab.expert_parallel.imbalance.a2a_imbalance_report`) in one job (keyword
    arguments of each)."""
    from distlab.runtime.distributed import init_distributed, shutdown

    from .imbalance import a2a_imbalance_report

    init_distributed()
    try:
        return {"mesh": ep_mesh_report(**(mesh or {})), "imbalance": a2a_imbalance_report(**(imbalance or {}))}
    finally:
        shutdown()
