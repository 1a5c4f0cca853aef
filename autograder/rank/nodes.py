"""A launch on one machine made to look like several nodes, from inside its ranks.

The grader runs every launch on one node, where ``LOCAL_WORLD_SIZE`` equals ``WORLD_SIZE`` and ``LOCAL_RANK``
equals ``RANK``: code that takes one for the other (``LOCAL_WORLD_SIZE`` as the world size, ``LOCAL_RANK == 0``
as "rank 0") is right there and wrong on a cluster. :func:`as_nodes` gives the learner's code torchrun's view of
``nodes`` nodes instead, for a block, where the check's device is already chosen (a CPU launch: on GPUs the
local rank picks the device, and two ranks of one node would share one).
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

from distlab.runtime import heartbeat

from .spies import learner_line


@contextlib.contextmanager
def as_nodes(path: str | Path, rank: int, world: int, nodes: int) -> Iterator[dict[str, str]]:
    """For the block, the ``world`` ranks as ``nodes`` nodes of ``world // nodes``: torchrun's node-local
    variables (``LOCAL_WORLD_SIZE``, ``LOCAL_RANK``, ``GROUP_RANK``) say so, marked as the launcher's values (the
    learner did not change them), and the learner's first line that reads ``LOCAL_WORLD_SIZE`` is noted in the
    dict yielded (``{"LOCAL_WORLD_SIZE": "file.py:12"}``). One node: nothing changes, nothing is watched."""
    reads: dict[str, str] = {}
    if nodes <= 1:
        yield reads
        return
    per = world // nodes
    values = {"LOCAL_WORLD_SIZE": str(per), "LOCAL_RANK": str(rank % per), "GROUP_RANK": str(rank // per)}
    before, getitem, where = {k: os.environ.get(k) for k in values}, os._Environ.__getitem__, Path(path).resolve()

    def read(self, key):  # os.environ[...], os.environ.get and os.getenv all come here
        if key == "LOCAL_WORLD_SIZE" and key not in reads and (found := learner_line(where)):
            reads[key] = f"{Path(found[0]).name}:{found[1]}"
        return getitem(self, key)

    with heartbeat.torchrun_vars(**values):
        os.environ.update(values)
        os._Environ.__getitem__ = read
        try:
            yield reads
        finally:
            os._Environ.__getitem__ = getitem
            for k, v in before.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
