"""The planner's arithmetic (distlab.lab.planner), held to the course's other accountings; its widget.

Pure functions, milliseconds: the parameter count against the real tiny transformer, ZeRO's bytes
against ``comm_volume.zero_prediction``, tensor parallelism's against ``activation_memory``, the
bubble formula. What the planner predicts for a real run is checked against that run: FSDP x TP in
``tests/distlab/test_mesh2d.py``; pipeline, context and expert parallelism here, in one launch of 4 ranks of the
three labs' own rank programs (``distlab.lab.planner_runs``, marked slow).
"""
import ipywidgets as widgets
import pytest

from distlab.lab.activation_memory import tp_comm_bytes_per_layer
from distlab.lab.comm_volume import zero_prediction
from dataclasses import replace

from distlab.lab.planner import (Cluster, Layout, Model, Training, active_params, collectives, in_flight_micro_batches,
                                 layer_params, layouts, memory_per_gpu, plan, plan_layout, pp_sends, stage_params,
                                 valid)
from distlab.lab.planner_time import link, spans_nodes
from distlab.lab import planner_runs
from distlab.lab.pipeline.timeline import bubble_fraction, ideal_schedule, stage_orders
from distlab.lab.planner_widget import H100_NODES, Planner
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


def test_a_schedules_own_order_replayed_in_slots_gives_its_bubble():
    """The hook the measured check uses: ideal_schedule(order=stage_orders(events)) replays a timeline's order."""
    for schedule in ("gpipe", "1f1b"):
        events = ideal_schedule(4, 8, schedule)
        replayed = ideal_schedule(4, 8, order=stage_orders(events))
        assert bubble_fraction(replayed) == pytest.approx(bubble_fraction(events)) == pytest.approx(3 / 11)
    # a middle stage sends both ways, an end stage one way
    assert [pp_sends(4, 8, s) for s in range(4)] == [8, 16, 16, 8] and pp_sends(4, 8) == 16 and pp_sends(1, 8) == 0


@pytest.fixture(scope="module")
def lab_runs():
    return planner_runs.run_planner_runs(4, timeout=120)


def _rows(inputs, dim):
    return [r for r in collectives(*inputs) if r["dim"] == dim]


