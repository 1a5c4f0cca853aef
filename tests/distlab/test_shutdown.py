"""``distlab.shutdown()`` leaves the process group, and no DDP model freed afterwards ends it.

A ``DistributedDataParallel`` freed after ``destroy_process_group`` holds the group's last
reference in its ``Reducer``, whose destructor then joins gloo's worker threads with the GIL
held; a worker that needs the GIL to free the last collective's tensor hangs the rank for good
(notebook 02's sweep hung about 1 launch in 10 on a loaded machine, in a rank that had already
returned). The hang is a race, the join is not: it shows as gloo's threads ending when the model
is freed, on every run.
"""
from __future__ import annotations

import pytest

from distlab import torchrun
from tests.helpers.targets import ranks


@pytest.mark.slow
def test_a_ddp_model_freed_after_shutdown_does_not_end_the_process_group():
    run = torchrun(ranks.threads_when_ddp_outlives_shutdown, 2, timeout=60)
    for rank, counts in enumerate(run.results):
        assert counts["after_ddp_freed"] == counts["after_shutdown"], (
            f"rank {rank}: freeing the DDP model after shutdown() ended gloo's threads "
            f"({counts['after_shutdown']} -> {counts['after_ddp_freed']}): its Reducer destroyed the "
            "process group with the GIL held")
