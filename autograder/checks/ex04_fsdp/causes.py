"""Exercise 4's likely mistakes, tested against what the ranks observed (see autograder/grader/diagnosis.py).

Each takes the :class:`~.observations.Run` of one world size; the peak-memory ones also take
the measured step of the rank with the worst peak and the criterion's account of it, which their message quotes.
Part 1's (ZeRO-1) are in ``zero1_causes``.
"""
from __future__ import annotations

from ...grader.diagnosis import KnownError, mistake, translate
from .observations import MeasuredStep, Run, StateDictCall
from .workloads import MEASURE_STEP, MODEL


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
    KnownError("ZeRO-1 collective of two dtypes", r"Check failed: outputTensors\[i\]\.dtype\(\) == inputTensors\[i\]",
               "a collective's output and input must have one dtype"),
    KnownError("ZeRO-1 all-gather sizes unequal", r"ProcessGroupGloo::allgather: invalid tensor size",
               "an all-gather collects W pieces of one size: every rank's shard must have c = ceil(numel / W) "
               "elements, and the output W * c"),
]


def mib(n: float) -> str:
    """``n`` bytes in MiB, for messages."""
    return f"{n / 2**20:.3f} MiB"


@mistake("no backward in train_step")
def no_backward(run: Run) -> str | None:
    s = run.ranks[0].step
    if s is None or s.leftover_grad_norm is not None or not s.optimizer_steps:
        return None
    return (f"step {MEASURE_STEP} ran the forward and called optimizer.step() {s.optimizer_steps} time(s), but no "
            "backward began: no gradient was computed for Adam to step with, and FSDP never resharded the parameters "
            "it had gathered for the backward (so the model's parameters are not the optimizer's sharded ones). Call "
            "loss.backward() between the forward and optimizer.step()")


@mistake("optimizer built before sharding")
def optimizer_first(run: Run) -> str | None:
    r = next((r for r in run.ranks if r.step.opt_foreign), None)
    if r is None:
        return None
    return (f"on rank {r.rank} the optimizer does not hold {r.step.opt_foreign} of the model's {r.step.n_params} "
            "parameters: it was built before fully_shard replaced them with DTensors, so it updates stale tensors. "
            "Build the optimizer after shard(model)")


@mistake("train_step raised")
def train_step_raised(run: Run) -> str | None:
    r = next((r for r in run.ranks if r.train_step_error), None)
    if r is None:
        return None
    e = r.train_step_error
    return (f"train_step raised on rank {r.rank}: {e.error} ({e.where}); the grader's own step went on in its "
            "place, so that shard, make_optimizer and the export are still graded, but these weights are not your "
            "step's")


@mistake("nothing sharded")
def nothing_sharded(run: Run) -> str | None:
    s = run.ranks[0].step
    if s.dtensors:
        return None
    return (f"none of the {s.n_params} parameters is a DTensor: shard(model) must call fully_shard on every "
            "block and then on the root, before the optimizer is built")


@mistake("root not sharded")
def root_not_sharded(run: Run, explain: str = "") -> str | None:
    s = run.ranks[0].step
    if s.root_wrapped or not s.blocks_wrapped:
        return None
    return (f"the blocks are sharded, but {len(s.plain)} parameters ({s.plain}) are plain tensors: the root's "
            "own layers are not sharded (every rank holds them whole, their gradients are never averaged across "
            "ranks, and each block, its own FSDP root, keeps its parameters unsharded from forward to backward)"
            f"{': ' + explain if explain else ''}. Call fully_shard(model) on the root after the blocks")


@mistake("only the root wrapped")
def root_only(run: Run, worst: MeasuredStep, explain: str) -> str | None:
    if worst.blocks_wrapped or not worst.root_wrapped:
        return None
    return (f"only the root is wrapped (0 of {MODEL['depth']} blocks are fully_shard units), so forward and backward "
            f"unshard the whole model at once: {explain}. Call fully_shard on each block before the root")


@mistake("blocks keep parameters unsharded after forward")
def no_reshard(run: Run, worst: MeasuredStep, explain: str) -> str | None:
    kept = worst.blocks_unsharded_after_forward
    if not kept or not worst.root_wrapped:  # a block that is its own FSDP root never reshards after forward
        return None
    return (f"{len(kept)} of {MODEL['depth']} blocks kept their parameters unsharded after forward "
            f"(reshard_after_forward=False): every rank holds their full {mib(run.block_bytes(kept))} from "
            f"forward until backward, not one block's at a time ({explain}). Call fully_shard(block) with the "
            "default reshard_after_forward=True")


@mistake("some blocks not wrapped")
def some_blocks(run: Run, worst: MeasuredStep, explain: str) -> str | None:
    if worst.blocks_wrapped in (0, MODEL["depth"]) or not worst.root_wrapped:
        return None
    return (f"only {worst.blocks_wrapped} of {MODEL['depth']} blocks are fully_shard units, so the root unshards "
            f"the others together: {explain}. Call fully_shard on every block in model.blocks, then the root")


