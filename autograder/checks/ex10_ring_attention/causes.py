"""Exercise 10's likely mistakes, tested against what the ranks observed (see autograder/grader/diagnosis.py).

The ring's protocol (a deadlock, the wrong neighbour, forwarding the wrong shard) explains any failure, in
the forward and in the backward (``Run.backward()``, the same view of the second ring); a wrong merge,
mask or backward formula is named only when a rank's result *is* that mistake's, replayed on one process
(``reference.replay``, ``reference.replay_backward``), to float rounding.
"""
from __future__ import annotations

import torch

from ...grader.diagnosis import KnownError, mistake
from .observations import BackwardRing, Run
from .ring_causes import PROTOCOL, packed_along_batch
from .reference import GRADS, HEAD_DIM, noncausal, replay, replay_backward, replay_sliced

KNOWN_ERRORS = [KnownError(
    "a send/recv deadlock in the ring",
    r"Timed out waiting \d+ms for (send|recv)|Watchdog caught collective operation timeout.*OpType=(SEND|RECV)",
    "every rank waited for its neighbour: a dist.send returns only once the peer has posted the matching recv, "
    "so post the send and the recv together (dist.batch_isend_irecv, or isend/irecv) and wait on both")]


def _close(a: torch.Tensor | None, b: torch.Tensor) -> bool:
    return a is not None and a.shape == b.shape and torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def _wrong_ranks(run: Run) -> list[int]:
    return [r.rank for r in run.ranks if not _close(r.out, run.reference[r.rank])]


def _is(run: Run, outs: list[torch.Tensor]) -> list[int]:
    """The ranks whose output is wrong and equals ``outs``' (the replayed mistake's)."""
    wrong = _wrong_ranks(run)
    return [r for r in wrong if _close(run.ranks[r].out, outs[r])] if wrong else []


@mistake("a receive never waited on")
def never_waited(run: Run) -> str | None:
    """A receive posted with irecv or batch_isend_irecv whose Work nobody waited on: what its buffer held when
    the code read it is a race with the transfer (the grader waited on it afterwards, for the next ring)."""
    for r in run.ranks:
        unwaited = [c for c in r.p2p if c.op == "recv" and c.waited is False]
        if unwaited:
            c, n = unwaited[0], len(unwaited)
            return (f"rank {r.rank} never waited on {n} of its {len(run.p2p(r.rank, 'recv'))} receives, the "
                    f"first from rank {c.peer} posted at {c.where}: with no .wait() on its Work the buffer is "
                    "read while the shard may still be arriving, a race with the transfer. Wait on every Work that "
                    "dist.batch_isend_irecv (or dist.irecv) returns before reading its buffer")
    return None


@mistake("a function still raises NotImplementedError")
def unwritten(run: Run, name: str) -> str | None:
    """The function ``name`` (this run's: ``run`` may be ``Run.backward()``) is the stub's still."""
    where = run.not_implemented()
    return None if where is None else f"{name} is not implemented yet ({where})"


@mistake("a function that returns nothing")
def returned_none(run: Run) -> str | None:
    for r in run.ranks:
        if r.returned_none:
            backward = isinstance(r, BackwardRing)
            name, want = ("ring_attention_backward", "(dq, dk, dv)") if backward else ("ring_attention", "its rows "
                                                                                       "of the output")
            return (f"rank {r.rank}'s {name} returned None and raised nothing, where its contract returns {want}: "
                    "its return statement is missing or never reached, or it returns a variable that was never "
                    "assigned a tensor (still its initial None)")
    return None


@mistake("a fully masked shard merged: NaN")
def masked_nan(run: Run) -> str | None:
    bad = [r.rank for r in run.ranks if r.out is not None and torch.isnan(r.out).any()]
    if not bad:
        return None
    out = run.ranks[bad[0]].out
    rows = int(torch.isnan(out).any(-1).sum())
    return (f"rank {bad[0]}'s output is NaN in {rows} of its {out[..., 0].numel()} (batch, head, position) rows: a row "
            "whose every score in a block is masked has logsumexp -inf, and exp(scores - lse) is then "
            "exp(-inf + inf) = NaN. Leave such rows out of that block (skip the pairs of chunks the mask hides "
            "entirely), and check that the mask keeps each query's own key (key position <= query position)")


@mistake("partial outputs averaged instead of weighed by their log-sum-exp")
def averaged(run: Run) -> str | None:
    ranks = _is(run, replay(run.world, merge="halves"))
    if not ranks:
        return None
    return (f"rank {ranks[-1]}'s output is (out + block_out) / 2 at each step: each partial output is normalised "
            "over its own block of keys, so the blocks weigh by their share of the softmax's normaliser, "
            "exp(lse_block - lse_total) with lse_total = logaddexp(lse, lse_block), not equally")


