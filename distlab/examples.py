"""Tiny rank programs used by notebooks and benchmarks."""
from __future__ import annotations

import distlab


def noop() -> None:
    """Join the process group and leave: the fixed cost of a launch."""
    distlab.init_distributed()
    distlab.shutdown()
