"""Rank-side instruments of exercise 9's part 2: the learner's ``train_uneven`` run once per scenario
(:data:`~.observations.SCENARIOS` at W=2, ``WIDE`` at W=4: each rank's number of batches), under the
:class:`~..ledger.Ledger`, which checks every collective against the peers' before it runs, comparing what
``TORCH_DISTRIBUTED_DEBUG=DETAIL`` compares (the kind and the shapes: a rank out of data takes part in steps it has
no batch of). A rank that leaves while another still has batches is thereby stopped as a hang on every rank, its
peer's line named, and the next scenario (and file) runs in a process group still in step.

Observed besides: the weights when each batch first went through the model's forward (a forward pre-hook
that knows this rank's batches by their values: however the learner reads the stream, batch ``t`` is
forwarded after ``t`` steps), the weights at the end, how far the learner read the stream, the DDP wrappers
and ``Join`` context managers it made (``DDP.join()`` makes one), and forwards that bypassed a DDP wrapper.
"""
from __future__ import annotations

import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import distributed as ddp_module

from distlab.models import cpu_state

from ....rank import CapturedPrints, DDPSpy, Replace, attempt, echo, learner_frame, raised
from ..ledger import Ledger
from .observations import (LENGTHS, LR, MAX_PAST_END, OPS_PER_STEP, SCENARIOS, Joined, ScenarioRun, UnevenCall,
                           model, uneven_batch)


class Stream:
    """This rank's batches in one scenario, as a data loader's stream: no ``len()``, read once. It records how far
    the learner read (``step``: the index of the last batch taken, what the Ledger tags each op with)."""

    def __init__(self, rank: int, count: int):
        self.rank, self.count = rank, count
        self.taken, self.exhausted, self.past_end, self.iterated = 0, False, 0, 0

    @property
    def step(self) -> int | None:
        return self.taken - 1 if self.taken else None

    def __iter__(self):
        """One reading, as a generator's (``iter`` of an iterator is itself); a second ``iter()`` of the stream is
        refused, where a data loader's would start over at batch 0 (a blind audit's next(iter(batches)) each step
        read batch 0 for ever from a loader, and was right from a generator)."""
        self.iterated += 1
        if self.iterated > 1:
            raise RuntimeError("iter() was called on this rank's stream of batches a second time: a data loader's "
                               "stream starts over at its first batch on each iter(), so a loop that calls it each "
                               "step reads batch 0 for ever. Take the iterator once (it = iter(batches)), then "
                               "next(it) each step")
        return _Reader(self)

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.taken < self.count:
            self.taken += 1
            return uneven_batch(self.rank, self.taken - 1)
        self.exhausted = True
        self.past_end += 1
        if self.past_end > MAX_PAST_END:
            raise RuntimeError(f"train_uneven asked this rank's stream for a batch {self.past_end} times after its "
                               f"last ({self.count}): the loop did not end")
        raise StopIteration


class UnevenLedger(Ledger):
    """The Ledger, its ops tagged with whether the rank's stream had run out, read back as :class:`UnevenCall`."""

    def tag(self, kind: str, tensors: list[torch.Tensor]) -> dict:
        return {**super().tag(kind, tensors), "exhausted": self.batches.exhausted}

    @property
    def uneven_calls(self) -> list[UnevenCall]:
        return [UnevenCall(kind=op.kind, shape=list(op.shape), **op.tags) for op in self.ops]


class JoinSpy(Replace):
    """Every ``Join`` made (``DDP.join()`` makes one): what it joins, and the division DDP's join hook will use."""

    def __init__(self):
        self.made: list[Joined] = []
        super().__init__({(Join, "__init__"): self._init})

    def _init(self, real):
        def init(join, joinables, *args, **kwargs):
            joinables = list(joinables)
            self.made.append(Joined(joinables=[type(j).__name__ for j in joinables],
                                    divide_by_initial_world_size=bool(kwargs.get("divide_by_initial_world_size",
                                                                                 True))))
            real(join, joinables, *args, **kwargs)
        return init


