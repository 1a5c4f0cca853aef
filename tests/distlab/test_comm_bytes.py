"""Bytes per step, DDP against FSDP, counted against the ZeRO accounting (distlab.measure.comm).

The unit tests check the accounting; the launch runs one step of each on 2 ranks and compares the
bytes the collectives carried (deterministic: sizes, not times) with the prediction.
"""
import pytest
from torch import nn

from distlab.lab.comm_volume import padded_bytes, zero_prediction
from distlab.measure.comm import collective_kind, wire_bytes


def test_wire_bytes_use_the_ring_bus_factors():
    assert wire_bytes("all_reduce", 1000, 4) == 1500    # 2(n-1)/n
    assert wire_bytes("all_gather", 1000, 4) == 750     # (n-1)/n
    assert wire_bytes("reduce_scatter", 1000, 2) == 500
    assert wire_bytes("all_reduce", 1000, 1) == 0


@pytest.mark.parametrize("op, kind", [
    ("allreduce_", "all_reduce"), ("_allgather_base_", "all_gather"), ("_reduce_scatter_base_", "reduce_scatter"),
    ("all_gather_into_tensor", "all_gather"), ("broadcast_", "broadcast"), ("reduce_", "reduce"),
    ("monitored_barrier_", "barrier"), ("recv_any_source_", "recv"), ("alltoall_base_", "all_to_all"),
    ("all_to_all_single", "all_to_all"), ("reduce_scatter_tensor", "reduce_scatter")])
def test_collective_kind_from_c10d_names(op, kind):
    assert collective_kind(op) == kind


def test_zero_prediction_is_one_and_a_half_ddp_when_every_unit_reshards():
    units = [(400, True), (600, True)]
    p = zero_prediction(1000, units, world=2)
    assert p["ddp"] == 1000 and p["fsdp"] == 1500 and p["ratio"] == 1.5
    kept = zero_prediction(1000, [(400, True), (600, False)], world=2)  # a root gathered once
    assert kept["fsdp"] == (2 * 400 + 600 + 1000) / 2 and kept["ratio"] < 1.5


def test_padded_bytes_pad_every_parameter_to_a_multiple_of_the_world():
    layer = nn.Linear(3, 5)  # weight 5x3, bias 5: 5 rows pad to 8 on 4 ranks, to 6 on 2
    assert padded_bytes(layer, 4) == 4 * (8 * 3 + 8)
    assert padded_bytes(layer, 2) == 4 * (6 * 3 + 6)
    assert padded_bytes(layer, 1) == 4 * (5 * 3 + 5)


def _bytes_job() -> dict:
    import distlab
    from distlab.lab.comm_volume import allreduce_as_rs_ag, measure_step_bytes

    distlab.init_distributed()
    out = measure_step_bytes()
    out["rs_ag_equal"] = allreduce_as_rs_ag(nbytes=1 << 16, calls=1, repeats=1)["equal"]
    distlab.shutdown()
    return out


@pytest.mark.slow
def test_fsdp_sends_what_zero_predicts_and_ddp_what_its_comm_hook_sees():
    """One job of 2 ranks: one step of notebook 04's model under DDP and FSDP2, every collective
    counted. Within 5% of the ZeRO prediction (it is exact here: the widths are even, so there is
    no padding at 2 ranks); 1.5x DDP when the root reshards too, less when it stays gathered."""
    from distlab import torchrun

    results = torchrun(_bytes_job, 2, timeout=120).results
    for b in results:
        ddp = b["ddp"]
        assert ddp["hook_bytes_per_step"] == ddp["all_reduce"]["bytes"]  # the dispatch mode saw DDP's buckets
        assert ddp["wire_bytes"] == pytest.approx(b["fsdp"]["prediction"]["ddp"], rel=0.05)
        for name in ("fsdp", "fsdp_root_resharded"):
            assert b[name]["wire_bytes"] == pytest.approx(b[name]["prediction"]["fsdp"], rel=0.05), name
        assert b["fsdp_root_resharded"]["wire_bytes"] / ddp["wire_bytes"] == pytest.approx(1.5, rel=0.05)
        assert b["fsdp"]["wire_bytes"] < b["fsdp_root_resharded"]["wire_bytes"]
        assert b["fsdp"]["all_gather"]["calls"] == 1 + 2 * 8 and b["fsdp"]["reduce_scatter"]["calls"] == 1 + 8
        assert b["rs_ag_equal"]
    assert results[0] == results[1]


def test_latency_bandwidth_fit_recovers_both_and_keeps_the_latency_under_large_message_noise():
    from distlab.lab.bandwidth import allreduce_time, bus_factor, fit_latency_bandwidth

    sizes = [4 << 10, 64 << 10, 1 << 20, 16 << 20]
    exact = [dict(bytes=b, time_s=1e-4 + bus_factor(2) * b / 2e9) for b in sizes]  # 2(W-1) alpha = 1e-4 at W=2
    alpha, busbw = fit_latency_bandwidth(exact, 2)
    assert alpha == pytest.approx(5e-5) and busbw == pytest.approx(2e9)
    # the largest message 10 % slow (3 ms, 30x the latency): the latency stays within 10 %
    noisy = exact[:-1] + [dict(exact[-1], time_s=exact[-1]["time_s"] * 1.1)]
    assert fit_latency_bandwidth(noisy, 2)[0] == pytest.approx(5e-5, rel=0.1)
    # the same alpha fitted at W = 4, and the latency at W = 8 is 7x the one at W = 2
    at4 = [dict(bytes=b, time_s=6 * 5e-5 + bus_factor(4) * b / 2e9) for b in sizes]
    assert fit_latency_bandwidth(at4, 4)[0] == pytest.approx(5e-5)
    assert allreduce_time(0, 8, 2e9, alpha) == pytest.approx(7 * allreduce_time(0, 2, 2e9, alpha)) == 7e-4
    assert allreduce_time(1e9, 1, 2e9, alpha) == 0.0


@pytest.mark.parametrize("prefix", ["00b_", "06_", "09_"])
def test_the_primer_and_notebooks_06_and_09_use_the_one_alpha_beta_model(prefix):
    """Issue 28: notebooks 06 and 09 use the primer's α-β model: all three call lab.bandwidth's allreduce_time
    (the model tested above) in a code cell, none a formula of its own."""
    import re

    import jupytext

    from tests.helpers.notebook_exec import COURSE

    (source,) = COURSE.glob(f"{prefix}*.py")
    code = "\n".join(c.source for c in jupytext.read(source).cells if c.cell_type == "code")
    assert re.search(r"^from distlab\.lab\.bandwidth import .*\ballreduce_time\b", code, re.M), source.name
    assert re.search(r"\ballreduce_time\(", code), f"{source.name} imports allreduce_time but never calls it"
    assert not re.search(r"ring_steps\([^)]*\)\s*\*\s*alpha", code), f"{source.name} writes the model out itself"
