"""Exercise 1's observations: the typed record each rank returns for one file (:class:`RankObservation`,
with its forwards and its first optimizer step), the configuration both sides share, and one file's run at
one world size with what follows from it (the global batches the ranks formed, the first step's gradient
against one process's on the same batch)."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.utils.data.distributed import DistributedSampler

from distlab.data import digits
from distlab.models import make_mlp

from ...rank.observation import Observation
from .bucketed.observations import Bucketed

# batch_size divides neither rank's shard (896 at W=2, 448 at W=4): each epoch ends with a smaller batch (16, 8),
# which one process trains on too (a blind audit's DataLoader with drop_last=True was right where it divided them)
CONFIG = dict(epochs=2, batch_size=40, lr=0.2, seed=7)
# evaluate_ddp's data set: the first EVAL_N digits, which neither world size divides (the sampler pads 1
# sample at W=2 and 3 at W=4), in batches that end with the padding; the same model on every rank.
EVAL = dict(n=21, batch_size=4, seed=3)
# and again on the first EVEN digits, which both world sizes divide: no padding there, and a count that assumes
# some (a blind audit's "drop each rank's last sample past n % W") leaves real samples out
EVEN = 20
MODEL = dict(hidden=64)


@dataclass
class Forward(Observation):
    """One forward of the model handed to ``train_ddp``."""

    through_ddp: bool  # entered through the DistributedDataParallel wrapper (False: model.module(x) directly)
    rows: int          # its batch size (the rows of its input)
    read: int          # the samples the rank had read from the data set when it ran


@dataclass
class FirstStep(Observation):
    """The first optimizer step over the model's parameters, as it began."""

    grads: dict[str, torch.Tensor]  # parameter name -> the .grad it stepped with (zeros where None), on the CPU
    lr: float                       # the optimizer's first param group's lr (nan if it has none)
    optimizer: str                  # the optimizer's class name
    grad_all_reduces: int           # dist.all_reduce calls made by hand on a parameter's .grad before it


@dataclass
class RankObservation(Observation):
    """What one rank observed of one file: ``train_ddp`` from this rank's own initial weights, then
    ``evaluate_ddp`` and ``teardown``."""

    rank: int
    initial: dict[str, torch.Tensor]  # the weights the rank built before train_ddp (a seed of its own)
    final: dict[str, torch.Tensor] = field(default_factory=dict)  # the weights train_ddp left (or returned)
    accessed: list[int] = field(default_factory=list)  # the training samples' indices, in the order read
    printed: list[str] = field(default_factory=list)   # the lines train_ddp printed on this rank
    printed_at: str | None = None  # the learner's line that printed the first ("ex01_ddp.py:73"; None: unknown)
    saves: list[str] = field(default_factory=list)     # the path of every torch.save train_ddp made
    samplers_built: int = 0  # DistributedSamplers train_ddp built (a DataLoader may still read past them)
    sampler_drop_last: bool = False  # whether one of them was built with drop_last=True
    loader_drop_last: bool = False  # whether train_ddp built a DataLoader with drop_last=True
    forwards: list[Forward] = field(default_factory=list)  # every forward of the model, in order
    ddp_built: list[bool] = field(default_factory=list)   # each DDP built around the model: its init_sync
    at_first_forward: dict[str, torch.Tensor] | None = None  # the weights when the first forward began
    first_step: FirstStep | None = None  # None: the optimizer never stepped over the model's parameters
    steps: int = 0              # optimizer steps over the model's parameters
    grad_all_reduces: int = 0   # dist.all_reduce calls by hand on a parameter's .grad, over the whole run
    eval: tuple[float, float] | None = None  # what evaluate_ddp returned, (loss, accuracy); None: not a pair
    eval_returned: str = ""     # the type name of what evaluate_ddp returned
    eval_error: str | None = None  # what evaluate_ddp raised, at the learner's line (None: nothing)
    eval_accessed: list[int] = field(default_factory=list)  # the evaluation samples this rank read
    eval_collectives: list[list[str]] = field(default_factory=list)  # evaluate_ddp's ops: [kind, "line N (`code`)"]
    eval_forwards: int = 0       # the model's forwards during evaluate_ddp
    eval_recorded: int = 0       # of them, those run with autograd recording (torch.is_grad_enabled())
    eval_even: tuple[float, float] | None = None  # what it returned on the first EVEN digits (None: not a pair)
    still_initialized: bool = False  # dist.is_initialized() after teardown()
    teardown_error: str = ""   # what teardown() raised, at the learner's line ("": nothing)
    setup_error: str = ""      # what setup() raised on every rank, at the learner's line: the grader's group went on
    bucketed: Bucketed | None = None  # part 2, BucketedDDP (None: not run, the rank stopped before it)


# The fields of RankObservation that each part after ``train_ddp`` fills (kept apart: ``rank.parts``).
EVAL_FIELDS = ("eval", "eval_returned", "eval_error", "eval_accessed", "eval_collectives", "eval_forwards",
               "eval_recorded", "eval_even")
