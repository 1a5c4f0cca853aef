"""Tiny rank programs used by notebooks and benchmarks."""
from __future__ import annotations

import distlab


def noop() -> None:
    """Join the process group and leave: the fixed cost of a launch."""
    distlab.init_distributed()
    distlab.shutdown()


def ddp_barrier() -> None:
    """A gloo process group, a DDP of one ``nn.Linear``, a barrier: what every DDP job pays before
    its first step (DDP's constructor imports ``torch._dynamo``)."""
    import torch
    import torch.distributed as dist

    distlab.init_distributed()
    torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    dist.barrier()
    distlab.shutdown()
