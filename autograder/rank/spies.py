"""The grader's spies: what the learner's code did, recorded inside a rank, never judged there.

Each spy that replaces a library function is a :class:`~.replace.Replace`, entered before the learner's
file is imported; the hooks observe modules and tensors the grader built.
"""
from __future__ import annotations

import functools
import linecache
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from distlab.measure.comm import CollectiveRecorder

from .observation import Observation
from .replace import Replace


class SaveSpy(Replace):
    """Records the path of every ``torch.save`` call on this rank (and still performs them).

    Enter it *before* importing the learner's module (see :class:`Replace`): ``from torch import
    save`` and ``torch.serialization.save`` are seen too.
    """

    def __init__(self):
        self.paths: list[str] = []
        super().__init__({(torch, "save"): self._spy, (torch.serialization, "save"): self._spy})

    def _spy(self, real):
        def save(obj, f, *args, **kwargs):
            self.paths.append(str(f))
            return real(obj, f, *args, **kwargs)
        return save


class DDPSpy(Replace):
    """Every DistributedDataParallel wrapper made (the module it wraps, its ``init_sync``, whether during a
    step), and with ``rounds``: how many forwards went through one (``ddp.module(x)`` bypasses DDP's
    gradient sync), and how many gradient all-reduce rounds DDP ran: a comm hook counts them, the
    learner's own hook wrapped, or DDP's default one installed at a wrapper's first forward."""

    def __init__(self, rounds: bool = True):
        self.wrapping: list[tuple[torch.nn.Module, bool]] = []  # each wrapper's module and init_sync, in order
        self.forwards = self.rounds = 0
        self.counter = None     # the step running, if any (``.active`` while it runs)
        self.built_in_step = 0  # wrappers made while a step() ran
        self._hooked: set[int] = set()
        targets = {(DistributedDataParallel, "__init__"): self._init}
        if rounds:  # the forwards and the rounds: a comm hook on every wrapper, which DDP's own C++ one is not
            targets.update({(DistributedDataParallel, "forward"): self._forward,
                            (DistributedDataParallel, "register_comm_hook"): self._register,
                            (DistributedDataParallel, "_register_builtin_comm_hook"): self._builtin})
        super().__init__(targets)

    @property
    def wrapped(self) -> int:
        """How many wrappers were made."""
        return len(self.wrapping)

    def _init(self, real):
        def init(ddp, *args, **kwargs):
            module = args[0] if args else kwargs.get("module")
            self.wrapping.append((module, bool(kwargs.get("init_sync", True))))
            self.built_in_step += bool(self.counter is not None and self.counter.active)
            real(ddp, *args, **kwargs)
        return init

    def _counting(self, hook):
        def counted(state, bucket):
            if bucket.index() == 0:  # every round hands bucket 0 to the hook once
                self.rounds += 1
            return hook(state, bucket)
        counted.__name__, counted.__qualname__ = getattr(hook, "__name__", "hook"), getattr(hook, "__qualname__", "")
        return counted

    def _register(self, real):
        def register_comm_hook(ddp, state, hook):
            self._hooked.add(id(ddp))
            return real(ddp, state, self._counting(hook))
        return register_comm_hook

    def _builtin(self, real):
        def register_builtin(ddp, comm_hook_type):
            self._hooked.add(id(ddp))
            self.rounds = None  # a C++ hook: its rounds cannot be counted
            return real(ddp, comm_hook_type)
        return register_builtin

    def _forward(self, real):
        def forward(ddp, *args, **kwargs):
            self.forwards += 1
            if id(ddp) not in self._hooked:  # before DDP's first backward: count its default all-reduce
                self._hooked.add(id(ddp))
                self.real[(DistributedDataParallel, "register_comm_hook")](
                    ddp, None, self._counting(default_hooks.allreduce_hook))
            return real(ddp, *args, **kwargs)
        return forward


