"""A real pipeline-parallel step with ``torch.distributed.pipelining``, timed stage by stage.

:func:`pipelined_step` splits an MLP into one stage per rank, drives it with
``ScheduleGPipe`` (Huang et al., 2019, GPipe) or ``Schedule1F1B`` (PipeDream-Flush:
Narayanan et al., 2021, "Memory-Efficient Pipeline-Parallel DNN Training"),
wraps every stage in :class:`distlab.pipeline.TimedStage` so each rank returns
the start and end of every forward and backward it ran, and checks the stage's
gradients against the unsplit model's.
:func:`pipeline_sweep` runs several configurations in one job (one launch).
The timeline maths and the drawing are in :mod:`distlab.pipeline`.
"""
from __future__ import annotations

import torch
from torch import nn

from .pipeline import TimedStage


def pipelined_step(schedule: str = "1f1b", n_microbatches: int = 4, *, width: int = 512, batch: int = 256,
                   depth: int = 4, seed: int = 0) -> dict:
    """Runs on every rank (one stage per rank, the process group left open): one training step of an MLP split into
    ``world_size`` stages, driven by ``torch.distributed.pipelining``'s ``ScheduleGPipe`` or
    ``Schedule1F1B``, timed by :class:`TimedStage`.

    A first, untimed step warms up (the library infers the shapes passed
    between stages on its first step). Returns this stage's event log, its
    parameters' gradients' max abs difference from the unsplit model's, and
    on the last stage the loss next to the unsplit model's.
    """
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from .distributed import device, init_distributed

    init_distributed()
    dev = device()
    rank, p = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    dims = [64] + [width] * (depth - 1) + [10]
    layers: list[nn.Module] = []
    for i in range(depth):
        layers += [nn.Linear(dims[i], dims[i + 1])] + ([nn.ReLU()] if i < depth - 1 else [])
    full = nn.Sequential(*layers)
    per = -(-depth // p)  # Linear layers per stage (the first stages take the remainder)
    cuts = [min(2 * per * s, len(full)) for s in range(p)] + [len(full)]
    part = full[cuts[rank]:cuts[rank + 1]].to(dev)
    timed = TimedStage(part, rank, sync=dev.type == "cuda")
    stage = PipelineStage(timed, rank, p, dev)
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    sched = kind(stage, n_microbatches=n_microbatches,
                 loss_fn=lambda out, target: nn.functional.cross_entropy(out, target))
    x = torch.randn(batch, 64, generator=torch.Generator().manual_seed(seed)).to(dev)
    y = torch.randint(0, 10, (batch,), generator=torch.Generator().manual_seed(seed + 1)).to(dev)
    losses: list[torch.Tensor] = []

    def step() -> None:
        losses.clear()
        if rank == 0:
            sched.step(x)
        elif rank == p - 1:
            sched.step(target=y, losses=losses)
        else:
            sched.step()

    step()                      # warm-up: shape inference and first-call costs
    part.zero_grad()
    timed.reset()
    dist.barrier()
    step()
    grads = [q.grad.detach().cpu() for q in part.parameters()]
    ref = full.cpu()
    ref.zero_grad()
    ref_loss = nn.functional.cross_entropy(ref(x.cpu()), y.cpu())
    ref_loss.backward()
    ref_grads = [q.grad for q in ref[cuts[rank]:cuts[rank + 1]].parameters()]
    try:
        for g, r in zip(grads, ref_grads):
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
        parity = True
    except AssertionError:
        parity = False
    out = {"stage": rank, "events": timed.log(), "grads_match": parity,
           "max_grad_diff": max((g - r).abs().max().item() for g, r in zip(grads, ref_grads))}
    if losses:
        out["loss"] = torch.stack(losses).detach().mean().item()
        out["unsplit_loss"] = ref_loss.item()
    return out


def pipeline_sweep(runs: list[dict]) -> list[dict]:
    """Runs on every rank: :func:`pipelined_step` once per dict of keyword arguments, in one job."""
    from .distributed import shutdown

    try:
        return [pipelined_step(**kw) for kw in runs]
    finally:
        shutdown()
