"""Rank-side instruments of the exercise 2 check (``ex02_accumulation``'s docstring lists them), and
the scenarios and data both sides share.

Everything here observes; the verdicts, and the single-process reference, are computed in
``ex02_accumulation``.
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from distlab import init_distributed, shutdown
from distlab.data import digits
from distlab.measure.ddp_hooks import BucketLog
from distlab.models import cpu_state, make_mlp

from ...rank import CapturedPrints, echo, load_learner

LR = 0.5
MODEL = dict(hidden=32)
# name -> (micro-batch sizes, identical on every rank; accumulation_steps)
SCENARIOS = {
    "equal": ([8] * 12, 4),
    "unequal": ([4, 12, 8, 10, 2, 6, 5, 7], 3),  # the last window short: 1/k, 1/2 and n_i/N all differ
    "short": ([8] * 10, 4),
    "tokens": ([2] * 4, 2),  # 2 padded sequences per micro-batch: TOKEN_LENGTHS gives each one's length
}
IGNORE_INDEX = -100  # the label of a padding token (cross_entropy's default ignore_index)
SEQ_LEN = 8
# rank -> micro-batch -> the lengths of its sequences (padded to SEQ_LEN). Token counts differ between the
# micro-batches of a window and between the ranks (window 0: 9+4 tokens on rank 0, 2+14 on rank 1), so the
# mean of micro-batch means, a rank's own count and a count that includes padding all give other gradients.
TOKEN_LENGTHS = {0: [[7, 2], [3, 1], [8, 8], [5, 6]], 1: [[1, 1], [6, 8], [2, 3], [8, 4]]}
# The grader's tolerance against one process (ex02_accumulation and causes both use it).
RTOL, ATOL = 1e-4, 1e-6  # DDP averages per-rank sums: another order than one big mean


def windows(n: int, k: int) -> list[range]:
    return [range(s, min(s + k, n)) for s in range(0, n, k)]


def rank_main(paths: list[str]) -> list[dict]:
    """Runs on every rank: observe each learner file in turn (tests grade several per launch).

    The grader makes the process group (the exercise is the loop, not the set-up), once for every file.
    """
    device = init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    results = [_observe(p, device, rank, world) for p in paths]
    shutdown()
    return results


def _observe(path: str, device: torch.device, rank: int, world: int) -> dict:
    """Each scenario trains a fresh DDP model with the learner's loop; return what was observed."""
    learner = load_learner(path)
    out = {}
    for name, (sizes, k) in SCENARIOS.items():
        model = make_mlp(seed=5, **MODEL).to(device)
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        probe = Probe(model)
        ddp.register_comm_hook(None, probe.comm_hook)
        model.register_forward_pre_hook(probe.before_forward)
        for module in (ddp, model):  # model.zero_grad() clears the gradients as well as the optimizer's
            module.zero_grad = probe.spy_zero_grad(module.zero_grad)
        opt = _recording_sgd(probe, ddp.parameters(), LR)
        batches = [(x.to(device), y.to(device)) for x, y in
                   (token_batches(rank) if name == "tokens" else micro_batches(sizes, rank, world))]
        with CapturedPrints() as printed:
            learner.train_accumulated(ddp, opt, batches, accumulation_steps=k)
        echo(printed.lines)
        out[name] = {"steps": probe.steps, "final": cpu_state(model), "mid_grads": probe.mid_grads,
                     "zero_grads": probe.zero_grads, "start_cleared": probe.start_cleared,
                     "total_rounds": probe.total_rounds + [probe.rounds]}
    return out


@functools.lru_cache(maxsize=1)
def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    return digits().tensors


def micro_batches(sizes: list[int], rank: int, world: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rank ``rank``'s micro-batches: micro-step i takes consecutive digits, rank-major."""
    x_all, y_all = _digits()
    out, start = [], 0
    for n in sizes:
        lo = start + rank * n
        out.append((x_all[lo:lo + n], y_all[lo:lo + n]))
        start += world * n
    return out


def token_batches(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rank ``rank``'s micro-batches of padded sequences: x ``(B, SEQ_LEN, 64)``, y ``(B, SEQ_LEN)``, each
    token a digit (consecutive digits, rank-major as in :func:`micro_batches`), padding x=0, y=IGNORE_INDEX."""
    x_all, y_all = _digits()
    out, start = [], 0
    for i in range(len(TOKEN_LENGTHS[0])):
        x = torch.zeros(len(TOKEN_LENGTHS[rank][i]), SEQ_LEN, x_all.shape[1])
        y = torch.full((len(TOKEN_LENGTHS[rank][i]), SEQ_LEN), IGNORE_INDEX, dtype=y_all.dtype)
        lo = start + sum(sum(TOKEN_LENGTHS[r][i]) for r in range(rank))
        for b, n in enumerate(TOKEN_LENGTHS[rank][i]):
            x[b, :n], y[b, :n] = x_all[lo:lo + n], y_all[lo:lo + n]
            lo += n
        out.append((x, y))
        start += sum(sum(TOKEN_LENGTHS[r][i]) for r in TOKEN_LENGTHS)
    return out


class Probe:
    """Counters and snapshots shared by the instruments of one scenario."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.forwards = 0          # micro-steps since the last optimizer step
        # DDP's reducer runs in C++: wrapping dist.all_reduce would see nothing, a comm hook sees every round.
        self.buckets = BucketLog()
        self.comm_hook = self.buckets.hook
        self.total_rounds: list[int] = []  # self.rounds at each forward (and at the end)
        self.steps: list[dict] = []
        self.zero_grads: list[tuple[int, int]] = []  # (optimizer steps so far, micro-steps since) per zero_grad()
        self.start_cleared: list[bool] = []  # at the first forward of every window but the first: .grad zero?
        self.mid_grads: dict | None = None

    @property
    def rounds(self) -> int:
        """DDP all-reduce rounds so far."""
        return self.buckets.rounds

    def cleared(self) -> bool:
        return all(p.grad is None or not p.grad.any() for p in self.model.parameters())

    def grads(self) -> dict:
        return {n: (p.grad.detach().to("cpu", copy=True) if p.grad is not None else torch.zeros_like(p, device="cpu"))
                for n, p in self.model.named_parameters()}

    def before_forward(self, module, args) -> None:
        if self.forwards == 0 and self.steps:
            self.start_cleared.append(self.cleared())
        if self.forwards > 0 and self.mid_grads is None:
            self.mid_grads = self.grads()  # after a micro-step that did not end the window
        self.forwards += 1
        self.total_rounds.append(self.rounds)

    def spy_zero_grad(self, zero_grad):
        def spy(*args, **kwargs):
            self.zero_grads.append((len(self.steps), self.forwards))
            return zero_grad(*args, **kwargs)
        return spy


def _recording_sgd(probe: Probe, params, lr: float) -> torch.optim.SGD:
    class RecordingSGD(torch.optim.SGD):
        def step(self, closure=None):
            probe.steps.append({"grads": probe.grads(), "params": cpu_state(probe.model), "micro": probe.forwards})
            probe.forwards = 0
            return super().step(closure)

    opt = RecordingSGD(params, lr=lr)
    opt.zero_grad = probe.spy_zero_grad(opt.zero_grad)
    return opt
