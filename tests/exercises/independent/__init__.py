"""Correct solutions of the exercises written independently of the reference, in another legitimate
style (other public APIs, another loop shape, names imported with ``from X import name``, in-place
collectives, non-blocking p2p, explicit DCP readers and writers, a device mesh, prints), as a learner
would write them from the stubs and the notebooks: each must score full marks (the suite's own
false-negative check).

Each is graded in the launch of its exercise's module fixture, ``tests/exercises/test_exNN_name.py``,
next to the reference and its mutants (no launch of its own), and that module asserts its full marks;
``tests/exercises/test_conformance.py`` holds every exercise of the registry to having one, graded so.
"""
from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
FILES = {1: "ex01_ddp.py", 2: "ex02_accumulation.py", 3: "ex03_amp.py", 4: "ex04_fsdp.py",
         5: "ex05_checkpoint.py", 6: "ex06_scaling.py", 7: "ex07_pipeline.py", 8: "ex08_tensor_parallel.py",
         9: "ex09_hang.py", 10: "ex10_ring_attention.py", 11: "ex11_moe_dispatch.py"}


def path(exercise: int) -> Path:
    return HERE / FILES[exercise]