class _Reader:
    """The iterator of a :class:`Stream`'s one reading (``for`` over it, or ``iter`` of it, is itself)."""

    def __init__(self, stream: Stream):
        self.stream = stream

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.stream)


def _through_ddp() -> bool:
    """Whether the forward running was called by a DistributedDataParallel's forward."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename == ddp_module.__file__ and frame.f_code.co_name == "forward":
            return True
        frame = frame.f_back
    return False


class Forwards:
    """The weights when each of this rank's batches first went through the model's forward (its values name it),
    and the forwards of a batch that called the model itself while a DDP wrapper of it existed."""

    def __init__(self, net: torch.nn.Module, rank: int, count: int, ddps: DDPSpy, stream: Stream):
        self.net, self.ddps, self.stream = net, ddps, stream
        self.ahead = 0  # the most batches taken from the stream past the one going through the forward
        self.xs = [uneven_batch(rank, i)[0] for i in range(count)]
        self.snapshots: dict[int, dict[str, torch.Tensor]] = {}
        self.direct = 0
        self.handle = net.register_forward_pre_hook(self._seen)

    def _seen(self, module: torch.nn.Module, args: tuple) -> None:
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor):
            return
        x = x.detach().cpu()
        index = next((i for i, b in enumerate(self.xs) if b.shape == x.shape and torch.equal(b, x)), None)
        if index is None:
            return
        if any(m is self.net for m, _ in self.ddps.wrapping) and not _through_ddp():
            self.direct += 1
        if index not in self.snapshots:
            self.ahead = max(self.ahead, self.stream.taken - (index + 1))
        self.snapshots.setdefault(index, cpu_state(module))


def observe_uneven(learner, path: str, tag: str, load_error: Exception | None = None,
                   names=tuple(SCENARIOS)) -> list[ScenarioRun]:
    """Runs on every rank: the learner's ``train_uneven`` in each scenario of ``names``, in turn (``learner``: its
    module, or ``None`` when the file could not be imported: ``load_error``)."""
    return [_scenario(learner, path, f"{tag}/uneven/{name}", name, load_error) for name in names]


def _scenario(learner, path: str, tag: str, name: str, load_error: Exception | None) -> ScenarioRun:
    rank, lengths = dist.get_rank(), LENGTHS[name]
    net, stream = model(), Stream(rank, lengths[rank])
    ledger = UnevenLedger(tag, stream, path, compare_steps=False, limit=OPS_PER_STEP * (max(lengths) + 1))
    fn = getattr(learner, "train_uneven", None)
    error: Exception | None = load_error
    if learner is not None and fn is None:
        error = NotImplementedError(f"{Path(path).name} has no train_uneven (part 2 of the exercise)")
    with JoinSpy() as joins, DDPSpy(rounds=False) as ddps:
        forwards = Forwards(net, rank, lengths[rank], ddps, stream)
        with CapturedPrints() as out:
            if error is None:
                with ledger:
                    _, error = attempt(fn, net, stream, lr=LR)
        wrapped = sum(1 for m, _ in ddps.wrapping if m is net)
    ledger.done()
    forwards.handle.remove()
    echo(out.lines)
    parting = ledger.parting
    return ScenarioRun(
        rank=rank, scenario=name, batches=lengths[rank], final=cpu_state(net), forwarded=forwards.snapshots,
        direct=forwards.direct, read_ahead=forwards.ahead, taken=stream.taken, exhausted=stream.exhausted,
        calls=ledger.uneven_calls,
        mismatch=parting, error=None if parting or error is None else raised(error, path),
        where=str(learner_frame(error, path) or "") if error is not None and not parting else "",
        not_implemented=isinstance(error, NotImplementedError), wrapped=wrapped, joins=joins.made,
        traceback=None if error is None or parting else "".join(traceback.format_exception(error))[-2000:])
