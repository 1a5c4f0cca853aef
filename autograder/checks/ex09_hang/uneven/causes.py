"""The named mistakes of exercise 9's part 2 (``train_uneven``): each tests one scenario's observations
(:class:`~.observations.Scenario`) and returns its message, or ``None`` when it does not explain them
(``autograder/grader/diagnosis.py``)."""
from __future__ import annotations

import math

import torch

from ....grader.diagnosis import KnownError, mistake
from ....grader.parity import parity
from ..partings import Fingerprint
from .observations import Scenario, UnevenCall, model, reference

RTOL, ATOL = 1e-5, 1e-6   # all-reduced sums in another order than one process's
GRADIENT_NUMEL = min(p.numel() for p in model().parameters())  # an all-reduce this large carries gradients

UNEVEN_ERRORS = [
    KnownError("uneven: join() called on a model that is not wrapped in DDP",
               r"AttributeError: '(?!DistributedDataParallel)\w+' object has no attribute 'join'",
               "join() is a method of DistributedDataParallel (a Joinable), not of the model: wrap the model, "
               "ddp = DistributedDataParallel(model), run every forward through ddp, and enter ddp.join(...) "
               "around the loop"),
]


def _lines(calls: list[UnevenCall]) -> str:
    """The learner's lines of ``calls``, each once."""
    return ", ".join(dict.fromkeys(c.at or "a line outside your file" for c in calls))


def _state(s: Scenario, rank: int) -> str:
    """How far ``rank`` had read its batches when it stopped: ``"out of data after its 2 batches"``."""
    r = s.ranks[rank]
    if r.exhausted:
        return f"out of data after its {r.batches} batch{'es' if r.batches != 1 else ''}" if r.batches \
            else "out of data, with no batch at all"
    if r.taken:
        return f"at its batch {r.taken - 1} of {r.batches}"
    return f"before the first of its {r.batches} batches"


def _op(op: Fingerprint) -> str:
    shape = op.shapes[0] if op.shapes else []
    return f"{op.kind} of {shape} at {op.at or 'a line outside your file'}"


@mistake("a collective's dtype differs between ranks")
def dtypes_differ(x) -> str | None:
    """Where the ranks' next collectives are the same op on tensors of the same shape but of other dtypes (gloo aborts
    the process on it; NCCL reads the bytes as another type). ``x``: either part's run (its ``mismatch``)."""
    m = x.mismatch
    if m is None or m.theirs is None or not (m.mine.dtypes and m.theirs.dtypes) or m.mine.dtypes == m.theirs.dtypes \
            or (m.mine.kind, m.mine.shapes) != (m.theirs.kind, m.theirs.shapes):
        return None
    (mine, theirs), where = (f"{o.dtypes[0]}{o.shapes[0] if o.shapes else []}" for o in (m.mine, m.theirs)), \
        (o.at or "a line outside your file" for o in (m.mine, m.theirs))
    return (f"rank {m.rank}'s collective {m.mine.n} is {m.mine.kind} of {mine} at {next(where)}, rank {m.peer}'s the "
            f"same {m.theirs.kind} of {theirs} at {next(where)}: a collective combines one dtype on every rank (gloo "
            "aborts the process on this one, NCCL would read the bytes as the wrong type). Give the tensor the same "
            "dtype on every rank, whatever its data")


def parted(s: Scenario) -> str | None:
    """Where the ranks' collectives parted: each rank's op, line and data (the words of the causes)."""
    m = s.mismatch
    if m is None:
        return None
    mine = f"{_op(m.mine)} (its collective {m.mine.n}, {_state(s, m.rank)})"
    if m.theirs is not None:
        return f"rank {m.rank}'s next collective is {mine}, rank {m.peer}'s is {_op(m.theirs)} ({_state(s, m.peer)})"
    if m.peer_done is None:
        return f"rank {m.rank} waits in {mine}; rank {m.peer} ({_state(s, m.peer)}) never reached its collective"
    return (f"rank {m.rank} waits in {mine}, while rank {m.peer} had returned from train_uneven after "
            f"{m.peer_done} collectives, {_state(s, m.peer)}")


