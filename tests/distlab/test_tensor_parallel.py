"""Tensor parallelism as notebook 08 teaches it (distlab.lab.tensor_parallel, distlab.lab.activation_memory).

The unit tests check the arithmetic: Korthikanti et al.'s per-layer table and the
communication it implies. The launch test runs one job of 2 ranks (distlab.lab.tensor_parallel.tp_job)
and checks, from byte counts and op counts only (no times): the DTensor-parallelized model
against the unsplit one, the collectives ``CommDebugMode`` counts, the bytes a rank holds and
saves, and sequence parallelism's communication volume.
"""
import pytest

from distlab.lab.activation_memory import (PRESETS, per_rank, resmlp_saved_bytes, tp_collectives_per_layer,
                                       tp_comm_bytes_per_layer, transformer_layer_bytes)
from distlab.measure.comm import collective_kind, label, wire_bytes

S, B, H, A = 2048, 1, 4096, 32


def test_korthikanti_table_2():
    sbh = S * B * H
    scores = 5 * A * S / H
    assert transformer_layer_bytes(S, B, H, A) == pytest.approx(sbh * (34 + scores))
    assert transformer_layer_bytes(S, B, H, A, tp=8) == pytest.approx(sbh * (10 + 24 / 8 + scores / 8))
    assert transformer_layer_bytes(S, B, H, A, tp=8, sp=True) == pytest.approx(sbh * (34 / 8 + scores / 8))
    assert transformer_layer_bytes(S, B, H, A, tp=8, recompute="selective") == pytest.approx(sbh * (10 + 24 / 8))
    assert transformer_layer_bytes(S, B, H, A, tp=8, recompute="full") == 2 * sbh
    assert transformer_layer_bytes(S, B, H, A, tp=8, sp=True, recompute="full") == 2 * sbh / 8
    # with t = 1 sequence parallelism changes nothing
    assert transformer_layer_bytes(S, B, H, A, sp=True) == pytest.approx(transformer_layer_bytes(S, B, H, A))
    with pytest.raises(ValueError):
        transformer_layer_bytes(S, B, H, A, recompute="some")


def test_tp_communication_per_layer():
    assert tp_collectives_per_layer(1) == {}
    assert tp_collectives_per_layer(4) == {"all-reduce": 4}
    assert tp_collectives_per_layer(4, sp=True) == {"all-gather": 4, "reduce-scatter": 4}
    assert tp_collectives_per_layer(4, recompute="full") == {"all-reduce": 6}  # the forward runs twice
    ar = tp_comm_bytes_per_layer(S, B, H, tp=4)
    assert ar == 4 * 2 * 3 / 4 * S * B * H * 2  # 4 all-reduces of s*b*h bf16, 2(t-1)/t each
    assert tp_comm_bytes_per_layer(S, B, H, tp=4, sp=True) == ar  # reduce-scatter + all-gather = all-reduce
    assert tp_comm_bytes_per_layer(S, B, H, tp=1) == 0


def test_per_rank_divides_the_weights_not_all_the_activations():
    one, four = per_rank("Llama-2 7B", seq=S, tp=1), per_rank("Llama-2 7B", seq=S, tp=4)
    assert four["weight state"] == pytest.approx(one["weight state"] / 4)
    assert one["activations"] / 4 < four["activations"] < one["activations"]  # the 10 s b h term stays
    sp = per_rank("Llama-2 7B", seq=S, tp=4, sp=True)
    assert sp["activations"] == pytest.approx(one["activations"] / 4)
    assert sp["comm per step"] == four["comm per step"] > 0 == one["comm per step"]
    assert set(PRESETS) >= {"Llama-2 7B", "GPT-3 175B"}


def test_collective_kinds_and_ring_factors():
    kind = lambda name: label(collective_kind(name))  # noqa: E731
    assert kind("c10d_functional.all_reduce") == kind("c10d.allreduce_.default") == "all-reduce"
    assert kind("_c10d_functional.all_gather_into_tensor.default") == "all-gather"
    assert kind("c10d._reduce_scatter_base_.default") == "reduce-scatter"
    for w in (2, 4, 8):
        halves = wire_bytes("all-gather", 1.0, w) + wire_bytes("reduce-scatter", 1.0, w)
        assert wire_bytes("all-reduce", 1.0, w) == halves


