"""Rank-side instruments of the exercise 8 check: build the learner's two layers from the grader's
unsplit block, run one forward and one backward through them, and record what happened.

Everything here observes; the verdicts are computed in ``ex08_tensor_parallel``. Every rank builds
the same unsplit block and input (fixed seeds, ``reference``), builds ``ColumnParallelLinear`` and
``RowParallelLinear`` from it with the learner's classes, assembles them with the block's GELU as
``parallelize_mlp`` does, and returns a :class:`~.observations.StepObservation` (as plain data):

* what each layer holds: its ``weight`` and ``bias`` (values, whether they are parameters) and every
  tensor reachable from it (parameters, buffers, tensor attributes, submodules'), with the bytes of
  its storage and whether that storage is the unsplit layer's;
* the layers built again for every other rank, and from a float64 copy of the block: their shards and dtypes;
* the output, the input's gradient and the shards' gradients;
* every collective the rank issued, with its phase (forward or backward), the layer whose forward
  was running, its shape, and for an all-reduce a copy of what this rank put in.

Collectives are seen as the dispatcher runs them (by the one recorder,
``distlab.measure.comm.CollectiveRecorder``, named as the ``torch.distributed`` calls), whatever the learner
called: ``dist.all_reduce``, the functional collectives,
``send``/``recv``; in the forward and inside an ``autograd.Function``'s backward alike (checked
under gloo with torch 2.13: the mode stays active in the backward).
"""
from __future__ import annotations

import copy
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

import distlab
from distlab.measure.comm import CollectiveRecorder
from distlab.runtime.launch import time_scale

from ...rank import CapturedPrints, echo, every_rank_tells, learner_frame, load_learner, raised, raised_at
from .observations import Collective, Held, Holdings, Param, StepObservation
from .reference import PARTS, block, data
from .stand_ins import off_shard, stand_in


class CommSpy(CollectiveRecorder):
    """The one recorder of collectives (:class:`~distlab.measure.comm.CollectiveRecorder`), each op tagged
    with the phase it ran in, the learner's layer whose forward was running, and for an all-reduce a
    copy of what this rank put in (the recorder tags an op before it runs: in-place collectives
    overwrite their input)."""

    def __init__(self):
        super().__init__()
        self.phase = "forward"
        self.layer: str | None = None   # the learner's layer whose forward is running
        self.shapes: dict[str, list[int] | None] = {}

    def watch(self, module: nn.Module, layer: str) -> list:
        """Tag the collectives issued during ``module``'s forward with ``layer``; note its output's shape."""
        def before(mod, args):
            self.layer = layer

        def after(mod, args, out):
            self.layer = None
            self.shapes[layer] = list(out.shape) if isinstance(out, torch.Tensor) else None

        return [module.register_forward_pre_hook(before), module.register_forward_hook(after)]

    def tag(self, kind: str, tensors: list[torch.Tensor]) -> dict:
        copy = tensors[0].detach().cpu().clone() if kind == "all_reduce" and tensors else None
        return {"phase": self.phase, "layer": self.layer, "input": copy}

    @property
    def collectives(self) -> list[Collective]:
        """Every op, in order: its kind (the ``torch.distributed`` call's name), first tensor's shape, tags."""
        return [Collective(kind=op.kind, shape=list(op.shape), **op.tags) for op in self.ops]

    @property
    def calls(self) -> list[dict]:
        """:attr:`collectives` as plain data, as a rank sends them."""
        return [c.to_wire() for c in self.collectives]


def _storage(t: torch.Tensor) -> tuple[str, int]:
    return str(t.device), t.untyped_storage().data_ptr()


def _tensors(layer: nn.Module):
    """``(name, tensor)`` for every tensor ``layer`` keeps: parameters, buffers, tensor attributes, recursively."""
    for prefix, mod in layer.named_modules():
        attrs = [(k, v) for k, v in vars(mod).items() if isinstance(v, torch.Tensor)]
        for name, t in [*mod._parameters.items(), *mod._buffers.items(), *attrs]:
            if isinstance(t, torch.Tensor):
                yield f"{prefix}.{name}" if prefix else name, t


def holdings(layer: nn.Module, unsplit: nn.Linear) -> Holdings:
    """What ``layer`` keeps: its ``weight`` and ``bias``, and every distinct storage it holds on to."""
    theirs = {_storage(p) for p in unsplit.parameters()}
    params: dict[str, Param | None] = {}
    for name in ("weight", "bias"):
        t = getattr(layer, name, None)
        params[name] = None if not isinstance(t, torch.Tensor) else Param(
            parameter=any(p is t for p in layer.parameters()), shape=list(t.shape), value=t.detach().cpu().clone())
    seen: dict[tuple[str, int], Held] = {}
    for name, t in _tensors(layer):
        if _storage(t) not in seen:
            seen[_storage(t)] = Held(name=name, shape=list(t.shape), bytes=t.numel() * t.element_size(),
                                     storage_bytes=t.untyped_storage().nbytes(), unsplit=_storage(t) in theirs)
    return Holdings(params=params, tensors=list(seen.values()))


def _tensor(layers: dict[str, nn.Module], part: str):
    """The layers' attribute ``part`` names ("column.weight"), or ``None``."""
    layer, name = part.split(".")
    return getattr(layers[layer], name, None)


def _grads(layers: dict[str, nn.Module]) -> dict[str, torch.Tensor | None]:
    out = {}
    for part in PARTS:
        grad = getattr(_tensor(layers, part), "grad", None)
        out[part] = grad.detach().cpu().clone() if isinstance(grad, torch.Tensor) else None
    return out