@mistake("uneven: a rank that runs out of batches leaves the loop")
def left_early(s: Scenario) -> str | None:
    m = s.mismatch
    if m is None or m.peer_done is None:
        return None
    gone = s.ranks[m.peer]
    if not gone.exhausted or gone.taken != gone.batches or gone.error:
        return None
    return (f"the job hangs with {s.label}: {parted(s)}. Rank {m.peer} left its loop when its own data ended, and "
            f"rank {m.rank}, which still had a batch, waits for it in that step's collectives (for ever, in a real "
            "job). Until no rank has a batch left, a rank out of data keeps making every step's collectives, "
            "adding nothing to them")


def _flat(state: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([v.reshape(-1).double() for v in state.values()])


def updates(s: Scenario) -> list[tuple[int, float, float]]:
    """``(step, ratio, residual)`` of the longest rank's update at each step it shows: its weights at the next
    batch's forward (or its final weights) minus those at this one's, against one process's step from the same
    weights on the step's samples: ``ratio`` the projection on it, ``residual`` what is left (relative)."""
    rank = s.ranks[s.longest]
    out = []
    for step in range(s.steps):
        before = rank.forwarded.get(step)
        after = rank.forwarded.get(step + 1) if step + 1 < s.steps else rank.final
        if before is None or after is None:
            continue
        start = _flat(before)
        ours, ref = _flat(after) - start, _flat(s.step_from(before, step)) - start
        if not torch.isfinite(ours).all() or float(ref.norm()) == 0:
            continue
        ratio = float(ours @ ref / (ref @ ref))
        out.append((step, ratio, float((ours - ratio * ref).norm() / ref.norm())))
    return out


def _listed(noun: str, items: list[int]) -> str:
    """``"step 3"``, ``"steps 1, 2 and 3"``."""
    return f"{noun} {items[0]}" if len(items) == 1 else f"{noun}s {', '.join(map(str, items[:-1]))} and {items[-1]}"


@mistake("uneven: the update divided by every rank's share, not the ranks with data")
def divided_by_all(s: Scenario) -> str | None:
    seen = updates(s)
    partial = [(t, ratio) for t, ratio, rest in seen if len(s.active(t)) < s.world and rest < 0.02]
    full = [ratio for t, ratio, rest in seen if len(s.active(t)) == s.world]
    if not partial or len(partial) != sum(len(s.active(t)) < s.world for t, _, _ in seen):
        return None
    if any(abs(ratio - len(s.active(t)) / s.world) > 0.02 for t, ratio in partial):
        return None
    if any(abs(ratio - 1) > 0.02 for ratio in full):
        return None
    k = len(s.active(partial[0][0]))
    steps = _listed("step", [t for t, _ in partial])
    head = (f"at {steps} only {k} of the {s.world} ranks had a batch, and rank {s.longest}'s "
            f"update there was {partial[0][1]:.3g}x one process's on those samples"
            + (" (1x at the steps where every rank had one)" if full else "")
            + f": the summed gradient was divided by the {s.world} ranks of the job, not by the {k} that had data")
    joined = [j for r in s.ranks for j in r.joins if "DistributedDataParallel" in j.joinables]
    if joined and all(j.divide_by_initial_world_size for j in joined):
        return (head + ". DDP's join() divides by the initial world size unless it is told "
                "divide_by_initial_world_size=False; then it divides by the ranks that have not joined, which with "
                "equal batches is the mean over the step's samples")
    return head + ". Divide by the samples of the ranks that had a batch at that step (an all-reduced count)"


@mistake("uneven: every update scaled by one factor")
def scaled_everywhere(s: Scenario) -> str | None:
    """The same factor (not 1) at every step, whatever the ranks with data: a scale on top of the mean loss."""
    seen = updates(s)
    if len(seen) < 2 or any(rest > 0.02 for _, _, rest in seen):
        return None
    k = seen[0][1]
    if abs(k - 1) < 0.02 or any(abs(ratio - k) > 0.02 * abs(k) for _, ratio, _ in seen):
        return None
    n = round(1 / k) if k > 0 else 0
    frac = f" (1/{n})" if n > 1 and abs(1 / k - n) < 0.02 * n else ""
    steps = _listed("step", [t for t, _, _ in seen])
    return (f"rank {s.longest}'s update was {k:.3g}x{frac} one process's SGD step on the step's samples at every "
            f"step it shows ({steps}), whichever ranks had a batch: the loss or the gradient "
            f"was scaled by {k:.3g} on top of the mean over the step's samples. Divide the summed gradient once, by "
            "the samples of the ranks that had a batch")


@mistake("uneven: the loop ends when the first rank runs out")
def stopped_at_shortest(s: Scenario) -> str | None:
    if not s.finished:
        return None
    longest, shortest = s.ranks[s.longest], min(s.lengths)
    if len(longest.forwarded) >= longest.batches or \
            not parity(longest.final, s.reference[shortest], rtol=RTOL, atol=ATOL).ok:
        return None
    first = min(range(s.world), key=lambda r: s.lengths[r])
    ran_out = f"ran out after its {shortest}" if shortest else "had no batch at all"
    return (f"rank {s.longest} ran {len(longest.forwarded)} of its {longest.batches} batches through the model, and "
            f"its weights after train_uneven are one process's after {shortest} steps: the job stopped as rank "
            f"{first} {ran_out}, so the batches the other ranks still had were never learnt from. It runs until "
            "the last batch of the longest rank, the ranks out of data taking part with nothing to add")


@mistake("uneven: a rank out of data sends a non-zero gradient")
def stale_on_exhausted(s: Scenario) -> str | None:
    for r in s.ranks:
        sent = [c for c in r.calls if c.exhausted and c.kind == "all_reduce" and c.numel >= GRADIENT_NUMEL]
        nonzero = [c for c in sent if c.input_abs > 0]
        if nonzero:
            total = sum(c.input_abs for c in nonzero)
            return (f"rank {r.rank} had run out of data (after its {r.batches} batches), yet all-reduced tensors "
                    f"whose |values| sum to {total:.3g} ({len(nonzero)} all-reduces at {_lines(nonzero)}): a rank "
                    "without a batch adds nothing to the step's sum: send zeros, not a gradient of an earlier batch "
                    "(one left in .grad, or one computed again on a batch it already had)")
    return None


@mistake("uneven: a rank out of data stops updating its weights")
def stops_updating(s: Scenario) -> str | None:
    if not s.finished or not parity(s.ranks[s.longest].final, s.reference[-1], rtol=RTOL, atol=ATOL).ok:
        return None
    for r in s.ranks:
        if r.batches < s.steps and not parity(r.final, s.reference[-1], rtol=RTOL, atol=ATOL).ok \
                and parity(r.final, s.reference[r.batches], rtol=RTOL, atol=ATOL).ok:
            had = (f"one process's after {r.batches} steps, the batches it had" if r.batches
                   else "still the initial ones: it had no batch")
            return (f"rank {r.rank}'s weights after train_uneven are {had}, while rank {s.longest}'s match one "
                    f"process's after all {s.steps} steps: a rank out of data still applies each later step's update "
                    "(the others' gradients), or receives the final weights, so that every rank returns the same "
                    "model")
    return None


@mistake("uneven: gradients never all-reduced")
def no_gradient_sync(s: Scenario) -> str | None:
    if any(c.kind == "all_reduce" and c.numel >= GRADIENT_NUMEL for r in s.ranks for c in r.calls):
        return None
    if not any(r.forwarded for r in s.ranks):
        return None
    kinds = sorted({f"{c.kind} of {c.shape}" for c in s.ranks[0].calls})
    head = (f"no rank all-reduced a gradient with {s.label} (rank 0's collectives: {', '.join(kinds) or 'none'}): "
            "each rank stepped on its own batches only, and the ranks trained apart")
    direct = sum(r.direct for r in s.ranks)
    if direct and any(r.wrapped for r in s.ranks):
        return (head + f". A DistributedDataParallel wrapped the model, but {direct} forwards of a batch called the "
                "model itself, not the wrapper, which bypasses DDP's gradient all-reduce: run every forward through "
                "the wrapper")
    return head + ". Every step all-reduces the gradients, on every rank"


@mistake("uneven: the round after the last batch divided by a count of 0")
def nan_after_last(s: Scenario) -> str | None:
    if not s.finished or not all(any(math.isnan(float(v.float().sum())) for v in r.final.values()) for r in s.ranks):
        return None
    if not all(torch.isfinite(v).all() for r in s.ranks for w in r.forwarded.values() for v in w.values()):
        return None
    return (f"every rank's weights were finite when the last batch went through the forward (step {s.steps - 1}) "
            "and NaN when train_uneven returned: after the last step the loop made one more round, in which no "
            "rank had a batch, and its update divided by a count of 0. Leave the loop when the step's all-reduced "
            "count is 0, before any update")


@mistake("uneven: the stream read ahead, not one batch per step")
def read_ahead(s: Scenario) -> str | None:
    ahead = max(s.ranks, key=lambda r: r.read_ahead)
    if ahead.read_ahead <= 1:  # one batch ahead: a look-ahead that tells the last batch, as a loader's prefetch does
        return None
    return (f"with {s.label}, rank {ahead.rank} had taken {ahead.read_ahead} batches past the one going through the "
            f"model (of its {ahead.batches}): the stream is read once, one batch per step, since a data loader's "
            "may be endless or larger than memory (list(batches) reads it all up front); take the next batch at each "
            "step")


def _groups(s: Scenario) -> list[list[int]]:
    """The ranks by their final weights: each group's ranks match its first's."""
    groups: list[list[int]] = []
    for r in s.ranks:
        home = next((g for g in groups if parity(r.final, s.ranks[g[0]].final, rtol=RTOL, atol=ATOL).ok), None)
        home.append(r.rank) if home else groups.append([r.rank])
    return groups


@mistake("uneven: gradients summed over part of the ranks, not all")
def partial_sum(s: Scenario) -> str | None:
    """The ranks end in groups of two or more that agree within but not with each other, none as one process: each
    group summed its own ranks' gradients (right at W=2, where the partner or subgroup is every rank)."""
    if not s.finished or any(parity(r.final, s.reference[-1], rtol=RTOL, atol=ATOL).ok for r in s.ranks):
        return None
    groups = _groups(s)
    if len(groups) < 2 or any(len(g) < 2 for g in groups):
        return None
    apart = max(parity(s.ranks[a[0]].final, s.ranks[b[0]].final, rtol=RTOL, atol=ATOL).max_abs_diff
                for a in groups for b in groups if a is not b)
    said = ", ".join(f"{_listed('rank', g)} with the same weights" for g in groups)
    own = all(parity(s.ranks[g[0]].final, reference(s.name, tuple(g))[-1], rtol=RTOL, atol=ATOL).ok for g in groups)
    learnt = "; each group's weights are one process's that learnt from its own ranks' batches only" if own else ""
    kinds = ", ".join(dict.fromkeys(f"{c.kind} of {c.shape}" for c in s.ranks[0].calls)) or "none"
    return (f"with {s.label} the ranks ended with {len(groups)} different models: {said}, the models up to "
            f"{apart:.3g} apart (rank 0's collectives: {kinds}){learnt}. Each step sums the gradients and counts of "
            f"all {s.world} ranks, with a collective over the whole job (dist.all_reduce on the default group): a sum "
            f"with one partner rank (send/recv) or over a subgroup is the whole job at 2 ranks, not at {s.world}")
