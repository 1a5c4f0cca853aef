"""Correct solutions of the eight exercises written independently of the reference, in another
legitimate style (other public APIs, another loop shape, names imported with ``from X import name``,
in-place collectives, non-blocking p2p, explicit DCP readers and writers, a device mesh, prints), as a
learner would write them from the stubs and the notebooks: each must score full marks (the suite's
own false-negative check, ``tests/exercises/test_independent_solutions.py``).

They are graded in the launches of the module fixtures of ``tests/exercises/test_exNN_*.py``, next to the
reference and its mutants (no launch of their own), and :func:`record` keeps their reports for the
session; :func:`report` grades one alone, with the same options, where its fixture did not run.
"""
from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
FILES = {1: "ex01_ddp.py", 2: "ex02_accumulation.py", 3: "ex03_amp.py", 4: "ex04_fsdp.py",
         5: "ex05_checkpoint.py", 6: "ex06_scaling.py", 7: "ex07_pipeline.py", 8: "ex08_tensor_parallel.py",
         9: "ex09_hang.py", 10: "ex10_ring_attention.py", 11: "ex11_moe_dispatch.py"}
_REPORTS: dict = {}


def path(exercise: int) -> Path:
    return HERE / FILES[exercise]


def record(exercise: int, report) -> None:
    """Keep the report a fixture graded for exercise ``exercise``'s independent solution."""
    _REPORTS[exercise] = report


def _grade_alone(exercise: int):
    """One launch for this file alone, with the options its fixture grades it with."""
    if exercise == 10:  # context parallelism: its fixture grades at W=4 only
        from autograder.checks import ex10_ring_attention
        return ex10_ring_attention.grade([path(10)], world_sizes=(4,), p2p_timeout_s=1.5)[0]
    from autograder.checks import (ex01_ddp, ex02_accumulation, ex03_amp, ex04_fsdp, ex05_checkpoint,
                                   ex06_scaling, ex07_pipeline, ex08_tensor_parallel, ex09_hang, ex11_moe_dispatch)
    from tests.test_ex03_amp import REAL_MODELS
    from tests.test_ex05_checkpoint import INDEPENDENT_SCENARIOS
    from tests.test_ex06_scaling import REAL_FEW_STEPS

    p = [path(exercise)]
    grade = {1: lambda: ex01_ddp.grade(p, world_sizes=(2,)), 2: lambda: ex02_accumulation.grade(p),
             3: lambda: ex03_amp.grade(p, real_models=REAL_MODELS), 4: lambda: ex04_fsdp.grade(p, world_sizes=(2,)),
             5: lambda: ex05_checkpoint.grade(p, scenarios=INDEPENDENT_SCENARIOS),
             6: lambda: ex06_scaling.grade(p, world_sizes=(1, 2), real=REAL_FEW_STEPS),
             7: lambda: ex07_pipeline.grade(p, p2p_timeout_s=1.5),
             8: lambda: ex08_tensor_parallel.grade(p, world_sizes=(2,)),
             9: lambda: ex09_hang.grade(p), 11: lambda: ex11_moe_dispatch.grade(p)}
    return grade[exercise]()[0]


def report(exercise: int):
    """The report of exercise ``exercise``'s independent solution: its fixture's, else graded now."""
    if exercise not in _REPORTS:
        _REPORTS[exercise] = _grade_alone(exercise)
    return _REPORTS[exercise]
