"""A real pipeline-parallel step with ``torch.distributed.pipelining``, timed stage by stage.

:func:`pipelined_step` splits an MLP into ``v`` stages per rank, drives it with
``ScheduleGPipe`` (Huang et al., 2019, GPipe), ``Schedule1F1B`` (PipeDream-Flush:
Narayanan et al., 2021, "Memory-Efficient Pipeline-Parallel DNN Training"),
``ScheduleInterleaved1F1B`` (Narayanan et al., 2021, "Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM", SC'21; bubble
``(p-1)/(v m + p-1)``) or the zero-bubble schedules (Qi et al., 2024, "Zero
Bubble Pipeline Parallelism", ICLR), wraps every stage in
:class:`distlab.lab.pipeline.timeline.TimedStage` so each rank returns the start and end of
every forward and backward it ran, optionally counts stage 0's saved-tensor
bytes (:class:`distlab.lab.pipeline.costs.SavedBytes`), and checks the stage's
gradients against the unsplit model's.
:func:`pipeline_sweep` runs several configurations in one job (one launch).
The timeline maths and the drawing are in :mod:`distlab.lab.pipeline.timeline`.
"""
from __future__ import annotations

import time

import torch
from torch import nn

from distlab.lab.pipeline.timeline import TimedStage
from distlab.lab.pipeline.costs import SavedBytes

SINGLE = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}
MULTI = {"interleaved1f1b": "ScheduleInterleaved1F1B", "zbv": "ScheduleZBVZeroBubble",
         "interleavedzb": "ScheduleInterleavedZeroBubble"}
ZERO_BUBBLE = ("zbv", "interleavedzb")


