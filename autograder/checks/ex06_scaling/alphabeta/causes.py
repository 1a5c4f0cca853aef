"""Exercise 6's likely mistakes in the α-β part (see autograder/grader/diagnosis.py): each names the variant of the
ring model (``alphabeta``) that makes the learner's figures from the same inputs.

The fit's (``FIT_CAUSES``) take the learner's ``(alpha, beta)`` and the set of times it was given, and fit
the same rows with the variant's model; the prediction's (``PREDICT_CAUSES``) take the learner's
efficiencies for ``CASES``, all of which must be the variant's. The criteria ask for them, most specific
first.
"""
from __future__ import annotations

from ....grader.diagnosis import mistake
from .observations import Fit, Number, Prediction
from .reference import (CASES, ELEMENT_BYTES, FIT_VARIANTS, NOISE, PREDICT_RTOL, PREDICT_VARIANTS, allreduce_s,
                        close, fit, predict, quantities)


def _like(got: tuple[float, float], data: dict, variant: str, **options) -> bool:
    """Whether ``got`` is what the ``variant`` of the fit makes of the same rows (within 1%)."""
    want = fit(data["rows"], **{**FIT_VARIANTS[variant], **options})
    return all(close(g, w, 0.01) for g, w in zip(got, want))


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} µs"


@mistake("elements fitted as bytes")
def fit_elements(got: tuple[float, float], data: dict) -> str | None:
    size = round(ELEMENT_BYTES * data["beta"] / got[1]) if got[1] > 0 else 0
    if not 1 <= size <= 16 or size == ELEMENT_BYTES or not _like(got, data, "elements", element_bytes=size):
        return None
    how = "a fit on the rows' numel gives" if size == 1 else f"a fit with {size} bytes an element gives"
    said = (f"your β ({got[1]:.3g} s a byte) is {got[1] / data['beta']:.2f}x the {data['beta']:.3g}, as {how}: "
            "numel counts float32 elements, 4 bytes each (bytes = 4 * numel)")
    if _like(got, data, "half the ring"):  # the same figures: both halve the bandwidth term's bytes
        said = (f"your β ({got[1]:.3g} s a byte) is {got[1] / data['beta']:.2f}x the {data['beta']:.3g}, as a fit "
                "gives whose bandwidth term is (W-1)/W * bytes, half the ring's 2(W-1)/W (a reduce-scatter, then an "
                "all-gather, each moving (W-1)/W of the bytes), or one that counts 2 bytes an element (numel counts "
                "float32 elements, 4 bytes each); the two give the same figures")
    return said


@mistake("nothing returned")
def returned_nothing(function: str, values: list[Fit] | list[Prediction]) -> str | None:
    if not any(v.value is None and not v.error for v in values):
        return None
    what = "(alpha, beta)" if function == "fit_alpha_beta" else "the efficiency, a float"
    return f"{function} returned None: every path through it must end in return {what}"


def first_unknown(numbers: list[Number], case: dict) -> str | None:
    """The learner's first line that made a number none of the model's quantities for ``case`` are."""
    known = quantities(case)
    for made in numbers:
        if not any(close(made.value, v, 1e-9) or made.value == v for v in known.values()):
            figures = ", ".join(f"{k} {known[k]:.6g} s" for k in ("all-reduce", "exposed all-reduce", "step"))
            return (f"{made.file} line {made.line} ({made.code}) made {made.name} = "
                    f"{made.value:.6g}, none of the model's numbers at W={case['world']} ({figures}, efficiency "
                    f"{known['efficiency']:.6g}, and the terms they add up from)")
    return None


@mistake("the bandwidth returned as beta")
def fit_bandwidth(got: tuple[float, float], data: dict) -> str | None:
    if not close(got[1] * data["beta"], 1.0, 0.05):
        return None
    return (f"you returned {got[1]:.3g} as β: that is a bandwidth, bytes a second (1/β = {1 / data['beta']:.3g}); "
            "β is its inverse, the seconds per byte")


