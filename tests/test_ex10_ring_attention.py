"""Exercise 10 (causal ring attention by hand): the solution and an independent one score full marks, each
known mistake fails with its own feedback, naming the cause. All are graded in one launch of 4 ranks (at 2
ranks the two neighbours are one rank, and a wrong neighbour cannot show); each file runs in its own
process group, so the two mutants whose ring never completes (stopped by a short p2p timeout) cost only
their own marks. The stub's grading: tests/test_stubs.py (every untouched stub, at once)."""
from __future__ import annotations

import pytest

from autograder.checks import ex10_ring_attention as check
from autograder.diagnosis import translate
from tests import independent
from tests.helpers import SOLUTIONS, failed, mutant

FILE = check.EXERCISE.filename
MERGE = "new = torch.logaddexp(lse, block_lse)"
BATCH = """            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, (rank + 1) % world),
                                            dist.P2POp(dist.irecv, buf, (rank - 1) % world)])"""
BLOCKING = """            dist.send(kv, (rank + 1) % world)
            dist.recv(buf, (rank - 1) % world)
            works = []"""
MISTAKES = {
    # two independent mistakes: the plain average, and an all_gather (which costs the ring's marks only)
    "averaged, all_gather": {"out = torch.exp(lse - new) * out + torch.exp(block_lse - new) * block_out":
                             "out = (out + block_out) / 2", "    kv = torch.stack([k, v])\n":
                             "    kv = torch.stack([k, v])\n    dist.all_gather([torch.empty_like(kv) for _ in "
                             "range(world)], kv)\n"},
    "max without rescale": {MERGE: "new = torch.maximum(lse, block_lse)"},
    "local mask": {"torch.arange(rank * n, (rank + 1) * n, device=q.device)": "torch.arange(n, device=q.device)",
                   "torch.arange(src * n, (src + 1) * n, device=q.device)": "torch.arange(n, device=q.device)"},
    "masked shard merged": {"if src <= rank:": "if True:"},
    "no mask": {"if src <= rank:": "if True:",
                "            scores = scores.masked_fill(q_pos[:, None] < k_pos[None, :], float(\"-inf\"))\n": ""},
    "deadlock": {BATCH: BLOCKING},
    "wrong neighbour": {"dist.P2POp(dist.irecv, buf, (rank - 1) % world)":
                        "dist.P2POp(dist.irecv, buf, (rank + 1) % world)"},
    "forwards its own shard": {"dist.P2POp(dist.isend, kv,": "dist.P2POp(dist.isend, torch.stack([k, v]),"},
}
OUTPUT = "[W=4] each rank's output matches causal attention on the whole sequence"
RING = "[W=4] key/value shards passed round the ring, point to point"


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    paths = [SOLUTIONS / FILE, independent.path(10)]
    for i, (name, repl) in enumerate(MISTAKES.items()):
        paths.append(mutant(tmp_path_factory.mktemp(f"m{i}"), FILE, repl))
    graded = check.grade(paths, world_sizes=(4,), p2p_timeout_s=1.5)  # the two hangs: 1.5 s each x the time scale
    independent.record(10, graded[1])
    return {"solution": graded[0], "independent": graded[1], **dict(zip(MISTAKES, graded[2:]))}


def test_solution_and_independent_full_marks(reports):
    for name in ("solution", "independent"):
        r = reports[name]
        assert r.score == r.max_score, r.feedback
    assert reports["solution"].measurements["W4_bytes_sent_per_rank"] == 3 * 2 * 1 * 2 * 8 * 8 * 4


@pytest.mark.parametrize("name, words", [
    ("averaged, all_gather", "(out + block_out) / 2 at each step"),
    ("max without rescale", "lse = max(lse, lse_block)"),
    ("local mask", "a causal mask by each block's own indices"),
    ("masked shard merged", "NaN in 16 of its 16 (head, position) rows"),
    ("no mask", "is the non-causal attention"),
])
def test_a_wrong_merge_or_mask_fails_parity_only_and_is_named(reports, name, words):
    f = failed(reports[name])
    assert list(f) == ([OUTPUT, RING] if "all_gather" in name else [OUTPUT]), f
    assert words in f[OUTPUT], f[OUTPUT]


def test_a_blocking_ring_is_a_named_deadlock(reports):
    f = failed(reports["deadlock"])
    assert set(f) == {OUTPUT, RING}
    for text in f.values():
        assert "all 4 ranks were waiting in a blocking dist.send at once" in text, text
        assert "dist.batch_isend_irecv" in text


def test_receiving_from_the_rank_it_sends_to_is_named(reports):
    f = failed(reports["wrong neighbour"])
    assert set(f) == {OUTPUT, RING}
    assert "sent to rank 1 and also waited for a shard from rank 1" in f[RING], f[RING]


def test_forwarding_its_own_shard_is_named(reports):
    f = failed(reports["forwards its own shard"])
    assert set(f) == {OUTPUT, RING}
    for text in f.values():
        assert "keys at each of its 3 receives" in text and "send on the shard you have just received" in text, text


def test_a_collective_costs_the_ring_marks_not_parity(reports):
    f = failed(reports["averaged, all_gather"])
    assert "the ring called all_gather" in f[RING]


def test_a_deadlock_that_escapes_the_rank_is_translated():
    gloo = "RuntimeError: [unbound_buffer.cc:129] Timed out waiting 1500ms for send operation to complete"
    assert translate(gloo, check.KNOWN_ERRORS).startswith("a send/recv deadlock in the ring")
