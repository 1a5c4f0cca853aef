"""The typed contract of exercise 4's part 1, ZeRO-1 by hand: what one rank observed of the learner's
``shard_range``, ``make_zero1_optimizer`` and ``zero1_step`` (``probes.observe_zero1`` fills a :class:`Zero1`).

It crosses to the grading process inside the rank's record (``..observations.FsdpRank``). Imported by both
sides: it imports nothing of either.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ....rank.observation import Observation


@dataclass
class Collective(Observation):
    """One collective a ``zero1_step`` issued, as the one recorder counted it."""

    kind: str   # "reduce_scatter", "all_gather", "all_reduce"...
    bytes: int  # the bytes it moved
    line: str   # the learner's line that issued it, "line N: code" ("" if none of the file's lines was on the stack)


@dataclass
class Holdings(Observation):
    """What ``make_zero1_optimizer`` returned: the shard, and the tensors its optimizer holds."""

    opt_numel: int          # elements of the tensors the optimizer holds
    opt_tensors: int        # how many tensors it holds
    opt_model_params: int   # how many of them are the model's own parameters
    model_params: int       # the model's parameters
    shard_in_opt: bool      # whether the optimizer holds the shard itself
    shard: torch.Tensor | None = None        # the shard, flattened, on the CPU (None: not a tensor)
    shard_dtype: str = ""                    # its dtype, "float32" ("" where it is no tensor)
    shard_is_leaf: bool | None = None        # whether it is a leaf tensor
    shard_aliases_model: bool | None = None  # whether it shares storage with a model parameter
    shard_storage_bytes: int = 0  # the bytes of the storage the shard holds alive (a view: its base's, all of it)
    shard_element_bytes: int = 0  # the bytes of one of its elements


@dataclass
class Half(Observation):
    """Part 1 again, two steps on a bfloat16 copy of the model: the contract's mixed precision, where the master
    shard is fp32 and the model's parameters keep their dtype (``probes.observe_half``)."""

    error: str | None = None      # what make_zero1_optimizer or zero1_step raised, "Type: message (at line N: ...)"
    steps: int = 0                # the zero1_step calls that returned
    shard_dtype: str = ""         # the shard's dtype ("" where it is no tensor)
    state_dtypes: list[str] = field(default_factory=list)  # the dtypes of Adam's moments, once each
    # parameters whose dtype a zero1_step changed, "name: bfloat16 -> float32" (the run stops after that step)
    retyped: list[str] = field(default_factory=list)
    rebound: int = 0              # parameters that hold another storage after the steps than before
    shard: torch.Tensor | None = None   # the shard after the last step, flat, as fp32 on the CPU
    params: torch.Tensor | None = None  # the model's flat parameters after the last step, as fp32 on the CPU


@dataclass
class Zero1(Observation):
    """Part 1 on one rank: ``shard_range``'s answers, then ZeRO-1 training on this rank's micro-batches
    (filled as it goes: a step that raises leaves the rest at its defaults). The rank keeps the two apart
    (``probes.observe_ranges``, ``probes.observe_zero1``); the grading process joins them
    (``..observations.Run.from_parts``)."""

    # for each parameter count asked, shard_range(n, W, r)'s [start, stop) for r = 0..W-1, keyed by the count
    ranges: dict[int, list[list[int]]] = field(default_factory=dict)
    ranges_error: str | None = None  # what shard_range raised, "Type: message (at the learner's line)"
    ranges_unwritten: str = ""       # where shard_range raised NotImplementedError ("" if it did not)
    error: str | None = None         # what make_zero1_optimizer or zero1_step raised
    aborted: str = ""                # how the launch ended while part 1 trained (a native abort, a hang)
    where: str = ""                  # the learner's line that raised it ("" if none of the file's lines)
    not_implemented: bool = False    # whether that error is NotImplementedError
    steps: list[list[Collective]] = field(default_factory=list)  # per step, its collectives in order
    holdings: Holdings | None = None  # None: make_zero1_optimizer did not return
    first_grad: torch.Tensor | None = None  # the optimizer's gradients at its first step, flat (None: no step)
    final: torch.Tensor | None = None       # the model's flat parameters after the last step (set at the end)
    state: dict[str, int] = field(default_factory=dict)  # elements of each kind of optimizer state (exp_avg...)
    half: Half | None = None  # the two steps on a bfloat16 model (None: the fp32 training raised first)
