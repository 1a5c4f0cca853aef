"""Rank-side instruments of exercise 4's part 1, ZeRO-1 by hand (Rajbhandari et al., 2020, stage 1, P_os).

Everything here observes; the verdicts are computed in ``ex04_fsdp`` against ``reference.zero1_reference``.
The grader runs its own copy of the learner file's ``train_zero1`` loop around the learner's
``make_zero1_optimizer`` and ``zero1_step``, so that each step's collectives are recorded apart
(the one recorder, :class:`~distlab.measure.comm.CollectiveRecorder`), and notes:

* ``shard_range``'s slices for the model's parameter count and two small ones, at this world size (apart:
  :func:`observe_ranges`);
* the shard the learner made (its size, dtype, first values: which slice of the flat parameters it copies)
  and which tensors its optimizer holds (the model's own parameters or not);
* the gradient the optimizer saw at its first step (an optimizer step pre-hook: what was averaged);
* every rank's flat parameters after the last step, and the elements of the optimizer's state;
* then two steps on a bfloat16 copy of the model (:func:`observe_half`): the master shard's dtype, the
  parameters' dtypes and values after each step.

An error the learner's part 1 raises is recorded, not raised: part 2 (FSDP) is graded all the same.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils import parameters_to_vector

from distlab.resmlp import make_resmlp

from ....rank import LineRecorder, learner_frame, raised, raised_at
from .observations import Collective, Half, Holdings, Zero1

# A model whose parameter count neither 2 nor 4 divides: 21489 parameters, padded by 1 at W=2 and by 3 at W=4.
ZERO1_MODEL = dict(in_features=64, hidden=47, out_features=10, depth=2)
# A buffer of the model's own, as a normalisation layer's statistics are: state_dict() holds it, model.parameters()
# does not (a blind audit's flat buffer built from the state dict shifted every slice by its length, unseen).
ZERO1_BUFFER = ("input_mean", ZERO1_MODEL["in_features"])
HALF_STEPS = 2  # the bfloat16 model's: the second step starts from the parameters the first wrote
SHARD_RANGE_SIZES = (10, 12)  # more counts shard_range is asked about: 4 does not divide 10, 2 and 4 divide 12


def zero1_model(seed: int) -> nn.Module:
    """Part 1's model: the ResidualMLP of ``ZERO1_MODEL``, with a buffer (``ZERO1_BUFFER``, zeros) of its own."""
    model = make_resmlp(seed=seed, **ZERO1_MODEL)
    model.register_buffer(ZERO1_BUFFER[0], torch.zeros(ZERO1_BUFFER[1]))
    return model


def zero1_numel() -> int:
    return sum(p.numel() for p in make_resmlp(seed=0, **ZERO1_MODEL).parameters())


def observe_ranges(learner, path: str) -> Zero1:
    """``shard_range``'s answers on this rank (a pure function: kept apart from the training, so that a rank
    that part 1's collectives end leaves them to be graded)."""
    world = dist.get_world_size()
    obs = Zero1()
    try:
        obs.ranges = {n: [[int(v) for v in learner.shard_range(n, world, r)] for r in range(world)]
                      for n in (zero1_numel(), *SHARD_RANGE_SIZES)}
    except Exception as exc:  # noqa: BLE001 - the learner's error is feedback
        obs.ranges_error = _where(exc, path)
        obs.ranges_unwritten = str(learner_frame(exc, path) or "") if isinstance(exc, NotImplementedError) else ""
    return obs


def observe_zero1(learner, path: str, batches: list[tuple[torch.Tensor, torch.Tensor]], *, seed: int,
                  lr: float, device: torch.device) -> Zero1:
    """Part 1's ZeRO-1 training on ``batches`` (this rank's), with the learner's optimizer factory and step
    (``shard_range``'s answers are :func:`observe_ranges`')."""
    world = dist.get_world_size()
    obs = Zero1()
    model = zero1_model(seed).to(device)  # the same start on every rank
    params = list(model.parameters())
    optimizer = None
    try:
        shard, optimizer = learner.make_zero1_optimizer(model, lr)
        obs.holdings = _holdings(params, shard, optimizer)
        first: dict = {}

        def at_step(opt, args, kwargs) -> None:
            first.setdefault("grad", _grads(opt))

        optimizer.register_step_pre_hook(at_step)
        for x, y in batches:
            model.zero_grad(set_to_none=True)  # train_zero1's loop, as the learner's file gives it
            nn.functional.cross_entropy(model(x), y).backward()
            with LineRecorder(world, path) as rec:
                learner.zero1_step(model, shard, optimizer)
            obs.steps.append([Collective(op.kind, op.bytes, op.tags["line"]) for op in rec.ops])
        obs.first_grad = first.get("grad")
    except Exception as exc:  # noqa: BLE001 - part 1's error costs part 1's marks only
        obs.error, obs.not_implemented = _where(exc, path), isinstance(exc, NotImplementedError)
        obs.where = str(learner_frame(exc, path) or "")
    obs.final = parameters_to_vector(p.detach() for p in params).cpu()
    obs.state = _state_numel(optimizer)
    if obs.error is None:  # a part 1 that raised in fp32 is said once, there
        obs.half = observe_half(learner, path, batches[:HALF_STEPS], seed=seed, lr=lr, device=device)
    return obs


