"""Rank-side instruments of the exercise 1 check (``ex01_ddp``'s docstring lists what they record).

Everything here observes; the verdicts, and the single-process reference, are computed in ``ex01_ddp``.
"""
from __future__ import annotations

import contextlib
import gc
import hashlib
import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data.distributed import DistributedSampler
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.data import DataLoader, Subset

import distlab
from distlab.data import RecordingDataset, digits
from distlab.models import cpu_state, make_mlp
from distlab.runtime.launch import time_scale

from ...rank import (CapturedPrints, DDPSpy, LineRecorder, Replace, SaveSpy, attempt, echo, every_rank_says,
                     grader_group, load_learner, own_rendezvous, raised_at, transparent)
from ...rank.nodes import as_nodes
from ...rank.parts import Parts
from .bucketed.probes import observe_bucketed
from .observations import (CONFIG, EVAL, EVAL_FIELDS, EVEN, MODEL, TEARDOWN_FIELDS, FirstStep, Forward,
                           RankObservation)

# The grader's tolerance against one process (ex01_ddp and causes both use it).
RTOL, ATOL = 1e-4, 1e-5  # all-reduce sums in another order than one big batch's mean


def rank_main(paths: list[str], ckpt_dir: str, outdir: str, skip: dict[str, list[str]]) -> list[dict]:
    """Runs on every rank: each file in turn, its parts (``PARTS``) that ``skip`` does not name, each kept as it
    returns (``rank.parts``: a part that ends the launch costs its own marks only). Returns per file
    ``{part: plain data}``: ``"train"`` a :class:`RankObservation`, the others their fields of one."""
    # Each file's DDP is freed by a full collection on every rank (in _train and own_rendezvous): over the
    # ~250k objects torch and the server left in this fork, each took about 0.15 CPU-s, a third of a rank's
    # work. Frozen, they are not walked again; everything made from here on is collected as before.
    gc.freeze()
    try:
        out = []
        for i, path in enumerate(paths):
            kept = Parts(outdir, i, skip)
            with own_rendezvous(f"file{i}"), as_nodes(path, *_node_view()):  # setup() makes the group, per file
                _observe(path, checkpoint_dir(ckpt_dir, path), kept, f"file{i}")
            kept.finished()
            out.append(kept.ran)
        return out
    finally:
        gc.unfreeze()


def _node_view() -> tuple[int, int, int]:
    """(rank, world, nodes): 4 ranks on the CPU run as 2 nodes of 2 (``rank.nodes``), so that ``LOCAL_RANK == 0``
    taken for rank 0 prints and saves on two ranks; on GPUs, where the local rank picks the device, one node."""
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    return rank, world, 2 if world == 4 and not torch.cuda.is_available() else 1


def checkpoint_dir(root: str | Path, path: str | Path) -> Path:
    """Where the file at ``path`` is told to save, under ``root``: named after the path, not its place in the
    launch (a launch that grades a file again, without a part that ended the first, numbers them anew)."""
    return Path(root) / hashlib.sha1(str(path).encode()).hexdigest()[:16]


def _observe(path: str, ckpt_dir: Path, kept: Parts, tag: str) -> None:
    """The file's parts on this rank, in order, after ``setup()`` (every launch: they need its process group)."""
    with contextlib.ExitStack() as group:  # the grader's process group, where the learner's setup() failed
        _observe_parts(path, ckpt_dir, kept, tag, group)


def _setup(learner, path: str, tag: str, group: contextlib.ExitStack) -> str:
    """The learner's ``setup()``. Where it raised on every rank alike without making a group (NCCL named on a
    machine without it, say), the grader's group goes on in its place (until ``group`` closes), so that the other
    functions are still graded (issue 37); what it raised, at the learner's line ("" where nothing)."""
    try:
        learner.setup()
        return ""
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - the learner's error is feedback; its criterion says it
        if dist.is_initialized() or not every_rank_says(tag, "setup-raised", timedelta(seconds=10 * time_scale())):
            raise  # some rank got past it, or made a group: nothing stands in for that
        group.enter_context(grader_group(tag))
        return raised_at(exc, path) or f"{type(exc).__name__}: {exc}"


def _observe_parts(path: str, ckpt_dir: Path, kept: Parts, tag: str, group: contextlib.ExitStack) -> None:
    # The spies go in before the import, so ``from torch import save`` (or all_reduce) binds them too.
    with AllReduceSpy() as reduces:
        learner, seen = _train(path, ckpt_dir, reduces, kept, lambda lrn: _setup(lrn, path, tag, group))
        if kept.starts("evaluate"):
            _evaluate(learner, path, seen)
            kept.keep("evaluate", {k: v for k, v in seen.to_wire().items() if k in EVAL_FIELDS})
        if kept.starts("bucketed"):
            kept.keep("bucketed", observe_bucketed(learner, path, reduces).to_wire())
    if kept.starts("teardown"):
        try:  # a teardown that raises loses its own criterion only
            learner.teardown()
        except Exception as exc:  # noqa: BLE001 - any error is the learner's, reported as feedback
            seen.teardown_error = raised_at(exc, path)
        seen.still_initialized = dist.is_initialized()
        kept.keep("teardown", {k: v for k, v in seen.to_wire().items() if k in TEARDOWN_FIELDS})


