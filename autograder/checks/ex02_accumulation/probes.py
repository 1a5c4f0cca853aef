"""Rank-side instruments of the exercise 2 check (``ex02_accumulation``'s docstring lists them); the
scenarios and data both sides share are in ``scenarios``.

Everything here observes; the verdicts, and the single-process reference, are computed in
``ex02_accumulation``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from distlab import init_distributed, shutdown
from distlab.measure.ddp_hooks import BucketLog
from distlab.models import cpu_state, make_mlp

from ...rank import CapturedPrints, echo, load_learner
from ...rank.first_calls import FirstCalls
from ...rank.nodes import as_nodes
from ...rank.parts import Parts
from .observations import ScenarioObservation, Step, ZeroGrad
from .scenarios import LR, MODEL, NODES, SCENARIOS, micro_batches, token_batches

# The grader's tolerance against one process (ex02_accumulation and causes both use it).
RTOL, ATOL = 1e-4, 1e-6  # DDP averages per-rank sums: another order than one big mean


def rank_main(paths: list[str], names: list[str], outdir: str, skip: dict[str, list[str]]) -> list[dict]:
    """Runs on every rank: observe each learner file in turn (tests grade several per launch), each scenario of
    ``names`` a part kept as it returns (``rank.parts``: one that ends the launch costs its own marks only;
    ``skip``: those an earlier launch kept or ended). Returns per file ``{scenario: ScenarioObservation as plain
    data}``.

    The grader makes the process group (the exercise is the loop, not the set-up), once for every file.
    """
    device = init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    results = []
    for i, path in enumerate(paths):
        kept = Parts(outdir, i, skip)
        with as_nodes(path, rank, world, NODES.get(world, 1)) as env_reads:
            _observe(path, device, rank, world, kept, names, env_reads)
        kept.finished()
        results.append(kept.ran)
    shutdown()
    return results


# a GPU habit: the number of processes taken for the number of GPUs (0 on a machine without them)
GPU_HABITS = [(torch.cuda, "device_count", "torch.cuda.device_count")]


def _observe(path: str, device: torch.device, rank: int, world: int, kept: Parts, names: list[str],
             env_reads: dict[str, str]) -> None:
    """Each scenario trains a fresh DDP model with the learner's loop; what was observed, kept."""
    learner = load_learner(path)
    for name, (sizes, k) in SCENARIOS.items():
        if name not in names or not kept.starts(name):
            continue
        model = make_mlp(seed=5, **MODEL).to(device)
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        probe = Probe(model)
        ddp.register_comm_hook(None, probe.comm_hook)
        model.register_forward_pre_hook(probe.before_forward)
        for module in (ddp, model):  # model.zero_grad() clears the gradients as well as the optimizer's
            module.zero_grad = probe.spy_zero_grad(module.zero_grad)
        opt = _recording_sgd(probe, ddp.parameters(), LR)
        batches = [(x.to(device), y.to(device)) for x, y in
                   (token_batches(rank, world) if name == "tokens" else micro_batches(sizes, rank, world))]
        with CapturedPrints() as printed, FirstCalls(path, GPU_HABITS) as habits:
            learner.train_accumulated(ddp, opt, batches, accumulation_steps=k)
        echo(printed.lines)
        probe.seen.device_count_at = habits.calls.get("torch.cuda.device_count", "")
        probe.seen.local_world_size_at = env_reads.get("LOCAL_WORLD_SIZE", "")
        probe.seen.end_cleared = probe.cleared()
        probe.seen.final = cpu_state(model)
        probe.seen.total_rounds.append(probe.rounds)
        kept.keep(name, probe.seen.to_wire())


class Probe:
    """Counters and snapshots shared by the instruments of one scenario (what they saw: ``seen``)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.forwards = 0          # micro-steps since the last optimizer step
        # DDP's reducer runs in C++: wrapping dist.all_reduce would see nothing, a comm hook sees every round.
        self.buckets = BucketLog()
        self.comm_hook = self.buckets.hook
        self.seen = ScenarioObservation()

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
        if self.forwards == 0 and self.seen.steps:
            self.seen.start_cleared.append(self.cleared())
        if self.forwards > 0 and self.seen.mid_grads is None:
            self.seen.mid_grads = self.grads()  # after a micro-step that did not end the window
        self.forwards += 1
        self.seen.total_rounds.append(self.rounds)

    def spy_zero_grad(self, zero_grad):
        def spy(*args, **kwargs):
            self.seen.zero_grads.append(ZeroGrad(steps=len(self.seen.steps), micro=self.forwards))
            return zero_grad(*args, **kwargs)
        return spy


def _recording_sgd(probe: Probe, params, lr: float) -> torch.optim.SGD:
    class RecordingSGD(torch.optim.SGD):
        def step(self, closure=None):
            probe.seen.steps.append(Step(grads=probe.grads(), params=cpu_state(probe.model), micro=probe.forwards))
            probe.forwards = 0
            return super().step(closure)

    opt = RecordingSGD(params, lr=lr)
    opt.zero_grad = probe.spy_zero_grad(opt.zero_grad)
    return opt
