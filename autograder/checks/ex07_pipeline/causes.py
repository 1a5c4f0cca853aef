"""Exercise 7's likely mistakes, tested against what the ranks observed (see autograder/grader/diagnosis.py).

Each takes the :class:`~.observations.Run` of one file and the part being judged
(``"count"``, ``"loss"``, ``"grads0"``, ``"grads1"`` or ``"overlap"``): the send and recv protocol's
causes explain any failure, the others only their part's. The check's criteria ask for them,
the protocol's first.
"""
from __future__ import annotations

import functools
import re

import torch
from torch import nn

from ...grader.diagnosis import KnownError, mistake
from .observations import P2PCall, Run
from .probes import BATCH, MICRO, STAGES, batch, model


KNOWN_ERRORS = [KnownError(
    "a send/recv deadlock between the stages",
    r"Timed out waiting \d+ms for (send|recv)|Watchdog caught collective operation timeout.*OpType=(SEND|RECV)",
    "both stages waited for each other: a dist.send completes only when the other rank posts the matching "
    "dist.recv. Stage 0 sends every activation before it receives a gradient, stage 1 receives every "
    "activation before it sends a gradient (all forwards, then all backwards), in micro-batch order")]


def _near(a: float | None, b: float, rel: float = 0.05) -> bool:
    return a is not None and abs(a - b) <= rel * abs(b)


def _what(part: str) -> str:
    return "the loss is" if part == "loss" else f"stage {part[-1]}'s gradients are"


def _waiting(rank: int, call: P2PCall, step: Run) -> str:
    """``"stage 0 sending micro-batch 1's activations"`` for a send or recv the rank was waiting in."""
    k = len(step.p2p(rank, call.op, done=False)) - 1
    thing = "activations" if (rank == 0) == (call.op == "send") else "gradient"
    verb = "sending" if call.op == "send" else "waiting for"
    return f"stage {rank} {verb} micro-batch {k}'s {thing}"


@mistake("activations received without requires_grad_()")
def activation_without_grad(step: Run, part: str) -> str | None:
    needs = step.ranks[1].inputs_require_grad
    if not needs or any(needs):
        return None
    err = step.ranks[1].error
    return (f"stage 1's {len(needs)} received activations did not require grad, so no gradient was computed for "
            f"them: act.grad stayed None{f' (rank 1 then raised {err})' if err else ''} and stage 0 got no gradient "
            "back. Call act.requires_grad_() after dist.recv, before stage(act)")


@mistake("gradients not sent back to stage 0")
def gradients_not_sent(step: Run, part: str) -> str | None:
    sent, backwards = len(step.p2p(1, "send", done=False)), len(step.events(0, "B"))
    if sent >= MICRO or backwards >= MICRO or step.ranks[1].error or len(step.events(1, "B")) < MICRO:
        return None
    wait = step.pending(0)
    waited = f"waited in dist.recv for the {'first' if not sent else 'next'} one until rank 1 had finished, and " \
        if wait and wait.op == "recv" else ""
    return (f"stage 1 sent {sent} of {MICRO} gradients back to rank 0, so stage 0 {waited}ran {backwards} "
            f"backward(s): after each micro-batch's loss.backward(), send act.grad to rank 0 (dist.send)")


@mistake("one receive or send too many: a micro-batch past the last")
def one_too_many(step: Run, part: str) -> str | None:
    """A stage waiting for (or sending) the message of micro-batch ``m`` or later, which the other never makes."""
    for r in (0, 1):
        call = step.pending(r)
        if call is None or len(step.p2p(r, call.op, done=False)) <= MICRO:
            continue
        other = "recv" if call.op == "send" else "send"
        return (f"{_waiting(r, call, step)} ({call.where}) is one dist.{call.op} too many: the batch has {MICRO} "
                f"micro-batches (0 to {MICRO - 1}), and the other stage makes no {other} to match it. Each stage "
                f"makes one {call.op} of each kind per micro-batch, {MICRO} in all")
    return None


@mistake("both stages send (or receive) at once: a deadlock")
def deadlock(step: Run, part: str) -> str | None:
    p0, p1 = step.pending(0), step.pending(1)
    if not (p0 and p1 and p0.op == p1.op):
        return None
    op, other = p0.op, "recv" if p0.op == "send" else "send"
    waited = re.search(r"Timed out waiting (\d+)ms", " ".join(r.error or "" for r in step.ranks))
    until = f" until the {int(waited.group(1)) / 1000:g} s timeout" if waited else ""
    return (f"both stages were waiting in dist.{op} at once ({_waiting(0, p0, step)}, {_waiting(1, p1, step)}){until}, "
            f"and a {op} completes only when the other rank posts the matching {other}: stage 1 must receive every "
            "activation before it sends the first gradient (all forwards, then all backwards), and stage 0 send "
            "every activation before it waits for a gradient")