@mistake("max of the log-sum-exps without rescaling")
def max_no_rescale(run: Run) -> str | None:
    ranks = _is(run, replay(run.world, merge="max"))
    if not ranks:
        return None
    return (f"rank {ranks[-1]}'s output is what the merge gives with lse = max(lse, lse_block): the weights "
            "exp(lse - max) and exp(lse_block - max) then add up to more than 1. The merged normaliser is "
            "the log of the *sum* of exps, torch.logaddexp(lse, lse_block)")


@mistake("lse replaced by the merged one before out is rescaled")
def lse_first(run: Run) -> str | None:
    ranks = _is(run, replay(run.world, merge="lse first"))
    if not ranks:
        return None
    return (f"rank {ranks[-1]}'s output is what the merge gives when the old partial output keeps its whole weight "
            "at each step (out never rescaled, or rescaled by exp(lse - new) after lse was set to the new "
            "logaddexp(lse, lse_block), which is exp(0) = 1). Rescale out by exp(old lse - new lse), then keep the "
            "new one")


@mistake("the merged lse never kept")
def lse_not_kept(run: Run) -> str | None:
    if ranks := _is(run, replay(run.world, merge="lse unset")):
        return (f"rank {ranks[-1]}'s output is the last block's alone, what the merge gives when the running lse "
                "stays at its initial -inf: exp(lse - new) is then 0 and each block replaces the output instead of "
                "joining it. Keep the merged lse for the next block (in place, if you merge into a slice)")
    if ranks := _is(run, replay(run.world, merge="lse kept")):
        return (f"rank {ranks[-1]}'s output is what the merge gives when lse stays the first block's: each later "
                "block is weighed against that one block's normaliser instead of all the blocks merged so far. "
                "Keep the merged lse for the next block")
    return None


@mistake("causal mask by each shard's own indices")
def local_mask(run: Run) -> str | None:
    ranks = _is(run, replay(run.world, mask="local")) or _is(run, replay_sliced(run.world, mask="local"))
    if not ranks:
        return None
    return (f"rank {ranks[-1]}'s output is what a causal mask by each block's own indices (is_causal=True per "
            "block) gives: that mask hides the upper triangle of every block, whatever the shards' places in the "
            "sequence. Mask by global positions: in the zig-zag layout rank r's shard holds chunk r then chunk "
            "2W - 1 - r (c = S / 2W positions each), and a query sees a key when the key's position is <= its own")


@mistake("the contiguous layout's mask or skip on zig-zag shards")
def contiguous_rule(run: Run) -> str | None:
    """The causal ring of a contiguous layout (notebook 10's, and many a tutorial's) run on zig-zag shards: its
    positions ``r n + i``, or its rule that a later rank's shard is hidden, skipping it whole."""
    ranks = _is(run, replay(run.world, mask="contiguous", skip_later=True)) or \
        _is(run, replay(run.world, skip_later=True))
    if not ranks:
        return None
    r = ranks[-1] if ranks[-1] < run.world - 1 else ranks[0]
    return (f"rank {r}'s output is what the contiguous layout's causal ring gives (positions r n + i, or the shards "
            "of later ranks skipped whole): in the zig-zag layout rank r holds chunk r and chunk 2W - 1 - r, so its "
            "late chunk comes after every rank's early chunk, a later rank's included. Build each shard's global "
            "positions from its two chunks, and skip only what they hide")


@mistake("the forward's scores not scaled by 1/sqrt(head_dim)")
def unscaled(run: Run) -> str | None:
    ranks = _is(run, replay(run.world, scale=1.0))
    if not ranks:
        return None
    return (f"rank {ranks[-1]}'s output is the causal attention of q @ k^T not multiplied by 1/sqrt(head_dim) = "
            f"{HEAD_DIM ** -0.5:.4g}: the softmax is then sharper than the reference's. Scale the scores of every "
            "block before its softmax and its log-sum-exp")


@mistake("a later rank's shard: its early chunk alone")
def later_early_only(run: Run) -> str | None:
    ranks = _is(run, replay_sliced(run.world, later_early_only=True))
    if not ranks:
        return None
    return (f"rank {ranks[0]}'s output is what the ring gives when the late chunk of its queries sees only the early "
            "chunk of a later rank's shard: that shard's late chunk, 2W - 1 - src, comes before this rank's late "
            "chunk, 2W - 1 - r, in the sequence (src > r), so those queries see the whole of a later rank's shard")


