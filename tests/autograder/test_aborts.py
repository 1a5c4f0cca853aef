"""What a rank that gloo aborted was doing, read from the job's output (``autograder.grader.aborts``): its line
and gloo's sizes where the output holds one abort, nothing where it holds two (their lines interleave)."""
from __future__ import annotations

from autograder.grader.aborts import abort_details

GLOO = ("terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
        "  what():  [enforce fail at /gloo/transport/tcp/pair.cc:456] op.preamble.length <= op.nbytes. 8192 vs 4096. "
        "Received data size doesn't match expected size.\n")


def _stack(path) -> str:
    return ("Fatal Python error: Aborted\n\nThread 0x01 (most recent call first):\n"
            '  File "/x/distlab/runtime/heartbeat.py", line 119 in run\n\n'
            "Thread 0x02 (most recent call first):\n"
            '  File "/x/torch/distributed/distributed_c10d.py", line 2799 in recv\n'
            f'  File "{path}", line 3 in stage\n'
            f'  File "{path}", line 6 in step\n'
            '  File "/x/autograder/checks/ex07_pipeline/probes.py", line 120 in _observe\n')


def test_the_learners_innermost_line_and_gloos_sizes_are_said(tmp_path):
    path = tmp_path / "ex07_pipeline.py"
    path.write_text("def stage(buf):\n    import torch.distributed as dist\n    dist.recv(buf, src=0)\n\n"
                    "def step(buf):\n    stage(buf)\n")
    said = abort_details("[rank0] loss 2.3\n" + GLOO + _stack(path), path)
    assert said == ("\n  at ex07_pipeline.py line 3 in stage: dist.recv(buf, src=0)"
                    "\n  gloo received a message of 8,192 bytes into a buffer of 4,096 bytes and aborted the process: "
                    "a send and its receive, and a collective on every rank, move tensors of one size")


def test_two_aborts_or_another_file_say_nothing_they_cannot_be_sure_of(tmp_path):
    path = tmp_path / "ex07_pipeline.py"
    path.write_text("\n" * 10)
    assert abort_details(GLOO + GLOO + _stack(path) + _stack(path), path) == ""  # whose line, whose sizes?
    assert abort_details(_stack(tmp_path / "other.py"), path) == ""  # no frame of the learner's file
    assert abort_details("Segmentation fault\n", path) == ""


def test_a_collective_inside_an_if_on_the_rank_is_said_so(tmp_path):
    # a blind audit's exercise 1: the log's all_reduce inside `if rank == 0:` met DDP's all-reduce of the
    # gradients on rank 1; the feedback named gloo's sizes only
    path = tmp_path / "ex01_ddp.py"
    path.write_text("def stage(buf):\n    import torch.distributed as dist\n    if dist.get_rank() == 0:\n"
                    "        dist.all_reduce(buf)\n\ndef step(buf):\n    stage(buf)\n")
    stack = _stack(path).replace(", line 3 in stage", ", line 4 in stage")
    said = abort_details(GLOO + stack, path)
    assert said.startswith("\n  at ex01_ddp.py line 4 in stage: dist.all_reduce(buf)\n  that collective is inside "
                           "`if dist.get_rank() == 0:` (line 3): only the ranks that test lets through call it"), said
    # a receive inside such an if is a pipeline's design: nothing more is said
    path.write_text("def stage(buf):\n    import torch.distributed as dist\n    if dist.get_rank() == 1:\n"
                    "        dist.recv(buf, src=0)\n\ndef step(buf):\n    stage(buf)\n")
    assert "inside" not in abort_details(GLOO + stack, path)


def test_a_hang_in_a_collective_inside_an_if_on_the_rank_is_said_so(tmp_path):
    from autograder.grader.main import explain
    from distlab.runtime.failures import LaunchHang

    path = tmp_path / "ex01_ddp.py"
    path.write_text("import torch.distributed as dist\n\ndef train(t):\n    if dist.get_rank() == 0:\n"
                    "        dist.all_reduce(t)\n    dist.barrier()\n")
    hang = LaunchHang(10, "rank 0 waits in all_reduce at ex01_ddp.py:5; rank 1 waits in barrier at ex01_ddp.py:6")
    said = explain(hang, path)
    assert said.endswith("waits forever.\n  that collective is inside `if dist.get_rank() == 0:` (line 4): only the "
                         "ranks that test lets through call it, and on them it meets whatever collective the "
                         "others make next"), said
