"""Exercise 4's likely mistakes in part 1, ZeRO-1 by hand (``z1_...``, and ``padding_dropped``), tested against what
the ranks observed (see autograder/grader/diagnosis.py); part 2's (FSDP) are in ``causes``. Each takes the
:class:`~..observations.Run` of one world size.
"""
from __future__ import annotations

import torch

from distlab.measure.comm import label

from ....grader.diagnosis import mistake, translate
from ..causes import KNOWN_ERRORS
from ..observations import Run
from ..reference import names_in
from .probes import ZERO1_BUFFER


def _slice(run: Run, s: int) -> str:
    start, stop = run.z1_slice(s)
    first, last = names_in(run.world, start, stop)
    return f"[{start}, {stop}) ('{first}' to '{last}')"


@mistake("shard_range drops the padding")
def padding_dropped(run: Run) -> str | None:
    numel = run.z1_ref["numel"]
    got = run.z1[0].ranges.get(numel)
    if not got or any(b - a != got[0][1] - got[0][0] for a, b in got) or got[-1][1] >= numel:
        return None
    left = numel - got[-1][1]
    return (f"shard_range({numel}, {run.world}, r) gave {got}: slices of {got[0][1] - got[0][0]} elements cover "
            f"{got[-1][1]} of the {numel} parameters, so the last {left} of them belong to no rank and are never "
            "stepped. "
            f"{run.world} does not divide {numel}: round the slice up to c = ceil(numel / W) = {run.z1_ref['c']} and "
            f"pad the flat buffers with zeros to W * c = {run.world * run.z1_ref['c']}")


@mistake("ZeRO-1 optimizer built over the full parameters")
def z1_optimizer_full(run: Run) -> str | None:
    r = next((r for r in run.ranks if r.zero1.holdings and r.zero1.holdings.opt_model_params), None)
    if r is None:
        return None
    h, rank = r.zero1.holdings, r.rank
    state = r.zero1.state.get("exp_avg", 0)
    return (f"on rank {rank} the optimizer holds {h.opt_model_params} of the model's {h.model_params} "
            f"parameters ({h.opt_numel} elements) and its exp_avg has {state} elements, where ZeRO-1 keeps "
            f"{run.z1_ref['c']} (1/{run.world}): every rank holds the whole Adam state, and the shard is never "
            "stepped. Build torch.optim.Adam over the shard alone, in make_zero1_optimizer")


@mistake("ZeRO-1 master shard not a copy of its own")
def z1_shard_a_view(run: Run) -> str | None:
    """The contract's "a copy (not a view)": the master shard's storage must be its own c elements, whatever
    tensor object it is (a slice of the padded flat buffer keeps all W * c elements alive on every rank)."""
    c = run.z1_ref["c"]
    for r in run.ranks:
        h = r.zero1.holdings
        if h is None or not h.shard_element_bytes:
            continue
        own = c * h.shard_element_bytes
        if h.shard_aliases_model:
            return (f"on rank {r.rank} the shard shares its storage with a model parameter: stepping it writes the "
                    "model's weights before the all-gather. Make the shard a copy with its own storage")
        if h.shard_storage_bytes > own:
            return (f"on rank {r.rank} the shard's {c} elements ({own} bytes) are a view into a storage of "
                    f"{h.shard_storage_bytes} bytes ({h.shard_storage_bytes // h.shard_element_bytes} elements: the "
                    f"whole padded flat buffer, W * c = {run.world * c}), which every rank keeps alive: the master "
                    "copy is not 1/W of the parameters. Make the shard a copy of its slice (.clone())")
    return None


