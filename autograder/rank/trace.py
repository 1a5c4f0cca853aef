"""A trace of what the learner's code did inside a rank, event by event, each at the learner's line.

A check names the mistakes it anticipated; a mistake nobody listed falls to a symptom ("weights
differ"). The trace is what lets the grader say more: it records the *observable* events of a run
(every optimizer and LR-scheduler step, every ``backward()``, every collective and point-to-point op,
every save and load with what it held, the RNG and parameter checksums at each step boundary, which module each forward
the learner called entered; the calls whose effect nothing else shows, with their plain arguments: the process
group made and left, a model wrapped in DDP, a DistributedSampler built and its epoch set, gradients zeroed, a
checkpoint committed or pruned; the values of small collectives the learner's line calls itself, such as a metric's
all-reduce; and what each of the learner's functions returned), each with the learner's file, line and code, so that
:mod:`autograder.grader.divergence` can report the first event where the learner's run and the reference's
part ways. This is the "trace differencing" of record-and-replay debuggers (rr; Zeller's *Why
Programs Fail*, ch. 14, "isolating failure causes") applied to a training loop.

The communication ops come from the one recorder, :class:`distlab.measure.comm.CollectiveRecorder`
(a ``TorchDispatchMode``, which also sees ``send``/``recv``: the ``c10d`` operators carry their peer),
tagged here as exercise 8's ``CommSpy`` does; the steps from PyTorch's global optimizer step and module
forward hooks; the scheduler steps, saves, loads and calls from :class:`~.replace.Replace` stand-ins (which also
wrap the learner module's public functions while it is traced, for what they return).

Everything is plain data (str, int, float, lists, dicts): it travels back to the grader through
``torch.load(weights_only=True)``. A trace is bounded (:data:`MAX_EVENTS` per file).
"""
from __future__ import annotations

import functools
import inspect
import linecache
import os
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.distributed_c10d import _resolve_process_group
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.lr_scheduler import LRScheduler
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils._pytree import tree_leaves
from torch.utils.data.distributed import DistributedSampler

from distlab import checkpoint
from distlab.measure.comm import NAMESPACES, CollectiveRecorder

from .errors import note_values
from .events import SMALL, checksum, held, plain_arguments, return_line, rng_checksum, summary
from .replace import TRANSPARENT, Replace

MAX_EVENTS = 2000   # per file and rank: a 12-step loop makes about 100; a runaway loop is cut, and says so
MAX_RETURNS = 64    # return events per function of the learner's (a helper called per sample would fill a trace)
_MODULE_PY = torch.nn.modules.module.__file__
_ACTIVE: list["Tracer"] = []  # the tracer of the rank_main running, if any (load_learner tells it each file)


def _group_size(func, args: tuple, kwargs: dict | None) -> int | None:
    """The size of the process group an operator was given: a boxed ``ProcessGroup`` (``c10d``), or the
    ``group_name`` of a functional collective (``_c10d_functional``, e.g. ``all_to_all_single_autograd``)."""
    boxed = next((a for a in args if isinstance(a, torch.ScriptObject)), None)
    named = dict(zip((a.name for a in func._schema.arguments), args), **(kwargs or {})).get("group_name")
    if boxed is None and not isinstance(named, str):
        return None
    try:
        return dist.ProcessGroup.unbox(boxed).size() if boxed is not None else _resolve_process_group(named).size()
    except Exception:  # noqa: BLE001 - another script object or an unknown name: the size is unknown, not an error
        return dist.get_world_size() if dist.is_initialized() else None


def _contributed(func, args: tuple, kwargs: dict | None) -> torch.Tensor | None:
    """The first tensor an operator takes as its input (``input``, ``input_tensor(s)``, ``inputs``: what this rank
    contributes), where its schema names one; ``None`` where it names none (an in-place op: all_reduce's, a
    broadcast's one tensor both holds and receives). Not the output buffer that c10d's ``alltoall_base_``,
    ``_allgather_base_`` or ``_reduce_scatter_base_`` take first: its values are whatever ``torch.empty`` left."""
    named = dict(zip((a.name for a in func._schema.arguments), args), **(kwargs or {}))
    given = next((v for k, v in named.items() if k.startswith("input")), None)
    return next((t for t in tree_leaves(given) if isinstance(t, torch.Tensor)), None) if given is not None else None


