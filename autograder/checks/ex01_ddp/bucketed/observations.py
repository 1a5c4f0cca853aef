"""The typed contract of exercise 1's part 2, ``BucketedDDP``: what one rank observed (``probes.observe_bucketed``
fills a :class:`Bucketed`), and the workload both sides share: the model, the caps, the batches, and the
buckets the contract implies (:func:`expected_buckets`).

It crosses to the grading process inside the rank's record (``..observations.RankObservation``). Imported by
both sides: it imports nothing of either.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ....rank.observation import Observation

#: The model: three Linear layers whose parameters have different sizes (fp32 bytes, registration order:
#: 8192, 128, 4096, 128, 1280, 40), so that each cap below makes buckets no other order or rule makes.
LAYERS = ((64, 32), (32, 32), (32, 10))
#: The caps, in bytes (``bucket_cap_mb = cap / 2**20``, exact in binary floating point). Reversed, the sizes add
#: up to 40, 1320, 1448, 5544, 5672, 13864 bytes. 1448 B is one of those sums: a bucket closes when it
#: *reaches* the cap, so the buckets are (4.bias, 4.weight, 2.bias), (2.weight), (0.bias, 0.weight); closed only
#: past the cap, it would make two. 1500 B makes (4.*, 2.*), (0.*) with the cap in MiB, and three buckets with
#: ``bucket_cap_mb * 10**6`` bytes (1430). 1 B: a bucket per parameter; 1 MiB: one bucket for all.
#: The overlap is judged on every cap that makes more than one bucket: the first layer's bucket is the last.
CAPS_BYTES = (1448, 1500, 1, 2**20)
STEPS = 2
ROWS = 8      # rows of each rank's slice of a global batch
LR = 0.1
SEED = 11


def make_model(seed: int, unused: bool = False) -> nn.Sequential:
    """The part's model: three Linear layers, then a frozen per-class scale (``requires_grad=False``, drawn from
    ``seed`` like the rest: it differs between the ranks until the broadcast, which the contract makes of *every*
    parameter); with ``unused``, a fourth Linear registered last and never called in the forward."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        layers = [nn.Linear(i, o) for i, o in LAYERS]
        model = nn.Sequential(layers[0], nn.ReLU(), layers[1], nn.ReLU(), layers[2], _Frozen(LAYERS[-1][1]))
        if unused:
            model.add_module("unused", _Unused(10, 10))
    return model


class _Frozen(nn.Module):
    """A per-feature scale that needs no gradient: in no bucket, yet part of every rank's start."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.empty(features).uniform_(0.5, 1.5), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class _Unused(nn.Linear):
    """A layer the forward skips: ``nn.Sequential`` calls every child, so this one passes its input on."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def batch(step: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: ``world * ROWS`` rows; rank ``r`` takes rows ``r*ROWS`` to ``(r+1)*ROWS``."""
    gen = torch.Generator().manual_seed(SEED + step)
    return torch.randn(world * ROWS, LAYERS[0][0], generator=gen), torch.randint(0, 10, (world * ROWS,), generator=gen)


def expected_buckets(model: nn.Module, cap_bytes: float, *, forward: bool = False,
                     past: bool = False) -> list[list[str]]:
    """The buckets the contract implies: parameter names, reverse registration order, closed once they reach
    ``cap_bytes``. The mistakes' rules too: ``forward``, filled in registration order; ``past``, closed only once
    they exceed the cap."""
    buckets, bucket, size = [], [], 0
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    for name, p in params if forward else reversed(params):
        bucket.append(name)
        size += p.numel() * p.element_size()
        if size > cap_bytes or (size == cap_bytes and not past):
            buckets.append(bucket)
            bucket, size = [], 0
    return buckets + [bucket] if bucket else buckets


@dataclass
class Event(Observation):
    """One event of a step's backward and ``finish_gradient_synchronization``, in the order they happened."""

    kind: str          # "grad": a parameter's gradient accumulated; "all_reduce": a collective started; "finish"
    name: str = ""     # "grad": the parameter's name
    numel: int = 0     # "all_reduce": its tensor's elements
    is_async: bool = False  # "all_reduce": called with async_op=True
    waited: bool = False    # "all_reduce": its Work waited on (or seen completed) before the optimizer step
    waited_in_backward: bool = False  # "all_reduce": its Work already waited on when loss.backward() returned
    where: str = ""    # "all_reduce": the learner's line that called it ("file.py line N (`code`)")
    other: str = ""    # a collective other than dist.all_reduce: its kind


@dataclass
class CapRun(Observation):
    """``BucketedDDP(model, cap)`` trained :data:`STEPS` steps by the grader's loop, on this rank."""

    cap_bytes: int
    error: str | None = None    # what the learner's code raised, at its line (the rest then stays default)
    where: str = ""             # that line ("file.py line N in fn: code"; "" when none of the file's lines raised)
    not_implemented: bool = False
    start: dict[str, torch.Tensor] = field(default_factory=dict)   # the weights after BucketedDDP(...)
    steps: list[list[Event]] = field(default_factory=list)        # per step, its events in order
    local: dict[str, torch.Tensor] = field(default_factory=dict)   # first step: each gradient as accumulated
    stepped: dict[str, torch.Tensor | None] = field(default_factory=dict)  # first step: .grad at the step
    final: dict[str, torch.Tensor] = field(default_factory=dict)   # the weights after the last step


@dataclass
class Bucketed(Observation):
    """Part 2 on one rank: a :class:`CapRun` for each cap, and one step with an unused parameter."""

    runs: list[CapRun] = field(default_factory=list)
    unused: CapRun | None = None   # the model with an unused parameter, the first cap, one step