@dataclass
class P2PCall(Observation):
    """One send or receive a :class:`P2PSpy` saw (``dist.send/recv/isend/irecv`` and the ops of a
    ``dist.batch_isend_irecv``), as a rank reports it to the grader."""

    op: str                           # "send" or "recv"
    is_async: bool                    # posted by isend, irecv or batch_isend_irecv (the spy's "async")
    peer: int | None                  # the rank it sends to or receives from
    shape: list[int]                  # its tensor's shape
    t0: float                         # time.perf_counter() when it was posted
    t1: float | None                  # when the call returned; None: it never did (it raised, or waits still)
    value: torch.Tensor | None        # a receive: what its buffer held once the spy exited; None for a send
    where: str                        # the learner's line that posted it: "file.py line N (`code`)"
    waited: bool | None = None        # an async op: whether the learner waited on its Work; None: no Work
    buffer: int = 0                   # where its tensor's storage lives (data_ptr): two ops' equal, one tensor
    source: int | None = None         # a blocking recv that named no src: the rank its message came from

    @classmethod
    def from_spy(cls, call: dict) -> P2PCall:
        """The spy's record of one op (``P2PSpy.calls``: a dict whose ``async`` is a keyword here)."""
        fields = {k: v for k, v in call.items() if k != "async"}
        return cls(is_async=call["async"], **fields)


def _peer(args: tuple, kwargs: dict) -> int | None:
    """The global rank a send or receive names (``dst``/``src``, or ``group_dst``/``group_src`` in its ``group``);
    ``None``: a receive from any source."""
    named = kwargs.get("dst", kwargs.get("src", args[0] if args else None))
    in_group = kwargs.get("group_dst", kwargs.get("group_src"))
    if named is not None or in_group is None:
        return named
    group = kwargs.get("group", args[1] if len(args) > 1 else None)
    return dist.get_global_rank(group, in_group) if group is not None else in_group


