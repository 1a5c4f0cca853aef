"""Exercise 6's rank-side instruments and real-run causes, checked in this process (no launch): clocks,
collectives and a DDP named in any import style are seen, and each count of the real run names its cause."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from autograder.checks.ex06_scaling import real_causes as causes
from autograder.checks.ex06_scaling.observations import REAL, MethodEvent, RankObservation, Run
from autograder.checks.ex06_scaling.probes import SYNTH
from autograder.grader.diagnosis import diagnose
from tests.helpers import REAL_FEW_STEPS


@pytest.mark.parametrize("imported", ["before the spies", "under the spies"])
def test_the_method_and_ddp_spies_see_every_import_style(tmp_path, imported):
    """No launch (one gloo rank in this process): clocks and collectives named by attribute, through an
    alias or by name (``timeit``'s clock too), and a DDP made under another name, are each seen, with the
    steps done at that moment, and DDP's gradient all-reduce is counted."""
    import torch.distributed as dist

    from autograder.checks.ex06_scaling.probes import CountedStep, MethodSpy
    from autograder.rank import DDPSpy
    from autograder.rank import watched
    from distlab.runtime.importing import import_path

    path = tmp_path / "styles.py"
    path.write_text(
        "import time\nimport time as T\nimport torch\nimport torch.distributed as D\n"
        "from time import perf_counter\nfrom timeit import default_timer\nfrom torch.distributed import barrier\n"
        "from torch.nn.parallel import DistributedDataParallel as Wrapper\n\n\n"
        "def every_style(step):\n    time.perf_counter()\n    barrier()\n    step()\n    T.monotonic()\n"
        "    perf_counter()\n    default_timer()\n    D.all_reduce(torch.ones(1), op=D.ReduceOp.MAX)\n\n\n"
        "def make_step():\n    model = Wrapper(torch.nn.Linear(3, 2))\n\n"
        "    def step():\n        model(torch.ones(4, 3)).sum().backward()\n    return step\n")
    load = lambda: watched(import_path(path, name=f"learner_ex06_{imported[0]}"))  # noqa: E731
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        learner = load() if imported == "before the spies" else None
        with MethodSpy(str(path)) as spy, DDPSpy() as ddp:
            learner = learner or load()
            step = ddp.counter = CountedStep(learner.make_step())
            with spy.watching(step) as events:
                learner.every_style(step)
    finally:
        dist.destroy_process_group()
    assert [(e.name, e.steps) for e in events] == [
        ("perf_counter", 0), ("barrier", 0), ("monotonic", 1), ("perf_counter", 1), ("perf_counter", 1),
        ("all_reduce", 1)]
    assert events[-1].op == "MAX"
    assert (ddp.wrapped, ddp.built_in_step, ddp.forwards, ddp.rounds) == (1, 0, 1, 1)


def _counted(world: int = 2, **real) -> Run:
    """A run whose synthetic method was right, with ``real``'s counts of the real run (no launch)."""
    k, n = SYNTH["warmup"], SYNTH["iters"]
    steps = REAL_FEW_STEPS["warmup"] + REAL_FEW_STEPS["iters"]
    reads = [MethodEvent(kind="clock", name="perf_counter", steps=s, in_step=False) for s in (k, k + n)]
    rank0 = RankObservation(**{"rank": 0, "backend": "gloo", "reported": None, "returned": 0.0,
                               "times": torch.zeros(k + n, 2), "method": reads, "real_steps": steps,
                               "ddp_built_in_make": 1, "ddp_built_in_step": 0, "ddp_rounds": steps,
                               "real_method": [replace(e, steps=s) for e, s in zip(reads, (2, steps))], **real})
    return Run([rank0] * world, {**REAL, **REAL_FEW_STEPS})


def test_the_real_runs_counts_name_their_causes_without_a_launch():
    assert diagnose(causes.REAL_CAUSES, _counted()) is None  # one wrapper, one round a step, 2..7 timed
    assert causes.wrappers_made(_counted(ddp_built_in_make=2)).startswith(
        "at 2 worker(s) make_ddp_step built 2 DistributedDataParallel wrappers: wrap the model once")
    assert causes.grad_rounds(_counted(ddp_rounds=14)) == (
        "at 2 worker(s) DDP all-reduced the gradients 14 times in 7 steps, 2 per step: run one forward and one "
        "backward per step")
    assert causes.grad_rounds(_counted(ddp_rounds=0)).startswith("at 2 worker(s) DDP all-reduced the gradients 0 "
                                                                "times in 7 steps: every backward must sync them")
    assert causes.grad_rounds(_counted(ddp_rounds=None)) is None  # a C++ comm hook: not counted
    # The real run timed otherwise than the synthetic one (a file that recognises the grader's step).
    from_zero = [MethodEvent(kind="clock", name="perf_counter", steps=s, in_step=False) for s in (0, 7)]
    assert causes.timed_other_steps(_counted(real_method=from_zero)) == (
        "on the real model your clock started after 0 steps, so the window timed 7 steps where the 5 after the 2 "
        "warm-up steps count")
    assert causes.timed_other_steps(_counted(real_steps=9)).startswith(
        "at 2 worker(s) measure_throughput called the real step 9 times; expected warmup + iters = 7")
    assert causes.timed_other_steps(_counted(real_method=[])) is None  # a clock the spies cannot see
    # Timed on the real model as on the synthetic step: the method's criterion named it, not this one.
    same = _counted(real_method=from_zero)
    same.ranks[0].method = [replace(e, steps=s) for e, s in zip(from_zero, (0, 10))]
    assert causes.timed_other_steps(same) is None


def _timeline(read_at: dict[int, tuple[float, float]], reported_window: float) -> Run:
    """Two ranks' synthetic steps (rank 1 warms up last, and is slower), each rank's clock read at
    ``read_at[rank]`` = (start, stop) on the grader's clock, rank 0's figure from ``reported_window``."""
    k, n, b = SYNTH["warmup"], SYNTH["iters"], SYNTH["batch_size"]
    ranks = []
    for rank, (warm, step) in enumerate([(0.1, 0.03), (0.15, 0.045)]):
        ends = [warm * (i + 1) for i in range(k)] + [0.3 + 0.01 + step * (i + 1) for i in range(n)]
        starts = [0.0, warm] + [0.31 + step * i for i in range(n)]
        reads = [MethodEvent(kind="clock", name="perf_counter", steps=s, in_step=False, before=t, after=t)
                 for s, t in zip((k, k + n), read_at.get(rank, ()))]
        ranks.append(RankObservation(rank=rank, backend="gloo", times=torch.tensor(list(zip(starts, ends)),
                                                                                 dtype=torch.float64),
                                     reported=2 * b * n / reported_window, returned=2.0, method=reads))
    return Run(ranks)


def test_the_window_is_judged_by_the_order_of_events_not_their_speed():
    """No launch: a correct method on a machine so loaded that rank 0 read its clock 50 ms after the start
    barrier and 0.2 s after the end one (0.78 of the truth's figure, far outside the old 10%) passes; a clock
    started before the late rank's warm-up ended fails whatever its figure; without clock reads the bounds
    are the truth's window and the last return."""
    from autograder.checks.ex06_scaling import _window_ok

    late = _timeline({0: (0.35, 0.88)}, reported_window=0.53)
    assert late.ratio() < 0.8 and _window_ok(late)
    assert not _window_ok(_timeline({0: (0.35, 0.88)}, reported_window=0.53 * 0.8))  # the warm-up's samples
    early = _timeline({0: (0.25, 0.73)}, reported_window=0.48)  # before rank 1's warm-up ended (0.3 s)
    assert early.read_windows() == (0.0, 0.0) and not _window_ok(early)
    unseen = _timeline({}, reported_window=0.4)
    assert unseen.read_windows() is None and _window_ok(unseen)
    assert not _window_ok(_timeline({}, reported_window=0.3))  # shorter than the timed steps (0.36 s)
