"""What a rank that stopped advancing waits in: the evidence that tells a hang from a slow rank
(:mod:`distlab.runtime.heartbeat` samples it, the launcher names it).

A rank waits in a collective when its main thread's stack is inside one, whoever issued it:

* the learner's own call (``dist.all_reduce``, ``dist.recv``, a ``work.wait()`` at their line);
* a library's Python: FSDP2's all-gathers and reduce-scatters (``fully_shard``), the pipeline schedules'
  sends and receives (``torch.distributed.pipelining``), DDP's broadcast before a forward (the buckets'
  rebuild after the first step, the buffers);
* DDP's all-reduce of the gradients, which the reducer issues from C++ on autograd's thread: no
  Python frame shows it. The evidence is that every gradient of a DDP model has been accumulated in
  this backward (:class:`DDPWatch`, a ``register_post_accumulate_grad_hook`` per parameter) while the
  backward still has not returned: what is left of it is waiting for the other ranks' buckets.
  Each accumulated gradient is also progress, so a long backward is slow, never a hang.
"""
from __future__ import annotations

import linecache
import os
import threading
from pathlib import Path

WAITS = {"init_process_group", "all_reduce", "all_gather", "all_gather_single", "all_gather_into_tensor",
         "all_gather_object", "reduce_scatter", "reduce_scatter_single",
         "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "barrier", "monitored_barrier", "recv",
         "send", "gather", "scatter", "reduce", "all_to_all", "all_to_all_single", "wait", "batch_isend_irecv"}
_DISTRIBUTED = f"{os.sep}torch{os.sep}distributed{os.sep}"
_C10D = f"{_DISTRIBUTED}distributed_c10d.py"
# whose collective it is, from the outermost library frame on the stack
_OWNERS = ((f"{_DISTRIBUTED}fsdp{os.sep}", "FSDP's"), (f"{_DISTRIBUTED}pipelining{os.sep}", "the pipeline schedule's"),
           (f"{os.sep}torch{os.sep}nn{os.sep}parallel{os.sep}distributed.py", "DDP's"),
           (f"{_DISTRIBUTED}tensor{os.sep}", "DTensor's"))  # after FSDP's: FSDP2's own stacks pass through DTensor
# what a DTensor method the job called waits in, by the method (its collective waits in funcol's ``wait``)
_DTENSOR_CALLS = {"full_tensor": "all-gather of full_tensor()", "redistribute": "redistribute()",
                  "from_local": "from_local()"}
_RUNTIME = tuple(str(Path(p).resolve()) + os.sep for p in (
    os.path.dirname(os.__file__), Path(__file__).resolve().parents[1],
    Path(__file__).resolve().parents[2] / "autograder"))
DDP_ALL_REDUCE = "DDP's all-reduce of the gradients"


def is_runtime(filename: str) -> bool:
    """Library or grader code (the standard library, site-packages, distlab, autograder), not the learner's."""
    return "site-packages" in filename or filename.startswith(_RUNTIME) or filename.startswith("<")


def _collective(frames: list[tuple[str, int, str]]) -> str | None:
    """The innermost torch.distributed collective below the learner's innermost frame, named by the library
    that issued it there (a collective the learner calls inside a DDP model's forward is the learner's)."""
    learner = [i for i, (path, _, _) in enumerate(frames) if not is_runtime(path)]
    tail = frames[learner[-1] + 1:] if learner else frames
    inner = next((fn for path, _, fn in reversed(tail) if _DISTRIBUTED in path
                  and (fn in WAITS or (path.endswith(_C10D) and not fn.startswith("_")))), None)
    names = {fn for _, _, fn in tail}
    owner = next((who for part, who in _OWNERS if any(part in path for path, _, _ in tail)), None)
    if inner is None:
        if "_wait_batch_p2p" in names:
            inner = "send/receive"
        elif owner == "FSDP's" and "wait_for_unshard" in names:
            inner = "all-gather"
        elif owner == "DDP's" and "_pre_forward" in names:
            inner = "broadcast before the forward"
    if inner is None:
        return None
    if owner == "DTensor's":  # the method the job called (the first frame below its line), not funcol's wait
        inner = next((_DTENSOR_CALLS[fn] for _, _, fn in tail if fn in _DTENSOR_CALLS), inner)
    if owner == "FSDP's":  # its collectives by what they carry, not by c10d's function names
        inner = ("all-gather of the parameters" if "gather" in inner else
                 "reduce-scatter of the gradients" if "reduce_scatter" in inner else inner)
    return f"{owner} {inner}" if owner else inner


def in_backward(frames: list[tuple[str, int, str]]) -> bool:
    return any(fn == "_engine_run_backward" for _, _, fn in frames)


def describe(frames: list[tuple[str, int, str]], ddp_reducing: bool = False) -> dict:
    """``{"at": "file.py:57", "function": "train", "code": "...", "waits_in": "all_reduce" | None}`` for a stack
    (outermost first): the innermost frame of the job's own code (``function``: "" at a module's top level);
    ``ddp_reducing``: every gradient of a DDP model is in (:meth:`DDPWatch.all_in`)."""
    waits = _collective(frames)
    if waits is None and ddp_reducing and in_backward(frames):
        waits = DDP_ALL_REDUCE
    learner = [(p, n, f) for p, n, f in frames if not is_runtime(p)]
    at, function, code = None, "", ""
    if learner:
        path, line, function = learner[-1]
        at, code = f"{os.path.basename(path)}:{line}", linecache.getline(path, line).strip()
        function = "" if function.startswith("<") else function  # <module>, <lambda>, <listcomp>
        if waits is None and ".wait(" in code:
            waits = "wait"
    return {"at": at, "function": function, "code": code, "waits_in": waits}


class DDPWatch:
    """Which of a DDP model's gradients this backward has accumulated: every one of them, with the backward
    still running, means the reducer is waiting for the other ranks (see the module's docstring)."""

    def __init__(self, tick):
        self.tick, self.models, self.ready, self.lock = tick, [], set(), threading.Lock()

    def wrapped(self, ddp) -> None:
        """Called once a ``DistributedDataParallel`` is built: hook each of its trained parameters."""
        params = [p for p in ddp.module.parameters() if p.requires_grad]
        with self.lock:
            self.models.append(frozenset(map(id, params)))
        for p in params:
            p.register_post_accumulate_grad_hook(self.accumulated)

    def accumulated(self, param) -> None:
        self.ready.add(id(param))  # on autograd's thread; set.add holds the GIL
        self.tick()

    def backward_started(self) -> None:
        self.ready = set()

    def all_in(self) -> bool:
        with self.lock:
            models = list(self.models)
        ready = self.ready
        return any(model and model <= ready for model in models)


def watch_ddp(watch: DDPWatch) -> None:
    """Every ``DistributedDataParallel`` built in this process from now on reports to ``watch``."""
    from torch.nn.parallel import DistributedDataParallel

    init = DistributedDataParallel.__init__

    def watched_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        watch.wrapped(self)

    DistributedDataParallel.__init__ = watched_init
