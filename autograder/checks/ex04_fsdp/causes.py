"""Exercise 4's likely mistakes, tested against what the ranks observed (see autograder/diagnosis.py).

Each takes the :class:`~.observed.Run` of one world size; the peak-memory ones also take
the rank with the worst peak and the criterion's account of it, which their message quotes.
Part 1's (ZeRO-1) come last, named ``z1_...``, with ``padding_dropped``.
"""
from __future__ import annotations

from distlab.measure.comm import label

from ...diagnosis import KnownError, mistake, translate
from .observed import Run
from .probes import MEASURE_STEP, MODEL
from .reference import names_in


KNOWN_ERRORS = [
    KnownError("fully_shard called on the ModuleList", r"fully_shard does not support containers that do not implement",
               "fully_shard needs a module with a forward, and model.blocks is a ModuleList: call fully_shard(block) "
               "for each block in model.blocks, then fully_shard(model)"),
    KnownError("fully_shard applied twice to one module", r"can only be applied to a module once",
               "fully_shard ran twice on the same module (shard called twice, or the root in the blocks' loop): "
               "call it once per block, then once on the root"),
    KnownError("root sharded before its blocks", r"Invariant encountered: value was None when it should not be",
               "fully_shard(model) ran before fully_shard(block), so the blocks' parameters were already DTensors: "
               "shard every block first, then the root"),
    KnownError("state-dict collective on rank 0 only, not completed", r"Timed out waiting \d+ms for (recv|send)",
               "a collective (most likely the state dict: DTensor.full_tensor(), or a checkpoint save) ran on rank 0 "
               "only: rank 0 waited for the others, which had returned. Every rank must make the call (it "
               "all-gathers the shards); only the torch.save is for rank 0"),
    KnownError("ZeRO-1 reduce-scatter input not padded", r"outputShape\[0\] \* worldSize == inputShape\[0\]",
               "the reduce-scatter's input must hold exactly W times its output's elements: pad the flat gradient "
               "with zeros to W * c, c = ceil(numel / W), the shard's length"),
    KnownError("ZeRO-1 all-gather sizes unequal", r"ProcessGroupGloo::allgather: invalid tensor size",
               "an all-gather collects W pieces of one size: every rank's shard must have c = ceil(numel / W) "
               "elements, and the output W * c"),
]


def mib(n: float) -> str:
    """``n`` bytes in MiB, for messages."""
    return f"{n / 2**20:.3f} MiB"


@mistake("no backward in train_step")
def no_backward(run: Run) -> str | None:
    r = run.ranks[0]
    if "leftover_grad_norm" not in r or r["leftover_grad_norm"] is not None or not r.get("optimizer_steps"):
        return None
    return (f"step {MEASURE_STEP} ran the forward and called optimizer.step() {r['optimizer_steps']} time(s), but no "
            "backward began: no gradient was computed for Adam to step with, and FSDP never resharded the parameters "
            "it had gathered for the backward (so the model's parameters are not the optimizer's sharded ones). Call "
            "loss.backward() between the forward and optimizer.step()")


@mistake("optimizer built before sharding")
def optimizer_first(run: Run) -> str | None:
    r = next((r for r in run.ranks if r["opt_foreign"]), None)
    if r is None:
        return None
    return (f"on rank {r['rank']} the optimizer does not hold {r['opt_foreign']} of the model's {r['n_params']} "
            "parameters: it was built before fully_shard replaced them with DTensors, so it updates stale tensors. "
            "Build the optimizer after shard(model)")


@mistake("nothing sharded")
def nothing_sharded(run: Run) -> str | None:
    r = run.ranks[0]
    if r["dtensors"]:
        return None
    return (f"none of the {r['n_params']} parameters is a DTensor: shard(model) must call fully_shard on every "
            "block and then on the root, before the optimizer is built")


@mistake("root not sharded")
def root_not_sharded(run: Run, explain: str = "") -> str | None:
    r = run.ranks[0]
    if r["root_wrapped"] or not r["blocks_wrapped"]:
        return None
    return (f"the blocks are sharded, but {len(r['plain'])} parameters ({r['plain']}) are plain tensors: the root's "
            "own layers are not sharded (every rank holds them whole, their gradients are never averaged across "
            "ranks, and each block, its own FSDP root, keeps its parameters unsharded from forward to backward)"
            f"{': ' + explain if explain else ''}. Call fully_shard(model) on the root after the blocks")


@mistake("only the root wrapped")
def root_only(run: Run, worst: dict, explain: str) -> str | None:
    if worst["blocks_wrapped"] or not worst["root_wrapped"]:
        return None
    return (f"only the root is wrapped (0 of {MODEL['depth']} blocks are fully_shard units), so forward and backward "
            f"unshard the whole model at once: {explain}. Call fully_shard on each block before the root")