class _Comm(CollectiveRecorder):
    """The collective recorder, tagged: each op becomes an event of the trace (with the peer of a send)."""

    def __init__(self, tracer: "Tracer"):
        super().__init__()
        self.tracer, self._peer, self._group, self._input = tracer, None, None, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace not in NAMESPACES:  # an aten op: no peer, no group, no input of a collective
            self._input = None
            return super().__torch_dispatch__(func, types, args, kwargs)
        ints = [a for a in args if type(a) is int]  # c10d::send(tensors, group, dstRank, tag): the peer first
        self._peer = ints[0] if ints else None
        self._group = _group_size(func, args, kwargs)
        self._input = _contributed(func, args, kwargs)
        if func._opname in ("send", "recv_") and self._peer is not None and self._group and \
                not 0 <= self._peer < self._group:  # gloo's own error for it crashes the process under this mode
            raise ValueError(f"{'dst' if func._opname == 'send' else 'src'}={self._peer} names no rank: "
                             f"the group has {self._group} ranks (0 to {self._group - 1})")
        return super().__torch_dispatch__(func, types, args, kwargs)

    def tag(self, kind: str, tensors: list[torch.Tensor]) -> dict:
        shape = list(tensors[0].shape) if tensors else []
        if kind == "send":  # what it sends (before the op: a recv's buffer is written by it)
            self.tracer.add(kind, shape=shape, peer=self._peer, value=checksum(tensors[:1]))
        elif kind == "recv":
            self.tracer.add(kind, shape=shape, peer=self._peer)
        elif tensors and tensors[0].dtype == torch.uint8:
            pass  # a pickled object (broadcast_object_list, DCP's plans): its length is that of paths, not the run's
        elif kind != "barrier" or tensors:
            given = self._input if self._input is not None else tensors[0]
            small = given.numel() <= SMALL and not given.dtype.is_complex
            # what this rank contributed, where the learner's line called it (a metric's sums), not what a
            # library sends for itself (DDP's shape check, DCP's pickled plans: their bytes are paths and memory);
            # its shape too, not the output buffer's that an all-to-all or an all-gather takes first
            values = {"held": summary(given)} if small and self.tracer.called_directly() else {}
            self.tracer.add("collective", kind=kind, shape=list(given.shape), group=self._group, **values)
        return {}


# Calls whose effect no other event shows (a process group made or left, a model wrapped, a sampler built or
# its epoch set, gradients zeroed, a checkpoint committed or pruned), recorded as events of their own with
# their plain arguments: (owner, attribute, the event's name).
CALLS = [(dist, "init_process_group", "init_process_group"), (dist, "destroy_process_group", "destroy_process_group"),
         (DDP, "__init__", "DistributedDataParallel"), (DistributedSampler, "__init__", "DistributedSampler"),
         (DistributedSampler, "set_epoch", "set_epoch"),
         (torch.optim.Optimizer, "zero_grad", "zero_grad"), (torch.nn.Module, "zero_grad", "zero_grad"),
         (checkpoint, "commit", "commit"), (checkpoint, "prune", "prune")]
# The files between a learner's call of a collective and the recorder: the API, its logger and decorators (the
# @deprecated of all_gather_into_tensor and reduce_scatter_tensor, torch 2.13: typing_extensions' or warnings'), us.
_DISPATCHING = ("distributed_c10d.py", "c10d_logger.py", "eval_frame.py", "_compile.py", "_ops.py",
                "_python_dispatch.py", "comm.py", "trace.py", "typing_extensions.py", "warnings.py")