class P2PSpy(Replace):
    """While entered, records every ``dist.send/recv/isend/irecv``: its peer,
    shape, when it was called and returned (``t1`` stays ``None`` if it raised), and a copy of each tensor
    received. Entered before the learner's file is imported (:class:`Replace`): ``from
    torch.distributed import isend`` is seen too. Not ``distributed_c10d``'s own names: torch's functions
    call each other by them (``send`` calls ``isend``), and each call would be recorded twice.

    The sends and receives a ``dist.batch_isend_irecv`` posts are recorded too. ``dist.P2POp`` checks that
    its ``op`` *is* ``isend`` or ``irecv``, and under the spy ``dist.isend`` is the spy's stand-in: so
    ``P2POp`` is replaced too, by a subclass that stores the real function, and the batch's stand-in records
    each op (its peer, shape, and what a receive got) before the real batch runs.

    Each op records the learner's line that posted it (``where``). The Works that ``isend``, ``irecv`` and the
    batch return are handed back as :class:`Watched`, so an async op records whether the learner waited on it
    (``waited``); :meth:`drain` waits on what they did not."""

    NAMES = ("send", "recv", "isend", "irecv")

    def __init__(self, dtype: torch.dtype | None = None):
        """``dtype``: every tensor the job sends or receives has it (exercise 7's contract: the dtype of ``x``); an
        op on another raises a ``TypeError`` at the learner's line before it runs, where gloo would abort the
        process (a receive whose bytes do not match the send's) or the peer would read the bytes as another type."""
        self.dtype = dtype
        self.calls: list[dict] = []
        self._async_recv: list[tuple[dict, torch.Tensor]] = []
        self._works: list[Watched] = []
        super().__init__({(dist, n): functools.partial(self._spy, n) for n in self.NAMES}
                         | {(dist, "P2POp"): self._p2p_op, (dist, "batch_isend_irecv"): self._batch})

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self.settle()
        return False

    def settle(self) -> None:
        """Each irecv's ``value``: what its buffer holds now, once the step is over (a spy that observes several
        steps calls it after each)."""
        for call, tensor in self._async_recv:
            call["value"] = tensor.detach().cpu().clone()
        self._async_recv = []

    def _check_dtype(self, op: str, tensor: torch.Tensor) -> None:
        if self.dtype is not None and tensor.dtype != self.dtype:
            what = "receive into" if "recv" in op else "send of"
            raise TypeError(f"dist.{op}: a {what} a {str(tensor.dtype).removeprefix('torch.')} tensor, where every "
                            f"tensor of this pipeline is {str(self.dtype).removeprefix('torch.')} (the dtype of x), "
                            "stopped here by the grader: the peer's bytes would be read as another type, and gloo "
                            "aborts the process on such a receive. Make each buffer with dtype=x.dtype")

    def _spy(self, name: str, real):
        def spy(tensor, *args, **kwargs):
            self._check_dtype(name, tensor)
            peer = _peer(args, kwargs)
            call = {"op": name.lstrip("i"), "async": name[0] == "i", "peer": peer, "shape": list(tensor.shape),
                    "t0": time.perf_counter(), "t1": None, "value": None, "where": _caller(),
                    "buffer": tensor.untyped_storage().data_ptr()}
            self.calls.append(call)
            result = real(tensor, *args, **kwargs)
            call["t1"] = time.perf_counter()
            if name == "recv":
                call["value"] = tensor.detach().cpu().clone()
                if peer is None and isinstance(result, int):  # recv from any source returns the sender's rank
                    call["source"] = result
            elif name == "irecv":
                self._async_recv.append((call, tensor))
            return self._watched([result], [call])[0] if call["async"] and result is not None else result

        return spy

    def _watched(self, works: list, calls: list[dict]) -> list["Watched"]:
        """The Works handed to the learner, each marking the ops it covers as waited when it is waited on:
        one op each (gloo's batch, isend, irecv), or all of them (NCCL's coalesced batch returns one). With no
        Work to wait on, whether the ops were waited on is not known: they get no ``waited`` at all."""
        if not works:
            return works
        for call in calls:
            call["waited"] = False
        covered = [[c] for c in calls] if len(works) == len(calls) else [calls] * len(works)
        watched = [Watched(w, c) for w, c in zip(works, covered)]
        self._works += watched
        return watched

    def drain(self, wait: bool = True) -> list[dict]:
        """The async ops the learner never waited on (nor saw completed), each after the grader has waited on
        it, so that no transfer is left pending in the group for the next call (gloo would time out there).
        ``wait=False`` after the learner's code raised: the ring is broken, and waiting would only time out."""
        pending = [w for w in self._works if not all(c["waited"] for c in w.calls)]
        self._works = []
        for work in pending if wait else []:
            work.work.wait()
        return [c for w in pending for c in w.calls if not c["waited"]]

    def _unspied(self, fn):
        """The real ``isend``/``irecv`` behind ``fn`` when ``fn`` is the spy's stand-in for it."""
        for name in ("isend", "irecv"):
            real = self.real.get((dist, name))
            if real is not None and fn is self._stand_ins.get(id(real)):
                return real
        return fn

    def _p2p_op(self, real_cls):
        spy = self

        class P2POp(real_cls):
            def __new__(cls, op, *args, **kwargs):
                return real_cls.__new__(cls, spy._unspied(op), *args, **kwargs)

            def __init__(self, op, *args, **kwargs):
                super().__init__(spy._unspied(op), *args, **kwargs)

        return P2POp

    def _batch(self, real):
        def spy(ops):
            now, isend = time.perf_counter(), self.real[(dist, "isend")]
            calls, where = [], _caller()
            for op in ops:
                send = self._unspied(op.op) is isend
                self._check_dtype("isend" if send else "irecv", op.tensor)
                peer = op.peer if op.peer is not None else getattr(op, "group_peer", None)
                calls.append({"op": "send" if send else "recv", "async": True, "peer": peer,
                              "shape": list(op.tensor.shape), "t0": now, "t1": None, "value": None, "where": where,
                              "buffer": op.tensor.untyped_storage().data_ptr()})
                if not send:
                    self._async_recv.append((calls[-1], op.tensor))
            self.calls.extend(calls)
            works = real(ops)
            for call in calls:
                call["t1"] = time.perf_counter()
            return self._watched(works, calls)

        return functools.wraps(real)(spy)


