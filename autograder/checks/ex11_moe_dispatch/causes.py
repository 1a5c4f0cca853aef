"""Exercise 11's likely mistakes, tested against what the ranks observed (see autograder/grader/diagnosis.py).

Each takes the :class:`~.observations.Run` of one file at one world size and returns its message with the
numbers of the run, or ``None`` when it does not explain what was seen.
"""
from __future__ import annotations

import torch

from ...grader.diagnosis import KnownError, mistake
from .answers import ANSWERS
from .observations import Run

KNOWN_ERRORS = [
    KnownError("split sizes that do not add up to the rows sent",
               r"[Ss]plit sizes? .*(sum|doesn't match)|split_sizes",
               "an all-to-all's input_split_sizes add up to the rows it sends, its output_split_sizes to the rows "
               "it receives: dispatch sends the kept slots (input_split_sizes) and receives output_split_sizes; "
               "combine sends those back, so its two lists swap places (all_to_all_single_autograd takes "
               "output_split_sizes first, and reports a mismatch where its result is first used)"),
]


def _kept(run: Run, rank: int) -> torch.Tensor:
    return run.slots(rank).keep.nonzero().squeeze(1)


@mistake("split sizes wrong on an edge case of the contract")
def edge_case_missed(run: Run) -> str | None:
    """sort_by_expert on the inputs its contract names (edges.edge_cases): an expert with none gets 0."""
    for case in run.ranks[0].edges:
        kept = [e for e, k in zip(case.expert, case.keep) if k]
        want = [kept.count(j) for j in range(run.world)]
        if case.error:
            return (f"sort_by_expert raised {case.error} where {case.name} (expert={case.expert}, keep={case.keep}); "
                    f"its input_split_sizes there are {want}")
        if case.send != want or not case.perm_ok:
            what = (f"input_split_sizes {case.send}, where the kept slots per expert are {want}" if case.send != want
                    else f"a perm that is not the {len(kept)} kept slots' indices in expert order")
            return (f"where {case.name} (expert={case.expert}, keep={case.keep}, W={run.world}), sort_by_expert "
                    f"returned {what}: the list has one count per rank, W of them, and an expert with no kept slot "
                    "gets 0")
    return None


@mistake("keep applied to the sorted order, not to the slots")
def keep_on_sorted(run: Run) -> str | None:
    """``argsort(expert)[keep]``: the mask of slot ``j`` picks position ``j`` of the sorted order (another slot)."""
    for obs in run.ranks:
        perm, r, slots = obs.returned.perm, obs.rank, run.slots(obs.rank)
        if not isinstance(perm, torch.Tensor) or perm.shape != slots.keep[slots.keep].shape:
            continue
        order = torch.argsort(slots.expert, stable=True)
        if not torch.equal(perm.cpu(), order[slots.keep]) or torch.equal(perm.cpu(), _kept(run, r)[
                torch.argsort(slots.expert[slots.keep], stable=True)]):
            continue
        sent, kept = set(perm.tolist()), set(slots.keep.nonzero().squeeze(1).tolist())
        return (f"rank {r}'s perm is argsort(expert) masked with keep: keep[j] says whether slot j is kept, but it "
                "picked position j of the sorted order, which holds another slot, so perm sends dropped slots "
                f"{sorted(sent - kept)[:5]} and leaves out kept slots {sorted(kept - sent)[:5]}. Drop first, then "
                "sort: kept = keep.nonzero().squeeze(1), then kept[argsort(expert[kept])]")
    return None


@mistake("capacity drop not applied: dropped slots sent")
def dropped_sent(run: Run) -> str | None:
    for obs in run.ranks:
        perm, r = obs.returned.perm, obs.rank
        dropped = (~run.slots(r).keep).nonzero().squeeze(1)
        if isinstance(perm, torch.Tensor) and len(dropped) and set(dropped.tolist()) & set(perm.tolist()):
            n = len(set(dropped.tolist()) & set(perm.tolist()))
            return (f"rank {r}'s perm holds {len(perm)} slots, {n} of them dropped at capacity (keep is False for "
                    f"slots {dropped.tolist()[:5]}): send only the slots where keep is True, and count only those "
                    "in input_split_sizes")
    return None


