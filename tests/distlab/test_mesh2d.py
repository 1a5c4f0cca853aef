"""Two parallelisms at once (distlab.lab.mesh2d): the tiny transformer on a 2 x 2 mesh, FSDP over dp x TP over tp,
and the planner (distlab.lab.planner) against what that run holds and sends.

One launch of 4 ranks (module fixture), checked for: parity with the single-process reference (each
step's loss, every rank's final weights), what each rank holds (a quarter of each split matrix, half of
the rest; the bytes of its parameters, gradients and momentum), the collectives of one step (counted by
``CollectiveRecorder``: kinds, calls, sizes), and the planner's prediction of both, which must be exact.
"""
import math

import pytest

from distlab.lab.mesh2d import comm_by_dimension, parity, run_mesh2d
from distlab.lab.planner import Layout, Model, Training, collectives, memory_per_gpu
from distlab.measure.comm import label, wire_bytes
from distlab.transformer import TransformerConfig

pytestmark = pytest.mark.slow

SPLIT = ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "mlp.w1.weight", "mlp.w1.bias", "mlp.w2.weight")
#: The run's layout and training, as the planner names them (the mesh's "dp" dimension is FSDP's).
LAYOUT, TRAINING = Layout(fsdp=2, tp=2), Training(batch=8, precision="fp32", optimizer="sgd+momentum")
MODEL = Model.of(TransformerConfig(), seq=32)


@pytest.fixture(scope="module")
def runs():
    return run_mesh2d(timeout=120, with_reference=True)


def test_fsdp_times_tp_matches_one_process(runs):
    """Loss and weights after 3 SGD-with-momentum steps within float rounding of the unsharded model (trained
    alone by rank 0, where torch.optim's imports are preloaded; no collective runs in it)."""
    ref = runs[0]["reference"]
    assert ref is not None and all(r["reference"] is None for r in runs[1:])
    diff = parity(runs, ref)
    assert diff["loss"] < 1e-5 * max(ref["losses"]), diff
    assert diff["weight_rel"] < 1e-5, diff
    assert sorted(r["coordinate"] for r in runs) == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_each_rank_holds_a_quarter_of_each_split_matrix_and_half_of_the_rest(runs):
    for run in runs:
        for name, (full, local, placements) in run["shapes"].items():
            split = any(s in name for s in SPLIT)
            assert math.prod(local) * (4 if split else 2) == math.prod(full), (run["rank"], name, full, local)
            assert placements.count("Shard(") == (2 if split else 1), (name, placements)  # _StridedShard too


def test_the_planner_predicts_the_bytes_each_rank_holds(runs):
    """training_memory's model states of the planner's stage, ZeRO-3 over fsdp: exact (nothing is padded)."""
    predicted = memory_per_gpu(MODEL, LAYOUT, TRAINING)
    for run in runs:
        held = run["held"]
        assert held["params"] == predicted["params"] == 41664, (held, predicted)
        assert held["grads"] == predicted["grads"] and held["optimizer"] == predicted["optimizer"], (held, predicted)


def test_the_planner_predicts_every_collective_of_a_step(runs):
    """Recorded by CollectiveRecorder on every rank: FSDP's all-gathers and reduce-scatters over dp, TP's
    four all-reduces a layer over tp, nothing else; the planner's calls, sizes and bytes sent, exactly."""
    predicted: dict = {}
    for row in collectives(MODEL, LAYOUT, TRAINING):
        dim = {"fsdp": "dp"}.get(row["dim"], row["dim"])  # the mesh names FSDP's dimension "dp"
        cell = predicted.setdefault(dim, {}).setdefault(label(row["kind"]), {"calls": 0, "bytes": 0, "wire_bytes": 0})
        cell["calls"] += row["calls"]
        cell["bytes"] += row["calls"] * row["bytes"]
        cell["wire_bytes"] += row["calls"] * wire_bytes(row["kind"], row["bytes"], row["group"])
    for run in runs:
        measured = comm_by_dimension(run["ops"], run["group_sizes"])
        assert measured == predicted, (run["rank"], measured, predicted)
    assert predicted["tp"]["all-reduce"]["calls"] == 4 * MODEL.layers
    assert predicted["dp"]["all-gather"]["calls"] == 2 * MODEL.layers + 1  # the root is gathered once
