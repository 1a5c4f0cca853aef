"""Exercise 4's state-dict spy: the learner's state-dict collectives on this rank, recorded, and completed for a rank
that waits in one this rank never made (so that the training is still graded). Rank side; used by ``probes``.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint.state_dict as dsd
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions

from distlab.runtime.distributed import default_timeout

from ...rank import Replace
from .observations import StateDictCall

STATE_DICT_CALLS = ("get_model_state_dict", "get_state_dict", "get_optimizer_state_dict")


class StateDictSpy(Replace):
    """Records this rank's calls of the state-dict collectives, in ``calls`` (plain dicts, a
    :class:`StateDictCall`'s fields) and in the process group's
    store (so the other ranks see a call they never made), and makes the calls another rank waits in.
    Entered before the learner's file is imported (:class:`Replace`): ``from ... import
    get_model_state_dict`` is seen too."""

    def __init__(self, tag: str) -> None:
        self.tag, self.calls, self.real_fn = tag, [], {name: getattr(dsd, name) for name in STATE_DICT_CALLS}
        self.store = dist.distributed_c10d._get_default_store()
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        super().__init__({(dsd, name): functools.partial(self._spy, name) for name in STATE_DICT_CALLS})

    def _spy(self, name: str, real):
        def spy(*args, **kwargs):
            options = kwargs.get("options")
            flags = dataclasses.asdict(options) if options is not None else {}
            record = {"fn": name, "options": {k: v for k, v in flags.items() if isinstance(v, bool)}}
            self.calls.append(record)
            self.store.set(f"{self.tag}/call/{self.rank}/{len(self.calls)}", json.dumps(record))
            self.store.add(f"{self.tag}/entered/{self.rank}", 1)
            result = real(*args, **kwargs)
            first = result[0] if isinstance(result, tuple) else result
            tensors = [v for v in first.values() if isinstance(v, torch.Tensor)] if isinstance(first, dict) else []
            record.update(tensors=len(tensors), bytes=sum(t.numel() * t.element_size() for t in tensors))
            return result
        return spy

    def settle(self, model: nn.Module, optimizer) -> list[StateDictCall]:
        """After ``train_fsdp``: until every rank has returned, make each state-dict call that a rank still in
        ``train_fsdp`` entered and this one never made (it waits for this rank); return the calls made."""
        self.store.set(f"{self.tag}/done/{self.rank}", "1")
        made: list[StateDictCall] = []
        deadline = time.monotonic() + default_timeout().total_seconds()  # then a collective's timeout names it
        while True:
            waiting = [r for r in range(self.world) if not self.store.check([f"{self.tag}/done/{r}"])]
            if not waiting or time.monotonic() > deadline:
                return made
            entered = {r: self.store.add(f"{self.tag}/entered/{r}", 0) for r in waiting}
            r, n = max(entered.items(), key=lambda kv: kv[1])
            if n > len(self.calls) + len(made):  # rank r waits in its call number n, which this rank never made
                record = StateDictCall.from_wire(json.loads(
                    self.store.get(f"{self.tag}/call/{r}/{len(self.calls) + len(made) + 1}")))
                self._make(record, model, optimizer)
                made.append(dataclasses.replace(record, for_rank=r))
            else:
                time.sleep(0.02)

    def _make(self, record: StateDictCall, model: nn.Module, optimizer) -> None:
        options = StateDictOptions(**record.options)
        if record.fn == "get_model_state_dict":
            self.real_fn[record.fn](model, options=options)
        else:
            self.real_fn[record.fn](model, optimizer, options=options)