@mistake("perm indexes the list of kept slots, not the slots")
def perm_in_kept(run: Run) -> str | None:
    for obs in run.ranks:
        perm, r = obs.returned.perm, obs.rank
        kept = _kept(run, r)
        # where no slot before the last kept one was dropped, the positions in the kept list are the slots
        apart = kept.tolist() != list(range(len(kept)))
        if apart and isinstance(perm, torch.Tensor) and sorted(perm.tolist()) == list(range(len(kept))):
            k = next(int(p) for p in perm if int(kept[p]) != int(p))  # a position that is not its slot
            return (f"rank {r}'s perm holds positions 0..{len(kept) - 1} in the list of its {len(kept)} kept slots, "
                    f"not the slots' own indices (position {k} there is slot {int(kept[k])}): index that list with "
                    "them, kept[order], where kept = keep.nonzero().squeeze(1)")
    return None


@mistake("split sizes count the dropped slots")
def counted_dropped(run: Run) -> str | None:
    for obs in run.ranks:
        r, send, slots = obs.rank, obs.returned.send, run.slots(obs.rank)
        every = torch.bincount(slots.expert, minlength=run.world).tolist()
        if isinstance(send, list) and send == every != slots.send:
            return (f"rank {r}'s input_split_sizes is {send}, the slots per expert dropped ones included; it sends "
                    f"only the kept ones, {slots.send} per expert: count the slots where keep is True")
    return None


@mistake("tokens sorted by the wrong key")
def wrong_order(run: Run) -> str | None:
    for obs in run.ranks:
        perm, r = obs.returned.perm, obs.rank
        kept = _kept(run, r)
        if isinstance(perm, torch.Tensor) and sorted(perm.tolist()) == kept.tolist():
            experts = run.slots(r).expert[perm]
            if len(experts) > 1 and not bool((experts.diff() >= 0).all()):
                k = int((experts.diff() < 0).nonzero()[0]) + 1
                return (f"rank {r}'s perm is not in expert order: its slot {k} goes to expert {int(experts[k])} "
                        f"after one for expert {int(experts[k - 1])}; all_to_all_single sends the first "
                        "input_split_sizes[0] rows to rank 0, the next to rank 1...: sort the kept slots by "
                        "expert, ascending")
    return None


@mistake("split sizes not exchanged: output_split_sizes = input_split_sizes")
def not_exchanged(run: Run) -> str | None:
    for obs in run.ranks:
        r, recv, send = obs.rank, obs.returned.recv, run.slots(obs.rank).send
        want = [run.slots(j).send[r] for j in range(run.world)]
        if recv != send or recv == want:
            continue
        made = [c for c in run.calls(r, "exchange") if c.kind == "all_to_all"]
        if made:
            return (f"rank {r}'s exchange_split_sizes made an all_to_all_single of the counts, but returned {recv}, "
                    f"its own input_split_sizes, not what it received ({want} from ranks 0..{run.world - 1}): "
                    "return the all-to-all's output")
        return (f"rank {r}'s exchange_split_sizes returned {recv}, its own input_split_sizes: it will receive "
                f"{want} rows from ranks 0..{run.world - 1}, which only they know; all-to-all the counts "
                "first (dist.all_to_all_single of a tensor of them)")
    return None