@mistake("ZeRO-1 flat buffer built from the state dict, buffers included")
def z1_buffers_flat(run: Run) -> str | None:
    """``torch.cat(model.state_dict().values())``: the model's buffer comes first, and every slice shifts."""
    name, size = ZERO1_BUFFER
    h = run.z1[0].holdings
    shard = h.shard if h else None
    if shard is None:
        return None
    with_buffer = torch.cat([torch.zeros(size), run.z1_ref["initial"][:run.z1_ref["numel"]]])
    if len(shard) > len(with_buffer) or not torch.equal(shard.float(), with_buffer[:len(shard)]):
        return None
    return (f"rank 0's shard begins with the {size} elements of the model's buffer '{name}', then 'inp.weight': the "
            "flat buffer was built from model.state_dict(), which holds the model's buffers too, and every slice "
            "after it is shifted. The contract's flat parameters are model.parameters() (parameters_to_vector), "
            "in that order")


@mistake("ZeRO-1 shard copied from another rank's slice")
def z1_wrong_offset(run: Run) -> str | None:
    for rank in range(run.world):
        s = run.z1_shard_of(rank)
        if s is not None and s != rank:
            return (f"rank {rank}'s shard is a copy of elements {_slice(run, s)} of the flat parameters, rank {s}'s "
                    f"slice, but the reduce-scatter hands rank {rank} the gradient of its own slice {_slice(run, rank)}"
                    f": rank {rank} stepped rank {s}'s weights with another slice's gradient. In make_zero1_optimizer "
                    f"copy shard_range(numel, W, rank) with this rank's own rank")
    return None


@mistake("ZeRO-1 gradients summed, not averaged")
def z1_grad_summed(run: Run) -> str | None:
    ratio = run.z1_grad_ratio(0)
    if ratio is None or abs(ratio - run.world) > 1e-2 * run.world:
        return None
    line = next((op.line for op in run.z1[0].steps[0] if op.kind == "reduce_scatter"), "") \
        if run.z1[0].steps else ""
    return (f"at the first step rank 0's shard.grad is {ratio:.3g}x the mean gradient of its slice over the global "
            f"batch{f' ({line})' if line else ''}: the reduce-scatter summed the {run.world} ranks' gradients (its "
            "default op is SUM). Average them: op=dist.ReduceOp.AVG")


@mistake("ZeRO-1 shards never all-gathered")
def z1_no_all_gather(run: Run) -> str | None:
    for rank in range(run.world):
        stale = [s for s in run.z1_stale(rank) if s != rank]
        if stale and rank not in run.z1_stale(rank):
            gathers = sum(c.get("all_gather", 0) for c in run.z1_counts(rank))
            how = ("no all-gather was issued" if not gathers else
                   f"the {gathers} all-gathers' output never reached its parameters")
            s = stale[0]
            return (f"after {len(run.z1[rank].steps)} steps rank {rank}'s weights in elements {_slice(run, s)}, "
                    f"rank {s}'s shard, are still their initial values, though its own slice changed: {how}. "
                    f"All-gather the {run.world} updated shards and write them into every rank's parameters")
    return None


@mistake("ZeRO-1 gradients never reduce-scattered")
def z1_no_reduce_scatter(run: Run) -> str | None:
    counts = run.z1_counts(0)
    if not counts or any(c.get("reduce_scatter") or c.get("all_reduce") for c in counts):
        return None
    ratio = run.z1_grad_ratio(0)
    if ratio is not None and abs(ratio - 1) < 1e-2:  # the mean gradient arrived some other way
        return None
    said = ", ".join(f"{n} {label(k)}" for k, n in counts[0].items()) or "no collective"
    return (f"none of the {len(counts)} steps issued a reduce-scatter (rank 0's first step issued {said}), so "
            "shard.grad never held the ranks' averaged gradient and Adam stepped the shard with whatever it held: "
            "reduce-scatter the padded flat gradient into shard.grad (op=dist.ReduceOp.AVG) before optimizer.step()")


