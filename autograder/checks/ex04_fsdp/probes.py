"""Rank-side instruments of the exercise 4 check, and the data and sizes it grades with.

Everything here observes; verdicts are computed in ``ex04_fsdp``. Each file's parts run in the order of
:data:`FILE_PARTS`: the learner's ``train_fsdp`` trains a :class:`~distlab.resmlp.ResidualMLP` on every rank, then
part 1 (ZeRO-1 by hand) is observed by :mod:`.zero1` on the same micro-batches. Around ``train_fsdp``:

* the wrapped ``train_step`` measures step ``MEASURE_STEP``: the placements and storage bytes of the
  parameters, gradients and Adam state, the peak of live tensor storage during the step, which
  blocks are FSDP units and which of them left their parameters unsharded after forward
  (``reshard_after_forward=False``), the gradient norm left in ``.grad`` when backward began (zero
  unless ``zero_grad`` was skipped), and the ``optimizer.step()`` calls;
* the loss each ``train_step`` returned (detached or not, and the last one's value, which ``loop`` looks for in
  what ``train_fsdp`` printed);
* :class:`~.state_dict_spy.StateDictSpy` records the learner's state-dict collectives (``get_model_state_dict``,
  ``get_state_dict``, ``get_optimizer_state_dict``) and what each returned. A rank that called one
  the others never made would wait in it for ever: after ``train_fsdp`` returns, the others see
  it in the store and make the same call, so the rank comes back and every other criterion can
  still be judged (the spy reports the calls it had to make: the mistake);
* an error ``train_fsdp`` raises after its last training step (the export) is recorded, not raised, and
  so is a ``NotImplementedError`` before it (part 2 not written yet: part 1 is still graded).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor, Shard

from distlab import init_distributed
from distlab.lab.fsdp_memory import activation_bytes, expected_bytes, full_shapes, measured_bytes, peak_bound
from distlab.measure.memory import PeakMemory
from distlab.resmlp import make_resmlp
from distlab.runtime import heartbeat

from ...rank import (CapturedPrints, SaveSpy, echo, frames, grad_norm, learner_frame, load_learner,
                        on_backward_start, raised)
from ...rank.parts import Parts
from .observations import FsdpRank, MeasuredStep, PeakBound, StateDictCall, TrainingError
from .workloads import LR, MEASURE_STEP, MICRO_BATCH, MODEL, SEED, STEPS, rank_batches
from .state_dict_spy import StateDictSpy
from .zero1.probes import observe_ranges, observe_zero1

def rank_main(paths: list[str], outdir: str, skip: dict[str, list[str]] | None = None) -> list[dict]:
    """Runs on every rank: each file in turn, its parts (:data:`FILE_PARTS`) that ``skip`` does not name, each kept
    on disk as it returns (``rank.parts``: ``grader.parts.launch_parts`` reads them and runs the file again
    without a part that ended the launch); one ``{part: observation}`` per file, as plain data, for the
    launcher's ``torch.load(weights_only=True)``. ``train_fsdp`` exports into ``outdir`` too.

    The grader makes the process group (the learner's file does not), so every file uses the same one.
    """
    device = init_distributed()
    return [_observe(p, Parts(outdir, i, skip), device, tag=f"distlab/ex04/{i}")
            for i, p in enumerate(paths)]


# A file's parts, in the order they run. Part 2 (FSDP) comes first: its training ("fsdp"), kept when the training
# is over (at the export's call, or when train_fsdp returns), then its export ("export": the learner's, then the
# grader's gather of the trained weights), so that an export that hangs or dies costs the export's criterion
# alone; then shard_range's answers, then part 1's training: its collectives are the learner's own, on shards
# the learner cut, where a wrong length aborts the process in gloo, and a pure function's answers are kept
# before them.
FILE_PARTS = ("fsdp", "export", "ranges", "zero1")
NEEDS = {"zero1": ("ranges",), "export": ("fsdp",)}  # a shard_range that never returns would hang zero1's first call


def _observe(path: str, kept: Parts, device: torch.device, tag: str) -> dict:
    """One file on this rank: what ``kept`` says to run of :data:`FILE_PARTS`, each kept as it returns."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # Both before the import, so that ``from torch import save`` (and the state-dict calls) bind the spies.
    with SaveSpy() as saves, StateDictSpy(tag) as calls:
        learner = load_learner(path)
        if kept.starts("fsdp"):
            obs = FsdpRank(rank=rank, world=world, steps=0)
            _train_observed(obs, learner, kept, device, saves, calls, path)
            kept.keep("export", obs.to_wire())
        if kept.starts("ranges"):
            kept.keep("ranges", observe_ranges(learner, path).to_wire())
        if kept.starts("zero1"):
            with CapturedPrints() as out:
                zero1 = observe_zero1(learner, path, rank_batches(world, rank, device), seed=SEED, lr=LR,
                                      device=device)
            echo(out.lines)
            kept.keep("zero1", zero1.to_wire())
    kept.finished()
    return kept.ran


def _error(exc: BaseException, path: str) -> TrainingError:
    """The error, where in the learner's file it was raised, and whether it came from FSDP1's module."""
    where = learner_frame(exc, path) or frames(exc)[-1]
    return TrainingError(error=raised(exc), where=f"line {where.lineno}: {where.line}",
                         fsdp1=any("fully_sharded_data_parallel.py" in f.filename for f in frames(exc)))


def _train_observed(obs: FsdpRank, learner, kept: Parts, device: torch.device, saves: SaveSpy,
                    calls: StateDictSpy, path: str) -> None:
    """Part 2 on this rank, observed into ``obs`` (up to ``not_implemented`` where train_fsdp is not written): the
    training kept as part "fsdp" once it is over (:func:`_keep_training`), the export then run as part "export"."""
    model = make_resmlp(seed=SEED, **MODEL).to(device)  # the same start on every rank
    shapes = full_shapes(model)
    export = kept.outdir / f"full_state-{kept.file}.pt"
    obs.shapes, obs.expected = {k: list(v) for k, v in shapes.items()}, expected_bytes(shapes, obs.world, obs.rank)
    obs.device, obs.export = device.type, str(export)
    batches = rank_batches(obs.world, obs.rank, device)
    held = _observe_step(learner, device, obs, path)
    returned = None
    with CapturedPrints() as out:
        _observe_export(learner, obs, lambda m: _keep_training(kept, obs, m, out.lines))
        try:
            returned = learner.train_fsdp(model, batches, lr=LR, export_path=str(export))
        except NotImplementedError as exc:
            if obs.completed < STEPS:  # part 2 not written yet (every rank alike): part 1 is graded
                echo(out.lines)
                obs.not_implemented = str(learner_frame(exc, path) or raised(exc))
                _keep_training(kept, obs, model, out.lines)
                return
            obs.after_training_error = _error(exc, path)
        except Exception as exc:  # noqa: BLE001 - the export's error is judged; the training is still graded
            if obs.completed < STEPS:
                raise  # training itself failed: nothing to grade
            obs.after_training_error = _error(exc, path)
        _keep_training(kept, obs, model, out.lines)  # before any collective of the grader's
        with heartbeat.waiting_for_peers():  # this rank is done with the learner's code
            obs.partnered = calls.settle(model, held.get("optimizer"))
    echo(out.lines)
    trained = returned[0] if isinstance(returned, tuple) else model
    final = get_model_state_dict(trained, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    dist.barrier()
    obs.final = final if obs.rank == 0 else {}
    obs.saves, obs.printed = saves.paths, out.lines
    obs.state_dict_calls = [StateDictCall(**call) for call in calls.calls]


def _keep_training(kept: Parts, obs: FsdpRank, model: nn.Module, printed: list[str]) -> None:
    """Keep part "fsdp", the training, once it is over (the export's first call after the last step, or
    train_fsdp's return, whichever comes first), with this rank's own shard of every trained weight (``shards``:
    no collective, which a rank stuck in the export would never join); then the export is part "export"."""
    if "fsdp" in kept.ran or (obs.completed < STEPS and obs.not_implemented is None):
        return
    shards, sharded = {}, []
    for name, value in model.state_dict().items():
        if isinstance(value, DTensor):
            if value.placements != (Shard(0),):
                continue  # no other placement is the contract's; the weights then differ from the reference's
            value, _ = value.to_local(), sharded.append(name)
        shards[name] = value.detach().to("cpu", copy=True)
    kept.keep("fsdp", dataclasses.replace(obs, printed=list(printed), shards=shards, sharded=sharded).to_wire())
    kept.starts("export")


def _observe_step(learner, device: torch.device, obs: FsdpRank, path: str) -> dict:
    """Wrap the learner's ``train_step`` so that its calls are counted into ``obs`` and step ``MEASURE_STEP``
    is measured (``obs.step``); returns what it holds (the optimizer, for a state-dict call made for another
    rank)."""
    held: dict = {}
    learners_step = learner.train_step

    def real_step(model, optimizer, x, y):
        """The learner's step; once it raised (not NotImplementedError), the grader's, so that what the other
        functions did (shard, make_optimizer, the export) is still graded (``obs.train_step_error``)."""
        if obs.train_step_error is None:
            try:
                return learners_step(model, optimizer, x, y)
            except NotImplementedError:
                raise
            except Exception as exc:  # noqa: BLE001 - the learner's error is feedback; its own criteria say it
                obs.train_step_error = _error(exc, path)
        return _grader_step(model, optimizer, x, y)

    def observed_step(model, optimizer, x, y):
        obs.steps += 1
        held["optimizer"] = optimizer
        if obs.steps != MEASURE_STEP:
            loss = real_step(model, optimizer, x, y)
        else:
            before = measured_bytes(model, optimizer)
            with _StepProbe(model, optimizer) as probe:
                loss, peak = _step_peak(real_step, model, optimizer, (x, y), device)
            bound = peak_bound(sum(before.values()), model, activation_bytes(MICRO_BATCH, **MODEL))
            obs.step = MeasuredStep(before=before, after=measured_bytes(model, optimizer), peak=peak,
                                    bound=PeakBound(**bound), blocks_unsharded_after_forward=probe.unsharded,
                                    leftover_grad_norm=probe.leftover, optimizer_steps=probe.optimizer_steps,
                                    **_layout(model, optimizer))
        obs.completed += 1
        obs.returned = obs.returned or _not_detached(loss)
        obs.last_loss = float(loss) if isinstance(loss, (torch.Tensor, float)) and torch.numel(
            torch.as_tensor(loss)) == 1 else None
        return loss

    learner.train_step = observed_step  # train_fsdp looks it up in its module when it calls it
    return held


def _observe_export(learner, obs: FsdpRank, at_call: Callable[[nn.Module], None]) -> None:
    """Wrap the learner's ``export_full_state_dict`` so that what it returns on this rank is seen: its contract
    returns the dict on rank 0 and ``None`` on the others (``obs.export_returned``); ``at_call(model)`` runs first."""
    learners_export = learner.export_full_state_dict

    def observed_export(model, path):
        at_call(model)
        got = learners_export(model, path)
        obs.export_returned = ("None" if got is None else f"a dict of {len(got)} entries" if isinstance(got, dict)
                               else f"a {type(got).__name__}")
        return got

    learner.export_full_state_dict = observed_export  # train_fsdp looks it up in its module when it calls it


def _not_detached(loss) -> str:
    """How a returned loss breaks the contract's "the detached loss" ("" where it keeps it)."""
    if not isinstance(loss, torch.Tensor):
        return f"a {type(loss).__name__}" if loss is not None else "None"
    if loss.requires_grad or loss.grad_fn is not None:
        return f"a tensor that requires grad (grad_fn={type(loss.grad_fn).__name__})"
    return ""


def _grader_step(model: nn.Module, optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """train_step's contract, the grader's: in place of a learner's step that raised."""
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()


class _StepProbe:
    """Hooks for one step: which FSDP blocks keep their parameters unsharded after forward, the gradient
    norm in ``.grad`` when backward begins, and the ``optimizer.step()`` calls."""

    def __init__(self, model: nn.Module, optimizer) -> None:
        self.model, self.optimizer, self.handles = model, optimizer, []
        self.params = list(model.parameters())  # outside forward: the sharded parameters
        self.unsharded: list[int] = []  # the blocks whose parameters were not all DTensors after their forward
        self.leftover: float | None = None  # the gradient norm in .grad as the first backward began
        self.optimizer_steps = 0

    def __enter__(self) -> "_StepProbe":
        for i, block in enumerate(self.model.blocks):
            if type(block).__name__.startswith("FSDP"):
                self.handles.append(block.register_forward_hook(self._after_block(i)))  # after FSDP's own
        self.handles.append(on_backward_start(self.model, self._at_backward))
        self.handles.append(self.optimizer.register_step_post_hook(self._on_step))
        return self

    def _after_block(self, i: int):
        def hook(mod, args, out) -> None:
            if any(type(p).__name__ != "DTensor" for p in mod.parameters()):
                self.unsharded.append(i)
        return hook

    def _at_backward(self) -> None:
        if self.leftover is None:  # the first backward of the step
            self.leftover = grad_norm(self.params)

    def _on_step(self, optimizer, args, kwargs) -> None:
        self.optimizer_steps += 1

    def __exit__(self, *exc) -> bool:
        for handle in self.handles:
            handle.remove()
        return False


def _step_peak(step, model: nn.Module, optimizer, batch: tuple, device: torch.device):
    """Run one ``step`` and return its loss and the peak bytes during it (:class:`PeakMemory`: the
    state it starts from, parameters, gradients and Adam's, included)."""
    params = list(model.parameters())
    with PeakMemory(device, state=[*params, *(p.grad for p in params if p.grad is not None),
                                   *(v for s in optimizer.state.values() for v in s.values())]) as mem:
        loss = step(model, optimizer, *batch)
    return loss, mem.peak


def _layout(model: nn.Module, optimizer) -> dict:
    """How the parameters are sharded and whether the optimizer holds them."""
    named = list(model.named_parameters())
    opt_ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
    return {"placements": sorted({str(getattr(p, "placements", "plain tensor")) for _, p in named}),
            "dtensors": sum(type(p).__name__ == "DTensor" for _, p in named), "n_params": len(named),
            "plain": [name for name, p in named if type(p).__name__ != "DTensor"],
            "opt_foreign": sum(id(p) not in opt_ids for _, p in named),
            "blocks_wrapped": sum(type(b).__name__.startswith("FSDP") for b in model.blocks),
            "root_wrapped": type(model).__name__.startswith("FSDP")}