@mistake("the counts exchanged in place: one tensor the all-to-all's output and input")
def aliased_exchange(run: Run) -> str | None:
    """``all_to_all_single(t, t)``: what arrives depends on the order the transfers run, so a run may be right."""
    r = next((o.rank for o in run.ranks if any(c.aliased for c in run.calls(o.rank, "exchange"))), None)
    if r is None:
        return None
    wrong = [(o.rank, o.returned.recv, [run.slots(j).send[o.rank] for j in range(run.world)]) for o in run.ranks]
    wrong = [w for w in wrong if w[1] != w[2]]
    outcome = (f"rank {wrong[0][0]} returned {wrong[0][1]}, where the ranks send it {wrong[0][2]}" if wrong else
               "every rank returned the right counts all the same")
    return (f"rank {r}'s exchange_split_sizes made its all_to_all_single with one tensor as both its output and its "
            "input: the counts it receives land in the buffer it is still sending from, so what the others get "
            f"depends on the order the transfers run (in this run {outcome}). Give the all-to-all an output tensor "
            "of its own (torch.empty_like of the counts)")


@mistake("permutation not inverted: rows come back in expert order")
def not_inverted(run: Run) -> str | None:
    for obs in run.ranks:
        r, got = obs.rank, obs.y_slots
        if got is None:
            continue
        kept, want = _kept(run, r), run.slots(r).y_slots
        perm = kept[torch.argsort(run.slots(r).expert[kept], stable=True)]
        if not torch.allclose(got, want, atol=1e-5) and torch.allclose(got[:len(perm)], want[perm], atol=1e-5):
            return (f"rank {r}'s combine returned the {len(perm)} rows in the order they were sent (by expert): "
                    "row k belongs to slot perm[k]; put it there (out[perm] = rows, or index_copy(0, perm, rows))")
    return None


@mistake("combine leaves the dropped slots' rows unwritten")
def dropped_unwritten(run: Run) -> str | None:
    for obs in run.ranks:
        r, got, want = obs.rank, obs.y_slots, obs.y_slots_want
        dropped = ~run.slots(r).keep
        if got is None or not dropped.any() or not torch.isnan(got[dropped]).all():
            continue
        if torch.allclose(got[~dropped], want[~dropped], rtol=1e-5, atol=1e-6):
            slots = dropped.nonzero().squeeze(1).tolist()
            return (f"rank {r}'s combine returned NaN in the rows of the {len(slots)} dropped slots {slots[:5]}, "
                    "where the contract gives zeros: the grader's runs fill fresh memory with NaN, so that a row "
                    "torch.empty or new_empty leaves unwritten shows; start from new_zeros")
    return None


@mistake("dispatch's split sizes swapped")
def splits_swapped(run: Run) -> str | None:
    for obs in run.ranks:
        r, shape = obs.rank, obs.returned.dispatch_shape
        sent, received = sum(run.slots(r).send), len(obs.dispatch_want)
        if isinstance(shape, list) and shape[:1] == [sent] and sent != received:
            return (f"rank {r}'s dispatch returned {sent} rows, the number it sends (the sum of input_split_sizes), "
                    f"not the {received} it receives (the sum of output_split_sizes): all_to_all_single_autograd("
                    "input, output_split_sizes, input_split_sizes, group) takes the output's sizes first")
    return None


def rows_differ(run: Run, rank: int) -> str:
    """Rank ``rank``'s dispatch returned the right number of rows, not the right ones: the first that differs,
    and the rank it comes from."""
    got, want = run.ranks[rank].returned.dispatched, run.ranks[rank].dispatch_want
    k = int((got != want).any(dim=1).nonzero()[0])
    counts = [run.slots(j).send[rank] for j in range(run.world)]
    src = next(j for j in range(run.world) if k < sum(counts[:j + 1]))
    elsewhere = next((i for i in range(len(want)) if torch.equal(want[i], got[k])), None)
    where = (f"it is the row that belongs at {elsewhere}" if elsewhere is not None
             else "it is none of the rows the ranks send")
    return (f"rank {rank}'s dispatch returned {len(got)} rows, the right number, but row {k} (of rank {src}'s "
            f"{counts[src]}) is not rank {src}'s row for it: {where}; send x_slots[perm], cut by input_split_sizes, "
            "in that order")