@mistake("the shard in hand taken for the one from the other side of the ring")
def other_direction(run: Run) -> str | None:
    if run.world < 3:  # at 2 ranks both sides are one rank
        return None
    ranks = _is(run, replay_sliced(run.world, mislabelled=True))
    if not ranks:
        return None
    # The same output whichever way the shards travel (the two steps that differ swap their labels): the direction
    # is the run's, from whom rank 0 received
    came = {c.peer for c in run.p2p(0, "recv")}
    sign, other = ("+", "-") if came == {1} else ("-", "+")
    return (f"rank {ranks[0]}'s output is what a ring gives that takes the shard in hand at step s for rank "
            f"(rank {other} s) % W's: each step the shard comes from rank {sign} 1 (rank 0 received from "
            f"{'rank 1' if sign == '+' else f'rank {run.world - 1}'}), so at step s it started at rank (rank {sign} s) "
            f"% W. At {run.world} ranks the two differ (at 2 they are one rank), and the blocks were cut and masked "
            "for another rank's positions")


@mistake("the shard's two chunks taken in the other order")
def chunks_swapped(run: Run) -> str | None:
    ranks = _is(run, replay_sliced(run.world, swapped=True))
    if not ranks:
        return None
    return (f"rank {ranks[0]}'s output is what a ring gives that takes each shard to hold chunk 2W - 1 - r first: "
            "its positions, and the chunks kept of other ranks' shards, are the other way round. The shard holds "
            "chunk r first (positions r c ... (r + 1) c - 1), then chunk 2W - 1 - r")


@mistake("no causal mask")
def no_mask(run: Run) -> str | None:
    ranks = _is(run, noncausal(run.world))
    if not ranks:
        return None
    return (f"rank {ranks[0]}'s output is the non-causal attention (every key seen): mask each block by global "
            "positions, key position <= query position (in the zig-zag layout: chunk r, then chunk 2W - 1 - r)")


@mistake("gathered the whole sequence with a collective")
def gathered(run: Run) -> str | None:
    kinds = sorted({k for r in run.ranks for k in r.collectives})
    if not kinds:
        return None
    return (f"the ring called {', '.join(kinds)}: a collective that gathers the keys and values holds the whole "
            "sequence on every rank, the memory context parallelism is there to save. Pass one shard at a time "
            "to the next rank with point-to-point sends")


# The backward's (``run`` is ``Run.backward()``: each rank's ``grads``, autograd's in ``run.grads``)

def grads_close(got: dict | None, want: dict, names=GRADS) -> bool:
    return got is not None and all(_close(got[g], want[g]) for g in names)


def _grads_are(run: Run, replayed: list[dict], names=GRADS) -> list[int]:
    """The ranks whose gradients ``names`` are wrong and equal the replayed mistake's."""
    return [r.rank for r in run.ranks if not grads_close(r.grads, run.grads[r.rank], names)
            and grads_close(r.grads, replayed[r.rank], names)]


@mistake("dk, dv left one or more hops from their owner")
def not_home(run: Run) -> str | None:
    if any(r.grads is None for r in run.ranks):
        return None
    for shift in range(1, run.world):
        if all(grads_close(r.grads, run.grads[(r.rank + shift) % run.world], ("dk", "dv"))
               for r in run.ranks):
            away = "one hop" if shift in (1, run.world - 1) else f"{shift} hops"
            return (f"every rank r returned the dk, dv of rank (r + {shift}) % W's shard (rank 0 those of rank "
                    f"{shift}'s): the accumulators travel with their k, v shard, and after its W - 1 = "
                    f"{run.world - 1} hops they sit {away} from home. Send dk, dv on once more, round the same "
                    "ring, so that each rank ends with the gradients of its own k, v")
    return None


@mistake("D computed per block instead of from the merged output")
def block_delta(run: Run) -> str | None:
    ranks = _grads_are(run, replay_backward(run.world, delta="block"), ("dq", "dk"))
    if not ranks:
        return None
    return (f"rank {ranks[-1]}'s dq and dk are what D = rowsum(dout * p @ v) of each block gives: D_i = "
            "sum_j p_ij dp_ij runs over every key query i sees, so it is one number per query, rowsum(dout * out) "
            "with the merged output you are given, computed once before the ring")


@mistake("lse of the block instead of the merged lse")
def block_lse(run: Run) -> str | None:
    ranks = _grads_are(run, replay_backward(run.world, lse="block"))
    if not ranks:
        return None
    return (f"rank {ranks[-1]}'s gradients are what p = exp(s - logsumexp(s)) of each block's own scores gives: that "
            "p sums to 1 over one block, as if every block held the whole softmax. The probabilities are over the "
            "whole sequence: p = exp(s - lse) with the merged lse you are given")


@mistake("the causal mask dropped in the backward")
def backward_no_mask(run: Run) -> str | None:
    ranks = _grads_are(run, replay_backward(run.world, mask=False)) or \
        _grads_are(run, replay_backward(run.world, mask=False, skip=False))
    if not ranks:
        return None
    return (f"rank {ranks[-1]}'s gradients are what a backward with no causal mask gives: p = exp(s - lse) must be 0 "
            "where the key's global position is after the query's (positions of the zig-zag layout), as in the "
            "forward; mask the scores before the exp")