HIDDEN, DEPTH, BATCH = 64, 3, 8


@pytest.fixture(scope="module")
def two_ranks():
    from distlab.lab.tensor_parallel import run_tp_job

    return run_tp_job(2, timeout=120, hidden=HIDDEN, depth=DEPTH, batch=BATCH, seq=16)


@pytest.mark.slow
def test_tensor_parallel_on_two_ranks(two_ranks):
    """One job of 2 ranks; every figure asserted on every rank.

    Parity: the loss and gradients of the parallelized model equal the unsplit model's up to
    float32 rounding (each output is now the sum of two partial dot products, added in
    another order), hence 1e-5 and not 0. Collectives: exactly one all-reduce per block in
    the forward (``g``) and one in the backward (``f``: the blocks' input needs grad, the
    input layer has parameters). Bytes: exact.
    """
    for run in two_ranks:
        step = run["step"]
        assert run["world"] == 2
        assert step["forward"] == step["backward"] == {"all-reduce": DEPTH}, (step["forward"], step["backward"])
        assert step["loss_diff"] < 1e-5 and step["grad_diff"] < 1e-5, (step["loss_diff"], step["grad_diff"])
        assert run["placements"] == {"fc1.weight": "(Shard(dim=0),)", "fc1.bias": "(Shard(dim=0),)",
                                     "fc2.weight": "(Shard(dim=1),)", "fc2.bias": "(Replicate(),)"}
        assert run["local_shapes"]["fc1.weight"] == run["local_shapes"]["fc2.weight"] == (HIDDEN, HIDDEN)
        local, full = run["matrix_bytes"]
        assert 2 * local == full  # the weight matrices: exactly 1/W
        local, full = run["block_bytes"]
        fc2_bias = 4 * HIDDEN  # replicated: added once, after the all-reduce
        assert local == (full - fc2_bias) // 2 + fc2_bias and abs(local / full - 0.5) < 0.02
        # each rank bytes sent: an all-reduce of a batch x hidden float32 activation per block, 2(W-1)/W of it
        assert step["forward_bytes"] == step["backward_bytes"] == DEPTH * 4 * BATCH * HIDDEN


@pytest.mark.slow
def test_activation_term_matches_a_tensor_parallel_rank(two_ranks):
    """The activation term with t=2 against the bytes a rank saved (DTensors counted by their local shard)."""
    term = resmlp_saved_bytes(BATCH, in_features=HIDDEN, hidden=HIDDEN, depth=DEPTH, out_features=10, tp=2)
    for run in two_ranks:
        measured = run["step"]["saved_bytes"]
        assert abs(term - measured) <= 0.05 * measured, (term, measured)


@pytest.mark.slow
def test_sequence_parallel_sends_what_tensor_parallel_sends(two_ranks):
    for run in two_ranks:
        tp, sp = run["sp"]["tensor parallel"], run["sp"]["sequence parallel"]
        assert tp["forward"] == tp["backward"] == {"all-reduce": 1}
        assert sp["forward"] == sp["backward"] == {"all-gather": 1, "reduce-scatter": 1}
        assert sp["forward_bytes"] + sp["backward_bytes"] == tp["forward_bytes"] + tp["backward_bytes"] > 0
        for s in (tp, sp):
            assert s["out_diff"] < 1e-5 and s["input_grad_diff"] < 1e-5, s  # float32 reduction order
        # the norm's input, mean and rstd are kept for seq/t positions only: (b*s*h + 2*b*s) / 2 floats less
        assert tp["saved_bytes"] - sp["saved_bytes"] == 4 * (2 * 16 * HIDDEN + 2 * 2 * 16) // 2
        assert sp["norm_grad"] == "(Partial(sum),)"