def observe_half(learner, path: str, batches: list[tuple[torch.Tensor, torch.Tensor]], *, seed: int, lr: float,
                 device: torch.device) -> Half:
    """The learner's ZeRO-1 on a bfloat16 model (mixed precision: the contract's master shard is fp32, and
    ``zero1_step`` writes into the bf16 parameters). A step after which a parameter's dtype changed ends the
    run there: the next forward would raise in the grader's loop, not in the learner's code."""
    obs = Half()
    model = zero1_model(seed).to(device, torch.bfloat16)
    named = list(model.named_parameters())
    storages = [p.untyped_storage().data_ptr() for _, p in named]
    shard = optimizer = None
    try:
        shard, optimizer = learner.make_zero1_optimizer(model, lr)
        obs.shard_dtype = str(shard.dtype).removeprefix("torch.") if isinstance(shard, torch.Tensor) else ""
        for x, y in batches:
            model.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x.to(torch.bfloat16)).float(), y).backward()
            learner.zero1_step(model, shard, optimizer)
            obs.steps += 1
            obs.retyped = [f"{n}: bfloat16 -> {str(p.dtype).removeprefix('torch.')}" for n, p in named
                           if p.dtype != torch.bfloat16]
            if obs.retyped:
                break
    except Exception as exc:  # noqa: BLE001 - the learner's error is feedback, for this criterion only
        obs.error = raised_at(exc, path)
    obs.rebound = sum(p.untyped_storage().data_ptr() != s for (_, p), s in zip(named, storages))
    obs.state_dtypes = sorted({str(v.dtype).removeprefix("torch.") for s in getattr(optimizer, "state", {}).values()
                               for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0})
    if isinstance(shard, torch.Tensor):
        obs.shard = shard.detach().reshape(-1).float().cpu()
    obs.params = parameters_to_vector(p.detach().float() for _, p in named).cpu()
    return obs


def _where(exc: BaseException, path: str) -> str:
    where = learner_frame(exc, path)
    return raised(exc) + (f" (at {where})" if where else "")


def _holdings(params: list[torch.Tensor], shard, optimizer) -> Holdings:
    """What ``make_zero1_optimizer`` returned: the shard's size, dtype and values, the optimizer's tensors."""
    held = [p for group in getattr(optimizer, "param_groups", []) for p in group["params"]]
    ids = {id(p) for p in params}
    out = Holdings(opt_numel=sum(p.numel() for p in held), opt_tensors=len(held),
                   opt_model_params=sum(id(p) in ids for p in held), model_params=len(params),
                   shard_in_opt=any(p is shard for p in held))
    if isinstance(shard, torch.Tensor):
        out.shard = shard.detach().reshape(-1).cpu().clone()
        out.shard_dtype, out.shard_is_leaf = str(shard.dtype).removeprefix("torch."), shard.is_leaf
        out.shard_aliases_model = any(shard.untyped_storage().data_ptr() == p.untyped_storage().data_ptr()
                                      for p in params)
        # what the rank keeps alive, views included: a slice of the flat buffer holds the whole buffer's storage
        out.shard_storage_bytes, out.shard_element_bytes = shard.untyped_storage().nbytes(), shard.element_size()
    return out


def _grads(optimizer) -> torch.Tensor:
    """The gradients of the optimizer's tensors as it is about to step, flattened (zeros for a missing one)."""
    held = [p for group in optimizer.param_groups for p in group["params"]]
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).cpu().float()
                      for p in held]) if held else torch.zeros(0)


def _state_numel(optimizer) -> dict[str, int]:
    """Elements of each kind of optimizer state on this rank (``exp_avg``...; scalars such as ``step`` left out)."""
    out: dict[str, int] = {}
    for state in getattr(optimizer, "state", {}).values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                out[key] = out.get(key, 0) + value.numel()
    return out