class Watched:
    """A ``dist.Work`` of the learner's isend, irecv, batch_isend_irecv or all_reduce: the real one for
    everything, and its ops marked as waited once ``wait()`` (or its future) was called, or ``is_completed()``
    said so. ``blocked``: whether ``wait()`` itself was called (a future chained with ``then`` waits on nothing)."""

    def __init__(self, work, calls: list[dict]):
        self.work, self.calls, self.blocked = work, calls, False

    def _seen(self) -> None:
        for call in self.calls:
            call["waited"] = True

    def wait(self, *args, **kwargs):
        self._seen()
        self.blocked = True
        return self.work.wait(*args, **kwargs)

    def get_future(self):
        self._seen()
        return self.work.get_future()

    def is_completed(self) -> bool:
        done = self.work.is_completed()
        if done:
            self._seen()
        return done

    def __getattr__(self, name: str):
        return getattr(self.work, name)


def _caller() -> str:
    """Where the learner's code called the spied function: ``"file.py line N (`code`)"``."""
    frame = sys._getframe(2)
    code = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    return f"{Path(frame.f_code.co_filename).name} line {frame.f_lineno} (`{code}`)"


def grad_norm(params) -> float:
    """The total 2-norm of the ``.grad`` of ``params`` that have one (a DTensor's: this rank's shard); 0.0
    when none has."""
    norms = [getattr(p.grad, "_local_tensor", p.grad).detach().float().norm() for p in params if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack(norms)).item() if norms else 0.0


def on_backward_start(model: torch.nn.Module, callback) -> torch.utils.hooks.RemovableHandle:
    """Call ``callback()`` each time a backward through ``model``'s output begins (before any ``.grad`` of
    that backward is written: what ``.grad`` holds then is what ``zero_grad`` should have cleared)."""
    def on_forward(mod, args, out) -> None:  # None: the output is not replaced
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda grad: callback())
    return model.register_forward_hook(on_forward)


@functools.lru_cache(maxsize=None)
def _resolved(filename: str) -> Path:
    """A code object's file name, resolved (once per file: the stack above a collective is the same files)."""
    return Path(filename).resolve()


def learner_line(path: Path) -> tuple[str, int, str] | None:
    """The innermost frame of the learner's file ``path`` (resolved) on the stack now: its file name, line number
    and line of code (stripped); ``None`` when the learner's file is not on the stack. The frames are walked, not
    extracted and formatted: this runs before every collective (the whole stack extracted, with every frame's
    file resolved, cost a grading about 2 ms a collective, and exercise 1 tags 27 a rank)."""
    frame = sys._getframe(1)
    while frame is not None and _resolved(frame.f_code.co_filename) != path:
        frame = frame.f_back
    if frame is None:
        return None
    filename, lineno = frame.f_code.co_filename, frame.f_lineno
    linecache.checkcache(filename)
    return filename, lineno, linecache.getline(filename, lineno).strip()


class LineRecorder(CollectiveRecorder):
    """The one recorder of collectives, each op tagged with the learner's line that issued it: ``line`` reads
    ``"line N: code"``, ``at`` ``"line N (`code`)"`` (as a sentence quotes it)."""

    def __init__(self, world: int, path: str) -> None:
        super().__init__(world)
        self.path = Path(path).resolve()

    def tag(self, kind: str, tensors: list[torch.Tensor]) -> dict:
        found = learner_line(self.path)
        if found is None:
            return {"line": "", "at": ""}
        _, lineno, line = found
        code = line.split("  #")[0].strip()  # the code, not its comment
        at = f"line {lineno}"
        return {"line": f"{at}: {code}", "at": f"{at} (`{code}`)" if code else at}