@mistake("the latency counted once per all-reduce")
def fit_latency_once(got: tuple[float, float], data: dict) -> str | None:
    if not _like(got, data, "latency once"):
        return None
    a = data["alpha"]
    return (f"your α ({_us(got[0])}) is {got[0] / a:.2f}x the {_us(a)} the times were made with, as a model with "
            "one latency per all-reduce gives: a ring all-reduce pays α at each of its 2(W-1) steps. Counted "
            f"once, a latency fitted at W=2 (2α = {_us(2 * a)}) predicts {_us(2 * a)} at W=8, where the ring pays "
            f"14α = {_us(14 * a)}: 7x too little")


@mistake("the bandwidth term without the ring's factor")
def fit_algbw(got: tuple[float, float], data: dict) -> str | None:
    if not _like(got, data, "algorithm bandwidth"):
        return None
    return (f"your β ({got[1]:.3g} s a byte) is {got[1] / data['beta']:.2f}x the {data['beta']:.3g}, as bytes * β "
            "gives (the algorithm bandwidth): in a ring every rank's link carries 2(W-1)/W of the bytes (1 at "
            "W=2, 1.5 at W=4, 1.75 at W=8), so the term is 2(W-1)/W * bytes * β")


@mistake("the bandwidth term without (W-1)/W")
def fit_no_w_factor(got: tuple[float, float], data: dict) -> str | None:
    if not _like(got, data, "no (W-1)/W"):
        return None
    return (f"your β ({got[1]:.3g} s a byte) is {got[1] / data['beta']:.2f}x the {data['beta']:.3g}, as 2 * bytes * β "
            "gives: the reduce-scatter and the all-gather each move (W-1)/W of the bytes through a link, "
            "2(W-1)/W in all (1 at W=2, not 2)")


@mistake("least squares in seconds, not relative")
def fit_in_seconds(got: tuple[float, float], data: dict) -> str | None:
    if not _like(got, data, "seconds"):
        return None
    times = sorted(r["seconds"] for r in data["rows"])
    return (f"your α ({_us(got[0])}) is {got[0] / data['alpha']:.2f}x the {_us(data['alpha'])}, as least squares in "
            f"seconds gives: the largest rows ({times[-1] * 1e3:.0f} ms) carry up to {NOISE:.0%} noise, "
            f"{_us(NOISE * times[-1])}, more than the smallest rows' whole times ({_us(times[0])}), which are what "
            "shows α. Minimise the relative errors: divide each row's equation by its time")


FIT_CAUSES = [fit_bandwidth, fit_elements, fit_latency_once, fit_algbw, fit_no_w_factor, fit_in_seconds]


def _first_apart(got: list[float | None], variant: str) -> int | None:
    """The first case where the learner's predictions are the ``variant``'s and the reference's are not; None
    unless every prediction at W > 1 is the variant's (at W = 1 a learner may return 1 before any of it)."""
    how = PREDICT_VARIANTS[variant]
    many = [(g, c) for g, c in zip(got, CASES) if c["world"] > 1]
    if any(g is None or not close(g, predict(c, **how), PREDICT_RTOL) for g, c in many):
        return None
    return next((i for i, c in enumerate(CASES) if c["world"] > 1
                 and not close(predict(c, **how), predict(c), PREDICT_RTOL)), None)


def _case(i: int) -> tuple[dict, str, float]:
    c = CASES[i]
    said = (f"at W={c['world']} (a {c['compute_s'] * 1e3:g} ms step, {c['backward_s'] * 1e3:g} ms of it the "
            f"backward, {c['grad_bytes'] / 1e6:g} MB of gradients, α = {_us(c['alpha'])}, 1/β = "
            f"{1 / c['beta'] / 1e9:g} GB/s)")
    return c, said, allreduce_s(c["grad_bytes"], c["world"], c["alpha"], c["beta"])


@mistake("the all-reduce not overlapped with the backward")
def predict_no_overlap(got: list) -> str | None:
    if (i := _first_apart(got, "no overlap")) is None:
        return None
    c, said, ar = _case(i)
    return (f"{said} you predicted {got[i]:.3f}, the step with the whole all-reduce ({ar * 1e3:.2f} ms) added: DDP "
            "all-reduces each gradient bucket during the backward, so only max(0, all-reduce - backward) = "
            f"{max(0.0, ar - c['backward_s']) * 1e3:.2f} ms adds to the step (efficiency {predict(c):.3f})")