@mistake("scale missing in dq or dk")
def no_scale(run: Run) -> str | None:
    root = HEAD_DIM ** 0.5
    for r in run.ranks:
        got, want = r.grads, run.grads[r.rank]
        off = [g for g in ("dq", "dk") if got is not None and not _close(got[g], want[g])
               and _close(got[g], want[g] * root)]
        if off:
            return (f"rank {r.rank}'s {' and '.join(off)} {'are' if len(off) > 1 else 'is'} sqrt(head_dim) = "
                    f"sqrt({HEAD_DIM}) = {root:.3g}x autograd's: the scores are s = scale * q k^T with scale = "
                    "1 / sqrt(head_dim), so ds reaches dq as scale * ds @ k and dk as scale * ds^T @ q")
    return None


@mistake("a gradient returned in another one's place")
def swapped_grads(run: Run) -> str | None:
    for r in run.ranks:
        got, want = r.grads, run.grads[r.rank]
        if got is None:
            continue
        for g in GRADS:
            twin = next((h for h in GRADS if h != g and _close(got[g], want[h])), None)
            if twin and not _close(got[g], want[g]):
                return (f"rank {r.rank}'s returned {g} is autograd's {twin} of this rank's shard: the tuple is "
                        "(dq, dk, dv), in that order, each the gradient of its own input")
    return None


@mistake("a gradient never accumulated: all zeros")
def zero_grad_returned(run: Run) -> str | None:
    for r in run.ranks:
        got, want = r.grads, run.grads[r.rank]
        zero = [g for g in GRADS if got is not None and got[g] is not None and not got[g].any() and want[g].any()]
        if zero:
            return (f"rank {r.rank}'s {' and '.join(zero)} {'are' if len(zero) > 1 else 'is'} zero in every value, "
                    "where autograd's is not: nothing was added into the tensor returned as "
                    f"{zero[0]} (an accumulation into another buffer, or into a copy of it)")
    return None


@mistake("NaN in the backward")
def backward_nan(run: Run) -> str | None:
    masked = replay_backward(run.world, lse="block", skip=False)  # the NaN a wholly masked block gives
    for r in run.ranks:
        bad = [g for g, t in (r.grads or {}).items() if t is not None and torch.isnan(t).any()]
        if any((torch.isnan(r.grads[g]) & ~torch.isnan(masked[r.rank][g])).any() for g in bad):
            return None  # NaN where no masked block puts it (memory never written?): not this mistake
        if bad:
            return (f"rank {r.rank}'s {', '.join(bad)} hold NaN: where every key of a block is after the query, "
                    "the row's scores are all -inf, and exp(-inf - logsumexp(-inf)) is NaN. Use the merged lse you "
                    "are given (finite: every query sees at least itself) and skip the pairs of chunks the mask hides")
    return None


OUTPUT = [*PROTOCOL, packed_along_batch, returned_none, masked_nan, averaged, max_no_rescale, lse_first, lse_not_kept,
          local_mask, contiguous_rule, chunks_swapped, no_mask, unscaled, later_early_only, other_direction]
GRADIENTS = [*PROTOCOL, returned_none, swapped_grads, zero_grad_returned, backward_nan, block_delta, block_lse,
             backward_no_mask, no_scale]
BACKWARD_RING = [*PROTOCOL, not_home]


@mistake("log-sum-exps merged without the max: overflow on large scores")
def large_scores_overflow(run: Run) -> str | None:
    """The forward's second ring, on queries times ``reference.LARGE``: scores past float32's ``exp`` range."""
    from .reference import LARGE

    for obs in run.ranks:
        got = getattr(obs, "out_large", None)
        if got is None or not run.large:
            continue
        ref = run.large[obs.rank]
        if tuple(got.shape) != tuple(ref.shape) or not torch.allclose(got, ref, rtol=1e-3, atol=1e-4):
            bad = ("holds inf or NaN" if not torch.isfinite(got).all() else
                   f"differs from the whole sequence's (max abs difference {float((got - ref).abs().max()):.3g})"
                   if tuple(got.shape) == tuple(ref.shape) else f"has shape {tuple(got.shape)}")
            return (f"with the queries times {LARGE:g} (scores up to {float(_max_score(run)):.0f}), rank {obs.rank}'s "
                    f"output {bad}, though the same ring matched on the ordinary inputs: the merge must hold for "
                    "scores past float32's exp() range (about 88), where exp(lse) is inf. Merge log-sum-exps as "
                    "m + log(exp(a - m) + exp(b - m)) with m = max(a, b) (torch.logaddexp does it)")
    return None


def _max_score(run: Run) -> torch.Tensor:
    from .reference import LARGE, whole

    q, k, _ = whole()
    return (q * LARGE @ k.transpose(-1, -2) * q.shape[-1] ** -0.5).max()
