"""The planner's arithmetic (distlab.lab.planner), held to the course's other accountings; its widget.

Pure functions, milliseconds: the parameter count against the real tiny transformer, ZeRO's bytes
against ``comm_volume.zero_prediction``, tensor parallelism's against ``activation_memory``, the
bubble formula. What the planner predicts for a real run is checked against that run in
``tests/test_mesh2d.py``.
"""
import ipywidgets as widgets
import pytest

from distlab.lab.activation_memory import tp_comm_bytes_per_layer
from distlab.lab.comm_volume import zero_prediction
from distlab.lab.planner import (Cluster, Layout, Model, Training, collectives, layouts, memory_per_gpu, plan,
                                 plan_layout, stage_params, valid)
from distlab.lab.planner_widget import Planner
from distlab.lab.training_memory import training_memory
from distlab.measure.comm import wire_bytes
from distlab.transformer import TransformerConfig, make_transformer

CFG = TransformerConfig()
TINY = Model.of(CFG, seq=32)
BIG = Model(layers=32, hidden=4096, heads=32, seq=4096, vocab=32000)
CLUSTER = Cluster(gpus=8, memory=80e9, bandwidth=100e9, latency=5e-6)


def _wire(rows, dim):
    return sum(r["calls"] * wire_bytes(r["kind"], r["bytes"], r["group"]) for r in rows if r["dim"] == dim)


def test_every_layout_multiplies_to_the_world():
    found = layouts(8)
    assert all(lo.world == 8 for lo in found) and len(set(found)) == len(found)
    assert Layout(fsdp=2, tp=2, pp=2) in found and Layout(dp=8) in found
    assert str(Layout(fsdp=2, tp=2)) == "fsdp 2 x tp 2" and str(Layout()) == "one GPU"


def test_the_parameter_count_is_the_tiny_transformers():
    stage = stage_params(TINY, Layout())
    assert stage["layers"] + stage["root"] == sum(p.numel() for p in make_transformer(0).parameters())
    # unsplit on one GPU: training_memory itself
    assert memory_per_gpu(TINY, Layout(), Training(batch=8))["params"] == training_memory(
        stage["layers"] + stage["root"], precision="bf16")["params"]


def test_fsdp_bytes_are_zero3s():
    """fsdp = W: comm_volume.zero_prediction of one unit per layer and the root, the root gathered once."""
    for reshard_root in (False, True):
        t = Training(batch=8, precision="fp32", reshard_root=reshard_root)
        stage = stage_params(BIG, Layout(fsdp=8))
        units = [(stage["per_layer"] * 4, True)] * BIG.layers + [(stage["root"] * 4, reshard_root)]
        zero = zero_prediction(int((stage["layers"] + stage["root"]) * 4), units, 8)
        assert _wire(collectives(BIG, Layout(fsdp=8), t), "fsdp") == pytest.approx(zero["fsdp"], rel=1e-12)
    # ... and DP's all-reduce is zero_prediction's "ddp", in 25 MB buckets
    rows = collectives(BIG, Layout(dp=8), Training(batch=8, precision="fp32"))
    assert _wire(rows, "dp") == pytest.approx(zero["ddp"], rel=1e-12) and rows[0]["calls"] > 1


def test_tp_bytes_are_activation_memorys():
    t = Training(batch=8, micro_batches=2, sp=True)
    rows = collectives(BIG, Layout(dp=2, tp=4), t)
    per_layer = tp_comm_bytes_per_layer(BIG.seq, 8 // 2 // 2, BIG.hidden, tp=4, sp=True)
    assert _wire(rows, "tp") == pytest.approx(per_layer * BIG.layers * 2)
    assert {r["kind"] for r in rows if r["dim"] == "tp"} == {"all_gather", "reduce_scatter"}


def test_bubble_memory_and_validity():
    t = Training(batch=16, micro_batches=4)
    one, piped = plan_layout(BIG, Layout(fsdp=8), t, CLUSTER), plan_layout(BIG, Layout(fsdp=2, pp=4), t, CLUSTER)
    assert one["bubble"] == 0 and piped["bubble"] == pytest.approx(3 / 7)  # (p-1)/(m+p-1)
    stage = stage_params(BIG, Layout(pp=4))  # a quarter of the layers, and the larger end: embeddings or head
    assert stage["layers"] == stage_params(BIG, Layout())["layers"] / 4
    assert stage["root"] == (BIG.vocab + 1) * BIG.hidden  # the head and the final norm
    assert piped["memory"]["params"] == training_memory(stage["layers"] + stage["root"], precision="bf16",
                                                        world=2, level="full")["params"]
    # 1F1B: the first stage holds p micro-batches of its L/p layers, one micro-batch of all L layers' worth
    assert piped["memory"]["activations"] == memory_per_gpu(BIG, Layout(fsdp=2), t)["activations"] > 0
    assert not valid(TINY, Layout(tp=8), t)  # 4 heads
    assert not valid(BIG, Layout(ep=2, dp=4), t)  # a dense model has no experts to split
    moe = Model(layers=4, hidden=256, heads=4, seq=128, vocab=1000, experts=8, top_k=2)
    rows = collectives(moe, Layout(ep=4, dp=2), Training(batch=8))
    assert {r["kind"] for r in rows if r["dim"] == "ep"} == {"all_to_all"}
    assert memory_per_gpu(moe, Layout(ep=4, dp=2), t)["params"] < memory_per_gpu(moe, Layout(dp=8), t)["params"]


def test_plan_puts_layouts_that_fit_first():
    rows = plan(BIG, CLUSTER, Training(batch=16, micro_batches=4))
    fits = [r["fits"] for r in rows]
    assert any(fits) and not all(fits) and fits == sorted(fits, reverse=True)
    assert all(valid(BIG, r["layout"], Training(batch=16, micro_batches=4)) for r in rows)


def _walk(w):
    yield w
    for child in getattr(w, "children", ()):
        yield from _walk(child)


def test_the_widget_redraws_its_table_on_every_change():
    p = Planner(TINY, Cluster(gpus=4, memory=1e9, bandwidth=1e9, latency=1e-5), Training(batch=8))
    before = p.table.value
    assert "fsdp 2 x tp 2" in before and "fsdp 2 x tp 2" in repr(p)
    p.cluster["gpus"].value = 2
    assert p.table.value != before and "tp 4" not in p.table.value
    p.model["heads"].value = 3  # 3 heads do not split over 2 ranks: no tensor parallelism left
    assert "tp 2" not in p.table.value and "fsdp 2" in p.table.value
    assert not any(isinstance(w, widgets.Output) for w in _walk(p.widget))  # see planner_widget's docstring
