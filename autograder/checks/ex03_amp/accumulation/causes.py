"""The likely mistakes of exercise 3's ``accumulated_step`` (see ``accumulation`` for what the rank observes).

Each tests one run's observations (``parity``, ``clipped`` or ``overflow``: per window the scaler's call
order and the gradient norms the optimizer stepped with); :data:`ACCUMULATION_ERRORS` translates what
PyTorch raises for them, ahead of the check's own ``KNOWN_ERRORS`` (the same "unscale_ twice" error means
"per micro-batch" here). ``ex03_amp`` lists them in its docstring table.
"""
from __future__ import annotations

from ....grader.diagnosis import KnownError, mistake, translate
from .observations import Windows
from .probes import K, reference
from ..causes import KNOWN_ERRORS
from ..workloads import MAX_NORM

PER_WINDOW = "scale and backward once per micro-batch, then unscale_, clip, step and update once per window"
ACCUMULATION_ERRORS = [
    KnownError("unscale_ per micro-batch", r"unscale_\(\) has already been called on this optimizer",
               "scaler.unscale_(optimizer) ran after a micro-batch's backward and again after the next one's; "
               "a GradScaler unscales once between two updates, and unscaling in the window would divide the "
               f"gradients accumulated so far again: {PER_WINDOW}"),
    KnownError("update per micro-batch", r"No inf checks were recorded prior to update",
               "scaler.update() ran after a micro-batch's backward, before the window's unscale_ and step had "
               f"checked its gradients for inf/NaN: {PER_WINDOW}"),
]


# the loss a window returned vs its own forwards' mean: the same values added in another order (5e-8 measured),
# where the last micro-batch's loss alone was 2.3e-3 away
ACC_LOSS_RTOL = 1e-5


@mistake("a window's loss not its micro-batches' mean")
def loss_not_the_windows(p: Windows) -> str | None:
    """The loss returned against the window's own forwards (the same device and roundings: only the order of
    the additions differs), where there was one forward per micro-batch."""
    for w, (got, want) in enumerate(zip(p.losses, p.forward_means)):
        if want is not None and abs(got - want) > ACC_LOSS_RTOL * max(1.0, abs(want)):
            return (f"the loss returned for window {w + 1} is {got:.6g}, but the mean of its {K} micro-batches' "
                    f"cross-entropies, as the model's forwards in it computed them, is {want:.6g}: return the "
                    "mean of the micro-batches' losses, unscaled")
    return None


def broken(run: Windows, what: str) -> str:
    """Why one run of ``accumulated_step`` did not finish, with the events logged until it raised ("")."""
    error = run.error
    if not error:
        return ""
    if error.startswith("NotImplementedError"):
        return f"not implemented yet ({what})"
    events = f"; the window called {run.events[-1]}" if run.events else ""
    cause = translate(error, [*ACCUMULATION_ERRORS, *KNOWN_ERRORS])
    return f"{cause} ({what} raised {error}{events})" if cause else f"{what} raised {error}{events}"


def _first(events: list[str], name: str) -> int:
    return events.index(name) if name in events else len(events)


def _last_backward(events: list[str]) -> int:
    return max((i for i, e in enumerate(events) if e == "backward"), default=-1)


@mistake("accumulation: gradients not cleared at the window's start")
def not_cleared(p: Windows) -> str | None:
    if True not in p.stale:
        return None
    return (f"accumulated_step did not clear the gradients it was handed: when window {p.stale.index(True) + 1}'s "
            "first backward began, .grad still held what the grader had left there (NaN, as a window that overflowed "
            "leaves inf), and the window's gradients with it. The window starts from no gradients: "
            "optimizer.zero_grad() first")