@mistake("combine puts rows in the wrong slots")
def wrong_slots(run: Run) -> str | None:
    for obs in run.ranks:
        r, got, want = obs.rank, obs.y_slots, obs.y_slots_want
        if got is None or got.shape != want.shape:
            continue
        kept = _kept(run, r).tolist()
        if not all(any(torch.allclose(got[i], want[j], atol=1e-6) for j in kept) for i in kept):
            continue
        i = next((i for i in kept if not torch.allclose(got[i], want[i], atol=1e-6)), None)
        if i is None:  # every kept slot holds its own row: what differs is elsewhere (a dropped slot's zeros)
            continue
        j = next(j for j in kept if torch.allclose(got[i], want[j], atol=1e-6))
        return (f"rank {r}'s combine put the expert's outputs in the wrong slots: slot {i} holds slot {j}'s; the "
                "row that comes back k-th belongs to slot perm[k] (out.index_copy(0, perm, rows), or "
                "out[perm] = rows)")
    return None


@mistake("all-to-all not autograd-aware: no gradient through it")
def not_autograd(run: Run, only: str | None = None) -> str | None:
    """A stage (``only``: that one) whose output has no grad_fn: the backward stops there."""
    for obs in run.ranks:
        for stage, grad_fn in (("dispatch", obs.received_grad_fn), ("combine", obs.combined_grad_fn)):
            if grad_fn is False and only in (None, stage):
                lost = ("the tokens' rows (x) get no gradient back through it, only the router's" if stage == "dispatch"
                        else "the expert's parameters get no gradient, nor do the tokens' rows back through dispatch")
                return (f"rank {obs.rank}'s {stage} returned a tensor with no grad_fn: dist.all_to_all_single "
                        f"writes into a buffer autograd cannot see through, so the backward stops there: {lost}; use "
                        "the autograd-aware all_to_all_single_autograd (torch.distributed._functional_collectives; "
                        "torch.distributed.nn.functional.all_to_all_single is deprecated in torch 2.13)")
    return None


FUNCTIONS = {"sort": ("sort_by_expert", "(perm, input_split_sizes)"),
             "exchange": ("exchange_split_sizes", "output_split_sizes, a list of {world} ints"),
             "dispatch": ("dispatch", "the rows this rank's expert receives, a tensor"),
             "combine": ("combine", "one row per slot, a tensor")}


@mistake("a function that returns nothing")
def returned_none(run: Run, stage: str) -> str | None:
    for obs in run.ranks:
        if stage in obs.returned_none:
            name, contract = FUNCTIONS[stage]
            return (f"rank {obs.rank}'s {name} returned None, where its contract returns "
                    f"{contract.format(world=run.world)}: a function returns None when no return statement is "
                    "reached (a value computed on its last line is not returned by itself)")
    return None


@mistake("split sizes exchanged by no collective")
def no_exchange_collective(run: Run) -> str | None:
    for obs in run.ranks:
        r, recv = obs.rank, obs.returned.recv
        want = [run.slots(j).send[r] for j in range(run.world)]
        if run.calls(r, "exchange") or not isinstance(recv, list) or recv == want:
            continue
        wild = [v for v in recv if not 0 <= v <= run.world * len(run.slots(r).keep)]
        return (f"rank {r}'s exchange_split_sizes made no collective and returned {recv}, where the ranks send it "
                f"{want} rows: those counts are known only on the ranks that send them, and reach this one by a "
                "collective (one dist.all_to_all_single of a tensor of the counts)"
                + (f"; {wild[0]} is no count of rows: a buffer (torch.empty) read before anything was written "
                   "into it" if wild else ""))
    return None


@mistake("exchange_split_sizes handed in as the runtime's copy")
def runtime_copy(run: Run) -> str | None:
    """The learner's ``exchange_split_sizes`` is, or calls, ``distlab``'s ``exchange_counts`` (notebook 11's)."""
    for obs in run.ranks:
        if said := ANSWERS.feedback("exchange_split_sizes", obs.answers.identified, obs.answers.calls):
            return said
    return None
