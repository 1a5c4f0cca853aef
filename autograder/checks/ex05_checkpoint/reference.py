"""Exercise 5's single-process reference: the uninterrupted run the contract describes, computed here.

A resumed run is compared with the learner's own uninterrupted run (``ex05_checkpoint``), which
shows what resuming lost; a mistake both runs share (the scheduler stepped before the optimizer, the
RNG seeded alike on every rank) is only seen against this reference: the stub's ``build`` (the same
model, Adam and cosine schedule), ``torch.manual_seed(seed + rank)``, ``DistributedSampler(shuffle=True,
seed=seed, drop_last=True)`` batches of ``BATCH_SIZE`` consecutive indices (:func:`stream`: the global
stream, which a resume at another world size continues), and per step zero_grad, the
mean cross-entropy, backward, ``optimizer.step()``, ``scheduler.step()``.

One process plays the ``WORLD`` ranks: each rank's forward and backward on its own batch with its own
RNG state (dropout draws from it), then the mean of their gradients, as FSDP's reduce-scatter gives.
It records per step what ``probes`` records per rank, in the same fields (``data``, ``lr``,
``fp``, and ``pre``: what the step started from), with the sums over the ranks' shards (``fp``,
``moments``) as totals here, and one RNG hash per rank.
"""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DistributedSampler

from distlab.data import synthetic_classification
from distlab.resmlp import make_resmlp

from .observations import WORLD
from .probes import DATA_SIZE, RUN

# The stub's given constants and build(): BATCH_SIZE, LR, MODEL (exercises/ex05_checkpoint.py).
BATCH_SIZE, LR, MODEL = 16, 3e-3, dict(hidden=48, depth=2, dropout=0.1)


@dataclass(frozen=True)
class ReferencePre:
    """What a step of the reference started from: :class:`~.observations.PreStep`'s, for all ranks at once."""

    fp: float         # the float64 sum of the parameters (every rank's shards together)
    moments: float    # the float64 sum of Adam's exp_avg and exp_avg_sq
    adam_step: float  # Adam's step count
    lr: float         # the learning rate the step trains with
    rng: list[str]    # each rank's RNG hash, in rank order


@dataclass(frozen=True)
class ReferenceStep:
    """One step of the reference: :class:`~.observations.StepRecord`'s fields, for all ranks at once."""

    step: int
    data: list[list[int]]  # per rank, the sample indices it reads at this step
    fp: float              # the float64 sum of the parameters after the step
    lr: float              # the learning rate after the step
    pre: ReferencePre      # what the step started from


def rng_hash(state: torch.Tensor) -> str:
    """As ``probes._rng_hash`` hashes a CPU rank's RNG state."""
    return hashlib.sha1(state.numpy().tobytes()).hexdigest()[:16]


@functools.lru_cache(maxsize=4)
def epoch_orders(world: int = WORLD, epochs: int = 8) -> dict[tuple[int, int], list[int]]:
    """``(rank, epoch) ->`` the indices the contract's sampler deals that rank in that epoch."""
    out = {}
    for r in range(world):
        sampler = DistributedSampler(range(DATA_SIZE), num_replicas=world, rank=r, shuffle=True, seed=RUN["seed"],
                                     drop_last=True)
        for e in range(epochs):
            sampler.set_epoch(e)
            out[(r, e)] = list(sampler)
    return out


def stream(world: int, steps: int, epoch: int = 0, used: int = 0) -> list[tuple[int, int, list[list[int]]]]:
    """The contract's global sample stream at ``world`` ranks from position ``(epoch, used)`` on: per step,
    the position it starts at and each rank's batch (rank ``r``'s ``BATCH_SIZE`` sampler indices from
    ``used / world`` on). An epoch ends where a rank's sampler has no whole batch left."""
    orders, out = epoch_orders(world), []
    while len(out) < steps:
        first = used // world
        if first + BATCH_SIZE > len(orders[(0, epoch)]):
            epoch, used = epoch + 1, 0
            continue
        out.append((epoch, used, [orders[(r, epoch)][first:first + BATCH_SIZE] for r in range(world)]))
        used += world * BATCH_SIZE
    return out


def position_after(steps: int, world: int = WORLD) -> tuple[int, int]:
    """``(epoch, samples used)`` after ``steps`` steps of the stream at ``world`` ranks (as the next one sees it)."""
    epoch, used, _ = stream(world, steps + 1)[-1]
    return epoch, used


