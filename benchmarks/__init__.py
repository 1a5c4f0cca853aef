"""``make bench``: the benchmark table. Every ``benchmarks/bench_*.py`` adds rows.

A bench module defines ``rows() -> list[Row]``; rows are measured side by side
in one run so ratios compare like with like. Absolute speeds are this
machine's, printed, never asserted.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Row:
    topic: str       # e.g. "launch", "ddp", "amp"
    what: str        # what was measured, in words
    value: float
    unit: str        # "s", "samples/s", "x", "MiB", ...
    note: str = ""   # how it was measured, or the target it is compared with
