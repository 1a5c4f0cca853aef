"""Exercise 1, written independently of the reference: the process group's functions imported by
name, the optimizer built before the wrapper (DDP keeps the same parameters), batches cut by hand
from the sampler's indices and collated with ``default_collate``, a loss module, the epoch's loss
averaged over every rank with an in-place all-reduce before rank 0 logs it, and ``from torch import
save``; the evaluation gathers every rank's (index, loss, correct) rows with ``all_gather`` and
keeps each index once with ``torch.unique``, rather than locating the sampler's padding. ``BucketedDDP``
keeps one flat buffer per bucket (DDP's own layout) and copies each gradient into its slot as it is ready,
broadcasts through ``broadcast`` imported by name, counts a bucket's readiness in a set, waits with
``get_future().wait()``, and names a parameter the forward did not use instead of reducing it.
Graded by tests/exercises/test_ex01_ddp.py."""
from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import torch
from torch import nn, save
from torch.distributed import (ReduceOp, all_gather, all_reduce, broadcast, destroy_process_group, get_rank,
                               get_world_size, init_process_group)
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset, default_collate
from torch.utils.data.distributed import DistributedSampler

import distlab


def setup() -> torch.device:
    """Join torchrun's process group; this rank's device."""
    device = distlab.device()
    if device.type == "cuda":
        torch.cuda.set_device(device.index)
    init_process_group(distlab.backend(), init_method="env://", timeout=timedelta(seconds=60))
    return device


def teardown() -> None:
    destroy_process_group()


def train_ddp(model: nn.Module, dataset: Dataset, *, epochs: int, batch_size: int, lr: float,
              seed: int, checkpoint_path: str | Path) -> nn.Module:
    """Data-parallel SGD: each rank ``batch_size`` samples of its shard per step."""
    device = next(model.parameters()).device
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    replica = DistributedDataParallel(model, device_ids=None if device.type == "cpu" else [device.index])
    criterion = nn.CrossEntropyLoss()
    shard = DistributedSampler(dataset, shuffle=True, seed=seed)
    for epoch in range(epochs):
        shard.set_epoch(epoch)
        indices = list(shard)
        summed = torch.zeros(2, dtype=torch.float64, device=device)  # (loss sum, batches)
        for start in range(0, len(indices), batch_size):
            inputs, targets = default_collate([dataset[i] for i in indices[start:start + batch_size]])
            inputs, targets = inputs.to(device), targets.to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(replica(inputs), targets)
            loss.backward()
            optimizer.step()
            summed += torch.stack([loss.detach().double(), torch.ones((), dtype=torch.float64, device=device)])
        all_reduce(summed, op=ReduceOp.SUM)  # every rank calls it; only rank 0 prints
        if get_rank() == 0:
            print(f"epoch {epoch + 1}/{epochs}: loss {summed[0].item() / summed[1].item():.4f} "
                  f"over {get_world_size()} ranks", flush=True)
    if get_rank() == 0:
        save(replica.module.state_dict(), checkpoint_path)
    return replica.module


def evaluate_ddp(model: nn.Module, dataset: Dataset, *, batch_size: int) -> tuple[float, float]:
    """Loss and accuracy over the data set, each sample once: gather every rank's rows, drop repeated indices."""
    device = next(model.parameters()).device
    order = list(DistributedSampler(dataset, shuffle=False))  # equal length on every rank (padded)
    rows = []
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            x, y = default_collate([dataset[i] for i in idx])
            logits = model(x.to(device))
            y = y.to(device)
            rows.append(torch.stack([torch.tensor(idx, device=device, dtype=torch.float64),
                                     nn.functional.cross_entropy(logits, y, reduction="none").double(),
                                     (logits.argmax(1) == y).double()], dim=1))
    mine = torch.cat(rows)
    parts = [torch.empty_like(mine) for _ in range(get_world_size())]
    all_gather(parts, mine)
    every = torch.cat(parts)
    _, which = torch.unique(every[:, 0], return_inverse=True)
    keep = torch.zeros(len(dataset), dtype=torch.long, device=device).scatter_(0, which, torch.arange(
        len(every), device=device))  # one row per index (any of its copies: they are equal)
    kept = every[keep]
    return float(kept[:, 1].mean()), float(kept[:, 2].mean())


class BucketedDDP(nn.Module):
    """DDP's buckets by hand: a flat buffer per bucket, filled slot by slot as the gradients arrive."""

    def __init__(self, module: nn.Module, bucket_cap_mb: float):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for tensor in module.parameters():
                broadcast(tensor, 0)
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.buckets: list[list[tuple[str, torch.Tensor]]] = [[]]
        filled = 0
        for name, p in reversed(named):
            if filled >= bucket_cap_mb * 1024 * 1024:
                self.buckets.append([])
                filled = 0
            self.buckets[-1].append((name, p))
            filled += p.element_size() * p.numel()
        self.buffers_ = [torch.zeros(sum(p.numel() for _, p in b), dtype=b[0][1].dtype, device=b[0][1].device)
                         for b in self.buckets]
        self.slot = {}
        for k, bucket in enumerate(self.buckets):
            offset = 0
            for name, p in bucket:
                self.slot[p] = (k, offset, name)
                offset += p.numel()
                p.register_post_accumulate_grad_hook(self._arrived)
        self.ready: list[set] = [set() for _ in self.buckets]
        self.futures: dict[int, torch.futures.Future] = {}

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _arrived(self, p: torch.Tensor) -> None:
        k, offset, name = self.slot[p]
        self.buffers_[k][offset:offset + p.numel()].copy_(p.grad.reshape(-1))
        self.ready[k].add(name)
        if len(self.ready[k]) == len(self.buckets[k]):
            self.futures[k] = all_reduce(self.buffers_[k], ReduceOp.SUM, None, True).get_future()

    def finish_gradient_synchronization(self) -> None:
        missing = [name for k, bucket in enumerate(self.buckets) for name, _ in bucket if name not in self.ready[k]]
        if missing:
            for k in list(self.futures):
                self.futures.pop(k).wait()
            self.ready = [set() for _ in self.buckets]
            raise RuntimeError(f"BucketedDDP: no gradient reached {missing} in this backward (unused in the forward?)")
        world = get_world_size()
        for k, bucket in enumerate(self.buckets):
            self.futures.pop(k).wait()
            offset = 0
            for _, p in bucket:
                p.grad.copy_(self.buffers_[k][offset:offset + p.numel()].view_as(p) / world)
                offset += p.numel()
        self.ready = [set() for _ in self.buckets]
