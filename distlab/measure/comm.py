"""The one recorder of communication: every collective and point-to-point op a block of code issues.

A ``TorchDispatchMode`` sees the communication operators on their way to the backend, whoever
called them: ``torch.distributed``'s own calls (the ``c10d`` operators: ``allreduce_``,
``_allgather_base_``, ``send``...), DDP's reducer, FSDP2, DTensor's redistributions and the
functional collectives (``_c10d_functional``, and ``_c10d_functional_autograd`` for
``torch.distributed.nn.functional``). PyTorch's ``CommDebugMode`` counts the same operators but
records no sizes and prints its own op names; the notebooks and the grader both need the sizes,
so this recorder is theirs, and the grader adds tags (:meth:`CollectiveRecorder.tag`), never a
counting of its own.

One vocabulary: an op is named as the ``torch.distributed`` call a learner writes
(:data:`KINDS`: ``"all_reduce"``, ``"all_gather"``, ``"reduce_scatter"``...), and shown in
prose by :func:`label` (``"all-reduce"``). Its size ``S`` is that of nccl-tests (the all-reduced
tensor, an all-gather's output, a reduce-scatter's input), and :func:`wire_bytes` turns it into
what each rank sends with ring algorithms: nccl-tests' bus factors (``PERFORMANCE.md``).
"""
from __future__ import annotations

from collections import Counter
from typing import NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

#: Bytes each rank sends per byte of the op's full size S, ring algorithms (nccl-tests' busbw
#: factors); a point-to-point send sends its bytes once, a receive none.
BUS_FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
               "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
               "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "gather": lambda n: (n - 1) / n,
               "scatter": lambda n: (n - 1) / n, "send": lambda n: 1.0, "recv": lambda n: 0.0,
               "barrier": lambda n: 0.0}
#: The kinds, most specific first: "allreduce_" also contains "reduce", "all_gather" "gather".
KINDS = ("reduce_scatter", "all_gather", "all_reduce", "all_to_all", "broadcast", "barrier", "send", "recv",
         "gather", "scatter", "reduce")
NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd")
#: Bookkeeping operators of the functional collectives: no bytes of their own.
NOT_COMMUNICATION = {"wait_tensor", "_wrap_tensor_autograd"}
_LABELS = {"all_reduce": "all-reduce", "all_gather": "all-gather", "reduce_scatter": "reduce-scatter",
           "all_to_all": "all-to-all"}
_UNLABEL = {v: k for k, v in _LABELS.items()}


def collective_kind(op_name: str) -> str:
    """The ``torch.distributed`` call behind an operator: ``"all_reduce"`` for ``allreduce_`` or
    ``all_reduce``, ``"all_gather"`` for ``_allgather_base_``, ``"recv"`` for ``recv_any_source_``..."""
    name = op_name.lower()
    for fused, spaced in (("allreduce", "all_reduce"), ("allgather", "all_gather"), ("alltoall", "all_to_all")):
        name = name.replace(fused, spaced)
    return next((kind for kind in KINDS if kind in name), name)


def label(kind: str) -> str:
    """``"all-reduce"`` for ``"all_reduce"``, and so on: how prose writes a kind (others as they are)."""
    return _LABELS.get(kind, kind)


def wire_bytes(kind: str, nbytes: float, world: int) -> float:
    """Bytes one rank sends for an op of full size ``nbytes`` on ``world`` ranks (ring; NaN for an op
    this table does not know, so that a total including it says so). ``kind`` as :func:`collective_kind`
    or :func:`label` writes it."""
    kind = _UNLABEL.get(kind, kind)
    return BUS_FACTORS[kind](world) * nbytes if kind in BUS_FACTORS else float("nan")


def is_communication(func) -> bool:
    """Whether a dispatched operator is a collective or a point-to-point op (not its bookkeeping)."""
    return func.namespace in NAMESPACES and func._opname not in NOT_COMMUNICATION


class Op(NamedTuple):
    """One recorded op: its kind, its full size in bytes, the shape of its first tensor argument,
    the operator's own name, and what the recorder's :meth:`~CollectiveRecorder.tag` added."""
    kind: str
    bytes: int
    shape: tuple
    operator: str
    tags: dict


class CollectiveRecorder(TorchDispatchMode):
    """``with CollectiveRecorder(world) as rec:`` records, in ``rec.ops``, every communication op
    issued inside, in the order the dispatcher ran them.

    ``world`` (default: the default group's size when the recorder is entered) prices
    :meth:`ring_bytes`. Subclasses add what they need to know about an op by overriding
    :meth:`tag`, which sees the arguments *before* the op runs (an in-place all-reduce overwrites
    its input).
    """

    def __init__(self, world: int | None = None):
        super().__init__()
        self.world, self.ops = world, []

    def __enter__(self):
        if self.world is None:
            import torch.distributed as dist

            self.world = dist.get_world_size() if dist.is_initialized() else 1
        return super().__enter__()

    def tag(self, kind: str, tensors: list[torch.Tensor]) -> dict:
        """What to record beside an op's kind and size; ``tensors``: its tensor arguments."""
        return {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not is_communication(func):
            return func(*args, **kwargs)
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        kind = collective_kind(func._opname)
        tags = self.tag(kind, tensors)
        out = func(*args, **kwargs)
        sizes = [t.numel() * t.element_size() for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
        self.ops.append(Op(kind, max(sizes, default=0), tuple(tensors[0].shape) if tensors else (),
                           func._opname, tags))
        return out

    def counts(self) -> dict[str, int]:
        """``{"all-reduce": n, ...}``: ops by kind, as prose writes them."""
        return dict(Counter(label(op.kind) for op in self.ops))

    def ring_bytes(self, world: int | None = None) -> float:
        """Bytes each rank sends for these ops with ring algorithms on ``world`` ranks."""
        return sum(wire_bytes(op.kind, op.bytes, world or self.world) for op in self.ops)

    def totals(self) -> dict:
        """Per kind: ``{"calls", "bytes", "wire_bytes"}``, and ``"wire_bytes"`` over all kinds."""
        out: dict = {}
        for op in self.ops:
            row = out.setdefault(op.kind, {"calls": 0, "bytes": 0, "wire_bytes": 0.0})
            row["calls"] += 1
            row["bytes"] += op.bytes
            row["wire_bytes"] += wire_bytes(op.kind, op.bytes, self.world)
        out["wire_bytes"] = sum(v["wire_bytes"] for v in out.values())
        return out