def _train(path: str, ckpt_dir: Path, reduces: AllReduceSpy, kept: Parts, setup):
    """Load the learner's file, ``setup()`` (``setup(learner)``: what it raised), and (where wanted) ``train_ddp``
    from this rank's own initial weights: the learner module and what was observed."""
    with SaveSpy() as saves, DDPSpy(rounds=False) as wrappers, SamplerSpy() as samplers:
        learner = load_learner(path)
        setup_error = setup(learner)
        if not dist.is_initialized():
            raise RuntimeError("setup() returned but no process group is initialised")
        rank = dist.get_rank()
        if not kept.starts("train"):
            return learner, RankObservation(rank=rank, initial={}, setup_error=setup_error)
        model = make_mlp(seed=1000 + rank, **MODEL).to(distlab.device())  # a different start on every rank
        initial = cpu_state(model)
        data = RecordingDataset(digits())
        saves.paths.clear()  # only what train_ddp saves counts
        samplers.built, samplers.drop_last, samplers.loader_drop_last = 0, False, False  # and the samplers it builds
        probe = Probe(model, data, reduces, wrappers)
        with CapturedPrints(learner.__file__) as out, probe:
            trained = learner.train_ddp(model, data, checkpoint_path=str(ckpt_dir / "model.pt"), **CONFIG)
    echo(out.lines)
    seen = RankObservation(rank=rank, initial=initial, final=cpu_state(trained if trained is not None else model),
                           accessed=data.accessed, printed=out.lines, printed_at=out.first_at, saves=saves.paths,
                           samplers_built=samplers.built, sampler_drop_last=samplers.drop_last,
                           loader_drop_last=samplers.loader_drop_last,
                           setup_error=setup_error)
    probe.fill(seen)
    wrappers.wrapping.clear()  # the modules it held on to: freed below, with the learner's DDP
    # The learner's DDP holds the process group. Freed by the garbage collector at some later moment
    # (a different one on each rank), the group's gloo context would close while its peers still run
    # the next file, and wait out its timeout for them: free it here, before teardown, on every rank.
    del trained, model, probe
    gc.collect()
    reduces.grads = []
    kept.keep("train", seen.to_wire())
    return learner, seen


def _evaluate(learner, path: str, seen: RankObservation) -> None:
    """``evaluate_ddp`` on the first ``EVAL["n"]`` digits with a model that is the same on every rank: what it
    returned (or raised) and which samples this rank read, into ``seen``."""
    data = RecordingDataset(Subset(digits(), range(EVAL["n"])))
    model = make_mlp(seed=EVAL["seed"], **MODEL).to(distlab.device())

    def before(module, args) -> None:  # whether autograd records this forward (no_grad, inference_mode: no)
        seen.eval_forwards += 1
        seen.eval_recorded += torch.is_grad_enabled()

    hook = model.register_forward_pre_hook(before)
    with CapturedPrints() as out, LineRecorder(dist.get_world_size(), path) as ops:
        got, exc = attempt(learner.evaluate_ddp, model, data, batch_size=EVAL["batch_size"])
    hook.remove()
    echo(out.lines)
    seen.eval_collectives = [[op.kind, op.tags["at"]] for op in ops.ops]
    ok = isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(v, (int, float)) for v in got)
    seen.eval = (float(got[0]), float(got[1])) if ok else None
    seen.eval_returned, seen.eval_error, seen.eval_accessed = type(got).__name__, raised_at(exc, path), data.accessed
    if seen.eval is not None:  # again on a set both world sizes divide (what it raises there: its own criterion's)
        with CapturedPrints():
            even, _ = attempt(learner.evaluate_ddp, model, Subset(digits(), range(EVEN)), batch_size=EVAL["batch_size"])
        if isinstance(even, (tuple, list)) and len(even) == 2 and all(isinstance(v, (int, float)) for v in even):
            seen.eval_even = (float(even[0]), float(even[1]))