class _Replace(Replace):
    """The tracer's stand-ins; and each learner module it covers has its top-level functions of the traced
    file wrapped, so that what each returns is an event (``return``), at its ``return`` line."""

    def __init__(self, tracer: "Tracer", targets):
        super().__init__(targets)
        self.tracer = tracer

    def cover(self, module) -> None:
        super().cover(module)
        for key, fn in list(vars(module).items()):
            if inspect.isfunction(fn) and fn.__code__.co_filename in self.tracer._paths and \
                    not key.startswith("_") and not getattr(fn, "_traced", False):
                self._set(module, key, self.tracer._returns(fn))


class Tracer:
    """``with Tracer(): ...`` around a ``rank_main``: one trace per learner file, begun by :func:`begin`
    (``load_learner`` calls it). ``traces`` holds them by the file's path."""

    def __init__(self, max_events: int = MAX_EVENTS):
        self.max_events = max_events
        self.traces: dict[str, list[dict]] = {}  # per file loaded (its path as given), its events
        self.path: str | None = None
        self._paths: set[str] = set()
        self._steps = 0
        self._returned: dict[str, int] = {}  # per function of the learner's, how many times it returned
        self._hooks: list = []
        self._replace = _Replace(self, {(LRScheduler, "step"): self._scheduler_step,
                                 (torch, "save"): self._save, (torch.serialization, "save"): self._save,
                                 (torch, "load"): self._load, (torch.serialization, "load"): self._load,
                                 (dcp, "save"): self._dcp("save"), (dcp, "load"): self._dcp("load"),
                                 (torch.Tensor, "backward"): self._backward,
                                 **{(owner, name): self._call(label) for owner, name, label in CALLS}})
        self._comm = _Comm(self)

    def begin(self, path: str | Path) -> None:
        """Events from now on are the file's at ``path`` (their line: its frame on the stack); the same
        file loaded again continues its trace."""
        if self.path == str(path):
            return
        self.path, self._steps, self._returned = str(path), 0, {}
        self._paths = {str(path), str(Path(path).resolve())}
        self.traces[self.path] = []

    def called_directly(self) -> bool:
        """Whether the op now dispatched was called by the learner's line itself (``dist.all_reduce(t)``),
        through nothing but ``torch.distributed``'s API module and the dispatcher."""
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename not in self._paths:
            if not (frame.f_code.co_filename.endswith(_DISPATCHING) or frame.f_code in TRANSPARENT):
                return False
            frame = frame.f_back
        return frame is not None

    def where(self) -> dict | None:
        """The innermost frame of the learner's file on the stack: its file name, line and code."""
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_code.co_filename in self._paths:
                line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
                return {"file": Path(frame.f_code.co_filename).name, "line": frame.f_lineno, "code": line[:120],
                        "function": frame.f_code.co_name}
            frame = frame.f_back
        return None

    def add(self, event: str, *, anywhere: bool = False, **details: Any) -> None:
        """Record ``event`` if the learner's code is on the stack (``anywhere``: in any case)."""
        if self.path is None:
            return
        trace = self.traces[self.path]
        at = self.where()
        if at is None and not anywhere:
            return  # the grader's own calls (its final state, its barriers): not the learner's run
        if len(trace) >= self.max_events:
            if trace[-1].get("event") != "truncated":
                trace.append({"event": "truncated", "step": self._steps})
            return
        trace.append({"event": event, "step": self._steps, **(at or {}), **details})  # a return: its own line

    # --- the instruments -------------------------------------------------------------------------------
    def _optimizer_step(self, optimizer, args, kwargs) -> None:
        self._steps += 1
        params = [p for g in optimizer.param_groups for p in g["params"]]
        self.add("optimizer.step", anywhere=True, lr=[float(g["lr"]) for g in optimizer.param_groups],
                 params=checksum(params), rng=rng_checksum())

    def _forward(self, module, args) -> None:
        caller = sys._getframe(1)
        while caller is not None and caller.f_code.co_filename == _MODULE_PY:  # _call_impl, _wrapped_call_impl
            caller = caller.f_back
        if caller is not None and caller.f_code.co_filename in self._paths:  # called by the learner, not a parent
            self.add("forward", module=type(module).__name__)

    def _scheduler_step(self, real: Callable) -> Callable:
        tracer = self

        def step(scheduler, *args, **kwargs):
            out = real(scheduler, *args, **kwargs)
            tracer.add("scheduler.step", lr=[float(g["lr"]) for g in scheduler.optimizer.param_groups],
                       epoch=int(scheduler.last_epoch))
            return out
        return step

    def _backward(self, real: Callable) -> Callable:
        def backward(tensor, *args, **kwargs):
            self.add("backward", shape=list(tensor.shape))
            return real(tensor, *args, **kwargs)
        return backward

    def _call(self, label: str) -> Callable:
        def make(real: Callable) -> Callable:
            def call(*args, **kwargs):
                if self.path is not None:
                    self.add(label, args=plain_arguments(real, args, kwargs))
                return real(*args, **kwargs)
            return functools.wraps(real)(call)
        return make

    def _returns(self, fn: Callable) -> Callable:
        """``fn`` (the learner's), recording what it returned (or that it raised nothing and returned)."""
        line, code = return_line(fn)
        where = {"file": Path(fn.__code__.co_filename).name, "line": line, "code": code, "function": fn.__name__}

        @functools.wraps(fn)
        def traced(*args, **kwargs):
            out = fn(*args, **kwargs)
            seen = self._returned[fn.__name__] = self._returned.get(fn.__name__, 0) + 1
            if self.path is not None and fn.__code__.co_filename in self._paths and seen <= MAX_RETURNS:
                self.add("return", anywhere=True, returned=summary(out), **where)
            return out
        traced._traced = True
        return traced

    def _save(self, real: Callable) -> Callable:
        def save(obj, f, *args, **kwargs):
            self.add("save", held=held(obj), api="torch.save")
            return real(obj, f, *args, **kwargs)
        return save

    def _load(self, real: Callable) -> Callable:
        def load(f, *args, **kwargs):
            out = real(f, *args, **kwargs)
            self.add("load", held=held(out), api="torch.load")
            return out
        return load

    def _dcp(self, name: str) -> Callable:
        def make(real: Callable) -> Callable:
            def call(state_dict, *args, **kwargs):
                self.add(name, held=held(state_dict), api=f"dcp.{name}")
                return real(state_dict, *args, **kwargs)
            return call
        return make

    def __enter__(self) -> "Tracer":
        self._hooks = [register_optimizer_step_post_hook(self._optimizer_step),
                       register_module_forward_pre_hook(self._forward)]
        self._replace.__enter__()
        self._comm.__enter__()
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> bool:
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        self._comm.__exit__(*exc)
        self._replace.__exit__(*exc)
        for hook in self._hooks:
            hook.remove()
        return False


def begin(path: str | Path) -> None:
    """Tell the tracer around this rank's ``rank_main`` (if any) that the file at ``path`` starts."""
    if _ACTIVE:
        _ACTIVE[-1].begin(path)


def dump(path: str | Path, file: Path) -> None:
    """Write this rank's trace of the file at ``path`` to ``file`` now (if a tracer runs): a launch that a
    later file kills returns nothing, and the files before it keep their traces this way."""
    if _ACTIVE and str(path) in _ACTIVE[-1].traces:
        torch.save(_ACTIVE[-1].traces[str(path)], file)


def traced_main(target: str, *args, **kwargs) -> dict:
    """Run ``target`` (a ``"module:function"`` rank_main) under a :class:`Tracer` on this rank.

    Returns ``{"results": what it returned, "traces": {path: its events} for each file it loaded}``;
    ``grading.launch_files`` takes them apart.
    """
    from distlab.runtime.importing import resolve

    with Tracer() as tracer:
        try:
            results = resolve(target)(*args, **kwargs)
        except Exception as exc:
            note_values(exc, tracer.path)  # the tensors on the learner's line, shown by grader.main.explain
            raise
    return {"results": results, "traces": tracer.traces, "rank": int(os.environ.get("RANK", "0"))}