class _Untimed(nn.Module):
    """A stage as it is (no events): the zero-bubble schedules' ``detach_()`` of stage outputs
    fails on :class:`TimedStage`'s marker views ("Can't detach views in-place")."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)

    def reset(self) -> None:
        pass

    def log(self) -> list[dict]:
        return []


def mlp(depth: int, width: int, seed: int, narrow: tuple[int, ...] = (), boundary: int = 0) -> nn.Sequential:
    """``depth`` Linear layers (64 -> width -> ... -> 10) with ReLUs between, seeded; the layers
    whose indices are in ``narrow`` output ``boundary`` features instead of ``width``."""
    torch.manual_seed(seed)
    dims = [64] + [boundary if i in narrow and boundary else width for i in range(depth - 1)] + [10]
    layers: list[nn.Module] = []
    for i in range(depth):
        layers += [nn.Linear(dims[i], dims[i + 1])] + ([nn.ReLU()] if i < depth - 1 else [])
    return nn.Sequential(*layers)


def cuts(n_layers: int, depth: int, pieces: int) -> list[int]:
    """Module indices where each of ``pieces`` stages starts (Linear+ReLU pairs; the first take the remainder)."""
    per = -(-depth // pieces)
    return [min(2 * per * s, n_layers) for s in range(pieces)] + [n_layers]


def last_linear_per_stage(depth: int, pieces: int) -> tuple[int, ...]:
    """Indices of the Linear layers whose outputs cross a stage boundary (what is sent)."""
    per = -(-depth // pieces)
    return tuple(per * s - 1 for s in range(1, pieces) if per * s < depth)


def _stage_indices(schedule: str, rank: int, p: int, v: int) -> list[int]:
    """The global stage indices this rank holds: ``rank`` (v=1), ``rank + k p`` (looped), or V-shaped (ZBV)."""
    if schedule == "zbv":
        return [rank, 2 * p - 1 - rank]
    return [rank + k * p for k in range(v)]


def _schedule(schedule: str, parts: list[nn.Module], mine: list[int], n_stages: int, m: int, rank: int,
              dev: torch.device) -> tuple[list, list, object]:
    """Wrap this rank's stage modules (:class:`SavedBytes` inside :class:`TimedStage`) and build the schedule.

    The stages infer their shapes from the first step. Fixed shapes (``input_args``/``output_args``)
    work in torch 2.13 only if the example tensors carry ``requires_grad`` (every non-last stage's
    output, every non-first stage's input); otherwise stage 0 gets no output gradient ("Output
    gradient: None") or the pipeline waits until gloo's timeout.
    """
    from torch.distributed import pipelining

    meters = [SavedBytes(part) for part in parts]
    timed = [TimedStage(meter, rank, sync=dev.type == "cuda") for meter in meters]
    if schedule in ZERO_BUBBLE:  # their split backward detaches outputs in place: no views (TimedStage's marks)
        meters, timed = [], [_Untimed(part) for part in parts]
    stages = [pipelining.PipelineStage(t, i, n_stages, dev) for t, i in zip(timed, mine)]
    loss_fn = lambda out, target: nn.functional.cross_entropy(out, target)  # noqa: E731
    if schedule in SINGLE:
        return meters, timed, getattr(pipelining, SINGLE[schedule])(stages[0], n_microbatches=m, loss_fn=loss_fn)
    return meters, timed, getattr(pipelining, MULTI[schedule])(stages, n_microbatches=m, loss_fn=loss_fn)


def pipelined_step(schedule: str = "1f1b", n_microbatches: int = 4, *, width: int = 512, batch: int = 256,
                   depth: int = 4, seed: int = 0, stages_per_rank: int = 1, microbatch_rows: int = 0,
                   memory: bool = False, boundary: int = 0, record: bool = False) -> dict:
    """Runs on every rank (the process group left open): one training step of an MLP split into
    ``stages_per_rank x world_size`` stages, driven by a ``torch.distributed.pipelining`` schedule
    (:data:`SINGLE`, :data:`MULTI`), timed by :class:`TimedStage` (events labelled with the rank).

    ``microbatch_rows`` > 0 fixes the micro-batch instead of the batch (batch = m x rows).
    ``boundary`` > 0 narrows the layers whose outputs cross a rank boundary of the ``v = 1`` split
    to that many features (smaller messages for the same compute; the model does not depend on ``v``).
    ``memory`` returns the peak saved-tensor bytes of this rank's first stage; ``record`` the
    communication ops of the timed step (:class:`distlab.measure.comm.CollectiveRecorder`).
    A first, untimed step warms up (the library infers the shapes passed
    between stages on its first step). Returns this rank's event log, its
    gradients' max abs difference from the unsplit model's, the step's
    wall time, and on the last stage the loss next to the unsplit model's.
    """
    import torch.distributed as dist

    from distlab.runtime.distributed import device, init_distributed

    init_distributed()
    dev = device()
    rank, p = dist.get_rank(), dist.get_world_size()
    v = 2 if schedule == "zbv" else stages_per_rank
    batch = microbatch_rows * n_microbatches if microbatch_rows else batch
    full = mlp(depth, width, seed, last_linear_per_stage(depth, p), boundary)  # the same model for any v
    cut = cuts(len(full), depth, p * v)
    mine = _stage_indices(schedule, rank, p, v)
    parts = [full[cut[i]:cut[i + 1]].to(dev) for i in mine]
    meters, timed, sched = _schedule(schedule, parts, mine, p * v, n_microbatches, rank, dev)
    x = torch.randn(batch, 64, generator=torch.Generator().manual_seed(seed)).to(dev)
    y = torch.randint(0, 10, (batch,), generator=torch.Generator().manual_seed(seed + 1)).to(dev)
    has_first, has_last = 0 in mine, p * v - 1 in mine
    losses: list[torch.Tensor] = []

    def step() -> None:
        losses.clear()
        sched.step(*([x] if has_first else []), **(dict(target=y, losses=losses) if has_last else {}))

    step()                      # warm-up: shape inference and first-call costs
    for part, t in zip(parts, timed):
        part.zero_grad()
        t.reset()
    for meter in meters:
        meter.reset()
    dist.barrier()
    from contextlib import nullcontext

    from distlab.measure.comm import CollectiveRecorder

    rec = CollectiveRecorder() if record else nullcontext()
    start, cpu = time.perf_counter(), time.thread_time()
    with rec:
        step()
    wall, cpu = time.perf_counter() - start, time.thread_time() - cpu
    events = [e for t in timed for e in t.log()]
    # The CPU time this thread got while it computed: below the busy wall time, it waited for a core.
    busy = sum(e["end"] - e["start"] for e in events)
    out = {"stage": rank, "events": events, "step_s": wall, "cpu_share": min(1.0, cpu / busy) if busy else 1.0}
    out.update(_parity(full, parts, cut, mine, x, y, key=(depth, width, seed, p, boundary, batch)))
    if memory and meters:
        out["saved_peak_bytes"] = meters[0].peak
        out["saved_live_bytes"] = meters[0].live
    if record:
        out["ops"] = [(op.kind, op.bytes) for op in rec.ops]
    if losses:
        out["loss"] = torch.stack(losses).detach().mean().item()
    return out


#: The unsplit model's loss and per-layer gradients, by (model, batch): every schedule and m of one
#: workload compares with the same reference, computed once per job (it costs two stages' work).
_REFERENCE: dict[tuple, tuple[float, list[list[torch.Tensor]]]] = {}


def _reference(full: nn.Sequential, x: torch.Tensor, y: torch.Tensor, key: tuple) -> tuple[float, list]:
    if key not in _REFERENCE:
        ref = full.cpu()
        ref.zero_grad()
        loss = nn.functional.cross_entropy(ref(x.cpu()), y.cpu())
        loss.backward()
        _REFERENCE[key] = loss.item(), [[q.grad.clone() for q in layer.parameters()] for layer in ref]
    return _REFERENCE[key]


def _parity(full: nn.Sequential, parts: list[nn.Module], cut: list[int], mine: list[int],
            x: torch.Tensor, y: torch.Tensor, key: tuple) -> dict:
    """This rank's stages' gradients against the unsplit model's, and the unsplit loss."""
    grads = [q.grad.detach().cpu() for part in parts for q in part.parameters()]
    ref_loss, per_layer = _reference(full, x, y, key)
    ref_grads = [g for i in mine for layer in per_layer[cut[i]:cut[i + 1]] for g in layer]
    try:
        for g, r in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
        parity = True
    except AssertionError:
        parity = False
    return {"grads_match": parity, "unsplit_loss": ref_loss,
            "max_grad_diff": max((g - r).abs().max().item() for g, r in zip(grads, ref_grads))}


def pipeline_sweep(runs: list[dict], message_sizes: list[int] | None = None) -> list[dict]:
    """Runs on every rank: :func:`pipelined_step` once per dict of keyword arguments, in one job;
    with ``message_sizes``, the per-message cost too (:func:`distlab.lab.pipeline.costs.message_cost`),
    returned as a last item ``{"message_cost": [...]}``."""
    from distlab.runtime.distributed import init_distributed, shutdown
    from distlab.lab.pipeline.costs import message_cost

    try:
        init_distributed()
        out = [pipelined_step(**kw) for kw in runs]
        if message_sizes:
            out.append({"message_cost": message_cost(message_sizes)})
        return out
    finally:
        shutdown()