@mistake("ZeRO-1 optimizer factory returned nothing")
def z1_returned_none(run: Run) -> str | None:
    r = next((r for r in run.ranks if r.zero1.error), None)
    if r is None or "cannot unpack non-iterable NoneType" not in r.zero1.error or r.zero1.where:
        return None  # a learner's line raised it: their own unpacking, shown where it is
    return ("make_zero1_optimizer returned None, so the grader's `shard, optimizer = make_zero1_optimizer(model, lr)` "
            "had nothing to unpack: every path through it must end in return (shard, optimizer)")


@mistake("ZeRO-1 gathered shards never written into the parameters")
def z1_not_written(run: Run) -> str | None:
    for rank in range(run.world):
        steps, gathers = run.z1[rank].steps, sum(c.get("all_gather", 0) for c in run.z1_counts(rank))
        scatters = sum(c.get("reduce_scatter", 0) for c in run.z1_counts(rank))
        if not steps or not gathers or not scatters or len(run.z1_stale(rank)) < run.world or not run.z1[rank].state:
            continue
        line = next((op.line for op in steps[0] if op.kind == "all_gather"), "")
        return (f"after {len(steps)} steps none of rank {rank}'s weights has changed, though its optimizer stepped "
                f"its shard and every step all-gathered the {run.world} updated shards{f' ({line})' if line else ''}: "
                "the gathered values never reached model.parameters(). Write them into the parameters in place "
                "(p.copy_(...) under torch.no_grad()), the padding dropped")
    return None


@mistake("ZeRO-1 gradients all-reduced")
def z1_all_reduce(run: Run) -> str | None:
    ops = run.z1[0].steps[0] if run.z1[0].steps else []
    reduces = [(op.bytes, op.line) for op in ops if op.kind == "all_reduce"]
    if not reduces:
        return None
    scatters = sum(op.kind == "reduce_scatter" for op in ops)
    b, line = reduces[0]
    return (f"each step issued {len(reduces)} all-reduce of {b} B ({line}) and {scatters} reduce-scatters: an "
            f"all-reduce leaves the whole averaged gradient on every rank and sends twice a reduce-scatter's bytes, "
            f"where each rank needs only its {run.z1_ref['c']}-element shard. Reduce-scatter the padded flat gradient")


@mistake("ZeRO-1 shards of unequal length")
def unequal_shards(run: Run) -> str | None:
    """shard_range's slices of the model's parameters are not all of one length (its collectives' pieces)."""
    got = run.z1[0].ranges.get(run.z1_ref["numel"])
    lengths = [b - a for a, b in got] if got else []
    if len(set(lengths)) < 2:
        return None
    long, short = max(range(len(lengths)), key=lengths.__getitem__), min(range(len(lengths)), key=lengths.__getitem__)
    return (f"shard_range({run.z1_ref['numel']}, {run.world}, r) gave {got}: rank {long}'s slice has "
            f"{lengths[long]} elements, rank {short}'s {lengths[short]}; the reduce-scatter and all-gather of ZeRO-1 "
            "take one piece of the same length from every rank, so every slice must have c = ceil(numel / W) = "
            f"{run.z1_ref['c']} elements, the last one padded with zeros")


def z1_error(run: Run) -> str | None:
    """Part 1 raised (or is not written yet, or the launch ended in it): what, where, and the mistake a known
    error means."""
    aborted = next((r for r in run.ranks if r.zero1.aborted), None)
    if aborted is not None:
        cause = unequal_shards(run)
        return f"{cause + '. ' if cause else ''}The launch ended during part 1's training: {aborted.zero1.aborted}"
    r = next((r for r in run.ranks if r.zero1.error), None)
    if r is None:
        return None
    z = r.zero1
    if z.not_implemented:  # the first function still to write, in the file's order
        return f"not implemented yet ({z.ranges_unwritten or z.where})"
    cause = padding_dropped(run) or unequal_shards(run) or z1_returned_none(run) or translate(z.error, KNOWN_ERRORS)
    return f"{cause + ': ' if cause else ''}rank {r.rank}'s part 1 raised {z.error}"
