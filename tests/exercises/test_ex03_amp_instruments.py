"""Exercise 3's rank-side instruments, checked in this process (no launch): every clock a learner's file
can read follows the virtual clock of the simulated workloads, however the file imported it, and the
runtime's copies of the measuring functions are recognised however they are handed in."""
from __future__ import annotations

import pytest

import distlab.measure.memory
import distlab.measure.timing
from autograder.checks.ex03_amp.probes import ANSWERS
from distlab.runtime.importing import import_path


def test_runtime_copies_recognised_in_process(tmp_path):
    """No launch: a partial is its copy; a call through peak_memory is seen; the watch puts the code back."""
    (tmp_path / "learner.py").write_text(
        "import functools\nimport distlab.measure.timing\nfrom distlab.measure.memory import peak_memory\n\n"
        "median_seconds = functools.partial(distlab.measure.timing.median_seconds, warmup=1)\n\n\n"
        "def saved_bytes(fn):\n    return peak_memory(fn, 'cpu')[0]\n")
    learner = import_path(tmp_path / "learner.py", name="learner_ex03_in_process")
    assert ANSWERS.identify(learner) == {"median_seconds": "distlab.measure.timing.median_seconds"}
    code = distlab.measure.memory.saved_tensor_bytes.__code__
    watch = ANSWERS.watch(learner)
    with pytest.raises(ZeroDivisionError), watch:
        learner.saved_bytes(lambda: None)
        1 / 0
    assert distlab.measure.memory.saved_tensor_bytes.__code__ is code
    assert watch.calls == [["distlab.measure.memory.saved_tensor_bytes", ["saved_bytes"]]]
    assert ANSWERS.feedback("saved_bytes", {}, watch.calls) == \
        "saved_bytes is distlab's copy (it calls distlab.measure.memory.saved_tensor_bytes): write your own"
    assert ANSWERS.feedback("median_seconds", {}, [["distlab.measure.timing.median_seconds", ["compare"]]]) == \
        ("compare calls distlab's copy of median_seconds (distlab.measure.timing.median_seconds) instead of yours: "
         "write your own median_seconds and call it")
    assert distlab.measure.timing.median_seconds(lambda: None, min_run_time=0.01, warmup=0) > 0  # the notebooks' use


CLOCK_STYLES = (  # every way a learner's file may read the clock, each a function of no arguments
    "import time\nimport time as t\nimport timeit\nfrom time import perf_counter, perf_counter_ns\n"
    "from timeit import default_timer\nfrom torch.utils import benchmark\n\n\n"
    "def by_attribute():\n    return time.perf_counter()\n\n\n"
    "def by_alias():\n    return t.monotonic()\n\n\n"
    "def by_name():\n    return perf_counter()\n\n\n"
    "def by_name_ns():\n    return perf_counter_ns() / 1e9\n\n\n"
    "def by_timeit_name():\n    return default_timer()\n\n\n"
    "def by_default_argument(clock=time.perf_counter):\n    return clock()\n\n\n"
    "def timeit_seconds(fn):\n    return timeit.timeit(fn, number=4) / 4\n\n\n"
    "def benchmark_seconds(fn):\n    return benchmark.Timer(stmt='fn()', globals={'fn': fn}).timeit(4).median\n")


@pytest.mark.parametrize("imported", ["under the clocks", "before the clocks"])
def test_every_clock_a_file_can_read_is_the_virtual_one(tmp_path, imported):
    """No launch: whichever way the learner's file names a clock (``from time import perf_counter``, an
    alias, an attribute, ``timeit``'s), it reads the case's virtual clock, and the real one outside it."""
    from autograder.checks.ex03_amp.workloads import Clocks
    from autograder.rank import watched

    (tmp_path / "clocks.py").write_text(CLOCK_STYLES)
    load = lambda: watched(import_path(tmp_path / "clocks.py", name=f"learner_clocks_{imported[0]}"))  # noqa: E731
    learner, clocks = load() if imported.startswith("before") else None, Clocks()
    with clocks.replaced():
        learner = learner or load()
        with clocks.reading(distlab.measure.timing.VirtualClock()) as clock:
            clock.advance(0.5)
            read = {name: getattr(learner, name)() for name in ("by_attribute", "by_alias", "by_name",
                                                              "by_name_ns", "by_timeit_name", "by_default_argument")}
            timed = [learner.timeit_seconds(lambda: clock.advance(0.25)),
                     learner.benchmark_seconds(lambda: clock.advance(0.25))]
        outside = learner.by_name()
    if imported.startswith("before"):  # a default argument is bound before any instrument could be entered
        assert read.pop("by_default_argument") != 1000.5
    assert read == dict.fromkeys(read, 1000.5) and timed == [0.25, 0.25]
    assert outside != 1000.5 and learner.by_name() != 1000.5  # the real clock, also for names bound under it
