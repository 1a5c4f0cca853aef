"""Fixtures of the tiers shared by more than one module (a test module never imports another)."""
from __future__ import annotations

import os

import pytest


@pytest.fixture
def cluster():
    """The two-node Slurm cluster of ``distlab/runtime/slurm_cluster.py``, started for the test; skipped with
    the reason where it cannot start (failed instead under ``DISTLAB_REQUIRE_SLURM=1``). Used by
    ``test_slurm_cluster.py`` and ``test_slurm_class.py``."""
    from distlab.runtime import slurm_cluster

    why = slurm_cluster.missing()
    if why:
        if os.environ.get("DISTLAB_REQUIRE_SLURM") == "1":
            pytest.fail(f"DISTLAB_REQUIRE_SLURM=1 but no Slurm cluster can start here: {why}")
        pytest.skip(why)
    with slurm_cluster.SlurmCluster() as c:
        yield c
