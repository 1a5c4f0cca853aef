"""What a stuck rank waits in (distlab.runtime.waits), read from stacks as the heartbeat samples them: the
learner's own collective, or one a library issues below the learner's line (DDP, FSDP2, a pipeline schedule),
and DDP's all-reduce of the gradients, which has no Python frame. The real launches are in
tests/autograder/test_progress.py."""
from __future__ import annotations

import os

from distlab.runtime.waits import DDP_ALL_REDUCE, describe

TORCH = os.path.join(os.sep, "venv", "lib", "python3.11", "site-packages", "torch")
LEARNER = os.path.join(os.sep, "home", "learner", "ex01_ddp.py")


def stack(*frames: tuple[str, str]) -> list[tuple[str, int, str]]:
    """(path under torch, or "learner"; function) pairs, outermost first."""
    return [(LEARNER if where == "learner" else os.path.join(TORCH, *where.split("/")), 10 + i, fn)
            for i, (where, fn) in enumerate(frames)]


DDP_FORWARD = [("learner", "train_ddp"), ("nn/modules/module.py", "_call_impl"),
               ("nn/parallel/distributed.py", "forward")]


def test_the_learners_own_collective_is_named_by_its_function():
    frames = stack(("learner", "train"), ("distributed/c10d_logger.py", "wrapper"),
                   ("distributed/distributed_c10d.py", "all_reduce"))
    assert describe(frames)["waits_in"] == "all_reduce"


def test_a_collective_the_learner_calls_inside_a_ddp_forward_is_the_learners_not_ddps():
    frames = stack(*DDP_FORWARD, ("learner", "forward"), ("distributed/distributed_c10d.py", "all_reduce"))
    assert describe(frames)["waits_in"] == "all_reduce"


def test_library_collectives_are_named_by_the_library_that_issued_them():
    fsdp = stack(("learner", "train"), ("distributed/fsdp/_fully_shard/_fsdp_collectives.py", "foreach_all_gather"),
                 ("distributed/distributed_c10d.py", "all_gather_single"))
    assert describe(fsdp)["waits_in"] == "FSDP's all-gather of the parameters"
    reduce = stack(("learner", "train"), ("distributed/fsdp/_fully_shard/_fsdp_collectives.py", "foreach_reduce"),
                   ("distributed/distributed_c10d.py", "reduce_scatter_tensor"))
    assert describe(reduce)["waits_in"] == "FSDP's reduce-scatter of the gradients"
    pipeline = stack(("learner", "train"), ("distributed/pipelining/schedules.py", "step"),
                     ("distributed/pipelining/schedules.py", "_wait_batch_p2p"))
    assert describe(pipeline)["waits_in"] == "the pipeline schedule's send/receive"
    full = stack(("learner", "export"), ("distributed/tensor/_api.py", "full_tensor"),
                 ("distributed/tensor/_api.py", "redistribute"),
                 ("distributed/tensor/_redistribute.py", "redistribute_local_tensor"),
                 ("distributed/_functional_collectives.py", "wait"))
    assert describe(full)["waits_in"] == "DTensor's all-gather of full_tensor()"
    rebuild = stack(*DDP_FORWARD, ("nn/parallel/distributed.py", "_pre_forward"))
    assert describe(rebuild)["waits_in"] == "DDP's broadcast before the forward"


def test_ddps_all_reduce_is_the_backward_once_every_gradient_is_in_and_not_before():
    backward = stack(("learner", "train_ddp"), ("_tensor.py", "backward"), ("autograd/__init__.py", "backward"),
                     ("autograd/graph.py", "_engine_run_backward"))
    assert describe(backward, ddp_reducing=True)["waits_in"] == DDP_ALL_REDUCE
    assert describe(backward, ddp_reducing=False)["waits_in"] is None  # still computing: slow, not stuck
    forward = stack(*DDP_FORWARD, ("learner", "forward"))
    assert describe(forward, ddp_reducing=True)["waits_in"] is None  # not in a backward
