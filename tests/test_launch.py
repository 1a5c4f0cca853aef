"""The launcher: results come back, failures are named, nothing survives, ports never collide."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import psutil
import pytest
import torch

from distlab import LaunchError, LaunchTimeout, RankFailure, torchrun
from distlab.magic import TorchrunCellError, torchrun_cell
from tests.helpers import session_processes
from tests.targets import ranks


def test_results_come_back_per_rank_with_prefixed_output():
    run = torchrun(ranks.allreduce_rank, 2, timeout=60)
    assert [r["rank"] for r in run.results] == [0, 1]
    for r in run.results:
        torch.testing.assert_close(r["sum"], torch.tensor([3.0]))  # 1 + 2: exact, two small integers
        assert r["world"] == 2 and r["backend"] == "gloo"
    assert run.rank_lines(0) == ["sum is 3"] and run.rank_lines(1) == ["sum is 3"]


def test_concurrent_launches_get_their_own_ports():
    runs: list = [None, None]

    def go(i):
        runs[i] = torchrun(ranks.allreduce_rank, 2, timeout=90)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ports = {r.results[0]["port"] for r in runs}
    assert len(ports) == 2, "two jobs at once must rendezvous on different ports"


def test_a_failing_rank_is_named_with_its_exception():
    with pytest.raises(RankFailure) as info:
        torchrun(ranks.raise_on_rank1, 2, timeout=60)
    assert info.value.rank == 1 and info.value.exc_type == "ValueError"
    assert str(info.value) == "rank 1 failed: ValueError: rank one is unhappy"
    assert "raise_on_rank1" in info.value.traceback


def test_a_hang_times_out_and_leaves_no_process(tmp_path):
    pid_file = str(tmp_path / "pid")
    start = time.monotonic()
    with pytest.raises(LaunchTimeout) as info:
        torchrun(ranks.hang, 2, args=(pid_file,), timeout=10)
    assert time.monotonic() - start < 10 + 10, "ending the job took too long"
    assert info.value.unfinished == [0, 1]
    pids = [int(Path(f"{pid_file}.{s}").read_text()) for s in ("0", "1", "child")
            if Path(f"{pid_file}.{s}").exists()]
    assert len(pids) >= 2, "the ranks never started: the timeout is too short for this machine"
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"processes of the job survived: {alive}"


def test_a_killed_rank_is_named_and_elastic_restart_recovers():
    with pytest.raises(LaunchError, match=r"rank 1 was killed by signal 9 \(SIGKILL\)"):
        torchrun(ranks.sigkill_first_attempt, 2, timeout=60)
    run = torchrun(ranks.sigkill_first_attempt, 2, timeout=90, max_restarts=1)
    assert run.results == [1, 1], "both ranks should finish on the second attempt"


def test_a_result_the_launcher_cannot_load_safely_is_a_named_error():
    with pytest.raises(RankFailure, match=r"rank 0 failed: TypeError: the function returned a Fraction"):
        torchrun(ranks.return_unloadable, 1, timeout=60)


def test_functions_the_workers_cannot_import_are_refused():
    def local():
        pass

    with pytest.raises(ValueError, match="not importable"):
        torchrun(local, 2)


def test_cell_magic_runs_the_cell_on_every_rank_and_returns_results(capsys):
    namespace: dict = {}
    cell = "import os\nprint('hello from', os.environ['RANK'])\nresult = {'rank': int(os.environ['RANK'])}\n"
    torchrun_cell("-n 2 -t 60 --result got", cell, namespace)
    out = capsys.readouterr().out
    assert "[rank0] hello from 0" in out and "[rank1] hello from 1" in out
    assert namespace["got"] == [{"rank": 0}, {"rank": 1}]


def test_cell_magic_raises_one_line_naming_the_failing_rank():
    with pytest.raises(TorchrunCellError) as info:
        torchrun_cell("-n 2 -t 60", "import os\nif os.environ['RANK'] == '1':\n    1 / 0\n")
    assert str(info.value) == "torchrun: rank 1 failed: ZeroDivisionError: division by zero"


def test_no_job_process_outlives_the_tests():
    assert session_processes() == []