@mistake("unscale_ per micro-batch")
def unscaled_per_micro(run: Windows) -> str | None:
    """It ran (an update each time let it): the events show an unscale_ before the last backward."""
    bad = next(((w, ev) for w, ev in enumerate(run.events) if _first(ev, "unscale_") < _last_backward(ev)), None)
    if bad is None:
        return None
    updates = bad[1].count("update")
    let = f" (scaler.update() {updates} times let it run again)" if updates > 1 else ""
    return (f"window {bad[0] + 1} called {bad[1]}: unscale_ before the last micro-batch's backward{let} divides the "
            f"gradients accumulated so far, and later ones again: {PER_WINDOW}")


@mistake("update per micro-batch")
def updated_per_micro(run: Windows) -> str | None:
    bad = next(((w, ev) for w, ev in enumerate(run.events) if ev.count("update") > 1
                or _first(ev, "update") < _last_backward(ev)), None)
    if bad is None:
        return None
    return (f"window {bad[0] + 1} called scaler.update() {bad[1].count('update')} times ({bad[1]}): after an "
            f"overflow the scale must drop once per window, not once per micro-batch: {PER_WINDOW}")


@mistake("not one backward per micro-batch")
def backwards_not_k(run: Windows) -> str | None:
    bad = next(((w, ev) for w, ev in enumerate(run.events)
                if ev.count("backward") != K or ev.count("scale") != K), None)
    if bad is None:
        return None
    return (f"window {bad[0] + 1} ran {bad[1].count('backward')} backward(s) of {bad[1].count('scale')} scaled "
            f"loss(es) for {K} micro-batches ({bad[1]}): backpropagate scaler.scale(...) of each micro-batch's loss "
            "right after its forward, so autograd holds one micro-batch's activations at a time")


@mistake("every forward of a window before its backwards")
def forwards_first(run: Windows) -> str | None:
    """Two forwards with no backward between them: autograd holds more than one micro-batch's activations."""
    bad = next(((w, p) for w, p in enumerate(run.passes) if "FF" in p), None)
    if bad is None:
        return None
    w, passes = bad
    most = max(len(run_of) for run_of in passes.split("B"))
    return (f"window {w + 1} ran the model's forwards and backwards in the order {' '.join(passes)} (F a forward, B "
            f"a backward): {most} micro-batches' forwards ran before a backward, so autograd held all their "
            "activations at once, the memory of a batch that size, which accumulation exists to avoid. Run each "
            "micro-batch's backward right after its forward")


@mistake("steps not once per window")
def steps_not_one(run: Windows) -> str | None:
    bad = next(((w, ev) for w, ev in enumerate(run.events)
                if ev.count("step") != 1 or ev.count("optimizer.step") > 1), None)
    if bad is None:
        return None
    return (f"window {bad[0] + 1} called scaler.step {bad[1].count('step')} time(s) and optimizer.step "
            f"{bad[1].count('optimizer.step')} time(s) ({bad[1]}): one scaler.step(optimizer) per window, "
            "after the last micro-batch")


@mistake("loss not divided by k")
def not_divided(run: Windows) -> str | None:
    ref = reference()["norms"]
    if not run.norms:
        return None
    ratio = run.norms[0] / ref[0]
    if abs(ratio / K - 1) > 0.02:
        return None
    return (f"the optimizer stepped with a gradient norm of {run.norms[0]:.3g} in window 1, {ratio:.3g}x the "
            f"whole batch's mean gradient's ({ref[0]:.3g}), the number of micro-batches ({K}): the gradients "
            f"summed the micro-batches' mean losses; divide each micro-batch's loss by k before its backward")


@mistake("clipped before unscale_ (accumulation)")
def clipped_scaled(run: Windows) -> str | None:
    if not run.norms or not run.norms[0] < MAX_NORM / 100:
        return None
    return (f"with max_norm={MAX_NORM} the optimizer stepped with a gradient norm of {run.norms[0]:.3g}, "
            f"max_norm divided by the scale ({run.scales[0][0]:g}): you clipped the scaled gradients; "
            "call scaler.unscale_(optimizer) once, after the last backward and before clip_grad_norm_")
