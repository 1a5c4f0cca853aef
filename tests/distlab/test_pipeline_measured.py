"""Pipeline parallelism measured against what notebook 07 teaches (distlab.lab.pipeline.sweep).

The unit tests check the instruments on their own (saved-tensor bytes, the message model).
The launch-based test runs GPipe and 1F1B for real on 2 ranks, in one job: stage 0's peak
saved-tensor bytes (deterministic: bytes, not time) and the GPipe bubble on the sized workload
(a ratio of times from one run, never an absolute time).
"""
import pytest
import torch
from torch import nn

from distlab.lab.pipeline.timeline import Event
from distlab.lab.pipeline.costs import SavedBytes, bubble_model, bubble_with_messages, one_way_cost, stage_costs
from distlab.lab.pipeline.sweep import MEMORY, SIZED


def _stage(width: int = 32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())


def test_saved_bytes_counts_each_activation_once_and_frees_it_after_backward():
    meter = SavedBytes(_stage())
    out = meter(torch.randn(4, 8))
    # the input (4x8), two ReLU outputs (4x32; each also the next Linear's saved input): float32
    assert meter.live == meter.peak == 4 * (4 * 8 + 2 * 4 * 32)
    out.sum().backward()
    assert meter.live == 0 and meter.peak == 4 * (4 * 8 + 2 * 4 * 32)


def test_saved_bytes_peak_is_the_micro_batches_alive_at_once():
    meter = SavedBytes(_stage())
    one = 4 * (4 * 8 + 2 * 4 * 32)
    outs = [meter(torch.randn(4, 8)) for _ in range(3)]  # GPipe-like: three forwards, then backwards
    for o in outs:
        o.sum().backward()
    assert meter.peak == 3 * one and meter.live == 0
    meter.reset()
    for _ in range(3):  # one forward, one backward: one micro-batch alive at a time
        meter(torch.randn(4, 8)).sum().backward()
    assert meter.peak == one


def test_saved_bytes_reset_forgets_graphs_from_before():
    meter = SavedBytes(_stage())
    kept = meter(torch.randn(4, 8))  # a graph the step before still holds
    meter.reset()
    meter(torch.randn(4, 8)).sum().backward()
    del kept
    assert meter.live == 0 and meter.peak == 4 * (4 * 8 + 2 * 4 * 32)


def test_message_model():
    costs = [{"bytes": 1000, "round_trip_s": 2e-4}, {"bytes": 3000, "round_trip_s": 6e-4}]
    assert one_way_cost(costs, 2000) == pytest.approx(2e-4)
    assert one_way_cost(costs, 10) == pytest.approx(1e-4)
    # p=2, m=4: the formula 1/5 plus 4 messages' worth of c per stage over the step
    assert bubble_with_messages(2, 4, 1e-3, 0.1) == pytest.approx(0.2 + 0.04)
    assert bubble_with_messages(2, 4, 0.0, 0.1, v=2) == pytest.approx(1 / 9)


def test_bubble_model():
    # equal stages, free messages: the formula (p-1)/(m+p-1), for GPipe's forward 1 and backward 2
    for p, m in ((2, 1), (2, 8), (4, 4)):
        assert bubble_model([1.0] * p, [2.0] * p, m) == pytest.approx((p - 1) / (m + p - 1))
    # a slower stage 0 (2 + 4 against 1 + 2), m = 4: the pipeline streams at its pace; step 3 + 6 + 3 x 6 = 27
    assert bubble_model([2.0, 1.0], [4.0, 2.0], 4) == pytest.approx(1 - 4 * 9 / (2 * 27))
    # overhead and messages add to every slot: slots 1.5 and 2.5, step 3 + 4.5 + 5 + 7.5 = 20
    assert bubble_model([1.0, 1.0], [2.0, 2.0], 4, o=0.25, c=0.25) == pytest.approx(1 - 4 * 6 / (2 * 20))


def test_stage_costs_reads_the_overhead_from_actions_that_wait_for_no_message():
    ev = [Event(0, "F", i, 3.0 * i, 3.0 * i + 2) for i in range(3)]           # stage 0: gaps of 1
    ev += [Event(1, "F", i, 10.0 * i + 5, 10.0 * i + 6) for i in range(3)]    # waits: not overhead
    ev += [Event(1, "B", i, 40.0 + 2.5 * i, 42.0 + 2.5 * i) for i in range(3)]  # last stage: gaps of 0.5
    ev += [Event(0, "B", i, 50.0 + 9 * i, 54.0 + 9 * i) for i in range(3)]
    got = stage_costs(ev, 2)
    assert got["f"] == [2.0, 1.0] and got["b"] == [4.0, 2.0] and got["o"] == pytest.approx(0.75)


def _measure() -> tuple[list[dict], dict]:
    from distlab.lab.pipeline.sweep import sweep

    bubble_runs = [dict(schedule="gpipe", n_microbatches=m, **SIZED) for m in (1, 2, 8)]
    memory_runs = [dict(schedule=s, n_microbatches=m, **MEMORY) for s in ("gpipe", "1f1b") for m in (4, 8)]
    figs, _ = sweep(bubble_runs + memory_runs, 2, messages=False, timeout=120)
    peaks = {(r["schedule"], r["n_microbatches"]): f["saved_peak_bytes"]
             for r, f in zip(memory_runs, figs[len(bubble_runs):])}
    return figs, peaks


@pytest.mark.slow
def test_gpipe_bubble_follows_the_formula_and_1f1b_keeps_fewer_activations():
    """One job of 2 ranks. Deterministic, asserted on every try: gradients match the unsplit
    model's, and stage 0's peak saved bytes are GPipe m x a and 1F1B p x a (a: one micro-batch).

    The bubble is a ratio of times from one run, and it is idle time: a rank that waited for a
    core (another job on this machine) shows up as bubble. So each rank reports the CPU time it
    got while it computed (``cpu_share``); a run in which a rank got under 90 % of it did not
    measure the pipeline, and is measured again (rule 6: at most 3 tries; if no try had its
    cores, the bubble is not asserted and the test says so).

    Within 10 points of (p-1)/(m+p-1): m = 1 and 2. At m = 4 and 8 this 2-core machine
    measures 5-17 points more (notebook 07 shows why: the schedule's own work between two
    actions, and messages that wait for a core while both ranks compute), so there the test
    asserts what holds on any machine: the bubble shrinks as m grows.
    """
    for attempt in (1, 2, 3):
        figs, peaks = _measure()
        assert all(f["grads_match"] for f in figs), [f["max_grad_diff"] for f in figs]
        a = peaks[("gpipe", 4)] // 4
        assert peaks[("gpipe", 8)] == 8 * a and peaks[("1f1b", 4)] == peaks[("1f1b", 8)] == 2 * a
        assert peaks[("1f1b", 4)] < peaks[("gpipe", 4)] and peaks[("1f1b", 8)] < peaks[("gpipe", 8)]
        m1, m2, m8 = figs[:3]
        if min(f["cpu_share"] for f in (m1, m2, m8)) >= 0.9:
            break
    else:
        pytest.skip(f"no try had a core per rank (CPU share {[round(f['cpu_share'], 2) for f in figs[:3]]})")
    assert abs(m1["bubble"] - m1["formula"]) <= 0.10, (m1["bubble"], m1["formula"])
    assert abs(m2["bubble"] - m2["formula"]) <= 0.10, (m2["bubble"], m2["formula"])
    assert m8["bubble"] < m1["bubble"] - 0.1, (m1["bubble"], m8["bubble"])
