"""Exercise 5: checkpoints that survive a crash.

A resumed run must continue *exactly* where the interrupted one stopped: on
the CPU its final weights must be bit-identical to a run that never stopped.
That takes every piece of state the next step depends on:

* model and optimizer, sharded: save them with torch.distributed.checkpoint
  (DCP), which writes one file per rank and can load into another world size;
  ``get_state_dict``/``set_state_dict`` give and take the DTensor state of a
  ``fully_shard`` model without gathering it;
* the LR scheduler and the step counter;
* the data position: the sampler's epoch and how many of its samples every rank together has used,
  which still means the same place in the data when the job resumes with another number of ranks;
* each rank's RNG state (dropout draws from it).

And a crash may come in the middle of a write, so write into a staging
directory and commit it with an atomic rename once every rank has finished
(``distlab.checkpoint``: ``staging_path``, ``commit``, ``prune``,
``latest_complete``). Keep only the last ``keep`` checkpoints.

Legacy names: DCP with ``get_state_dict`` replaces FSDP1's
``FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT)`` plus
``FSDP.optim_state_dict``; a full checkpoint is ``StateDictType.FULL_STATE_DICT``.
FSDP1's optimizer load (``FSDP.optim_state_dict_to_load`` then
``optimizer.load_state_dict``, or ``FSDP.full_optim_state_dict``) does not work
on a ``fully_shard`` model: load with ``set_state_dict`` (or
``set_optimizer_state_dict``).

The grader runs ``train`` under torchrun, kills a rank with SIGKILL at steps
it chooses (once in the middle of a checkpoint write), and resumes with
torchrun's ``--max-restarts`` and with a fresh job. Check your work from the
repository's root with ``make grade`` (every exercise) or
``.venv/bin/python -m autograder grade --exercise 5`` (this one), or with
``check(5)`` in the notebook ``course/05_checkpointing``.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DistributedSampler

# distlab.checkpoint's helpers, all offered (the reference solution does without final_path)
from distlab.checkpoint import commit, final_path, latest_complete, prune, staging_path  # noqa: F401
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


def save_checkpoint(root: str | Path, step: int, model, optimizer, scheduler, data_position: dict,
                    keep: int) -> None:
    """Save everything needed to resume after ``step`` steps; called on every rank.

    * ``model_sd, optim_sd = get_state_dict(model, optimizer)`` and
      ``dcp.save({"model": model_sd, "optim": optim_sd, "scheduler": ..., "step": step,
      "data": data_position}, checkpoint_id=staging_path(root, step))``. Every rank calls it.
    * Each rank's RNG state (``torch.get_rng_state()``, and the CUDA one on a GPU) differs
      per rank, so each rank also ``torch.save``s its own into the staging directory,
      as ``rng-rank{R}.pt``.
    * ``dist.barrier()`` so all ranks have finished, then on rank 0 only:
      ``commit(root, step)`` and ``prune(root, keep)``; then ``dist.barrier()`` again
      so no rank runs ahead while rank 0 renames.
    """
    ### BEGIN SOLUTION
    staged = staging_path(root, step)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "scheduler": scheduler.state_dict(),
             "step": step, "data": dict(data_position)}
    dcp.save(state, checkpoint_id=staged)
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and dist.get_backend() == "nccl":
        rng["cuda"] = torch.cuda.get_rng_state()
    torch.save(rng, staged / f"rng-rank{dist.get_rank()}.pt")
    dist.barrier()  # every rank's shard and RNG file are on disk
    if dist.get_rank() == 0:
        commit(root, step)  # atomic rename: a crash before this leaves only a .tmp- directory
        prune(root, keep)
    dist.barrier()
    ### END SOLUTION


def load_checkpoint(root: str | Path, model, optimizer, scheduler) -> tuple[int, dict] | None:
    """Restore the newest *complete* checkpoint under ``root``; return ``(step, data_position)``.

    Return ``None`` (and change nothing) when there is none. Find it with
    ``latest_complete(root)`` (never a ``.tmp-`` directory). Build the same
    structure ``save_checkpoint`` saved (``get_state_dict`` gives the
    destination tensors), ``dcp.load`` it in place, then ``set_state_dict``
    and ``scheduler.load_state_dict``. Restore this rank's RNG state from
    ``rng-rank{R}.pt`` when that file exists (after resuming with more ranks
    than saved it, the new ranks keep their own seed).
    """
    ### BEGIN SOLUTION
    found = latest_complete(root)
    if found is None:
        return None
    _, path = found
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "scheduler": scheduler.state_dict(),
             "step": 0, "data": {"epoch": 0, "samples": 0}}
    dcp.load(state, checkpoint_id=path)  # reshards when the world size changed
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    scheduler.load_state_dict(state["scheduler"])
    rng_file = path / f"rng-rank{dist.get_rank()}.pt"
    if rng_file.is_file():
        rng = torch.load(rng_file, weights_only=True)
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
    return int(state["step"]), dict(state["data"])
    ### END SOLUTION


def train(root: str | Path, dataset, *, steps: int, save_every: int, keep: int, seed: int,
          on_step=None):
    """Train for ``steps`` steps in total, resuming from ``root`` if it holds a checkpoint.

    Contract (the grader checks each point):

    * ``model, optimizer, scheduler = build(steps, seed)``, then seed this
      rank's RNG with ``torch.manual_seed(seed + rank)``, then ``load_checkpoint``.
    * Data: ``DistributedSampler(dataset, shuffle=True, seed=seed, drop_last=True)``;
      an epoch is ``len(sampler) // BATCH_SIZE`` batches of consecutive sampler
      indices; read samples with ``dataset[i]`` and stack them. Call
      ``sampler.set_epoch(epoch)`` for each epoch. The data position is
      ``{"epoch": e, "samples": n}``: the ranks together have used the first ``n`` samples
      of epoch ``e``'s global stream (the sampler's shuffled order of the whole dataset, which
      rank ``r`` of ``W`` deals from at ``r, r + W, r + 2W, ...``: each step uses the next
      ``W * BATCH_SIZE`` of it). The grader resumes with another world size ``W'``
      (``n`` a multiple of ``W'``): the next batch of rank ``r`` is then the ``BATCH_SIZE``
      indices of its sampler from index ``n / W'`` on, and the job continues the same stream,
      no sample skipped or seen twice. An epoch ends when a rank's sampler has fewer than
      ``BATCH_SIZE`` indices left: the next batch is the first of epoch ``e + 1``.
    * Each step: ``optimizer.zero_grad()``, mean cross-entropy, ``backward()``,
      ``optimizer.step()``, ``scheduler.step()``. After step ``s`` (counting
      from 1), if ``s % save_every == 0`` call ``save_checkpoint``; then call
      ``on_step(s, optimizer)`` if given.
    * Return ``(model, optimizer, scheduler, step)`` (the last step done).
    """
    ### BEGIN SOLUTION
    model, optimizer, scheduler = build(steps, seed)
    torch.manual_seed(seed + dist.get_rank())
    step, position = 0, {"epoch": 0, "samples": 0}
    resumed = load_checkpoint(root, model, optimizer, scheduler)
    if resumed is not None:
        step, position = resumed
    sampler = DistributedSampler(dataset, shuffle=True, seed=seed, drop_last=True)
    world, device = dist.get_world_size(), _device()
    epoch, used = position["epoch"], position["samples"]
    while step < steps:
        sampler.set_epoch(epoch)
        order = list(sampler)  # this rank's indices for the whole epoch: the global stream's r, r + W, ...
        # The position counts the global stream, so it means the same place whatever the world size
        # that saved it: this rank's next index is number used / W of its share.
        for first in range(used // world, len(order) - BATCH_SIZE + 1, BATCH_SIZE):
            if step >= steps:
                break
            batch = [dataset[i] for i in order[first:first + BATCH_SIZE]]
            x = torch.stack([s[0] for s in batch]).to(device)
            y = torch.stack([s[1] for s in batch]).to(device)
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            scheduler.step()
            step += 1
            used += world * BATCH_SIZE
            if step % save_every == 0:
                save_checkpoint(root, step, model, optimizer, scheduler, {"epoch": epoch, "samples": used}, keep)
            if on_step is not None:
                on_step(step, optimizer)
        else:  # no whole batch left of this epoch (also when a resume lands past its last one): the next
            epoch, used = epoch + 1, 0
    return model, optimizer, scheduler, step
    ### END SOLUTION
