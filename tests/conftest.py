"""Test-session set-up, and the rule every test of this suite follows.

How to write a distributed test that cannot flake
-------------------------------------------------

``make test`` runs on a fresh clone, on machines of any speed, while other
jobs load the same cores and share the same ``/tmp``. A test may only assert
what is decided by the code under test, never what the scheduler decides.

1. **No race winners.** Which rank fails, prints or finishes first is a race
   whenever two ranks can do it independently (a syntax error raises on every
   rank; the launcher may see either one first). Assert "a rank is named"
   (``rank \\d+``) plus the error and the learner's line. Name a specific rank
   only when the others can fail *because of it* and so only after it (rank 1
   raises; rank 0 then loses its peer in a collective).
2. **Per-rank output, not interleaving.** Read a rank's lines with
   ``run.rank_lines(r)`` or its result with ``run.results[r]``; never assert
   the order of lines *between* ranks in ``run.output`` or a stream.
3. **No wall-clock assertions.** A timeout is a hang guard: generous, and
   multiplied by ``DISTLAB_TIME_SCALE`` (the launcher and the grader do that
   for theirs). Assert the functional outcome instead (it was stopped, it says
   so, nothing was left running). Durations, speeds and ratios of timings are
   rows of ``make bench`` (``benchmarks/bench_*.py``), printed, never asserted.
4. **No fixed sleeps to wait for an event.** Poll the condition with a bound
   (the ``wait_for`` fixture), or have the program announce it (a rank writes
   a file: ``tests/helpers/targets/ranks.py``). A sleep is too short on a busy machine
   and wasted time on an idle one.
5. **Force the concurrency you claim.** "Two jobs at once" means they wait for
   each other (a file barrier, ``ranks.port_while_jobs_overlap``), not that
   they were started close together and probably overlapped.
6. **Preconditions that depend on speed are retried, not assumed.** If a test
   needs the ranks to have started before a timeout fires, check that they
   did and retry with a longer limit (bounded), asserting the outcome on every
   try (``distlab/test_launch.py::test_a_hang_times_out_and_leaves_no_process``).
7. **Look only at what this session made.** Other suites run on the machine:
   find leftover processes by this session's marker (``leftover_processes``,
   which polls, since killed processes take a moment to go), not by name
   machine-wide; find leftover files in a temp dir of the test's own
   (``monkeypatch`` ``tempfile.tempdir`` and ``TMPDIR``), not by scanning
   ``/tmp``; identify a process by pid *and* creation time (pids are reused),
   and expect it to vanish between two calls (``psutil.NoSuchProcess``).
8. **Exact where exact, with a reason where not.** ``rtol=0, atol=0`` where
   the result is bit-identical by construction (DDP's replicas, gloo resumes);
   a tolerance only for a stated numerical reason (reduction order), never to
   absorb timing noise.
9. **Prove it before you rely on it.** Run a new distributed test 20 times
   while something else loads the machine, e.g.
   ``for i in $(seq 20); do .venv/bin/python -m pytest -x -q tests/distlab/test_x.py::name || break; done``
   next to a ``make bench``.
"""
import os
import sys
import time
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Every process this test session starts inherits this marker, so "nothing was left
# behind" can be checked without mistaking someone else's processes for ours.
os.environ["DISTLAB_TEST_SESSION"] = SESSION = uuid.uuid4().hex
# A self-test run by a test records its time-scale calibration here, not in this machine's cache.
os.environ["DISTLAB_CALIBRATION"] = os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                                 f"distlab-calibration-{SESSION}.json")
# The reference traces a grading keeps for later ones: shared by this session's workers, not by other sessions.
os.environ["DISTLAB_REFERENCE_STORE"] = os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                                     f"distlab-reference-traces-{SESSION}")


