"""Context parallelism as practised (distlab.lab.context_parallel.allgather), one 4-rank launch (at 2 ranks a ring
also holds the whole sequence's k and v, so the memory would not tell the variants apart): the all-gather
variant equals one process's attention forward and backward, the ring forward (its backward is exercise 10's,
whose bytes tests/exercises/test_ex10_ring_attention.py checks); what each sends and holds; the weights'
gradients summed over the CP group are one process's."""
import pytest

from distlab import torchrun


@pytest.fixture(scope="module")
def runs():
    return torchrun("distlab.lab.context_parallel.allgather:practised_job", 4, timeout=300).results


def test_both_variants_are_one_processs_attention(runs):
    for run in runs:
        for name in ("ring", "all-gather"):
            assert run["variants"][name]["max_diff"] < 1e-5, name
        assert run["variants"]["ring"]["ops"] == ["recv", "send"]
        assert run["variants"]["all-gather"]["ops"] == ["all_gather", "reduce_scatter"]


def test_the_same_bytes_forward_fewer_backward_and_the_whole_k_v_held(runs):
    world = len(runs)
    for run in runs:
        ring, gather = run["variants"]["ring"], run["variants"]["all-gather"]
        kv = 2 * ring["shard_bytes"]  # one rank's packed (k, v)
        assert ring["forward_bytes"] == gather["forward_bytes"] == (world - 1) * kv
        # the gather reduce-scatters (dk, dv): (W - 1) kv, where the ring's backward (exercise 10) sends (2 W - 1) kv
        assert ring["backward_bytes"] is None and gather["backward_bytes"] == (world - 1) * kv
        # every rank's k and v at once, against the ring's two shards and their buffers in flight
        assert gather["peak"] >= world * kv and gather["peak"] > ring["peak"]


def test_each_ranks_weight_gradient_is_partial_until_summed_over_the_group(runs):
    for run in runs:
        w = run["weights"]
        assert w["before"] > 0.1 * w["scale"] and w["after"] < 1e-5 * max(1.0, w["scale"])
