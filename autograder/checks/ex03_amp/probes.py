"""Rank-side instruments of the exercise 3 check (what they run on, and the references: ``workloads``).

Everything here observes; verdicts are computed in ``ex03_amp``. Each part is
run separately, so a learner who finished ``train_step`` but not the
measuring functions still gets the marks for the step:

* forward hooks record the ``nn.Linear`` output dtypes inside autocast, and a
  recording optimizer the parameter and gradient dtypes at ``step()``;
* each of the float32, bf16 and fp16 runs records, per ``train_step``, the gradient norm
  left in ``.grad`` when backward began (zero unless ``zero_grad`` was skipped), the
  ``optimizer.step()`` calls and the gradient norm each stepped with;
* a recording ``GradScaler`` logs the call order, the optimizer the gradient
  norm it steps with, and whether a batch with an ``inf`` changed the weights
  (the first step and the ``inf`` step each on their own, so a missing
  ``scaler.update()``, which makes the second raise, still shows the first's order);
* ``compare`` runs (``measuring_probes``) on the simulated workloads of ``workloads`` under a
  :class:`distlab.measure.timing.VirtualClock` (``CASES``, whose truths are
  ``CASES_TRUTH`` and ``MEMORY_TRUTH``), which every clock the learner's code reads
  follows, however it was imported (``Clocks``, replaced before the file is imported),
  then on the real model (``REAL_MODEL``), on the real clocks;
* ``ANSWERS`` records which graded functions are the runtime's copies (see :func:`observe`).
"""
from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

from distlab import device as rank_device
from distlab.models import cpu_state, make_mlp

from ...rank.observation import Observation
from ...rank import (CapturedPrints, attempt, echo, grad_norm, load_learner, on_backward_start)
from ...rank.first_calls import FirstCalls
from ...rank.parts import Parts
from .accumulation import probes as accumulation
from .accumulation.observations import Accumulation
from .answers import ANSWERS  # the runtime's copies, resolved now: before any learner file is loaded
from .lookalikes import TARGETS as LOOK_ALIKES
from .observations import (Answers, Autocast, LookAlikes, Measure, Parity, PrecisionRun, RealModel,
                           Scaler)
from .measuring_probes import _error, _measure, _real
from .workloads import (LR, MAX_NORM, MODEL, Clocks, RecordingScaler, RecordingSGD,
                        batches)

# The real model whose bf16 speedup is reported (graded on a GPU with bf16 tensor cores), per device type.
REAL_MODEL = {"cpu": dict(in_features=256, hidden=1024, depth=3, batch=256),
              "cuda": dict(in_features=1024, hidden=4096, depth=4, batch=4096)}
P = TypeVar("P", bound=Observation)


def _part(fn, record: type[P], learner) -> P:
    """What one part observed, or its ``record`` with only the error set (the verdict explains it; one broken
    part must not hide the others)."""
    observed, exc = attempt(fn)
    return observed if exc is None else record(error=_error(exc, learner))


def _autocast(learner, device) -> Autocast:
    model = make_mlp(seed=3, **MODEL).to(device)
    seen = Autocast()
    for m in model.modules():
        if isinstance(m, nn.Linear):
            m.register_forward_hook(lambda mod, args, out: seen.linear_out.append(str(out.dtype)))

    def on_step(ps):
        seen.param_dtypes = [str(p.dtype) for p in ps]
        seen.grad_dtypes = [str(p.grad.dtype) for p in ps if p.grad is not None]

    x, y = batches(device)[0]
    learner.train_step(model, RecordingSGD(model.parameters(), LR, on_step), x, y, amp_dtype=torch.bfloat16,
                       max_norm=MAX_NORM)
    return seen


def _run(learner, device, dtype) -> PrecisionRun:
    """``STEPS`` steps of one kind: the losses, and per step the gradient norm left in ``.grad`` when its
    backward began, the number of ``optimizer.step()`` calls and the gradient norm of each."""
    model = make_mlp(seed=3, **MODEL).to(device)
    params = list(model.parameters())
    seen = PrecisionRun()

    on_backward_start(model, lambda: seen.leftover.append(grad_norm(params)))
    opt = RecordingSGD(params, LR, lambda ps: seen.step_norms.append(grad_norm(ps)))
    scaler = torch.amp.GradScaler(device.type) if dtype is torch.float16 else None
    for x, y in batches(device):
        calls = len(seen.step_norms)
        seen.losses.append(float(learner.train_step(model, opt, x, y, amp_dtype=dtype, scaler=scaler,
                                                    max_norm=MAX_NORM)))
        seen.steps.append(len(seen.step_norms) - calls)
    if dtype is None:
        seen.state = cpu_state(model)
    return seen


def _parity(learner, device) -> Parity:
    """The float32, bf16 and fp16 runs, each on its own: one that raises does not hide the others."""
    return Parity(runs={kind: _part(lambda dtype=dtype: _run(learner, device, dtype), PrecisionRun, learner)
                        for kind, dtype in (("fp32", None), ("bf16", torch.bfloat16), ("fp16", torch.float16))})


