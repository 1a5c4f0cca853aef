"""The launcher: results come back, failures are named, nothing survives, ports never collide."""
from __future__ import annotations

import re
import threading
from pathlib import Path

import psutil
import pytest
import torch

from distlab import LaunchError, LaunchTimeout, RankFailure, torchrun
from distlab.runtime.launch import time_scale
from distlab.runtime.magic import TorchrunCellError, torchrun_cell
from tests.helpers.targets import ranks


@pytest.mark.slow
def test_results_come_back_per_rank_with_prefixed_output():
    run = torchrun(ranks.allreduce_rank, 2, timeout=60)
    assert [r["rank"] for r in run.results] == [0, 1]
    for r in run.results:
        torch.testing.assert_close(r["sum"], torch.tensor([3.0]))  # 1 + 2: exact, two small integers
        assert r["world"] == 2 and r["backend"] == "gloo"
    assert run.rank_lines(0) == ["sum is 3"] and run.rank_lines(1) == ["sum is 3"]


@pytest.mark.slow
def test_concurrent_launches_get_their_own_ports(tmp_path):
    # The two jobs wait for each other inside their process groups (a file barrier), so they hold
    # their ports at the same moment: started together is not enough, a job that had already ended
    # could hand its port to the next one and the test would prove nothing.
    runs: list = [None, None]
    errors: list = []

    def go(i):
        try:
            runs[i] = torchrun(ranks.port_while_jobs_overlap, 2, args=(str(tmp_path), 2), timeout=90)
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    assert all(r.results[0]["port"] == r.results[1]["port"] for r in runs), "one job, one rendezvous port"
    ports = {r.results[0]["port"] for r in runs}
    assert len(ports) == 2, "two jobs at once must rendezvous on different ports"


@pytest.mark.slow
def test_a_rank_later_than_a_short_group_timeout_still_joins():
    # The grader's short timeouts (exercises 7 and 10: a deadlock found in seconds) bound the collectives and the
    # sends, not how late a rank may come to the group: a slow import or a loaded machine is not a timeout.
    run = torchrun(ranks.late_rank_joins, 2, args=(3.0, 1.0), timeout=60)
    for r in run.results:
        assert r["sum"].item() == 3.0 and r["got"].item() == 3.0


@pytest.mark.slow
def test_a_failing_rank_is_named_with_its_exception():
    # Naming rank 1 is deterministic: only rank 1 raises; rank 0 can fail only after rank 1 has
    # gone (its barrier loses the peer), so rank 1's error is the first by construction.
    with pytest.raises(RankFailure) as info:
        torchrun(ranks.raise_on_rank1, 2, timeout=60)
    assert info.value.rank == 1 and info.value.exc_type == "ValueError"
    assert str(info.value) == "rank 1 failed: ValueError: rank one is unhappy"
    assert "raise_on_rank1" in info.value.traceback


def _announced(path: Path) -> tuple[int, float] | None:
    """(pid, creation time) a rank program wrote with ``ranks._announce``, or None if it did not."""
    if not path.exists():
        return None
    pid, created = path.read_text().split()
    return int(pid), float(created)


def _running(pid: int, created: float) -> bool:
    """Is that very process (not a later one with its pid) still running? It may vanish mid-call."""
    try:
        p = psutil.Process(pid)
        return p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
def test_a_hang_times_out_and_leaves_no_process(tmp_path, wait_for):
    # Only a hang of *started* ranks tests the clean-up, and how long start-up takes depends on the
    # machine's load: if a limit ran out before both ranks and the grandchild announced themselves,
    # try again with twice the limit (bounded), checking that nothing survived every time. How long
    # ending the job took is a bench row (bench_launch.py), not an assertion.
    limits = (10, 20, 40)
    for attempt, timeout in enumerate(limits):
        pid_file = tmp_path / f"attempt{attempt}" / "pid"
        pid_file.parent.mkdir()
        with pytest.raises(LaunchError) as info:  # a job that never returns cannot succeed
            torchrun(ranks.hang, 2, args=(str(pid_file),), timeout=timeout)
        procs = {s: _announced(Path(f"{pid_file}.{s}")) for s in ("0", "1", "child")}

        def survivors() -> list[str]:
            return [s for s, p in procs.items() if p and _running(*p)]

        wait_for(lambda: not survivors(), timeout=10)  # SIGKILL takes effect asynchronously
        assert survivors() == [], f"processes of the job survived: {procs}"
        if all(procs.values()):
            break
    else:
        pytest.fail(f"the ranks had not started when the limit ran out, at {[t * time_scale() for t in limits]} s: "
                    "the machine is too busy (DISTLAB_TIME_SCALE multiplies the limits)")
    # Both ranks were running and hung: only the time limit can have ended the job.
    assert info.type is LaunchTimeout, f"expected the time limit to end the job: {info.value!r}"
    assert info.value.unfinished == [0, 1]
    # where each rank was when the limit came, from the heartbeats read by then: in its sleep, at its own line
    for rank in filter(None, info.value.where.split("; ")):
        assert re.fullmatch(r"rank [01] is at ranks\.py:\d+ in \w+ \(time\.sleep\(600\)\)", rank), info.value.where


