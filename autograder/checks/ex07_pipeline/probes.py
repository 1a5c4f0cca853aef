"""Rank-side instruments of the exercise 7 check: run the learner's ``gpipe_step`` on a stage the
grader built, and record every forward, backward, send and recv it makes.

Everything here observes; the verdicts are computed in ``ex07_pipeline``. Each file runs in a
process group of its own (``rank.own_rendezvous``), so a file whose sends and recvs do not
match cannot hang the files after it:

* a rank that returns (or raises) leaves its group, and a peer still waiting in ``dist.recv`` or
  ``dist.send`` for it gets gloo's "Connection closed by peer" at once;
* two ranks that both wait (both in ``send``, or both in ``recv``) time out after ``p2p_timeout_s``
  (gloo; a healthy step waits about 0.1 s for its peer).

Either error is caught here and returned with the rest of the observation.
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

import distlab
from distlab.data import digits
from distlab.models import make_mlp
from distlab.lab.pipeline.timeline import Delay, TimedStage
from distlab.runtime.process import time_scale

from ...rank import CapturedPrints, P2PSpy, echo, learner_frame, load_learner, own_rendezvous, raised
from ...rank.errors import values_at
from .observations import P2PCall, RankObservation, StageEvent

BATCH, MICRO, HIDDEN, BOUNDARY = 64, 4, 48, 4   # MLP depth 3: Linear,ReLU,Linear,ReLU | Linear,ReLU,Linear
# HIDDEN is not the 64 input features: a receive buffer shaped like the input micro-batch is caught
DELAYS = (0.03, 0.015)                           # seconds of "compute" per forward, stage 0 and stage 1
P2P_TIMEOUT_S = 3.0                              # x DISTLAB_TIME_SCALE: two ranks both waiting is a deadlock


def model() -> nn.Sequential:
    return make_mlp(seed=3, hidden=HIDDEN, depth=3).net


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    x, y = digits().tensors
    return x[:BATCH], y[:BATCH]


class StageProbe:
    """Hooks on the stage: whether each forward's input required grad, and the gradient that reached
    each forward's output (what the learner backpropagated through the stage)."""

    def __init__(self, stage: nn.Module):
        self.inputs_require_grad: list[bool] = []
        self.out_grads: dict[int, torch.Tensor] = {}
        stage.register_forward_pre_hook(self._before)
        stage.register_forward_hook(self._after)

    def _before(self, module, args) -> None:
        self.inputs_require_grad.append(bool(getattr(args[0], "requires_grad", False)) if args else False)

    def _after(self, module, args, out) -> None:
        i = len(self.inputs_require_grad) - 1
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda g: self.out_grads.__setitem__(i, g.detach().cpu().clone()))


def rank_main(paths: list[str], p2p_timeout_s: float = P2P_TIMEOUT_S) -> list[dict]:
    """Runs on both ranks: one GPipe step with each learner file in turn, each in its own process group."""
    observed = []
    for i, path in enumerate(paths):
        with own_rendezvous(f"file{i}"):
            observed.append(_observe(path, p2p_timeout_s).to_wire())
    return observed


def _observe(path: str, p2p_timeout_s: float) -> RankObservation:
    # The grader owns the process group: the learner's code only sends and receives. Under gloo its
    # timeout is the p2p timeout (NCCL's watchdog would abort the job instead: it keeps the default).
    short = timedelta(seconds=p2p_timeout_s * time_scale()) if distlab.backend() == "gloo" else None
    dev = distlab.init_distributed(timeout=short)
    rank = dist.get_rank()
    if dist.get_world_size() != 2:
        raise RuntimeError("exercise 7 is a 2-stage pipeline: run it on 2 ranks")
    x, y = (t.to(dev) for t in batch())
    layers = model()[:BOUNDARY] if rank == 0 else model()[BOUNDARY:]
    stage = TimedStage(nn.Sequential(Delay(DELAYS[rank]), *layers).to(dev), rank, sync=dev.type == "cuda")
    probe = StageProbe(stage)
    loss = error = where = None
    with P2PSpy() as p2p:  # before the import: the send and recv it binds are spied on too
        learner = load_learner(path)
        dist.barrier()
        with CapturedPrints() as out:
            try:
                loss = learner.gpipe_step(stage, x.clone(), y.clone(), n_microbatches=MICRO, hidden=HIDDEN)
            except NotImplementedError:
                raise
            except Exception as exc:  # noqa: BLE001 - reported, so the other criteria are still judged
                error, where = raised(exc), str(learner_frame(exc, path) or "")
                if values := values_at(exc, path):  # the tensors on that line: shapes, requires_grad, .grad
                    where += f" (with {values})"
    echo(out.lines)
    return RankObservation(
        rank=rank, events=[StageEvent(**e) for e in stage.log()], error=error, where=where,
        p2p=[P2PCall.from_spy(c) for c in p2p.calls], inputs_require_grad=probe.inputs_require_grad,
        out_grads=probe.out_grads,
        grads=[None if p.grad is None else p.grad.detach().cpu().clone() for p in layers.parameters()],
        loss=torch.as_tensor(loss).detach().cpu().float() if isinstance(loss, (torch.Tensor, float)) else None,
    )