@mistake("blocks keep parameters unsharded after forward")
def no_reshard(run: Run, worst: dict, explain: str) -> str | None:
    kept = worst.get("blocks_unsharded_after_forward", [])
    if not kept or not worst["root_wrapped"]:  # a block that is its own FSDP root never reshards after forward
        return None
    return (f"{len(kept)} of {MODEL['depth']} blocks kept their parameters unsharded after forward "
            f"(reshard_after_forward=False): every rank holds their full {mib(run.block_bytes(kept))} from "
            f"forward until backward, not one block's at a time ({explain}). Call fully_shard(block) with the "
            "default reshard_after_forward=True")


@mistake("some blocks not wrapped")
def some_blocks(run: Run, worst: dict, explain: str) -> str | None:
    if worst["blocks_wrapped"] in (0, MODEL["depth"]) or not worst["root_wrapped"]:
        return None
    return (f"only {worst['blocks_wrapped']} of {MODEL['depth']} blocks are fully_shard units, so the root unshards "
            f"the others together: {explain}. Call fully_shard on every block in model.blocks, then the root")


@mistake("optimizer.zero_grad() not called")
def grads_not_zeroed(run: Run) -> str | None:
    r = max(run.ranks, key=lambda r: r.get("leftover_grad_norm") or 0.0)
    if not r.get("leftover_grad_norm"):
        return None
    return (f"when the backward of step {MEASURE_STEP} began, .grad still held gradients of norm "
            f"{r['leftover_grad_norm']:.3g} (rank {r['rank']}'s shard) from the step before, and FSDP added the new "
            "ones to them: call optimizer.zero_grad() at the start of train_step")


@mistake("optimizer.step() not called once per step")
def steps_not_one(run: Run) -> str | None:
    n = run.ranks[0].get("optimizer_steps", 1)
    if n == 1:
        return None
    return f"train_step called optimizer.step() {n} times in step {MEASURE_STEP}: step once, after backward"


def _called(record: dict) -> str:
    options = ", ".join(f"{k}={v}" for k, v in record["options"].items()
                        if k in ("full_state_dict", "cpu_offload") and v)
    return f"{record['fn']}({options})" if options else f"{record['fn']}(...)"


@mistake("state-dict collective called on some ranks only")
def one_sided_collective(run: Run) -> str | None:
    made = [(r["rank"], call) for r in run.ranks for call in r["partnered"]]
    if not made:
        return None
    callers = sorted({call["for_rank"] for _, call in made})
    absent = sorted({rank for rank, _ in made})
    only = f"rank {callers[0]} only" if len(callers) == 1 else f"ranks {callers} only"
    return (f"{_called(made[0][1])} ran on {only}: rank(s) {absent} never called it, so the callers waited for them "
            "(the grader made the missing call, so the training could be graded). It is a collective: call it on "
            "every rank, and torch.save on rank 0 only")


@mistake("FSDP1 state_dict_type on an FSDP2 model")
def fsdp1_api(run: Run) -> str | None:
    err = run.ranks[0]["after_training_error"]
    if not err.get("fsdp1"):
        return None
    return (f"FullyShardedDataParallel.state_dict_type (FSDP1) does not apply to fully_shard (FSDP2) modules: the "
            f"export raised {err['error']} ({err['where']}). Use get_model_state_dict(model, "
            "options=StateDictOptions(full_state_dict=True, cpu_offload=True))")


@mistake("export raised")
def export_raised(run: Run) -> str | None:
    r = next((r for r in run.ranks if r["after_training_error"]), None)
    if r is None:
        return None
    err = r["after_training_error"]
    if err["error"].startswith("NotImplementedError"):
        return f"not implemented yet (the export, after training: {err['where']}); the training was graded"
    cause = translate(err["error"], KNOWN_ERRORS) or f"the export (after training) raised on rank {r['rank']}"
    return f"{cause}: {err['error']} ({err['where']}); the training was graded, the export was not"


@mistake("full state dict on every rank")
def full_everywhere(run: Run) -> str | None:
    calls = [(r["rank"], c) for r in run.ranks if r["rank"] for c in r["state_dict_calls"] if c.get("tensors")]
    if not calls:
        return None
    rank, c = calls[0]
    return (f"{_called(c)} returned the full state dict ({c['tensors']} tensors, {mib(c['bytes'])}) on rank {rank} "
            "too: every rank gathered a whole copy of the model, which FSDP exists to avoid. Pass "
            "StateDictOptions(full_state_dict=True, cpu_offload=True): only rank 0 then receives it, on the CPU")


# Part 1, ZeRO-1 by hand ---------------------------------------------------------------------------------

def _slice(run: Run, s: int) -> str:
    start, stop = run.z1_slice(s)
    first, last = names_in(run.world, start, stop)
    return f"[{start}, {stop}) ('{first}' to '{last}')"


