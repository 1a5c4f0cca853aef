"""Exercise 8's mistakes of the two operators, f and g (Megatron-LM's conjugate pair: Shoeybi et al., 2019): which
all-reduce runs where, in the forward and in the backward, judged from the collectives each rank made and what
they carried. Each takes the :class:`~.observations.Run` of one file at one world size and the part being judged,
as :mod:`.causes`' do."""
from __future__ import annotations

from ...grader.diagnosis import mistake
from ...grader.parity import parity
from .causes import _alike, _shape
from .observations import Run
from .reference import ATOL, LEAD, RTOL, X_SHAPE, H


@mistake("f and g swapped: the all-reduce in the wrong operator")
def swapped(run: Run, part: str) -> str | None:
    forward = run.calls(0, "forward", "all_reduce")
    in_column = [c for c in forward if c.layer == "column"]
    if not in_column or any(c.layer == "row" for c in forward):
        return None
    first = [next((c.input for c in run.calls(r, "forward", "all_reduce")), None) for r in range(run.world)]
    same = _alike(first)
    said = (f"the forward's all-reduce ran in ColumnParallelLinear, on its {_shape(in_column[0].shape)} input"
            + (f" (the same x on every rank, so the layer computed with {run.world}·x)" if same else "")
            + ", and RowParallelLinear's partial sums were never added up")
    backward = [next((c.input for c in run.calls(r, "backward", "all_reduce")), None) for r in range(run.world)]
    if _alike(backward):
        said += "; the backward's all-reduce summed the output's gradient, the same on every rank"
    return (said + ": f and g are swapped. f = CopyToParallelRegion (identity forward, all-reduce backward) takes "
            "the column layer's input, g = ReduceFromParallelRegion (all-reduce forward, identity backward) the "
            "row layer's partial sums")


@mistake("f all-reduces in the forward")
def f_reduces_forward(run: Run, part: str) -> str | None:
    """g's all-reduce in RowParallelLinear, and another in ColumnParallelLinear's forward: f communicating."""
    forward = run.calls(0, "forward", "all_reduce")
    in_column = [c for c in forward if c.layer == "column"]
    if not in_column or not any(c.layer == "row" for c in forward):
        return None
    first = [next((c.input for c in run.calls(r, "forward", "all_reduce") if c.layer == "column"), None)
             for r in range(run.world)]
    same = _alike(first)
    backward = len(run.calls(0, "backward", "all_reduce"))
    made = "no all-reduce" if backward == 0 else f"{backward} all-reduce{'s' if backward > 1 else ''}"
    return (f"the forward made an all-reduce in ColumnParallelLinear, on its {_shape(in_column[0].shape)} input"
            + (f" (the same x on every rank, so the column layer computed with {run.world}·x)" if same else "")
            + f", besides g's in RowParallelLinear, and rank 0's backward made {made}: "
            "CopyToParallelRegion (f) is the identity in the forward and all-reduces the gradient in the backward")


@mistake("g all-reduces in the backward too")
def g_reduces_backward(run: Run, part: str) -> str | None:
    """A backward all-reduce of a tensor that is the same on every rank: the block output's gradient, which only
    a g whose backward communicates (an autograd all-reduce) would sum."""
    reduces = [run.calls(r, "backward", "all_reduce") for r in range(run.world)]
    if len({len(calls) for calls in reduces}) != 1 or len(reduces[0]) < 2:
        return None
    for i, call in enumerate(reduces[0]):
        if _alike([calls[i].input for calls in reduces]):
            return (f"the backward made {len(reduces[0])} all-reduces; its all-reduce {i + 1} summed a "
                    f"{_shape(call.shape)} gradient that was the same on every rank (the block output's), so "
                    f"everything below it is {run.world}x too large: ReduceFromParallelRegion (g) must be the "
                    "identity in the backward (torch.distributed.nn.functional.all_reduce, whose backward "
                    "all-reduces, is not g)")
    return None


@mistake("no all-reduce in the forward (g's forward is the identity)")
def no_forward_reduce(run: Run, part: str) -> str | None:
    outs, ref = [obs.out for obs in run.ranks], run.ref.out
    if any(run.calls(r, "forward") for r in range(run.world)) or any(o is None or o.shape != ref.shape for o in outs):
        return None
    bias = run.ref.weights["row.bias"]
    summed = parity(sum(o - bias for o in outs) + bias, ref, rtol=RTOL, atol=ATOL)
    if not summed.ok:
        return None
    off = (outs[0] - ref).abs().max().item()
    return (f"the forward made no all-reduce, so each rank returned its own partial sum plus the bias (rank 0's "
            f"output is off by up to {off:.3g}); the {run.world} ranks' partial sums add up to the unsplit block's "
            f"output (max abs difference {summed.max_abs_diff:.2g}): ReduceFromParallelRegion.forward must "
            "all-reduce (sum) them")


@mistake("no all-reduce in the backward (f's backward is the identity)")
def no_backward_reduce(run: Run, part: str) -> str | None:
    grads, ref = [obs.x_grad for obs in run.ranks], run.ref.x_grad
    if any(run.calls(r, "backward") for r in range(run.world)) or any(g is None or g.shape != ref.shape for g in grads):
        return None
    summed = parity(sum(grads), ref, rtol=RTOL, atol=ATOL)
    if not summed.ok:
        return None
    off = (grads[0] - ref).abs().max().item()
    return (f"the backward made no all-reduce, so each rank's x.grad is only its own shard's part (rank 0's is off "
            f"by up to {off:.3g}); the {run.world} ranks' parts add up to the unsplit block's gradient (max abs "
            f"difference {summed.max_abs_diff:.2g}): CopyToParallelRegion.backward must all-reduce (sum) the gradient")


@mistake("f on the column layer's output, not its input")
def f_on_output(run: Run, part: str) -> str | None:
    """The backward's one all-reduce is of a tensor shaped like the column layer's output on a rank (4 x 3 x H/W):
    the gradient of the column layer's output, where f's is the block's input's (4 x 3 x D)."""
    local = [*LEAD, H // run.world]
    if not all([(c.kind, c.shape) for c in run.calls(r, "backward")] == [("all_reduce", local)]
               for r in range(run.world)):
        return None
    return (f"rank 0's backward all-reduced a {_shape(local)} tensor, the shape of ColumnParallelLinear's output "
            f"on a rank (its {H // run.world} of the {H} hidden features), not the {X_SHAPE} gradient of the block's "
            "input: that sums the ranks' gradients of different features. f (the identity forward, an all-reduce in "
            "the backward) goes on the column layer's input x: each rank's columns give one part of x's gradient, "
            "and f's all-reduce sums the parts")