@mistake("optimizer.zero_grad() not called")
def grads_not_zeroed(run: Run) -> str | None:
    r = max(run.ranks, key=lambda r: r.step.leftover_grad_norm or 0.0)
    if not r.step.leftover_grad_norm:
        return None
    return (f"when the backward of step {MEASURE_STEP} began, .grad still held gradients of norm "
            f"{r.step.leftover_grad_norm:.3g} (rank {r.rank}'s shard) from the step before, and FSDP added the new "
            "ones to them: call optimizer.zero_grad() at the start of train_step")


@mistake("optimizer.step() not called once per step")
def steps_not_one(run: Run) -> str | None:
    n = run.ranks[0].step.optimizer_steps
    if n == 1:
        return None
    return f"train_step called optimizer.step() {n} times in step {MEASURE_STEP}: step once, after backward"


def _called(record: StateDictCall) -> str:
    options = ", ".join(f"{k}={v}" for k, v in record.options.items() if k in ("full_state_dict", "cpu_offload") and v)
    return f"{record.fn}({options})" if options else f"{record.fn}(...)"


@mistake("state-dict collective called on some ranks only")
def one_sided_collective(run: Run) -> str | None:
    made = [(r.rank, call) for r in run.ranks for call in r.partnered]
    if not made:
        return None
    callers = sorted({call.for_rank for _, call in made})
    absent = sorted({rank for rank, _ in made})
    only = f"rank {callers[0]} only" if len(callers) == 1 else f"ranks {callers} only"
    return (f"{_called(made[0][1])} ran on {only}: rank(s) {absent} never called it, so the callers waited for them "
            "(the grader made the missing call, so the training could be graded). It is a collective: call it on "
            "every rank, and torch.save on rank 0 only")


@mistake("FSDP1 state_dict_type on an FSDP2 model")
def fsdp1_api(run: Run) -> str | None:
    err = run.ranks[0].after_training_error
    if err is None or not err.fsdp1:
        return None
    return (f"FullyShardedDataParallel.state_dict_type (FSDP1) does not apply to fully_shard (FSDP2) modules: the "
            f"export raised {err.error} ({err.where}). Use get_model_state_dict(model, "
            "options=StateDictOptions(full_state_dict=True, cpu_offload=True))")


@mistake("export raised")
def export_raised(run: Run) -> str | None:
    r = next((r for r in run.ranks if r.after_training_error is not None), None)
    if r is None:
        return None
    err = r.after_training_error
    if err.error.startswith("NotImplementedError"):
        return f"not implemented yet (the export, after training: {err.where}); the training was graded"
    cause = translate(err.error, KNOWN_ERRORS) or f"the export (after training) raised on rank {r.rank}"
    return f"{cause}: {err.error} ({err.where}); the training was graded, the export was not"


@mistake("full state dict on every rank")
def full_everywhere(run: Run) -> str | None:
    calls = [(r.rank, c) for r in run.ranks if r.rank for c in r.state_dict_calls if c.tensors]
    if not calls:
        return None
    rank, c = calls[0]
    return (f"{_called(c)} returned the full state dict ({c.tensors} tensors, {mib(c.bytes)}) on rank {rank} "
            "too: every rank gathered a whole copy of the model, which FSDP exists to avoid. Pass "
            "StateDictOptions(full_state_dict=True, cpu_offload=True): only rank 0 then receives it, on the CPU")


@mistake("the export returns the dict off rank 0 too")
def export_returned(run: Run) -> str | None:
    for r in run.ranks:
        got = r.export_returned  # None: train_fsdp never called export_full_state_dict by its name
        if got is not None and (got == "None") != (r.rank != 0):
            want = "the dict it saved" if r.rank == 0 else "None"
            return f"export_full_state_dict returned {got} on rank {r.rank}, where its contract returns {want} there"
    return None


@mistake("export saved on several ranks")
def saved_everywhere(run: Run) -> str | None:
    savers = [r.rank for r in run.ranks if r.saves]
    if not savers or savers == [0]:
        return None
    return (f"torch.save was called on ranks {savers}: every rank must call get_model_state_dict (it is a "
            "collective), but only rank 0 saves")


@mistake("export saved nothing")
def saved_nothing(run: Run) -> str | None:
    if any(r.saves for r in run.ranks):
        return None
    calls, where = len(run.ranks[0].state_dict_calls), run.ranks[0].export
    if not calls:
        return (f"nothing was saved to {where}: neither get_model_state_dict nor torch.save ran on any rank. "
                "train_fsdp must call export_full_state_dict(model, export_path) on every rank after training, and "
                "it must gather the full state dict and torch.save it on rank 0")
    return (f"nothing was saved to {where}: get_model_state_dict ran {calls} time(s) on rank 0, but no rank called "
            "torch.save. torch.save the full state dict to export_path on rank 0")
