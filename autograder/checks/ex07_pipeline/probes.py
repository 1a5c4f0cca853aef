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
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import distlab
from distlab.data import digits
from distlab.models import make_mlp
from distlab.lab.pipeline.costs import SavedBytes
from distlab.lab.pipeline.timeline import Delay, TimedStage
from distlab.runtime.process import time_scale

from ...rank import CapturedPrints, P2PSpy, echo, learner_frame, load_learner, own_rendezvous, raised
from ...rank.parts import Parts
from ...rank.errors import values_at
from .observations import P2PCall, RankObservation, StageEvent

BATCH, MICRO, HIDDEN, BOUNDARY = 64, 4, 48, 4   # MLP depth 3: Linear,ReLU,Linear,ReLU | Linear,ReLU,Linear
# HIDDEN is not the 64 input features: a receive buffer shaped like the input micro-batch is caught
# The layers of each stage, per number of stages: GPipe's 2, and 1F1B's p = 4 too, where stages 1 and 2 each
# receive and send both ways (code written for 2 stages, src=0 and dst=1, passes p = 2 unseen).
STAGES = {2: (0, BOUNDARY, 7), 4: (0, 2, 4, 6, 7)}
DELAYS = {2: (0.03, 0.015), 4: (0.03, 0.02, 0.02, 0.015)}  # seconds of "compute" per forward, per stage
P2P_TIMEOUT_S = 3.0                              # x DISTLAB_TIME_SCALE: two ranks both waiting is a deadlock
PARTS = {"gpipe": "gpipe_step", "one_f_one_b": "one_f_one_b_step"}   # the graded functions, in the order run


# float64, not torch's default: the contract's buffers have "the dtype of x", and a buffer made with the default
# dtype (float32) would pass a float32 run unseen
DTYPE = torch.float64


def model() -> nn.Sequential:
    return make_mlp(seed=3, hidden=HIDDEN, depth=3).net.to(DTYPE)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    x, y = digits().tensors
    return x[:BATCH].to(DTYPE), y[:BATCH]


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


def rank_main(paths: list[str], p2p_timeout_s: float, only: list[str], outdir: str,
              skip: dict[str, list[str]]) -> list[dict]:
    """Runs on every rank: each learner file in turn, imported once, its GPipe step then its 1F1B step (``only``:
    the parts this launch runs; 1F1B alone at 4 ranks), each in a process group of its own (one part's broken send
    or recv cannot cost the other part its marks), each kept as it returns (``rank.parts``: a part whose message
    aborts gloo costs its own marks only). ``skip``: the parts of each file an earlier launch kept or ended.
    Returns per file ``{part: RankObservation as plain data}``."""
    observed = []
    for i, path in enumerate(paths):
        kept = Parts(outdir, i, skip)
        with P2PSpy(dtype=DTYPE) as p2p:  # before the import: the send and recv it binds are spied on too
            learner = load_learner(path)
            for name, fn in PARTS.items():
                if name in only and kept.starts(name):
                    with own_rendezvous(f"file{i}-{name}"):
                        kept.keep(name, _observe(learner, path, p2p, p2p_timeout_s, fn,
                                                 saved=name == "one_f_one_b").to_wire())
        if len(only) == len(PARTS) and kept.ran and all(part["not_implemented"] for part in kept.ran.values()) \
                and not kept.skip:
            # the stub: "not implemented yet", as any
            raise NotImplementedError(f"{Path(path).name}: {', '.join(PARTS.values())} still raise it")
        kept.finished()
        observed.append(kept.ran)
    return observed


def _stage(rank: int, p: int, dev: torch.device, saved: bool) -> tuple[TimedStage, nn.Sequential, SavedBytes | None]:
    """Stage ``rank`` of ``p`` as the learner gets it (the layers after a fixed delay, timed), the layers, and the
    counter of the activations they keep for backward (``saved``: 1F1B's part)."""
    layers = model()[STAGES[p][rank]:STAGES[p][rank + 1]].to(dev)
    counted = SavedBytes(layers) if saved else None
    return TimedStage(nn.Sequential(Delay(DELAYS[p][rank]), counted or layers), rank, sync=dev.type == "cuda"), \
        layers, counted


def _per_microbatch(counted: SavedBytes, rank: int, x: torch.Tensor) -> int:
    """What one micro-batch's forward through the layers saves (the grader's own forward, before the learner's)."""
    rows = x.shape[0] // MICRO
    inp = x[:rows] if rank == 0 else torch.randn(rows, HIDDEN, dtype=x.dtype, device=x.device, requires_grad=True)
    out = counted(inp)
    one = counted.peak
    del out
    counted.reset()
    return one


def _observe(learner, path: str, p2p: P2PSpy, p2p_timeout_s: float, fn: str, saved: bool = False) -> RankObservation:
    # The grader owns the process group: the learner's code only sends and receives. Under gloo its
    # timeout is the p2p timeout (NCCL's watchdog would abort the job instead: it keeps the default).
    short = timedelta(seconds=p2p_timeout_s * time_scale()) if distlab.backend() == "gloo" else None
    dev = distlab.init_distributed(timeout=short)
    rank, p = dist.get_rank(), dist.get_world_size()
    if p not in STAGES or (fn == PARTS["gpipe"] and p != 2):
        raise RuntimeError("exercise 7's GPipe step is a 2-stage pipeline, its 1F1B step 2 or 4: run it on so many")
    x, y = (t.to(dev) for t in batch())
    stage, layers, counted = _stage(rank, p, dev, saved)
    one = _per_microbatch(counted, rank, x) if counted else 0
    probe = StageProbe(stage)
    loss = error = where = None
    first = len(p2p.calls)   # this part's sends and receives: the spy's from here on
    dist.barrier()
    with CapturedPrints() as out:
        try:
            loss = getattr(learner, fn)(stage, x.clone(), y.clone(), n_microbatches=MICRO, hidden=HIDDEN)
        except Exception as exc:  # noqa: BLE001 - reported, so the other criteria are still judged
            error, where = raised(exc), str(learner_frame(exc, path) or "")
            if values := values_at(exc, path):  # the tensors on that line: shapes, requires_grad, .grad
                where += f" (with {values})"
    p2p.drain(wait=error is None)   # no send left pending in the group that is about to close
    p2p.settle()
    echo(out.lines)
    return RankObservation(
        rank=rank, events=[StageEvent(**e) for e in stage.log()], error=error, where=where,
        p2p=[P2PCall.from_spy(c) for c in p2p.calls[first:]], inputs_require_grad=probe.inputs_require_grad,
        out_grads=probe.out_grads,
        grads=[None if p.grad is None else p.grad.detach().cpu().clone() for p in layers.parameters()],
        loss=torch.as_tensor(loss).detach().cpu().double() if isinstance(loss, (torch.Tensor, float)) else None,
        loss_grad_fn=type(loss.grad_fn).__name__ if isinstance(loss, torch.Tensor) and loss.requires_grad else "",
        loss_type="" if isinstance(loss, torch.Tensor) or error is not None else type(loss).__name__,
        not_implemented=error is not None and error.startswith("NotImplementedError"),
        saved_peak=counted.peak if counted else 0, saved_per_microbatch=one,
    )