@mistake("shard_range drops the padding")
def padding_dropped(run: Run) -> str | None:
    numel = run.z1_ref["numel"]
    got = run.ranks[0]["zero1"]["ranges"].get(numel)
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
    r = next((r for r in run.ranks if r["zero1"]["holdings"].get("opt_model_params")), None)
    if r is None:
        return None
    h, rank = r["zero1"]["holdings"], r["rank"]
    state = r["zero1"]["state"].get("exp_avg", 0)
    return (f"on rank {rank} the optimizer holds {h['opt_model_params']} of the model's {h['model_params']} "
            f"parameters ({h['opt_numel']} elements) and its exp_avg has {state} elements, where ZeRO-1 keeps "
            f"{run.z1_ref['c']} (1/{run.world}): every rank holds the whole Adam state, and the shard is never "
            "stepped. Build torch.optim.Adam over the shard alone, in make_zero1_optimizer")


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
    line = next((ln for kind, _, ln in run.z1[0]["steps"][0] if kind == "reduce_scatter"), "") \
        if run.z1[0]["steps"] else ""
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
            return (f"after {len(run.z1[rank]['steps'])} steps rank {rank}'s weights in elements {_slice(run, s)}, "
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
    r = next((r for r in run.ranks if r["zero1"]["error"]), None)
    if r is None or "cannot unpack non-iterable NoneType" not in r["zero1"]["error"] or r["zero1"]["where"]:
        return None  # a learner's line raised it: their own unpacking, shown where it is
    return ("make_zero1_optimizer returned None, so the grader's `shard, optimizer = make_zero1_optimizer(model, lr)` "
            "had nothing to unpack: every path through it must end in return (shard, optimizer)")


@mistake("ZeRO-1 gathered shards never written into the parameters")
def z1_not_written(run: Run) -> str | None:
    for rank in range(run.world):
        steps, gathers = run.z1[rank]["steps"], sum(c.get("all_gather", 0) for c in run.z1_counts(rank))
        scatters = sum(c.get("reduce_scatter", 0) for c in run.z1_counts(rank))
        if not steps or not gathers or not scatters or len(run.z1_stale(rank)) < run.world or not run.z1[rank]["state"]:
            continue
        line = next((ln for kind, _, ln in steps[0] if kind == "all_gather"), "")
        return (f"after {len(steps)} steps none of rank {rank}'s weights has changed, though its optimizer stepped "
                f"its shard and every step all-gathered the {run.world} updated shards{f' ({line})' if line else ''}: "
                "the gathered values never reached model.parameters(). Write them into the parameters in place "
                "(p.copy_(...) under torch.no_grad()), the padding dropped")
    return None


@mistake("export saved on several ranks")
def saved_everywhere(run: Run) -> str | None:
    savers = [r["rank"] for r in run.ranks if r["saves"]]
    if not savers or savers == [0]:
        return None
    return (f"torch.save was called on ranks {savers}: every rank must call get_model_state_dict (it is a "
            "collective), but only rank 0 saves")


@mistake("export saved nothing")
def saved_nothing(run: Run) -> str | None:
    if any(r["saves"] for r in run.ranks):
        return None
    calls, where = len(run.ranks[0]["state_dict_calls"]), run.ranks[0]["export"]
    if not calls:
        return (f"nothing was saved to {where}: neither get_model_state_dict nor torch.save ran on any rank. "
                "train_fsdp must call export_full_state_dict(model, export_path) on every rank after training, and "
                "it must gather the full state dict and torch.save it on rank 0")
    return (f"nothing was saved to {where}: get_model_state_dict ran {calls} time(s) on rank 0, but no rank called "
            "torch.save. torch.save the full state dict to export_path on rank 0")


@mistake("ZeRO-1 gradients all-reduced")
def z1_all_reduce(run: Run) -> str | None:
    ops = run.z1[0]["steps"][0] if run.z1[0]["steps"] else []
    reduces = [(b, ln) for kind, b, ln in ops if kind == "all_reduce"]
    if not reduces:
        return None
    scatters = sum(kind == "reduce_scatter" for kind, _, _ in ops)
    b, line = reduces[0]
    return (f"each step issued {len(reduces)} all-reduce of {b} B ({line}) and {scatters} reduce-scatters: an "
            f"all-reduce leaves the whole averaged gradient on every rank and sends twice a reduce-scatter's bytes, "
            f"where each rank needs only its {run.z1_ref['c']}-element shard. Reduce-scatter the padded flat gradient")


def z1_error(run: Run) -> str | None:
    """Part 1 raised (or is not written yet): what, where, and the mistake a known error means."""
    r = next((r for r in run.ranks if r["zero1"]["error"]), None)
    if r is None:
        return None
    z = r["zero1"]
    if z["not_implemented"]:  # the first function still to write, in the file's order
        return f"not implemented yet ({z.get('ranges_unwritten') or z['where']})"
    cause = padding_dropped(run) or z1_returned_none(run) or translate(z["error"], KNOWN_ERRORS)
    return f"{cause + ': ' if cause else ''}rank {r['rank']}'s part 1 raised {z['error']}"
