"""Exercise 5, written independently of the reference: explicit DCP writers and readers
(``FileSystemWriter``/``FileSystemReader``), the model's and the optimizer's state dicts fetched and
restored separately, the RNG states kept in one dict per rank, one flat loop over the global step
with the data position carried as the samples every rank together has seen (this rank starts at their
1/W), batches collated by ``default_collate``. Graded by tests/exercises/test_ex05_checkpoint.py."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint import load as dcp_load
from torch.distributed.checkpoint import save as dcp_save
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DistributedSampler, default_collate

from distlab.checkpoint import commit, latest_complete, prune, staging_path
from distlab.resmlp import make_resmlp

BATCH_SIZE, LR, MODEL = 16, 3e-3, dict(hidden=48, depth=2, dropout=0.1)


def build(steps: int, seed: int) -> tuple[nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """Given: the same model, Adam and cosine schedule on every rank, sharded with FSDP2."""
    model = make_resmlp(seed=seed, **MODEL).to(_device())
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    return model, optimizer, scheduler


def _device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _rng_file(folder: Path, rank: int) -> Path:
    return folder / f"rng-rank{rank}.pt"


def _payload(model, optimizer, scheduler, step: int, data_position: dict) -> dict:
    return {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer),
            "scheduler": scheduler.state_dict(), "step": step, "data": dict(data_position)}


def save_checkpoint(root: str | Path, step: int, model, optimizer, scheduler, data_position: dict,
                    keep: int) -> None:
    """Save everything needed to resume after ``step`` steps; called on every rank."""
    folder = staging_path(root, step)
    dcp_save(_payload(model, optimizer, scheduler, step, data_position), storage_writer=FileSystemWriter(folder))
    generators = {"cpu": torch.get_rng_state()}
    if dist.get_backend() == "nccl":
        generators["cuda"] = torch.cuda.get_rng_state()
    torch.save(generators, _rng_file(folder, dist.get_rank()))
    dist.barrier()
    if dist.get_rank() == 0:
        commit(root, step)
        prune(root, keep)
    dist.barrier()


def load_checkpoint(root: str | Path, model, optimizer, scheduler) -> tuple[int, dict] | None:
    """Restore the newest complete checkpoint under ``root``; ``(step, data_position)`` or ``None``."""
    newest = latest_complete(root)
    if newest is None:
        return None
    folder = newest[1]
    target = _payload(model, optimizer, scheduler, 0, {"epoch": 0, "samples": 0})
    dcp_load(target, storage_reader=FileSystemReader(folder))
    set_model_state_dict(model, target["model"])
    set_optimizer_state_dict(model, optimizer, target["optim"])
    scheduler.load_state_dict(target["scheduler"])
    mine = _rng_file(folder, dist.get_rank())
    if mine.exists():
        generators = torch.load(mine, weights_only=True)
        torch.set_rng_state(generators["cpu"])
        if "cuda" in generators and torch.cuda.is_available():
            torch.cuda.set_rng_state(generators["cuda"])
    return int(target["step"]), target["data"]


def train(root: str | Path, dataset, *, steps: int, save_every: int, keep: int, seed: int, on_step=None):
    """Train for ``steps`` steps in total, resuming from ``root`` if it holds a checkpoint."""
    model, optimizer, scheduler = build(steps, seed)
    torch.manual_seed(seed + dist.get_rank())
    resumed = load_checkpoint(root, model, optimizer, scheduler)
    done = resumed[0] if resumed else 0
    sampler = DistributedSampler(dataset, shuffle=True, seed=seed, drop_last=True)
    world = dist.get_world_size()
    epoch, seen = (resumed[1]["epoch"], resumed[1]["samples"]) if resumed else (0, 0)
    device, order, order_epoch = _device(), [], None
    while done < steps:
        if epoch != order_epoch:
            sampler.set_epoch(epoch)
            order, order_epoch = list(sampler), epoch
        start = seen // world  # seen counts every rank's samples: this rank's share of them is seen / W
        if start + BATCH_SIZE > len(order):  # no whole batch left of the epoch
            epoch, seen = epoch + 1, 0
            continue
        picked = order[start:start + BATCH_SIZE]
        x, y = (t.to(device) for t in default_collate([dataset[i] for i in picked]))
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        scheduler.step()
        done, seen = done + 1, seen + world * BATCH_SIZE
        if done % save_every == 0:
            save_checkpoint(root, done, model, optimizer, scheduler, {"epoch": epoch, "samples": seen}, keep)
        if on_step is not None:
            on_step(done, optimizer)
    return model, optimizer, scheduler, done