@mistake("a send or recv with no partner on the other stage")
def unmatched(step: Run, part: str) -> str | None:
    for r in (0, 1):
        call, peer = step.pending(r), step.ranks[1 - r]
        if call and step.pending(1 - r) is None:
            other = "recv" if call.op == "send" else "send"
            waited = f"rank {r} waited in dist.{call.op} ({_waiting(r, call, step)}) for a matching {other}"
            if peer.error:
                return (f"rank {1 - r} raised {peer.error}" + (f" at {peer.where}" if peer.where else "")
                        + f", so {waited} that never came")
            return (f"{waited} that rank {1 - r} never made (it returned from gpipe_step): every send needs a "
                    "recv on the other stage, in the same order")
    return None


@mistake("no micro-batches: the whole batch in one forward")
def no_microbatches(step: Run, part: str) -> str | None:
    f0 = step.events(0, "F")
    if len(f0) == 1 and f0[0].rows == BATCH:
        return (f"stage 0 ran one forward of all {BATCH} rows: cut the batch into n_microbatches = {MICRO} "
                f"pieces with x.chunk({MICRO}) and run the stage once per piece")
    return None


@mistake("split(n) instead of chunk(n): pieces of n rows")
def pieces_of_n_rows(step: Run, part: str) -> str | None:
    f0 = step.events(0, "F")
    if len(f0) == BATCH // MICRO != MICRO and {e.rows for e in f0} == {MICRO}:
        return (f"stage 0 ran {len(f0)} forwards of {MICRO} rows: x.split({MICRO}) cuts pieces of {MICRO} rows, "
                f"x.chunk({MICRO}) cuts {MICRO} pieces of {BATCH // MICRO}")
    return None


@mistake("a micro-batch count other than n_microbatches")
def count_scales(step: Run, part: str) -> str | None:
    k, r = len(step.events(0, "F")), step.ratio(part)
    if k and k != MICRO and _near(r, k / MICRO) and not _near(r, 1):
        return (f"{_what(part)} {r:.2f}x the unsplit model's because the batch went through in {k} micro-batches, "
                f"each loss divided by n_microbatches = {MICRO}: fix the split into micro-batches (see above)")
    return None


@mistake("loss not divided by the number of micro-batches")
def loss_not_scaled(step: Run, part: str) -> str | None:
    r = step.ratio(part)
    if len(step.events(0, "F")) == MICRO and _near(r, MICRO):
        return (f"{_what(part)} {r:.2f}x the unsplit model's with {MICRO} micro-batches: divide each "
                "micro-batch's loss by n_microbatches so the gradients add up to the batch mean's")
    return None


@mistake("returned the last micro-batch's loss")
def last_loss(step: Run, part: str) -> str | None:
    r, last = step.ratio("loss"), step.ref_micro[-1]
    if part != "loss" or r is None:
        return None
    got = r * step.ref_loss.item()
    for value, how in ((last / MICRO, f"micro-batch {MICRO - 1}'s loss divided by {MICRO}"),
                       (last, f"micro-batch {MICRO - 1}'s loss")):
        if _near(got, value, 1e-4):
            return (f"rank 1 returned {got:.6g}, {how}; the batch mean is {step.ref_loss.item():.6g}: return the "
                    "sum of every micro-batch's divided loss, not the last one")
    return None


@mistake("averaged the already-divided micro-batch losses")
def mean_of_scaled(step: Run, part: str) -> str | None:
    r = step.ratio("loss")
    if part == "loss" and _near(r, 1 / MICRO, 1e-3) and _near(step.ratio("grads1"), 1, 1e-3):
        return (f"rank 1 returned {r * step.ref_loss.item():.6g}, 1/{MICRO} of the batch mean "
                f"{step.ref_loss.item():.6g}: each micro-batch's loss is already divided by n_microbatches, "
                "so sum them instead of averaging")
    return None


@mistake("stage 1 backpropagates in another order than stage 0")
def backward_order(step: Run, part: str) -> str | None:
    o0, o1 = ([e.mb for e in step.events(s, "B")] for s in (0, 1))
    if part != "grads0" or len(o0) != MICRO or len(o1) != MICRO or o0 == o1:
        return None
    return (f"stage 1 backpropagated the micro-batches in the order {o1} and sent their gradients in that order, "
            f"but stage 0 used the k-th gradient it received for its micro-batches in the order {o0}, so micro-batch "
            f"{o1[0]}'s gradient went through micro-batch {o0[0]}'s activations: backpropagate in the same order on "
            "both stages (0, 1, 2, ...)")


