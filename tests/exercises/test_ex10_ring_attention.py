"""Exercise 10 (causal ring attention by hand, forward and backward): the solution and an independent one
score full marks, each known mistake fails with its own feedback, naming the cause. All are graded in one
launch of 4 ranks (at 2 ranks the two neighbours are one rank, and a wrong neighbour cannot show); each
file's forward and backward run in process groups of their own, so the two mutants whose forward ring never
completes (stopped by a short p2p timeout) cost only their own forward's marks. The backward is graded
apart from the forward (it is given the exact out and lse), so each mistake of the backward rides in a
mutant of the forward's (no file of its own: no launch time of its own), and fails only the backward's
criteria. The stub's grading: tests/autograder/test_stubs.py (every untouched stub, at once)."""
from __future__ import annotations

import pytest

from autograder.checks import ex10_ring_attention as check
from autograder.grader.diagnosis import translate
from tests.exercises import independent
from tests.helpers import SOLUTIONS, failed, mutant

FILE = check.EXERCISE.filename
MERGE = "new = torch.logaddexp(lse, block_lse)"
BATCH = """            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, (rank + 1) % world),
                                            dist.P2POp(dist.irecv, buf, (rank - 1) % world)])"""
BLOCKING = """            dist.send(kv, (rank + 1) % world)
            dist.recv(buf, (rank - 1) % world)
            works = []"""
PROBS = 'p = torch.exp(s.masked_fill(cols[None, :] > rows[:, None], float("-inf")) - lse)'
DS = "ds = p * (dout @ moving[1].transpose(-1, -2) - delta)"
# The backward's mistakes, each added to a mutant of the forward's
BACKWARD = {
    "not written": {"    delta = (dout * out)": "    raise NotImplementedError\n    delta = (dout * out)"},
    "D per block": {DS: "ds = p * (dout @ moving[1].transpose(-1, -2) - (dout * (p @ moving[1])).sum(-1, True))"},
    "block lse": {PROBS: 's = s.masked_fill(cols[None, :] > rows[:, None], float("-inf"))\n'
                         "            p = torch.exp(s - torch.logsumexp(s, -1, keepdim=True))"},
    "mask dropped": {PROBS: "p = torch.exp(s - lse)"},
    "scale missing": {"dq += (ds @ moving[0]) * scale": "dq += ds @ moving[0]",
                      "moving[2] += (ds.transpose(-1, -2) @ q) * scale": "moving[2] += ds.transpose(-1, -2) @ q"},
    "not home": {"send = moving if step < world - 1 else moving[2:].contiguous()":
                 "if step == world - 1:\n            return dq, moving[2], moving[3]\n        send = moving"},
    "returns nothing": {"    return dq, moving[0], moving[1]\n": "    dq, dk, dv = dq, moving[0], moving[1]\n"},
    "dk into dv": {"moving[2] += (ds.transpose(-1, -2) @ q)": "moving[3] += (ds.transpose(-1, -2) @ q)"},
    "dk, dv swapped": {"    return dq, moving[0], moving[1]\n": "    return dq, moving[1], moving[0]\n"},
}
RESCALE = "                out = torch.exp(lse - new) * out + torch.exp(block_lse - new) * block_out\n"
MISTAKES = {
    # independent mistakes: the plain average, an all_gather (which costs the ring's marks only), no backward
    "averaged, all_gather": {"out = torch.exp(lse - new) * out + torch.exp(block_lse - new) * block_out":
                             "out = (out + block_out) / 2", "    kv = torch.stack([k, v])\n":
                             "    kv = torch.stack([k, v])\n    dist.all_gather([torch.empty_like(kv) for _ in "
                             "range(world)], kv)\n", **BACKWARD["not written"]},
    "max without rescale": {MERGE: "new = torch.maximum(lse, block_lse)", **BACKWARD["D per block"]},
    "local mask": {"torch.arange(rank * n, (rank + 1) * n, device=q.device)": "torch.arange(n, device=q.device)",
                   "torch.arange(src * n, (src + 1) * n, device=q.device)": "torch.arange(n, device=q.device)",
                   **BACKWARD["block lse"]},
    "masked shard merged": {"if src <= rank:": "if True:", **BACKWARD["mask dropped"]},
    "no mask": {"if src <= rank:": "if True:",
                "            scores = scores.masked_fill(q_pos[:, None] < k_pos[None, :], float(\"-inf\"))\n": "",
                **BACKWARD["scale missing"]},
    "deadlock": {BATCH: BLOCKING},
    "wrong neighbour": {"dist.P2POp(dist.irecv, buf, (rank - 1) % world)":
                        "dist.P2POp(dist.irecv, buf, (rank + 1) % world)"},
    "forwards its own shard": {"dist.P2POp(dist.isend, kv,": "dist.P2POp(dist.isend, torch.stack([k, v]),",
                               **BACKWARD["not home"]},
    "returns nothing": {"    return out\n": "    out = out.contiguous()\n", **BACKWARD["returns nothing"]},
    "lse set before the rescale": {RESCALE + "                lse = new\n": "                lse = new\n" + RESCALE,
                                   **BACKWARD["dk into dv"]},
    "lse never kept": {"                lse = new\n": "", **BACKWARD["dk, dv swapped"]},
    # no ring waits on its receives (a race, whatever the values read: the grader waits on them afterwards)
    "never waited": {"                work.wait()\n            kv = buf": "                pass\n            kv = buf",
                     "            work.wait()\n        moving = recv": "            pass\n        moving = recv"},
}
OUTPUT = "[W=4] each rank's output matches causal attention on the whole sequence"
RING = "[W=4] key/value shards passed round the ring, point to point"
DQ = "[W=4] backward: each rank's dq matches autograd on the whole sequence"
DKDV = "[W=4] backward: each rank ends with its own shards' dk, dv, as autograd's"
BRING = "[W=4] backward: k, v and their dk, dv passed round the ring, and home"


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    paths = [SOLUTIONS / FILE, independent.path(10)]
    for i, (name, repl) in enumerate(MISTAKES.items()):
        paths.append(mutant(tmp_path_factory.mktemp(f"m{i}"), FILE, repl))
    graded = check.grade(paths, world_sizes=(4,), p2p_timeout_s=1.5)  # the two hangs: 1.5 s each x the time scale
    return {"solution": graded[0], "independent": graded[1], **dict(zip(MISTAKES, graded[2:]))}