@pytest.mark.slow
def test_a_killed_rank_is_named_and_elastic_restart_recovers():
    with pytest.raises(LaunchError, match=r"rank 1 was killed by signal 9 \(SIGKILL\)"):
        torchrun(ranks.sigkill_first_attempt, 2, timeout=60)
    run = torchrun(ranks.sigkill_first_attempt, 2, timeout=90, max_restarts=1)
    assert run.results == [1, 1], "both ranks should finish on the second attempt"
    # a restarted job that fails again fails for its last attempt's reason, not the kill before it (nor the
    # peer's lost connection then)
    with pytest.raises(RankFailure, match=r"rank 0 failed: ValueError: attempt 1 went wrong"):
        torchrun(ranks.killed_then_raises, 2, timeout=90, max_restarts=1)
    # a rank that leaves with a non-zero code and no exception (os._exit) is the cause, not its peer's lost
    # connection (a blind audit's: the grader pinned it on whichever rank's error came first)
    with pytest.raises(LaunchError, match=r"rank 1 exited with code 3 without raising a Python exception"):
        torchrun(ranks.exits_quietly, 2, timeout=60)


def test_a_rank_killed_by_sigpipe_is_its_peers_victim_not_the_cause(tmp_path):
    """No launch: CI run B's race. Rank 1 left with os._exit(3); rank 0's next send to it raised SIGPIPE and
    killed it. The rank that left is the cause; a SIGPIPE is named only where no rank died otherwise."""
    from distlab.runtime.failures import RankExited, RankKilled, failure

    output = "rank : 0 (local_rank: 0)\n  exitcode : -13 (pid: 1)\nrank : 1 (local_rank: 1)\n  exitcode : 3 (pid: 2)\n"
    said = failure(tmp_path, 1, 2, set(), output)
    assert isinstance(said, RankExited) and said.rank == 1, said
    alone = failure(tmp_path, 1, 2, set(), "rank : 0 (local_rank: 0)\n  exitcode : -13 (pid: 1)\n")
    assert isinstance(alone, RankKilled) and alone.rank == 0, alone


@pytest.mark.slow
def test_a_result_the_launcher_cannot_load_safely_is_a_named_error():
    with pytest.raises(RankFailure, match=r"rank 0 failed: TypeError: the function returned a Fraction"):
        torchrun(ranks.return_unloadable, 1, timeout=60)


def test_functions_the_workers_cannot_import_are_refused():
    def local():
        pass

    with pytest.raises(ValueError, match="not importable"):
        torchrun(local, 2)


@pytest.mark.slow
def test_cell_magic_runs_the_cell_on_every_rank_and_returns_results(capsys):
    namespace: dict = {}
    cell = "import os\nprint('hello from', os.environ['RANK'])\nresult = {'rank': int(os.environ['RANK'])}\n"
    torchrun_cell("-n 2 -t 60 --result got", cell, namespace)
    out = capsys.readouterr().out
    assert "[rank0] hello from 0" in out and "[rank1] hello from 1" in out
    assert namespace["got"] == [{"rank": 0}, {"rank": 1}]


@pytest.mark.slow
def test_cell_magic_raises_one_line_naming_the_failing_rank():
    with pytest.raises(TorchrunCellError) as info:
        torchrun_cell("-n 2 -t 60", "import os\nif os.environ['RANK'] == '1':\n    1 / 0\n")
    assert str(info.value) == "torchrun: rank 1 failed: ZeroDivisionError: division by zero"


def test_no_job_process_outlives_the_tests(leftover_processes):
    assert leftover_processes() == []
