"""On GPUs: the launcher picks NCCL and collectives run on each rank's own device.

Skipped, with the reason, on a machine without enough CUDA GPUs (``requires_gpus``); the same
launches run on gloo and the CPU in tests/distlab/test_launch.py."""
from __future__ import annotations

import torch

from distlab import torchrun
from tests.helpers import requires_gpus
from tests.helpers.targets import ranks


@requires_gpus(1)
def test_one_rank_on_a_gpu_picks_nccl_and_all_reduces_on_the_device():
    run = torchrun(ranks.allreduce_on_device, 1, timeout=120)
    assert run.backend == "nccl"
    (result,) = run.results
    assert (result["backend"], result["device"]) == ("nccl", "cuda:0")
    torch.testing.assert_close(result["sum"], torch.tensor([1.0]), rtol=0, atol=0)


@requires_gpus(2)
def test_two_ranks_each_use_their_own_gpu_and_all_reduce_over_nccl():
    run = torchrun(ranks.allreduce_on_device, 2, timeout=120)
    assert run.backend == "nccl"
    assert [(r["rank"], r["backend"], r["device"]) for r in run.results] == [(0, "nccl", "cuda:0"),
                                                                             (1, "nccl", "cuda:1")]
    for r in run.results:
        torch.testing.assert_close(r["sum"], torch.tensor([3.0]), rtol=0, atol=0)  # 1 + 2: exact