@mistake("stage 0 backpropagates something other than the received gradient")
def ignores_received(step: Run, part: str) -> str | None:
    received = [c.value for c in step.p2p(0, "recv") if c.value is not None]
    if part != "grads0" or not received:
        return None
    for mb, g in sorted(step.ranks[0].out_grads.items()):
        if not any(g.shape == r.shape and torch.equal(g, r) for r in received):
            what = "all ones (what out.sum().backward() gives)" if torch.all(g == 1) else \
                "none of the gradients received from stage 1"
            return (f"the gradient that reached stage 0's output for micro-batch {mb} is {what}: continue the "
                    "backward with out.backward(grad), grad being what stage 1 sent for that micro-batch")
    return None


@mistake("activations sent after the forward loop")
def sent_after_loop(step: Run, part: str) -> str | None:
    sends, f0 = step.p2p(0, "send", done=False), step.events(0, "F")
    if sends and f0 and min(c.t0 for c in sends) >= max(e.end for e in f0):
        return (f"stage 0 sent its first activations only after all {len(f0)} of its forwards, so stage 1 could "
                "not start before stage 0 had finished: send each micro-batch's output right after computing it, "
                "inside the forward loop")
    return None


@mistake("the loss returned as a Python number, not a tensor")
def loss_not_a_tensor(step: Run) -> str | None:
    last = step.ranks[-1]
    if last.loss_type not in ("float", "int"):
        return None
    return (f"rank {last.rank} returned the right loss, but as a Python {last.loss_type}: the contract returns a "
            "detached scalar tensor (a .item() there waits for the device on a GPU, every step); return "
            "the tensor .detach()ed")


@mistake("the loss returned still requires grad")
def loss_not_detached(step: Run) -> str | None:
    last = step.ranks[-1]
    if not last.loss_grad_fn:
        return None
    return (f"rank {last.rank} returned the right loss, but still requiring grad (its grad_fn is "
            f"{last.loss_grad_fn}): the contract returns a detached scalar, so that a caller that keeps it (a running "
            "total, a log) keeps no autograd graph with it; return it .detach()ed")


_PEER_GONE = ("Connection closed by peer", "Connection reset by peer")  # gloo's words where the peer went away


def raised_first(step: Run) -> tuple[list, list[int]]:
    """The ranks whose error is their own, and the ranks that only lost their connection to one of them (gloo's
    "Connection closed by peer" on a rank whose peer stopped): a consequence, said in a word, not in full."""
    failed = [r for r in step.ranks if r.error]
    own = [r for r in failed if not any(words in r.error for words in _PEER_GONE)] or failed
    return own, [r.rank for r in failed if r not in own]


def peers_gone(ranks: list[int]) -> str:
    """The words for the ranks that lost their connection to a rank that stopped ("" for none)."""
    return f" (then rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} lost the connection to it)" \
        if ranks else ""


@functools.cache  # the same for every file: computed once per grading process (read, never written)
def cut_grads() -> list[torch.Tensor]:
    """Each micro-batch's gradient at the cut between the 2 stages, in the unsplit model (its loss divided by the
    micro-batch count): what stage 1 sends back for it."""
    net, (x, y), cut = model(), batch(), STAGES[2][1]
    grads = []
    for xi, yi in zip(x.chunk(MICRO), y.chunk(MICRO)):
        act = net[:cut](xi).detach().requires_grad_()
        (nn.functional.cross_entropy(net[cut:](act), yi) / MICRO).backward()
        grads.append(act.grad)
    return grads


@mistake("one receive buffer for every micro-batch")
def one_buffer(step: Run, part: str) -> str | None:
    recvs = step.p2p(1, "recv")
    if part not in ("grads0", "grads1") or len(recvs) < 2 or not recvs[0].buffer or \
            len({c.buffer for c in recvs}) > 1:
        return None
    sent = [c.value for c in step.p2p(0, "recv") if c.value is not None]
    want = cut_grads()
    summed = len(sent) >= 2 and all(g.shape == w.shape for g, w in zip(sent, want)) and \
        torch.allclose(sent[1], want[0] + want[1], rtol=1e-5, atol=1e-8)
    added = (" Stage 0 received, for micro-batch 1, the sum of micro-batches 0 and 1's gradients "
             f"({float(sent[1].sum()):.6g}, where micro-batch 1's own is {float(want[1].sum()):.6g})."
             if summed else "")
    return (f"stage 1 received all {len(recvs)} micro-batches' activations into one tensor ({recvs[0].where}): a "
            "receive writes it in place, unseen by autograd, so each changes the activations the earlier "
            "micro-batches' forwards saved for their backward, and its .grad adds each backward to the last "
            f"ones'.{added} Receive each micro-batch into a new tensor (torch.empty inside the loop)")
