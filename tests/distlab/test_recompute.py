"""Activation recomputation as notebook 08 measures it (distlab.lab.recompute) and the calculator's
activation term (distlab.lab.activation_memory) against it. Single process, byte counts only."""
import math
import warnings

import pytest
import torch

from distlab.lab.activation_memory import block_bytes, resmlp_peak_bytes, resmlp_saved_bytes
from distlab.lab.fsdp_memory import activation_bytes
from distlab.lab.recompute import (POLICIES, Recomputed, grads, peak_activation_bytes, saved_bytes, segment_length,
                               step_time_ratios, sweep, workload)

SHAPE = dict(in_features=64, hidden=256, out_features=10)
BATCH = 64


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One torch thread, as ``recompute.sweep`` measures: byte counts do not depend on it, but on
    a machine whose cores are shared two threads spin waiting for each other (seconds lost)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _term(depth: int, every: int) -> int:
    return resmlp_saved_bytes(BATCH, depth=depth, every=every, **SHAPE)


def test_segment_lengths():
    assert [segment_length(16, p) for p in POLICIES] == [0, 1, 4]
    assert segment_length(8, "every √L blocks") == 3 and segment_length(1, "every √L blocks") == 1
    with pytest.raises(ValueError):
        segment_length(8, "sometimes")


def test_checkpointing_every_block_saves_60_percent_at_depth_16_and_changes_no_gradient():
    """Bit for bit: the recomputed forward runs the same ops on the same inputs."""
    model, x, y = workload(16, batch=BATCH, **SHAPE)
    plain, every = saved_bytes(model, 0, x, y), saved_bytes(model, 1, x, y)
    assert 1 - every / plain >= 0.60, (plain, every)
    assert all(torch.equal(a, b) for a, b in zip(grads(model, 0, x, y), grads(model, 1, x, y)))


def test_sqrt_schedule_keeps_sqrt_depth_segment_inputs():
    """Beyond the fixed ends (batch, head input, loss), every √L blocks keeps √L inputs: 4x deeper, 2x the bytes."""
    ends = _term(4, 4) - block_bytes(BATCH, SHAPE["hidden"], recomputed=True)  # one segment, one input
    kept = {}
    for depth in (16, 64):
        model, x, y = workload(depth, batch=BATCH, **SHAPE)
        kept[depth] = saved_bytes(model, segment_length(depth, "every √L blocks"), x, y) - ends
        assert kept[depth] == math.isqrt(depth) * block_bytes(BATCH, SHAPE["hidden"], recomputed=True)
    assert kept[64] == 2 * kept[16]


@pytest.mark.parametrize("depth", [4, 8, 16])
def test_activation_term_within_5_percent_of_the_saved_bytes(depth):
    model, x, y = workload(depth, batch=BATCH, **SHAPE)
    for policy in POLICIES:
        every = segment_length(depth, policy)
        measured, term = saved_bytes(model, every, x, y), _term(depth, every)
        assert abs(term - measured) <= 0.05 * measured, (policy, term, measured)
    # and within the FSDP lesson's bound, which doubles the layers' inputs and outputs as a margin
    assert _term(depth, 0) <= activation_bytes(BATCH, depth=depth, **SHAPE)


def test_peak_with_recomputation():
    """Byte counts of one step: the backward's recomputation is in the peak, the √L schedule peaks
    lowest, and the estimate (saved + one segment + a weight gradient) is within 10 %."""
    model, x, y = workload(16, batch=BATCH, **SHAPE)
    peaks = {p: peak_activation_bytes(model, segment_length(16, p), x, y) for p in POLICIES}
    assert peaks["every √L blocks"] < peaks["every block"] < peaks["none"], peaks
    for p, peak in peaks.items():
        every = segment_length(16, p)
        assert peak > saved_bytes(model, every, x, y)
        estimate = resmlp_peak_bytes(BATCH, depth=16, every=every, **SHAPE)
        assert abs(estimate - peak) <= 0.10 * peak, (p, estimate, peak)


def test_non_reentrant_checkpoint_warns_nothing_and_the_sweeps_restore_threads():
    model, x, y = workload(4, batch=8, **SHAPE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # checkpoint without use_reentrant would warn
        Recomputed(model, 2)(x).sum().backward()
    before = torch.get_num_threads()
    rows = sweep((2,), measure=("saved",), threads=1, batch=8, **SHAPE)
    assert torch.get_num_threads() == before
    assert [r["policy"] for r in rows] == list(POLICIES)
    assert all(set(r) == {"depth", "policy", "every", "saved_bytes"} for r in rows)
    ratios = step_time_ratios(2, rounds=1, min_run_time=0.01, batch=8, **SHAPE)  # what it returns, not how fast
    assert set(ratios) == {*POLICIES[1:], "forward share"} and torch.get_num_threads() == before