TEARDOWN_FIELDS = ("still_initialized", "teardown_error", "setup_error")


@dataclass
class Run:
    """One file's run at one world size: every rank's observation, and where rank 0 was told to save."""

    ranks: list[RankObservation]
    world: int
    checkpoint: Path

    @functools.cached_property
    def samples_per_rank(self) -> int:
        # cached: every criterion reads each epoch, and digits() builds the data set's tensors anew at each call
        return len(digits()) // self.world

    def epoch(self, rank: int, e: int) -> list[int]:
        local = self.samples_per_rank
        return self.ranks[rank].accessed[e * local:(e + 1) * local]

    def global_batches(self) -> list[list[int]]:
        """Every optimizer step's global batch as the contract has it: the ranks' local batches of
        ``batch_size``, concatenated in rank order."""
        local, bs = self.samples_per_rank, CONFIG["batch_size"]
        return [sum((self.epoch(r, e)[s:s + bs] for r in range(self.world)), [])
                for e in range(CONFIG["epochs"]) for s in range(0, local, bs)]

    def first_batch(self, rank: int) -> list[int]:
        """The samples ``rank`` had read when its first forward ran: its first batch, as it really was."""
        forwards = self.ranks[rank].forwards
        return self.ranks[rank].accessed[:forwards[0].read] if forwards else []

    @functools.cached_property
    def gradient_ratio(self) -> float | None:
        """Rank 0's first-step gradient over one process's on the same global batch, at the same weights
        (``None`` when the two do not point the same way: then no scale factor explains the difference)."""
        r0 = self.ranks[0]
        if not r0.first_step or r0.at_first_forward is None:
            return None
        model = make_mlp(seed=0, **MODEL)
        model.load_state_dict(r0.at_first_forward)
        x_all, y_all = digits().tensors
        idx = sum((self.first_batch(r) for r in range(self.world)), [])
        nn.functional.cross_entropy(model(x_all[idx]), y_all[idx]).backward()
        ref = torch.cat([p.grad.flatten() for p in model.parameters()]).double()
        got = torch.cat([r0.first_step.grads[n].flatten() for n, _ in model.named_parameters()]).double()
        ratio = float(got @ ref / (ref @ ref))
        return ratio if torch.allclose(got, ratio * ref, rtol=1e-3, atol=1e-6) else None

    def shards(self, drop_last: bool = False) -> list[list[int]]:
        """The indices of evaluate_ddp's data set each rank's ``DistributedSampler(shuffle=False)`` deals out
        (the real sampler's, so its padding: the head of the index list repeated)."""
        return [list(DistributedSampler(range(EVAL["n"]), num_replicas=self.world, rank=r, shuffle=False,
                                        drop_last=drop_last)) for r in range(self.world)]

    @functools.cached_property
    def _eval_samples(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each of the first ``EVAL["n"]`` digits' cross-entropy and correctness under the evaluation model, in one
        process (float64): both evaluation sets (``EVEN`` is the first of them) are means of these."""
        model = make_mlp(seed=EVAL["seed"], **MODEL).double()
        x, y = digits().tensors
        with torch.no_grad():
            logits = model(x[:EVAL["n"]].double())
        return (nn.functional.cross_entropy(logits, y[:EVAL["n"]], reduction="none"),
                (logits.argmax(-1) == y[:EVAL["n"]]).double())

    @functools.cached_property
    def eval_candidates(self) -> dict[str, tuple[float, float]]:
        """(loss, accuracy) of the evaluation model over the data set once (``"reference"``, one process),
        and what the usual mistakes return; ``"rank r's shard"``: what rank r alone would report."""
        loss, correct = self._eval_samples

        def over(idx: list[int]) -> tuple[float, float]:
            return float(loss[idx].mean()), float(correct[idx].mean())

        padded, real = self.shards(), [[i for j, i in enumerate(s) if j * self.world + r < EVAL["n"]]
                                       for r, s in enumerate(self.shards())]
        out = {"reference": over(list(range(EVAL["n"]))), "padding counted": over(sum(padded, [])),
               "drop_last=True": over(sum(self.shards(drop_last=True), [])),
               "mean of the ranks' means": tuple(sum(over(s)[m] for s in real) / self.world for m in (0, 1))}
        out.update({f"rank {r}'s shard": over(s) for r, s in enumerate(padded)})
        out.update({f"rank {r}'s shard without its repeats": over(s) for r, s in enumerate(real)})
        return out

    @functools.cached_property
    def eval_even_reference(self) -> tuple[float, float]:
        """(loss, accuracy) of the evaluation model over the first ``EVEN`` digits, in one process."""
        loss, correct = self._eval_samples
        return float(loss[:EVEN].mean()), float(correct[:EVEN].mean())

    def ratio_is(self, value: float) -> bool:
        return self.gradient_ratio is not None and abs(self.gradient_ratio - value) < 1e-2 * value