def _wait_for(condition, timeout: float = 30.0, interval: float = 0.05):
    """Call ``condition()`` until it returns something truthy or ``timeout`` s (times
    ``DISTLAB_TIME_SCALE``) have passed; return its last value, so the caller's assert shows it."""
    from distlab.runtime.launch import time_scale

    deadline = time.monotonic() + timeout * time_scale()
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)  # the polling interval, not a guess at how long the event takes


@pytest.fixture
def wait_for():
    """``wait_for(condition, timeout=30)``: poll with a bound instead of sleeping (rule 4)."""
    return _wait_for


@pytest.fixture
def leftover_processes():
    """``leftover_processes(within=10)``: this session's live processes, after giving the ones a job
    has just killed up to ``within`` s to go (SIGKILL is asynchronous: a process with a few hundred
    MB to unmap can take a moment to become a zombie). Empty at once in the usual case; a process
    that was never signalled (a real leak, e.g. ``time.sleep(600)``) is still there at the end."""
    from tests.helpers import session_processes

    def left(within: float = 10.0) -> list:
        return [] if _wait_for(lambda: not session_processes(), timeout=within) else session_processes()

    return left


def pytest_collection_modifyitems(config, items):
    """Put the machine-wide modules first (:func:`_group_for_workers`), then multiply each test's
    pytest-timeout (a hang guard, rule 3) by ``DISTLAB_TIME_SCALE``, as the launcher and the grader
    multiply theirs: on a machine that needs the knob, the test's own guard must not fire before the
    limits it is testing."""
    from distlab.runtime.launch import time_scale

    _group_for_workers(items)
    scale = time_scale()
    if scale == 1:
        return
    default = getattr(config, "_env_timeout", None)  # pytest-timeout's: --timeout, PYTEST_TIMEOUT or the ini
    for item in items:
        marker = item.get_closest_marker("timeout")
        base = (marker.args[0] if marker.args else marker.kwargs.get("timeout")) if marker else default
        if base:
            item.add_marker(pytest.mark.timeout(float(base) * scale), append=False)


# Modules that touch something machine-wide: the learner user's processes (ended by uid), the containers,
# the Slurm cluster, the browser. Under ``make test``'s two workers they run on one worker, one after
# another, and first (together they are the longest unit of work). Paths relative to tests/.
TESTS = Path(__file__).resolve().parent
MACHINE_WIDE = {"tiers/test_grading_image.py", "distlab/test_sandbox.py", "autograder/test_selftest.py",
                "distlab/test_warm.py", "tiers/test_docker.py", "tiers/test_containers.py",
                "tiers/test_gradescope_container.py", "tiers/test_slurm_cluster.py", "tiers/test_slurm_class.py",
                "tiers/test_browser.py", "tiers/test_hub.py", "tiers/test_hub_slurm.py",
                "tiers/test_hub_podman.py"}
if _moved := sorted(m for m in MACHINE_WIDE if not (TESTS / m).is_file()):  # a module moved: say so, not run it apart
    raise pytest.UsageError(f"tests/conftest.py: MACHINE_WIDE names no module at {_moved}")


def _module(nodeid: str) -> str:
    """The test module of ``nodeid``, as its path relative to tests/ (unique, where a file's stem need not be)."""
    path = Path(nodeid.split("::", 1)[0])
    return path.relative_to("tests").as_posix() if path.parts[:1] == ("tests",) else path.as_posix()


def _group_for_workers(items) -> None:
    """Put :data:`MACHINE_WIDE` first: the longest unit of work starts at once (without ``-n``, only the
    order changes)."""
    items.sort(key=lambda item: _module(item.nodeid) not in MACHINE_WIDE)  # stable: each keeps its order


def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's units of work: each module (its module-scoped fixtures, such as a solution graded
    with its mutants, are set up once, on one worker), and all of :data:`MACHINE_WIDE` as one unit.
    (``--dist loadgroup`` would say the same with markers, but xdist 3.8 marks the groups in a node id
    that pytest 9 no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = _module(nodeid)
            return "machine-wide" if module in MACHINE_WIDE else module

    return ModuleScheduling(config, log)
