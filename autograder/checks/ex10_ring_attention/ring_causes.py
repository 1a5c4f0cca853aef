"""Exercise 10's ring protocol causes: who sends to whom, and what. A ring sends each step to one neighbour,
``(rank + 1) % W``, receives from the other, and passes on the shard it has just received (Liu et al., 2023), so
that each link carries one shard per step. These explain any failure first (``PROTOCOL``), in the forward and the
backward alike; the per-criterion lists are ``causes``'.
"""
from __future__ import annotations

from ...grader.diagnosis import mistake
from .observations import Run
from .reference import BATCH


@mistake("each shard sent straight to every rank, not passed round the ring")
def sent_to_all(run: Run) -> str | None:
    """Each step to ``rank + step + 1``: an all-to-all made of point-to-point sends (the outputs are right)."""
    if run.world < 3:
        return None
    for r in range(run.world):
        sent, got = [c.peer for c in run.p2p(r, "send")], [c.peer for c in run.p2p(r, "recv")]
        if len(set(sent)) > 1:
            return (f"rank {r} sent to ranks {', '.join(map(str, sent))} in turn, and received from ranks "
                    f"{', '.join(map(str, got))}: each rank sent shards straight to several others, an all-to-all "
                    "made of point-to-point messages. A ring sends to one neighbour only, (rank + 1) % W, and "
                    "receives from the other, each step passing on the shard it has just received: every link "
                    "carries one shard per step, and no rank needs a connection to every other")
    return None


@mistake("every rank sends before it receives: a deadlock")
def deadlock(run: Run) -> str | None:
    pending = [next((c for c in reversed(r.p2p) if c.t1 is None and not c.is_async), None) for r in run.ranks]
    if not all(p is not None and p.op == "send" for p in pending):
        return None
    at = f" at {pending[0].where}" if pending[0].where else ""
    return (f"all {run.world} ranks were waiting in a blocking dist.send at once (rank 0 sending to rank "
            f"{pending[0].peer}{at}), and a send returns only when its peer posts the matching recv, which every "
            "peer would do only after its own send: post the send and the recv together, with "
            "dist.batch_isend_irecv([P2POp(dist.isend, ...), P2POp(dist.irecv, ...)]), then wait on both")


@mistake("sends to and receives from the same neighbour")
def wrong_neighbour(run: Run) -> str | None:
    if run.world < 3:
        return None
    for r in range(run.world):
        sent = {c.peer for c in run.p2p(r, "send")}
        got = {c.peer for c in run.p2p(r, "recv")}
        if sent and got and sent & got:
            peer = sorted(sent & got)[0]
            return (f"rank {r} sent to rank {peer} and also waited for a shard from rank {peer}, but rank {peer} "
                    f"sends to rank {(peer + 1) % run.world}: in a ring each rank receives from the neighbour on "
                    f"the other side, (rank - 1) % W = {(r - 1) % run.world} here, and sends to (rank + 1) % W")
    return None


@mistake("each step's shard received into the tensor it is sent from")
def one_buffer(run: Run) -> str | None:
    """The receive buffer made once and passed on (``kv = buf``): from the next step on, one tensor is both sent
    and received into, and what arrives overwrites what is still being sent."""
    for r in range(run.world):
        for k, (send, recv) in enumerate(zip(run.p2p(r, "send"), run.p2p(r, "recv"))):
            if send.buffer and send.buffer == recv.buffer:
                return (f"at step {k} rank {r} received into the tensor it was sending from ({recv.where}): what "
                        "arrives overwrites the shard still being passed on, so what the next rank gets depends on "
                        "the order the transfers run. Receive each step into a tensor of its own "
                        "(torch.empty_like), then pass that one on")
    return None


@mistake("forwards its own shard instead of the one it received")
def forwards_own(run: Run) -> str | None:
    for r in range(run.world):
        sources = [s for s in run.sources(r) if s is not None]
        if len(sources) > 1 and len(set(sources)) == 1:
            return (f"rank {r} received rank {sources[0]}'s keys at each of its {len(sources)} receives, so it never "
                    f"saw the other shards: each step, send on the shard you have just received (not your own k, v)")
    return None


PROTOCOL = [deadlock, sent_to_all, wrong_neighbour, one_buffer, forwards_own]


@mistake("k and v packed along the batch, read back as k and v")
def packed_along_batch(run: Run) -> str | None:
    """k and v sent as one tensor made with ``torch.cat([k, v])``: 2B rows of the batch dim, where ``kv[0]`` and
    ``kv[1]`` are batch 0 and 1 of k, not k and v (the same only at a batch of 1). Said where the output is wrong:
    ``kv[:B], kv[B:]`` reads such a tensor right."""
    sends = run.p2p(0, "send")
    if not sends or sends[0].shape[:1] != [2 * BATCH] or len(sends[0].shape) != 4:
        return None
    return (f"rank 0 sent k and v as one tensor of shape {sends[0].shape} at {sends[0].where}, the two concatenated "
            f"along the batch dim (torch.cat): indexing it kv[0], kv[1] gives batch 0 and 1 of k, not k and v (the "
            f"same only at a batch of 1; this batch is {BATCH}). Stack them (torch.stack([k, v]): kv[0] is k) or "
            "split along the batch (kv[:B], kv[B:])")