def _scaler(learner, device) -> Scaler:
    """One fp16 step's call order and stepped gradient norm, then (on its own) a step with an inf in its batch."""
    events: list[str] = []
    norms: list[float] = []

    def on_step(ps):
        events.append("optimizer.step")
        norms.append(grad_norm(ps))

    model = make_mlp(seed=3, **MODEL).to(device)
    first = next(model.parameters())
    first.register_post_accumulate_grad_hook(lambda p: events.append("backward"))
    opt, scaler = RecordingSGD(model.parameters(), LR, on_step), RecordingScaler(device.type, events)
    (x, y), (x2, y2) = batches(device)[:2]
    learner.train_step(model, opt, x, y, amp_dtype=torch.float16, scaler=scaler, max_norm=MAX_NORM)
    out = Scaler(events=list(events), grad_norm=norms[0] if norms else float("nan"),
                 scaled_dtype=scaler.scaled[0] if scaler.scaled else "")
    bad = x2.clone()
    bad[0, 0] = float("inf")
    before, out.scale_before_inf = cpu_state(model), scaler.get_scale()
    _, exc = attempt(learner.train_step, model, opt, bad, y2, amp_dtype=torch.float16, scaler=scaler,
                     max_norm=MAX_NORM)
    out.inf_error = "" if exc is None else _error(exc, learner)  # a missing scaler.update() makes this step raise
    after = cpu_state(model)
    out.scale_after_inf = scaler.get_scale()
    out.inf_params_unchanged = all(torch.equal(before[k], after[k]) for k in before)
    return out


# The parts, in the order they run, each kept as it returns (``rank.parts``: one that ends the launch, a loop that
# never returns, costs its own criteria only). The real model right after the measuring: it is measured only with
# the learner's own ``median_seconds``, which the measure part's calls show, so it runs only in a launch where the
# measure part runs (the grading process's ``needs``).
PARTS = ("train", "measure", "real", "accumulation")


def observe(learner, device: torch.device, real_model: dict, clocks: Clocks, kept: Parts) -> None:
    """Every part of the exercise that ``kept`` runs now, each under its own instruments, each kept as a dict of
    :class:`AmpObservation`'s fields it fills, with ``capability`` and its ``answers``.

    ``answers``: which graded functions *are* the runtime's copies (before any call), and which copies ran
    during the learner's ``compare`` calls in this part (the watch is entered around those only).

    The real model is only measured with the learner's own ``median_seconds`` (its seconds would be
    the runtime's otherwise, and they take the longest to measure): ``RealModel(skipped="median_seconds")``.
    ``real_model``: the real model's sizes (``REAL_MODEL``'s for this device, or the tests' smaller ones).
    ``clocks``: replaced since before the learner's file was imported (:class:`Clocks`).
    """
    capability = list(torch.cuda.get_device_capability(device)) if device.type == "cuda" else None
    identified = ANSWERS.identify(learner)
    watch = ANSWERS.watch(learner)

    def keep(part: str, since: int, **records: Observation) -> None:
        calls = [(d, chain) for d, chain in watch.calls[since:]]
        kept.keep(part, {"capability": capability, "answers": Answers(identified=identified, calls=calls).to_wire(),
                         **{name: record.to_wire() for name, record in records.items()}})

    if kept.starts("train"):
        with FirstCalls(learner.__file__, LOOK_ALIKES) as seen:
            records = dict(autocast=_part(lambda: _autocast(learner, device), Autocast, learner),
                           parity=_part(lambda: _parity(learner, device), Parity, learner),
                           scaler=_part(lambda: _scaler(learner, device), Scaler, learner))
        keep("train", len(watch.calls), lookalikes=LookAlikes(calls=seen.calls), **records)
    if kept.starts("measure"):
        since = len(watch.calls)
        keep("measure", since, measure=_part(lambda: _measure(learner, watch, clocks), Measure, learner))
        timed_by_runtime = "median_seconds" in identified or any(
            dotted in ANSWERS.graded["median_seconds"] for dotted, _ in watch.calls[since:])
        if kept.starts("real"):
            since = len(watch.calls)
            keep("real", since, real=RealModel(skipped="median_seconds") if timed_by_runtime
                 else _part(lambda: _real(learner, device, watch, real_model), RealModel, learner))
    if kept.starts("accumulation"):
        keep("accumulation", len(watch.calls),
             accumulation=_part(lambda: accumulation.observe(learner, device), Accumulation, learner))


def rank_main(paths: list[str], real_models: dict[str, dict], outdir: str, skip: dict[str, list[str]]) -> list[dict]:
    """Runs on the one rank: observe each learner file (tests grade several per launch), the parts ``skip`` does
    not name (``rank.parts``), each kept as plain data (see :func:`observe`) for the launcher's
    ``torch.load(weights_only=True)``.

    ``real_models``: the real model's sizes per device type (``REAL_MODEL``; tests: a smaller CPU one).
    """
    device = rank_device()
    out = []
    for i, path in enumerate(paths):
        kept = Parts(outdir, i, skip)
        clocks = Clocks()
        with clocks.replaced():  # before the import: a clock the file binds then is the virtual one too
            learner = load_learner(path)
            with CapturedPrints() as printed:
                observe(learner, device, real_models["cuda" if device.type == "cuda" else "cpu"], clocks, kept)
        echo(printed.lines)
        kept.finished()
        out.append(kept.ran)
    return out