@pytest.mark.slow
def test_the_planner_predicts_the_pipeline_labs_sends_bubble_and_activations(lab_runs):
    """torch.distributed.pipelining at p = 4 (distlab.lab.pipeline.run.pipelined_step): each stage's sends as
    CollectiveRecorder records them equal pp_sends (the planner's row is the busiest stage's), every size the
    planner's activation; the bubble in slots of the order torch ran equals the planner's (p-1)/(m+p-1) (wall
    time is not compared: planner_runs' docstring); stage 0's saved bytes under 1F1B are min(p, m) micro-batches'."""
    p = len(lab_runs)
    for schedule, m in planner_runs.PP_RUNS:
        per_rank = [r["pp"][(schedule, m)] for r in lab_runs]
        assert all(r["grads_match"] for r in per_rank), [r["max_grad_diff"] for r in per_rank]
        inputs = planner_runs.pp_inputs(p, m)
        (row,) = _rows(inputs, "pp")
        for stage, run in enumerate(per_rank):
            assert planner_runs.sends(run["ops"]) == {row["bytes"]: pp_sends(p, m, stage)}, (schedule, m, stage)
        assert row["calls"] == max(pp_sends(p, m, s) for s in range(p))
        bubble = plan_layout(*inputs, CLUSTER)["bubble"]
        assert planner_runs.slot_bubble(per_rank, p, m) == pytest.approx(bubble), (schedule, m)
    one = [r["pp"][("gpipe", 4)]["saved_peak_bytes"] // 4 for r in lab_runs]  # GPipe: all 4 in flight
    for m in (4, 8):
        held = [r["pp"][("1f1b", m)]["saved_peak_bytes"] for r in lab_runs]
        assert held == [in_flight_micro_batches(p, m, s) * one[s] for s in range(p)], (m, held, one)


@pytest.mark.slow
def test_the_planner_predicts_the_rings_sends(lab_runs):
    """Notebook 10's ring (parity_report, W = 4): parity with SDPA, and the planner's cp rows equal the recorded
    forward sends plus the backward's, which exercise 10 builds (tests/exercises/test_ex10_ring_attention.py checks
    the reference solution's recorded backward against the same rows)."""
    rows = _rows(planner_runs.cp_inputs(len(lab_runs)), "cp")
    for run in lab_runs:
        cp = run["cp"]
        assert cp["out"] < 1e-5 and cp["other_ops"] == [], cp  # SDPA's
        # W - 1 exchanges of (k, v) forward; backward W - 1 of (k, v, dk, dv) and the last of (dk, dv) home
        world, shard = len(lab_runs), cp["shard_bytes"]
        assert cp["sends"] == world - 1 and cp["bytes"] == (world - 1) * 2 * shard
        assert sum(r["calls"] for r in rows) == cp["sends"] + world
        assert sum(r["calls"] * r["bytes"] for r in rows) == cp["bytes"] + (4 * world - 2) * shard
        assert {r["bytes"] for r in rows} == {2 * cp["shard_bytes"], 4 * cp["shard_bytes"]}


@pytest.mark.slow
def test_the_planner_predicts_the_moe_labs_all_to_alls(lab_runs):
    """Notebook 11's padded dispatch (ep_report, one expert a rank, W = 4): parity with the single-process MoE,
    the counts exchanged, and four all-to-alls of W x C rows, the planner's."""
    (row,) = _rows(planner_runs.ep_inputs(len(lab_runs)), "ep")
    for run in lab_runs:
        ep = run["ep"]
        assert ep["y_diff"] == 0 and ep["x_grad_diff"] == 0, ep         # the same adds, in the same order
        assert ep["expert_grad_diff"] < 1e-5 and ep["router_grad_diff"] < 1e-5, ep  # summed in another order
        assert ep["a2a_counts"] == {"all-to-all": 4} and ep["count_exchange"]["all_to_all"]["calls"] == 1
        measured = ep["a2a"]["all_to_all"]
        assert (measured["calls"], measured["bytes"]) == (row["calls"], row["calls"] * row["bytes"]), (measured, row)
        assert measured["wire_bytes"] == row["calls"] * wire_bytes("all_to_all", row["bytes"], row["group"])
    for r, run in enumerate(lab_runs):   # what each rank received is what the others said they would send
        assert run["ep"]["recv_counts"] == [other["ep"]["send_counts"][r] for other in lab_runs]


# -- time (distlab.lab.planner_time): compute, the bubble as idle compute, links, overlap ----------------------
LLAMA3_8B = Model(layers=32, hidden=4096, heads=32, seq=8192, vocab=128256)  # notebook 12's
H100S = H100_NODES


def test_compute_is_six_n_per_token_eight_with_full_recomputation_and_the_bubble_idles_it():
    t = Training(batch=256, micro_batches=16)
    n = active_params(LLAMA3_8B)
    assert n == sum(p for k, p in stage_params(LLAMA3_8B, Layout()).items() if k != "per_layer")
    step = plan_layout(LLAMA3_8B, Layout(fsdp=16), t, H100S)["time"]
    assert step["compute"] == pytest.approx(6 * n * 256 * 8192 / (16 * 989e12 * 0.4))
    full = plan_layout(LLAMA3_8B, Layout(fsdp=16), Training(batch=256, micro_batches=16, recompute="full"), H100S)
    assert full["time"]["compute"] == pytest.approx(step["compute"] * 8 / 6)
    piped = plan_layout(LLAMA3_8B, Layout(fsdp=4, pp=4), t, H100S)["time"]
    assert piped["bubble"] == pytest.approx(piped["compute"] * 3 / 16)  # (p - 1) / m of the compute
    # a MoE computes with its active experts only
    moe = Model(layers=4, hidden=64, heads=4, seq=16, vocab=100, experts=8, top_k=2)
    dense = Model(layers=4, hidden=64, heads=4, seq=16, vocab=100)
    expert_mlp = layer_params(dense)["mlp"]
    assert active_params(moe) == pytest.approx(active_params(dense) + 4 * expert_mlp)  # 2 experts where 1 was


def test_a_group_is_priced_on_the_slowest_link_it_spans():
    lo = Layout(tp=8, pp=2)
    assert not spans_nodes(("tp",), lo, 8) and spans_nodes(("pp",), lo, 8)
    assert link(("tp",), lo, H100S) == (H100S.bandwidth, H100S.latency)
    assert link(("pp",), lo, H100S) == (H100S.inter_bandwidth, H100S.inter_latency)
    pp_inside = replace(H100S, placement=("pp", "fsdp", "dp", "cp", "ep", "tp"))
    assert spans_nodes(("tp",), lo, 8, pp_inside.placement) and not spans_nodes(("pp",), lo, 8, pp_inside.placement)
    # the data-parallel all-reduce over dp x cp x ep spans what its outermost degree spans
    assert spans_nodes(("dp", "cp", "ep"), Layout(dp=2, cp=8), 8) and spans_nodes(("dp", "cp"), Layout(cp=8, tp=2), 8)
    assert not spans_nodes(("dp", "cp"), Layout(cp=4, tp=2, pp=2), 8)  # ranks 2 apart, 4 of them: 8 in a node
    assert not spans_nodes(("tp",), Layout(tp=16), 0)  # one node


def test_data_parallel_communication_hides_behind_the_compute_and_the_rest_waits():
    t = Training(batch=256, micro_batches=16)
    for lo, window in ((Layout(fsdp=16), 1.0), (Layout(dp=16), 2 / 3), (Layout(fsdp=8, tp=2), 1.0)):
        step = plan_layout(LLAMA3_8B, lo, t, H100S)["time"]
        assert step["exposed"] == pytest.approx(max(0.0, step["overlappable"] - window * step["compute"]))
        assert step["step"] == pytest.approx(step["compute"] + step["bubble"] + step["critical"] + step["exposed"])
    assert plan_layout(LLAMA3_8B, Layout(fsdp=16), t, H100S)["time"]["critical"] == 0
    assert plan_layout(LLAMA3_8B, Layout(fsdp=8, tp=2), t, H100S)["time"]["critical"] > 0


def test_the_rules_notebook_12_derives_for_a_llama_3_8b_shape_on_two_nodes():
    t = Training(batch=256, micro_batches=16, recompute="selective", sp=True)
    ranked = plan(LLAMA3_8B, H100S, t)
    best = ranked[0]["layout"]
    # FSDP first, sharded within a node and replicated across (no tp, pp or cp: nothing on the critical path)
    assert ranked[0]["fits"] and best.tp == best.pp == best.cp == 1 and 1 < best.fsdp <= 8 and best.dp > 1
    # TP within a node, PP across: the same degrees placed the other way take far longer
    lo = Layout(tp=8, pp=2)
    inside = plan_layout(LLAMA3_8B, lo, t, H100S)["time"]["step"]
    across = plan_layout(LLAMA3_8B, lo, t, replace(H100S, placement=("pp", "fsdp", "dp", "cp", "ep", "tp")))
    assert across["time"]["step"] > 2 * inside
    # without a peak nothing is timed but the communication, and the plan ranks by it
    untimed = plan(LLAMA3_8B, replace(H100S, peak_flops=0.0), t)
    fitting = [r["comm_s"] for r in untimed if r["fits"]]
    assert fitting == sorted(fitting) and all(r["time"]["compute"] == 0 for r in untimed)