class SamplerSpy(Replace):
    """Counts the ``DistributedSampler`` s built (whether or not a DataLoader then reads through them), and whether
    one dropped the tail; and whether a ``DataLoader`` built meanwhile drops each epoch's last, partial batch."""

    def __init__(self):
        self.built = 0
        self.drop_last = False  # whether one was built with drop_last=True (the contract's keeps the default)
        self.loader_drop_last = False  # whether a DataLoader was built with drop_last=True
        super().__init__({(DistributedSampler, "__init__"): self._spy, (DataLoader, "__init__"): self._loader})

    def _loader(self, real):
        def __init__(loader, *args, **kwargs):
            result = real(loader, *args, **kwargs)
            self.loader_drop_last = self.loader_drop_last or bool(getattr(loader, "drop_last", False))
            return result
        return __init__

    def _spy(self, real):
        def __init__(sampler, *args, **kwargs):
            self.built += 1
            result = real(sampler, *args, **kwargs)
            self.drop_last = self.drop_last or bool(getattr(sampler, "drop_last", False))
            return result
        return __init__


class AllReduceSpy(Replace):
    """Counts ``dist.all_reduce`` calls made from Python on a tensor that is some parameter's ``.grad``.

    DDP's own all-reduces run in its C++ reducer and never pass through here: what this counts is
    gradients all-reduced by hand (``dist.all_reduce`` or ``from torch.distributed import all_reduce``:
    enter it before the learner's file is imported, see :class:`Replace`).
    """

    def __init__(self):
        self.grads: list = []  # the parameters whose .grad counts
        self.calls = 0
        # part 2's observer while it runs: given each call's async_op and its result, returns what the
        # learner gets back (a Work it watches); None: the result as it is
        self.on_call = None
        super().__init__({(dist, "all_reduce"): self._spy})

    def _spy(self, real):
        @transparent   # the trace records the all-reduce it forwards as the learner's own call
        def all_reduce(tensor, *args, **kwargs):
            if any(p.grad is not None and p.grad.data_ptr() == tensor.data_ptr() for p in self.grads):
                self.calls += 1
            result = real(tensor, *args, **kwargs)
            is_async = bool(kwargs.get("async_op", args[2] if len(args) > 2 else False))
            return self.on_call(is_async, result) if self.on_call else result
        return all_reduce


class Probe(contextlib.AbstractContextManager):
    """While ``train_ddp`` runs: which module each forward entered (the DDP wrapper or the model inside),
    each forward's batch size and the samples read so far, the weights at the first forward, every DDP
    built around the model (and its ``init_sync``), and at the first optimizer step its gradients and lr."""

    def __init__(self, model: torch.nn.Module, data: RecordingDataset, reduces: AllReduceSpy, wrappers: DDPSpy):
        self.model, self.data, self.reduces, self.wrappers = model, data, reduces, wrappers
        self.ddp_depth = 0
        self.forwards: list[Forward] = []
        self.at_first_forward: dict | None = None
        self.first_step: FirstStep | None = None
        self.steps = 0
        reduces.grads = list(model.parameters())

    def _pre(self, module, args):
        if isinstance(module, DDP) and module.module is self.model:
            self.ddp_depth += 1
        elif module is self.model:
            if self.at_first_forward is None:
                self.at_first_forward = cpu_state(self.model)
            n = len(args[0]) if args and hasattr(args[0], "__len__") else 0
            self.forwards.append(Forward(through_ddp=self.ddp_depth > 0, rows=n, read=len(self.data.accessed)))

    def _post(self, module, args, output):
        if isinstance(module, DDP) and module.module is self.model:
            self.ddp_depth -= 1

    def _step(self, optimizer, args, kwargs):
        mine = {id(p) for p in self.model.parameters()}
        if not any(id(p) in mine for group in optimizer.param_groups for p in group["params"]):
            return
        self.steps += 1
        if self.first_step is None:
            self.first_step = FirstStep(
                grads={n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().to("cpu", copy=True)
                       for n, p in self.model.named_parameters()},
                lr=float(optimizer.param_groups[0].get("lr", float("nan"))),
                optimizer=type(optimizer).__name__, grad_all_reduces=self.reduces.calls,
            )

    @property
    def ddp_built(self) -> list[bool]:
        """The ``init_sync`` of each DDP wrapping the model."""
        return [sync for module, sync in self.wrappers.wrapping if module is self.model]

    def __enter__(self):
        self._handles = [register_module_forward_pre_hook(self._pre), register_module_forward_hook(self._post),
                         register_optimizer_step_pre_hook(self._step)]
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        return False

    def fill(self, seen: RankObservation) -> None:
        """What was observed while ``train_ddp`` ran, into ``seen`` (before the wrappers are let go)."""
        seen.forwards, seen.ddp_built, seen.at_first_forward = self.forwards, self.ddp_built, self.at_first_forward
        seen.first_step, seen.steps, seen.grad_all_reduces = self.first_step, self.steps, self.reduces.calls