@mistake("the all-reduce hidden under the whole step")
def predict_overlap_step(got: list) -> str | None:
    if (i := _first_apart(got, "overlap with the whole step")) is None:
        return None
    c, said, ar = _case(i)
    return (f"{said} you predicted {got[i]:.3f}, as max(step, all-reduce) gives: the all-reduce starts when the "
            f"backward produces gradients, so it hides under the backward ({c['backward_s'] * 1e3:g} ms), not "
            f"under the forward or the update: the step is compute + max(0, {ar * 1e3:.2f} - "
            f"{c['backward_s'] * 1e3:g}) ms (efficiency {predict(c):.3f})")


@mistake("the exposed all-reduce not clamped at 0")
def predict_unclamped(got: list) -> str | None:
    if (i := _first_apart(got, "exposed time not clamped")) is None:
        return None
    c, said, ar = _case(i)
    return (f"{said} you predicted {got[i]:.3f}, as compute + (all-reduce - backward) gives where the all-reduce "
            f"({ar * 1e3:.2f} ms) is shorter than the backward ({c['backward_s'] * 1e3:g} ms): the difference is "
            f"negative ({(ar - c['backward_s']) * 1e3:.2f} ms), and a hidden all-reduce adds nothing to the step, it "
            f"cannot shorten it. The exposed time is max(0, all-reduce - backward) (efficiency {predict(c):.3f})")


@mistake("the speed-up predicted, not the efficiency")
def predict_speedup(got: list) -> str | None:
    if (i := _first_apart(got, "speed-up")) is None:
        return None
    c = CASES[i]
    return (f"you predicted {got[i]:.3g} at W={c['world']}, the speed-up W * t_step(1) / t_step(W): the efficiency "
            f"divides it by W, throughput(W) / (W * throughput(1)) = {predict(c):.3g} (1 at linear scaling)")


@mistake("the latency counted once in the prediction")
def predict_latency_once(got: list) -> str | None:
    if (i := _first_apart(got, "latency once")) is None:
        return None
    c, said, _ = _case(i)
    w = c["world"]
    return (f"{said} you predicted {got[i]:.3f}, with one latency ({_us(c['alpha'])}) in the all-reduce: the ring "
            f"pays it at each of its 2(W-1) = {2 * (w - 1)} steps ({_us(2 * (w - 1) * c['alpha'])}; efficiency "
            f"{predict(c):.3f}). Many ranks and small gradients are where the latency decides")


@mistake("the prediction's bandwidth term without the ring's factor")
def predict_algbw(got: list) -> str | None:
    if (i := _first_apart(got, "algorithm bandwidth")) is None:
        return None
    c, said, _ = _case(i)
    w = c["world"]
    return (f"{said} you predicted {got[i]:.3f}, with the all-reduce moving bytes * β: every rank's link "
            f"carries 2(W-1)/W = {2 * (w - 1) / w:g} times the gradients' bytes (efficiency {predict(c):.3f})")


@mistake("the prediction's bandwidth term without (W-1)/W")
def predict_no_w_factor(got: list) -> str | None:
    if (i := _first_apart(got, "no (W-1)/W")) is None:
        return None
    c, said, _ = _case(i)
    w = c["world"]
    return (f"{said} you predicted {got[i]:.3f}, with 2 * bytes * β: the ring's factor is 2(W-1)/W = "
            f"{2 * (w - 1) / w:g} (efficiency {predict(c):.3f})")


@mistake("the prediction's bandwidth term half the ring's")
def predict_half_ring(got: list) -> str | None:
    if (i := _first_apart(got, "half the ring")) is None:
        return None
    c, said, _ = _case(i)
    w = c["world"]
    return (f"{said} you predicted {got[i]:.3f}, with (W-1)/W * bytes * β, one reduce-scatter's worth: a ring "
            "all-reduce is a reduce-scatter and an all-gather, each moving (W-1)/W of the bytes through a link, "
            f"2(W-1)/W = {2 * (w - 1) / w:g} in all (efficiency {predict(c):.3f})")


PREDICT_CAUSES = [predict_speedup, predict_no_overlap, predict_overlap_step, predict_unclamped, predict_latency_once,
                  predict_algbw, predict_no_w_factor, predict_half_ring]