def rank_main(paths: list[str]) -> list[dict]:
    """Runs on every rank: observe each learner file in turn (the tests grade several per launch).

    The grader makes the process group, once for every file: the learner's code only communicates. A
    file that raises on every rank (a shape mismatch) leaves no collective pending; one whose ranks
    disagree waits out the group's timeout, and the files after it in the same launch may then not be
    graded (a learner's grading has one file; the tests' mutants raise on every rank alike).
    """
    dev = distlab.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        return [_observe(path, dev, rank, world, f"ex08/W{world}/file{i}").to_wire() for i, path in enumerate(paths)]
    finally:
        distlab.shutdown()


def _observe(path: str, dev: torch.device, rank: int, world: int, tag: str) -> StepObservation:
    obs = StepObservation(rank=rank, world=world)
    unsplit = block().to(dev)
    x, grad_out = (t.to(dev) for t in data())
    layers = {}
    learner = load_learner(path)  # an import error ends the launch, which names it, as for any exercise
    with CapturedPrints() as printed:
        try:
            layers = _layers(learner, unsplit, rank, world)
            obs.layers = {k: holdings(m, unsplit[0 if k == "column" else 2]) for k, m in layers.items()}
            _rebuilt(obs, learner, unsplit, path)
            _step(obs, layers, unsplit, x, grad_out)
        except NotImplementedError as exc:
            obs.not_implemented = str(learner_frame(exc, path) or f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - reported, so that what did run is still judged
            obs.error, obs.where = raised(exc), str(learner_frame(exc, path) or "")
        if obs.error and obs.stage in ("forward", "backward"):
            layers = _stand_ins(obs, learner, layers, unsplit, (x, grad_out), tag, path)
    echo(printed.lines)
    if len(layers) == 2:
        obs.grads = _grads(layers)
    return obs


def _layers(learner, unsplit: nn.Sequential, rank: int, world: int) -> dict[str, nn.Module]:
    return {"column": learner.ColumnParallelLinear(unsplit[0], rank, world),
            "row": learner.RowParallelLinear(unsplit[2], rank, world)}


def _rebuilt(obs: StepObservation, learner, unsplit: nn.Sequential, path: str) -> None:
    """The two layers built again on this rank: for every other rank (a shard follows the ``rank`` it is given,
    not the process's), and from a float64 copy of the block (a shard keeps its layer's dtype). Into ``obs``."""
    try:
        for r in (r for r in range(obs.world) if r != obs.rank):
            built = _layers(learner, unsplit, r, obs.world)
            obs.built_for[str(r)] = {part: t.detach().cpu().clone() if isinstance(t := _tensor(built, part),
                                                                                  torch.Tensor) else None
                                     for part in PARTS}
        wide = _layers(learner, copy.deepcopy(unsplit).double(), obs.rank, obs.world)
        obs.wide_dtypes = {part: str(getattr(_tensor(wide, part), "dtype", "none")).removeprefix("torch.")
                           for part in PARTS}
    except Exception as exc:  # noqa: BLE001 - said by the criterion that reads these; the step goes on
        obs.rebuild_error = raised_at(exc, path)


def _step(obs: StepObservation, layers: dict[str, nn.Module], unsplit: nn.Sequential, x: torch.Tensor,
          grad_out: torch.Tensor) -> None:
    """One forward and backward of the block assembled from ``layers``, as ``parallelize_mlp`` does, into ``obs``:
    the output, the input's gradient, the collectives (raises what the learner's code raised)."""
    spy, x = CommSpy(), x.detach().clone().requires_grad_()
    hooks = [h for name, module in layers.items() for h in spy.watch(module, name)]
    tp = nn.Sequential(layers["column"], unsplit[1], layers["row"])
    try:
        with spy:
            obs.stage = spy.phase = "forward"
            out = tp(x)
            obs.out = out.detach().cpu().clone()
            obs.stage = spy.phase = "backward"
            out.backward(grad_out)
        obs.stage = None
        obs.x_grad = None if x.grad is None else x.grad.detach().cpu().clone()
    except Exception:
        obs.raised_in = spy.layer or ""  # the layer whose forward was running, if one was
        raise
    finally:
        obs.comm, obs.shapes = spy.collectives, spy.shapes
        for h in hooks:
            h.remove()


def _stand_ins(obs: StepObservation, learner, layers: dict[str, nn.Module], unsplit: nn.Sequential, batch: tuple,
               tag: str, path: str) -> dict[str, nn.Module]:
    """Where the step raised on every rank, and a layer does not hold its shard or its forward raised (on any rank),
    the step again with the grader's layer in its place (``stand_ins``), so that ``f``, ``g`` and the other layer
    are still graded: the layers that step used. A rank whose step got through does not tell: no stand-in then."""
    obs.off_shard = off_shard(layers, unsplit, obs.rank, obs.world)
    mine = obs.off_shard + ([obs.raised_in] if obs.raised_in and obs.stage == "forward" else [])
    told = every_rank_tells(tag, "stand-ins", ",".join(mine), timedelta(seconds=10 * time_scale()))
    wrong = sorted({name for said in told or [] for name in said.split(",") if name})
    if not wrong:
        return layers
    try:
        mixed = {k: stand_in(k, unsplit, obs.rank, obs.world, learner) if k in wrong else m for k, m in layers.items()}
    except AttributeError:  # no f or g to put in it: nothing stands in
        return layers
    for module in layers.values():
        module.zero_grad(set_to_none=True)  # what the first step's backward left
    obs.replaced, obs.substituted = f"{obs.error}" + (f" at {obs.where}" if obs.where else ""), wrong
    obs.error = obs.where = None
    try:
        _step(obs, mixed, unsplit, *batch)
    except Exception as exc:  # noqa: BLE001 - reported, so that what did run is still judged
        obs.error, obs.where = raised(exc), str(learner_frame(exc, path) or "")
    return mixed