def test_solution_and_independent_full_marks(reports):
    for name in ("solution", "independent"):
        r = reports[name]
        assert r.score == r.max_score, r.feedback
    assert reports["solution"].measurements["W4_bytes_sent_per_rank"] == 3 * 2 * 1 * 2 * 8 * 8 * 4
    assert reports["solution"].measurements["W4_backward_bytes_sent_per_rank"] == (4 * 4 - 2) * 1 * 2 * 8 * 8 * 4


@pytest.mark.parametrize("name, words", [
    ("averaged, all_gather", "(out + block_out) / 2 at each step"),
    ("max without rescale", "lse = max(lse, lse_block)"),
    ("local mask", "a causal mask by each block's own indices"),
    ("masked shard merged", "NaN in 16 of its 16 (head, position) rows"),
    ("no mask", "is the non-causal attention"),
    ("lse set before the rescale", "when lse is set to the new logaddexp(lse, lse_block) before out is rescaled"),
    ("lse never kept", "when lse stays the first block's"),
])
def test_a_wrong_merge_or_mask_fails_parity_only_and_is_named(reports, name, words):
    f = {k: v for k, v in failed(reports[name]).items() if "backward" not in k}
    assert list(f) == ([OUTPUT, RING] if "all_gather" in name else [OUTPUT]), f
    assert words in f[OUTPUT], f[OUTPUT]


@pytest.mark.parametrize("name, words", [
    ("max without rescale", "dq and dk are what D = rowsum(dout * p @ v) of each block gives"),
    ("local mask", "p = exp(s - logsumexp(s)) of each block's own scores"),
    ("masked shard merged", "what a backward with no causal mask gives"),
    ("no mask", "dq and dk are sqrt(head_dim) = sqrt(8) = 2.83x autograd's"),
])
def test_a_wrong_backward_fails_its_gradients_only_and_is_named(reports, name, words):
    f = {k: v for k, v in failed(reports[name]).items() if "backward" in k}
    assert list(f) == [DQ, DKDV], f
    for text in f.values():
        assert words in text, text


def test_gradients_left_a_hop_from_home_are_named_with_the_shift(reports):
    f = failed(reports["forwards its own shard"])
    assert DQ not in f and {DKDV, BRING} <= set(f), f
    for text in (f[DKDV], f[BRING]):
        assert "every rank r returned the dk, dv of rank (r + 1) % W's shard (rank 0 those of rank 1's)" in text, text
        assert "one hop from home" in text


