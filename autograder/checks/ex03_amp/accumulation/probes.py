"""Exercise 3's accumulation part: ``accumulated_step``, float16 with a GradScaler over K micro-batches.

Shared by the rank (:func:`observe`, which runs the learner's function; ``probes`` calls it) and the
grading process (:func:`reference`, the same window written the right way, in one process, on the CPU):

* ``parity``: ``WINDOWS`` windows of ``K`` micro-batches with a ``max_norm`` no gradient reaches, so the
  update is the mean gradient itself (a loss not divided by K steps with K times its norm);
* ``clipped``: one window with ``MAX_NORM``, which every window's true gradient exceeds (clipping the
  scaled gradients steps with ``MAX_NORM / scale``);
* ``overflow``: one window whose micro-batch ``INF_MICRO`` holds an ``inf``: the weights must not change
  and the scale must halve once.

Per window a recording GradScaler logs the calls in order (``scale``, ``backward``, ``unscale_``, ``step``,
``optimizer.step``, ``update``) and a recording optimizer the gradient norm it steps with. A window that
raises keeps the events logged until then and the learner's line (:func:`autograder.rank.learner_frame`).
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from distlab.models import cpu_state, make_mlp

from ....rank import attempt, grad_norm, learner_frame, on_backward_start, raised
from ..workloads import LR, MAX_NORM, MODEL, RecordingScaler, RecordingSGD, batches
from .observations import Accumulation, Windows

K, WINDOWS = 4, 3        # micro-batches per window (of BATCH // K samples each), windows in the parity run
NO_CLIP = 1e9            # a max_norm no gradient reaches, scaled or not: the parity run's update is unclipped
INF_MICRO = 2            # the micro-batch of the overflow window that holds an inf (0-based)


def micro_batches(device: torch.device, window: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Window ``window``'s K micro-batches: the batch ``workloads.batches`` gives for that step, split."""
    x, y = batches(device)[window]
    return list(zip(x.chunk(K), y.chunk(K)))


class _Recorder:
    """The window's events and stepped norms; a GradScaler and an SGD that append to them."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.events: list[str] = []
        self.norms: list[float] = []

        def on_step(params) -> None:
            self.events.append("optimizer.step")
            self.norms.append(grad_norm(params))

        self.scaler = RecordingScaler(device.type, self.events)
        self.opt = RecordingSGD(model.parameters(), LR, on_step)
        self.passes: list[str] = []  # "F" at each forward of the model, "B" at each backward's end

        def backward_done(p) -> None:
            self.events.append("backward")
            self.passes.append("B")

        next(model.parameters()).register_post_accumulate_grad_hook(backward_done)


def _windows(learner, device: torch.device, windows: list[int], max_norm: float,
             inf_micro: int | None = None, stale: bool = False) -> Windows:
    """Run the learner's ``accumulated_step`` on ``windows``; what each did, up to an error if one raised.
    ``stale``: NaN left in ``.grad`` before each window (the parity run only: it alone is judged on it)."""
    model = make_mlp(seed=3, **MODEL).to(device)
    rec = _Recorder(model, device)
    out = Windows()
    first = {"backward": True}

    def at_backward() -> None:  # a window's first backward: does .grad still hold what was left before it?
        if first["backward"]:
            first["backward"] = False
            out.stale.append(any(p.grad is not None and bool(p.grad.isnan().any()) for p in model.parameters()))

    handle = on_backward_start(model, at_backward)
    for w in windows:
        # What a window that overflowed leaves in .grad (inf/NaN), before every window: the contract's window
        # starts from no gradients (left in, a GradScaler divides a stale gradient by its scale and the
        # weights barely differ, but NaN makes it skip the window)
        for p in model.parameters() if stale else ():
            p.grad = torch.full_like(p, float("nan"))
        first["backward"] = True
        micro = micro_batches(device, w)
        if inf_micro is not None:
            bad = micro[inf_micro][0].clone()
            bad[0, 0] = float("inf")
            micro[inf_micro] = (bad, micro[inf_micro][1])
        before, scale_before = cpu_state(model), rec.scaler.get_scale()
        rec.events.clear()
        rec.passes.clear()
        outputs: list[torch.Tensor] = []
        def forward_done(mod, args, y) -> None:  # returns None: the output stays the model's
            outputs.append(y.detach().float())
            rec.passes.append("F")

        hook = model.register_forward_hook(forward_done)
        try:
            loss, exc = attempt(learner.accumulated_step, model, rec.opt, micro, scaler=rec.scaler,
                                max_norm=max_norm)
        finally:
            hook.remove()
        out.events.append(list(rec.events))
        out.passes.append("".join(rec.passes))
        out.scales.append((scale_before, rec.scaler.get_scale()))
        if exc is not None:
            frame = learner_frame(exc, learner.__file__)
            out.error = raised(exc, learner.__file__) + (f" (line {frame.lineno}: {frame.line})" if frame else "")
            break
        out.losses.append(float(loss))
        out.forward_means.append(_forward_mean(outputs, micro))
        after = cpu_state(model)
        out.unchanged = all(torch.equal(before[n], after[n]) for n in before)
    handle.remove()
    out.norms = list(rec.norms)
    out.state = cpu_state(model)
    return out


def _forward_mean(outputs: list[torch.Tensor], micro: list[tuple[torch.Tensor, torch.Tensor]]) -> float | None:
    """The window's loss as the learner's own forwards computed it: the mean of each micro-batch's mean
    cross-entropy (the micro-batches are of one size), where there was one forward per micro-batch."""
    if len(outputs) != len(micro) or any(o.shape[0] != y.shape[0] for o, (_, y) in zip(outputs, micro)):
        return None
    return float(torch.stack([nn.functional.cross_entropy(o, y) for o, (_, y) in zip(outputs, micro)]).mean())


def observe(learner, device: torch.device) -> Accumulation:
    """The three runs, each on its own model and scaler (one that raises does not hide the others)."""
    if not hasattr(learner, "accumulated_step"):
        return Accumulation(error="AttributeError: the file defines no accumulated_step (copy its stub and "
                                  "docstring from exercises/ex03_amp.py)")
    return Accumulation(parity=_windows(learner, device, list(range(WINDOWS)), NO_CLIP, stale=True),
                        clipped=_windows(learner, device, [0], MAX_NORM),
                        overflow=_windows(learner, device, [1], NO_CLIP, inf_micro=INF_MICRO))


@functools.lru_cache(maxsize=1)  # the grading process compares every file it grades with it
def reference() -> dict:
    """The parity run done here, the right way: losses, the stepped gradient norms, the final weights."""
    device = torch.device("cpu")
    model = make_mlp(seed=3, **MODEL)
    opt, scaler = torch.optim.SGD(model.parameters(), lr=LR), torch.amp.GradScaler("cpu")
    losses, norms = [], []
    for w in range(WINDOWS):
        opt.zero_grad()
        total = 0.0
        for xs, ys in micro_batches(device, w):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = nn.functional.cross_entropy(model(xs), ys)
            scaler.scale(loss / K).backward()
            total += loss.item() / K
        scaler.unscale_(opt)
        norms.append(nn.utils.clip_grad_norm_(model.parameters(), NO_CLIP).item())
        scaler.step(opt)
        scaler.update()
        losses.append(total)
    return {"losses": losses, "norms": norms, "state": cpu_state(model), "scale": scaler.get_scale()}
