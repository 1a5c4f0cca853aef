"""The trace reader behind notebook 09's Gantt charts and overlap fractions (distlab.measure.profiling).

Synthetic spans and a synthetic Chrome trace check the arithmetic and the classification exactly;
one real single-process profile checks that ``profile_steps`` writes what ``trace_spans`` reads.
No timing is asserted: the overlap of a real run is a row of ``make bench``.
"""
import json

import pytest
import torch

from distlab.measure.profiling import (Span, covered, intersection, overlap_fraction, profile_steps, summarize,
                                      trace_spans,
                               union)


def _spans(kind, *intervals):
    return [Span(kind, "backward" if kind == "compute" else "all_reduce", a, b) for a, b in intervals]


def test_union_and_intersection_count_overlapping_time_once():
    assert union([(5, 7), (0, 2), (1, 3), (7, 8)]) == [(0, 3), (5, 8)]
    assert covered([(0, 2), (1, 3), (10, 11)]) == 4
    assert intersection([(0, 10)], [(2, 3), (2.5, 4), (9, 12)]) == pytest.approx(3)
    assert intersection([(0, 1)], [(1, 2)]) == 0


@pytest.mark.parametrize("comm, compute, expected", [
    ([(0, 10)], [(5, 15)], 0.5),                      # half the all-reduce under backward
    ([(0, 4), (2, 6)], [(0, 3)], 0.5),                # two buckets at once: comm counted once (6 s)
    ([(10, 20)], [(0, 10)], 0.0),                     # one bucket after backward: nothing hidden
    ([(1, 2), (3, 4)], [(0, 1.5), (1.5, 10)], 1.0),   # nested and adjacent compute
    ([], [(0, 1)], 0.0),                              # no communication at all
])
def test_overlap_fraction_is_hidden_comm_over_all_comm(comm, compute, expected):
    assert overlap_fraction(_spans("comm", *comm) + _spans("compute", *compute)) == pytest.approx(expected)


def _event(name, ts, dur, tid, cat="cpu_op"):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "pid": 1, "cat": cat}


def test_trace_spans_reads_a_cpu_ddp_trace(tmp_path):
    """Times in microseconds from the first ProfilerStep; gloo's collective on its own thread is comm,
    the step thread's operators are compute by phase, and c10d's enqueue call is neither."""
    events = [
        _event("ProfilerStep#1", 1000, 100, tid=7, cat="user_annotation"),
        _event("DistributedDataParallel.forward", 1000, 20, tid=7, cat="user_annotation"),
        _event("aten::addmm", 1005, 10, tid=7),
        _event("autograd::engine::evaluate_function: AddmmBackward0", 1030, 40, tid=7),
        _event("aten::mm", 1035, 20, tid=7),
        _event("c10d::allreduce_", 1050, 1, tid=7),
        _event("gloo:all_reduce", 1052, 30, tid=9, cat="user_annotation"),
        _event("torch.distributed.ddp.reducer::copy_bucket_to_grad", 1085, 5, tid=7),
        _event("Optimizer.step#SGD.step", 1090, 8, tid=7, cat="user_annotation"),
        _event("aten::add_", 1091, 2, tid=7),
        {"ph": "i", "name": "an instant event, ignored", "ts": 1000, "tid": 7},
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    spans, steps = trace_spans(path)
    assert steps == [(0.0, pytest.approx(100e-6))]
    comm = [s for s in spans if s.kind == "comm"]
    assert comm == [Span("comm", "all_reduce", pytest.approx(52e-6), pytest.approx(82e-6))]
    phases = {(s.phase, round(s.start * 1e6)) for s in spans if s.kind == "compute"}
    assert phases == {("forward", 5), ("backward", 30), ("backward", 35), ("bucket copy", 85), ("optimizer", 91)}
    # comm 52-82 us, backward until 70: 18 of 30 us hidden
    assert overlap_fraction(spans) == pytest.approx(18 / 30)


def test_profile_steps_writes_a_trace_that_trace_spans_reads(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    x = torch.randn(4, 8)

    def step():
        model.zero_grad()
        model(x).sum().backward()

    path = profile_steps(step, 2, tmp_path / "t.json")
    spans, steps = trace_spans(path)
    assert len(steps) == 2  # the profiler's warm-up step is not in the trace
    assert any(s.phase == "backward" for s in spans) and not any(s.kind == "comm" for s in spans)
    figures = summarize(path)
    assert figures["overlap"] == 0.0 and figures["collectives"] == 0 and figures["backward_s"] > 0