def test_an_unwritten_backward_costs_only_its_own_marks(reports):
    f = failed(reports["averaged, all_gather"])
    assert {DQ, DKDV, BRING} <= set(f)
    assert "ring_attention_backward is not implemented yet (ex10_ring_attention.py line" in f[DQ], f[DQ]
    assert f[BRING].startswith("not checked: ring_attention_backward is not implemented yet")


def test_a_forward_ring_that_hangs_costs_the_backward_nothing(reports):
    for name in ("deadlock", "wrong neighbour"):
        assert set(failed(reports[name])) == {OUTPUT, RING}, failed(reports[name])


def test_a_blocking_ring_is_a_named_deadlock(reports):
    f = failed(reports["deadlock"])
    for text in f.values():
        assert "all 4 ranks were waiting in a blocking dist.send at once" in text, text
        assert "dist.batch_isend_irecv" in text


def test_receiving_from_the_rank_it_sends_to_is_named(reports):
    f = failed(reports["wrong neighbour"])
    assert "sent to rank 1 and also waited for a shard from rank 1" in f[RING], f[RING]


def test_forwarding_its_own_shard_is_named(reports):
    f = {k: v for k, v in failed(reports["forwards its own shard"]).items() if "backward" not in k}
    assert set(f) == {OUTPUT, RING}
    for text in f.values():
        assert "keys at each of its 3 receives" in text and "send on the shard you have just received" in text, text


def test_a_collective_costs_the_ring_marks_not_parity(reports):
    f = failed(reports["averaged, all_gather"])
    assert "the ring called all_gather" in f[RING]


def test_a_deadlock_that_escapes_the_rank_is_translated():
    gloo = "RuntimeError: [unbound_buffer.cc:129] Timed out waiting 1500ms for send operation to complete"
    assert translate(gloo, check.KNOWN_ERRORS).startswith("a send/recv deadlock in the ring")


def test_functions_that_return_nothing_are_named(reports):
    f = failed(reports["returns nothing"])
    assert set(f) == {OUTPUT, DQ, DKDV}, f  # both rings ran as they should
    assert f[OUTPUT].startswith("rank 0's ring_attention returned None and raised nothing, where its contract")
    for name in (DQ, DKDV):
        assert f[name].startswith("rank 0's ring_attention_backward returned None and raised nothing"), f[name]


def test_a_gradient_in_the_wrong_slot_or_never_accumulated_is_named(reports):
    f = failed(reports["lse never kept"])
    assert DQ not in f and DKDV in f, f
    assert "rank 0's returned dk is autograd's dv of this rank's shard" in f[DKDV], f[DKDV]
    f = failed(reports["lse set before the rescale"])
    assert DKDV in f and "rank 0's dk is zero in every value, where autograd's is not" in f[DKDV], f[DKDV]


def test_receives_never_waited_on_are_named_at_their_line_in_every_criterion_of_the_ring(reports):
    f = failed(reports["never waited"])
    assert set(f) == {OUTPUT, RING, DQ, DKDV, BRING}, f
    forward = "rank 0 never waited on 3 of its 3 receives, the first from rank 3 posted at ex10_ring_attention.py line"
    for name in (OUTPUT, RING):
        assert f[name].startswith(forward) and "(`works = dist.batch_isend_irecv(" in f[name], f[name]
    for name in (DQ, DKDV, BRING):
        assert f[name].startswith("rank 0 never waited on 4 of its 4 receives, the first from rank 3"), f[name]


@pytest.mark.slow  # a launch beyond the one per exercise that make test-fast keeps
def test_a_merge_without_the_max_is_named_on_scores_past_exps_range(tmp_path):
    """The realistic family's (benchmarks/realistic/ex10.py): right on the ordinary inputs, wrong once the scores
    pass float32's exp() range, which the forward's second ring (queries times LARGE) reaches."""
    from benchmarks.realistic import family

    (mistake,) = [m for m in family()[10][0] if m.name == "lse_merge_without_max"]
    path = tmp_path / FILE
    path.write_text(mistake.apply((SOLUTIONS / FILE).read_text()))
    (report,) = check.grade([path])
    said = failed(report)[OUTPUT]
    assert said.startswith("with the queries times 40 (scores up to ") and "though the same ring matched" in said
