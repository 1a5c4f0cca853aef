"""Rank-side instruments of the exercise 9 check: run the learner's ``train`` on each rank's batches under
the :class:`~.ledger.Ledger`, which checks every collective against the peers' before it runs (a job that would
hang is stopped on every rank at once, each rank's line named), then ``train_uneven`` (part 2, ``uneven.probes``);
at W=4 (:func:`rank_main_wide`) ``train_uneven`` alone, in the ``WIDE`` scenario.
"""
from __future__ import annotations

import traceback

import torch
import torch.distributed as dist

from distlab.models import cpu_state
from distlab.runtime.distributed import init_distributed

from ...rank import CapturedPrints, attempt, echo, learner_frame, load_learner, raised
from .ledger import Ledger, Mismatch
from .observations import LR, STEPS, Backward, RankObservation, batch, model
from .uneven.observations import WIDE
from .uneven.probes import observe_uneven

RTOL, ATOL = 1e-5, 1e-6        # all-reduced sums in another order than one process's


class Batches:
    """This rank's batches, recording which step the learner's loop is at (the last batch it took)."""

    def __init__(self, rank: int):
        self.rank, self.step = rank, None

    def __len__(self) -> int:
        return STEPS

    def __iter__(self):
        for step in range(STEPS):
            self.step = step
            yield batch(self.rank, step)


class Backwards:
    """Every gradient a backward accumulated into the model's parameters: the step the loop was at, how many
    collectives the rank had made by then, and the sum of |grad| (``register_post_accumulate_grad_hook``)."""

    def __init__(self, net: torch.nn.Module, batches: Batches, ledger: Ledger):
        self.seen: list[Backward] = []
        self.handles = [p.register_post_accumulate_grad_hook(
            lambda p: self.seen.append(Backward(step=batches.step, after=ledger.made,
                                                grad_abs=float(p.grad.detach().abs().sum()))))
            for p in net.parameters()]

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def rank_main(paths: list[str]) -> list[dict]:
    """Runs on every rank: each file's ``train``, then its ``train_uneven`` in each scenario, each under its own
    :class:`Ledger`."""
    init_distributed()
    return [_observe(path, f"ex09/file{i}").to_wire() for i, path in enumerate(paths)]


def rank_main_wide(paths: list[str]) -> list[dict]:
    """Runs on every rank of the W=4 launch: each file's ``train_uneven`` in the ``WIDE`` scenario only."""
    init_distributed()
    observed = []
    for i, path in enumerate(paths):
        learner, error = attempt(load_learner, path)
        uneven = observe_uneven(learner, path, f"ex09w/file{i}", error, names=tuple(WIDE))
        observed.append(RankObservation(rank=dist.get_rank(), uneven=uneven).to_wire())
    return observed


def _observe(path: str, tag: str) -> RankObservation:
    rank = dist.get_rank()
    net, batches = model(), Batches(rank)
    learner, error = attempt(load_learner, path)
    load_error = error
    ledger = Ledger(tag, batches, path)
    backwards = Backwards(net, batches, ledger)
    with CapturedPrints() as out:
        if error is None:
            with ledger:
                trained, error = attempt(learner.train, net, batches, lr=LR)
    ledger.done()
    backwards.remove()
    echo(out.lines)
    mismatch = error.parting if isinstance(error, Mismatch) else None
    return RankObservation(
        rank=rank, final=cpu_state(net), calls=ledger.calls, counts=ledger.counts(), mismatch=mismatch,
        error=None if mismatch else raised(error, path),
        where=str(learner_frame(error, path) or "") if error is not None and not mismatch else "",
        backwards=backwards.seen,
        traceback=None if error is None or mismatch else "".join(traceback.format_exception(error))[-2000:],
        uneven=observe_uneven(learner, path, tag, load_error))
