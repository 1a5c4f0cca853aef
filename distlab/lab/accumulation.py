"""Gradient accumulation at a fixed effective batch, measured under DDP (notebook 02 and ``make bench``).

:func:`sweep` runs on every rank of a torchrun job: for k = 1, 2, 4, 8 it
splits the same per-rank batch into k micro-batches and trains with an
accumulation loop (the caller's: the learner's, or the reference solution of
exercise 2, loaded inside the rank), measuring throughput, the activation bytes of one
micro-step, and the all-reduce rounds per optimizer step (a DDP comm hook).

Timing under DDP cannot use ``torch.utils.benchmark``'s adaptive repeat
count: ranks would choose different counts and wait forever in each other's
all-reduce. So every rank runs the same fixed number of steps between
barriers, the slowest rank counts (``all_reduce(MAX)``), median of repeats
(:func:`distlab.measure.timing.distributed_median_seconds`).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from distlab.data import seeded_batch
from distlab.measure.ddp_hooks import BucketLog
from distlab.measure.memory import peak_memory
from distlab.runtime.distributed import init_distributed, shutdown
from distlab.models import make_mlp
from distlab.measure.timing import distributed_median_seconds
from distlab.runtime.importing import resolve

KS = (1, 2, 4, 8)
MODEL = dict(in_features=256, hidden=1024, depth=2)


def sweep(train: str, ks: tuple[int, ...] = KS, batch_per_rank: int = 256, steps: int = 5,
          repeats: int = 5) -> list[dict]:
    """Runs on every rank: for each k, samples/s (all ranks), activation bytes of one micro-step
    (parameters excluded), all-reduce rounds per optimizer step. ``train`` names the loop
    (``"module:function"`` or ``"path/file.py:function"`` with ``train_accumulated``'s signature):
    the caller chooses it, since the runtime knows no answer to an exercise."""
    train_accumulated = resolve(train)
    device = init_distributed()
    world = dist.get_world_size()
    model = make_mlp(seed=0, **MODEL).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    buckets = BucketLog().register(ddp)  # one round per backward that all-reduces
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x, y = seeded_batch(batch_per_rank, MODEL["in_features"], 10, seed=dist.get_rank(), device=device)
    out = []
    for k in ks:
        if dist.get_rank() == 0:
            print(f"measuring k={k} ...", flush=True)
        micro = list(zip(x.chunk(k), y.chunk(k)))
        train_accumulated(ddp, opt, micro, accumulation_steps=k)  # warm-up, and count all-reduces
        before = buckets.rounds
        train_accumulated(ddp, opt, micro, accumulation_steps=k)
        per_step = buckets.rounds - before
        step_s = distributed_median_seconds(lambda: train_accumulated(ddp, opt, micro, accumulation_steps=k),
                                            calls=steps, repeats=repeats, device=device)
        act, method = peak_memory(lambda: model(micro[0][0]).sum(), device, exclude=list(model.parameters()))
        out.append({"k": k, "micro_batch": batch_per_rank // k, "samples_per_s": world * batch_per_rank / step_s,
                    "activation_bytes": act, "allreduce_per_step": per_step,
                    "memory_method": method})
    shutdown()
    return out