def _batches(world: int, steps: int) -> list[list[list[int]]]:
    """Per step, per rank, the sample indices the contract's sampler gives."""
    return [batch for _, _, batch in stream(world, steps)]


def short_tail(rank: int, indices: list[int], world: int = WORLD) -> int | None:
    """The epoch whose last indices on ``rank`` ``indices`` are, fewer than ``BATCH_SIZE`` (what the contract never
    trains on: an epoch ends where a rank's sampler has no whole batch left), if they are."""
    if not 0 < len(indices) < BATCH_SIZE:
        return None
    return next((e for (r, e), order in epoch_orders(world).items() if r == rank and order[-len(indices):] == indices
                 and len(order) % BATCH_SIZE == len(indices)), None)


def short_batch_said(rank: int, indices: list[int], step: int, world: int = WORLD) -> str | None:
    """What a step that trained on the short tail of an epoch (:func:`short_tail`) did, if it did."""
    if (epoch := short_tail(rank, indices, world)) is None:
        return None
    share = len(epoch_orders(world)[(rank, epoch)])
    return (f"at {world} rank{'s' if world > 1 else ''} rank {rank} trained step {step} on the last {len(indices)} "
            f"indices of its share of epoch {epoch} ({share} indices, {share // BATCH_SIZE} whole batches of "
            f"{BATCH_SIZE}), a batch shorter than BATCH_SIZE: an epoch ends when a rank's sampler has fewer than "
            f"BATCH_SIZE indices left, and the next batch is the first of epoch {epoch + 1}. Loop while offset + "
            "BATCH_SIZE <= len")


def contract_batch(rank: int, indices: list[int], world: int = WORLD) -> tuple[int, int] | None:
    """``(epoch, batch)``: which of the contract's batches ``indices`` is on ``rank``, if any."""
    for (r, e), order in epoch_orders(world).items():
        for b in range(len(order) // BATCH_SIZE):
            if r == rank and order[b * BATCH_SIZE:(b + 1) * BATCH_SIZE] == indices:
                return e, b
    return None


def _state_sums(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[float, float, float]:
    """The parameters' sum, Adam's moments' sum and its step count (as the ranks record them, in total)."""
    with torch.no_grad():
        fp = sum(p.double().sum().item() for p in model.parameters())
        states = list(optimizer.state.values())
        moments = sum(v.double().sum().item() for s in states for k, v in s.items() if k in ("exp_avg", "exp_avg_sq"))
    return fp, moments, float(states[0]["step"]) if states else 0.0


@functools.lru_cache(maxsize=2)
def reference_run(world: int = WORLD) -> tuple[list[ReferenceStep], dict]:
    """The uninterrupted run at ``world`` ranks, in one process: its records, one per step, and the final
    model state (``{name: tensor}``, as the ranks' full state dict has it). Do not modify them."""
    data = synthetic_classification(DATA_SIZE, 64, 10, seed=3)
    seed, steps = RUN["seed"], RUN["steps"]
    with torch.random.fork_rng():
        model = make_resmlp(seed=seed, **MODEL)
        params = list(model.parameters())
        optimizer = torch.optim.Adam(params, lr=LR)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
        rngs = []
        for r in range(world):
            torch.manual_seed(seed + r)
            rngs.append(torch.get_rng_state())
        records = []
        for s, indices in enumerate(_batches(world, steps), start=1):
            total = [torch.zeros_like(p) for p in params]
            for r, idx in enumerate(indices):
                torch.set_rng_state(rngs[r])
                x = torch.stack([data[i][0] for i in idx])
                y = torch.stack([data[i][1] for i in idx])
                grads = torch.autograd.grad(nn.functional.cross_entropy(model(x), y), params)
                rngs[r] = torch.get_rng_state()
                for acc, g in zip(total, grads):
                    acc += g
            for p, acc in zip(params, total):
                p.grad = acc / world
            fp, moments, adam_step = _state_sums(model, optimizer)
            pre = ReferencePre(fp=fp, moments=moments, adam_step=adam_step, lr=float(optimizer.param_groups[0]["lr"]),
                               rng=[rng_hash(state) for state in rngs])
            optimizer.step()
            scheduler.step()
            records.append(ReferenceStep(step=s, data=indices, fp=_state_sums(model, optimizer)[0],
                                         lr=float(optimizer.param_groups[0]["lr"]), pre=pre))
    return records, {k: v.detach().clone() for k, v in model.state_dict().items()}
