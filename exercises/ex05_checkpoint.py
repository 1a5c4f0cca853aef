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
    # YOUR CODE HERE
    raise NotImplementedError


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
    # YOUR CODE HERE
    raise NotImplementedError


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
    # YOUR CODE HERE
    raise NotImplementedError
