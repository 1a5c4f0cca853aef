"""Two parallelisms at once: the tiny transformer on a 2-D mesh, FSDP over ``dp`` x tensor parallel over ``tp``.

The layout of torchtitan (``torchtitan/models/llama3/infra/parallelize.py``: ``apply_tp`` then
``apply_fsdp``), at ``W = 4`` on gloo: ``init_device_mesh(dev, (2, 2), mesh_dim_names=("dp", "tp"))``
lays the ranks on a grid (rank = 2 dp + tp); each row is a tensor-parallel pair, each column a
data-parallel pair.

* **Tensor parallelism** (Megatron-LM, Shoeybi et al. 2019, sec. 3) on ``mesh["tp"]``: in each block
  ``wq, wk, wv`` and ``mlp.w1`` are column-parallel (``ColwiseParallel``: a rank keeps half the heads,
  half the hidden features), ``wo`` and ``mlp.w2`` row-parallel (``RowwiseParallel``: one all-reduce of
  the partial outputs, Megatron's ``g``). ``PrepareModuleInput`` on the attention makes its input one
  replicated DTensor, so the gradients of ``wq, wk, wv``'s input add up as partial sums and are
  all-reduced *once* (Megatron's ``f``), not once per projection: 2 all-reduces a layer forward, 2 backward.
* **FSDP** (ZeRO-3, Rajbhandari et al. 2020; PyTorch's ``fully_shard``, Zhao et al. 2023) on
  ``mesh["dp"]``: one unit per block and the root (embeddings, final norm, head). A block's parameters,
  already halves of the matrices on ``tp``, are halved again on ``dp`` (placements
  ``(_StridedShard(0), Shard(0))``): **a quarter of each split matrix per rank**, half of the rest. Each
  unit is all-gathered over ``dp`` before its forward and again before its backward (the root once:
  FSDP2 keeps the root gathered in between), and its gradients reduce-scattered.

:func:`mesh2d_job` trains a few steps (SGD with momentum: linear in the gradients, so the parity is tight;
Adam's first steps are ``sign(g)`` and flip on rounding) and returns what the test and notebook 12 check:
the losses and final weights against :func:`reference_run` (one process, the whole batch), every
parameter's local shape, the bytes each rank holds (:func:`distlab.lab.fsdp_memory.measured_bytes`) and
every collective of one step (:class:`~distlab.measure.comm.CollectiveRecorder`).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, parallelize_module

from distlab.lab.fsdp_memory import measured_bytes
from distlab.measure.comm import CollectiveRecorder, label, wire_bytes
from distlab.measure.memory import local_tensor
from distlab.transformer import make_transformer, next_token_loss

#: The run's shape: the tiny transformer's defaults, 8 sequences of 32 tokens (4 per data-parallel rank).
BATCH, SEQ, STEPS, LR, MOMENTUM = 8, 32, 3, 0.1, 0.9
#: Which mesh dimension each kind of collective runs on in this layout (the test checks no other kind occurs).
DIMENSION_OF = {"all_reduce": "tp", "all_gather": "dp", "reduce_scatter": "dp"}


def block_plan() -> dict:
    """The Megatron plan of one :class:`~distlab.transformer.Block`, in ``parallelize_module``'s terms."""
    return {"attn": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),),
                                       use_local_output=False),
            "attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(), "attn.wv": ColwiseParallel(),
            "attn.wo": RowwiseParallel(), "mlp.w1": ColwiseParallel(), "mlp.w2": RowwiseParallel()}


def apply_tp(model: nn.Module, *, tp_mesh: DeviceMesh) -> nn.Module:
    """Every block of ``model`` tensor-parallel over ``tp_mesh`` (in place); embeddings, norms and head
    stay whole on each tensor-parallel rank. ``Attention.heads`` reads the head count from the
    projection's width, so a rank's attention runs on its ``n_heads / t`` heads unchanged."""
    if model.cfg.n_heads % tp_mesh.size():
        raise ValueError(f"{model.cfg.n_heads} heads do not split over {tp_mesh.size()} tensor-parallel ranks")
    for block in model.blocks:
        parallelize_module(block, tp_mesh, block_plan())
    return model


def apply_fsdp(model: nn.Module, *, dp_mesh: DeviceMesh, reshard_after_forward: bool | None = None) -> nn.Module:
    """``fully_shard`` each block, then the root, over ``dp_mesh`` (in place). ``reshard_after_forward``
    applies to the root (``None``: FSDP2's default, the root stays gathered until its backward)."""
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh,
                **({} if reshard_after_forward is None else {"reshard_after_forward": reshard_after_forward}))
    return model


def batches(*, steps: int = STEPS, batch: int = BATCH, seq: int = SEQ, vocab: int = 64, seed: int = 1):
    """The token batches of the run (``batch x seq + 1``: inputs and next-token targets), the same everywhere."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (batch, seq + 1), generator=g) for _ in range(steps)]


def _optimizer(model: nn.Module, lr: float, momentum: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)


def reference_run(*, seed: int = 0, steps: int = STEPS, batch: int = BATCH, seq: int = SEQ, lr: float = LR,
                  momentum: float = MOMENTUM) -> dict:
    """The single-process reference: the whole model, the whole batch; its losses and final weights."""
    model = make_transformer(seed)
    opt, losses = _optimizer(model, lr, momentum), []
    for tokens in batches(steps=steps, batch=batch, seq=seq, vocab=model.cfg.vocab):
        loss = next_token_loss(model, tokens)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "weights": {n: p.detach().clone() for n, p in model.named_parameters()}}


def _full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter gathered whole (collectives: outside any recorder). FSDP over TP leaves strided
    shards that gather in two steps; torch logs a warning each time, silenced here."""
    import logging

    quiet = logging.getLogger("torch.distributed.tensor._redistribute")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}
    finally:
        quiet.setLevel(level)


def mesh2d_job(*, seed: int = 0, steps: int = STEPS, batch: int = BATCH, seq: int = SEQ, lr: float = LR,
               momentum: float = MOMENTUM, with_reference: bool = False) -> dict:
    """Runs on each of 4 ranks: the tiny transformer with :func:`apply_tp` over ``tp`` and :func:`apply_fsdp`
    over ``dp``, ``steps`` steps on this data-parallel rank's half of each batch. Returns its losses, the
    weights gathered whole, each parameter's global and local shape and placements, the bytes this rank
    holds after the last backward (before ``zero_grad``), and the collectives of the last step. With
    ``with_reference`` rank 0 also returns :func:`reference_run` (no collective in it; where a notebook's
    kernel would pay ``torch.optim``'s first import of ``torch._dynamo``, the ranks have it preloaded)."""
    from torch.distributed.device_mesh import init_device_mesh

    from distlab.runtime.distributed import init_distributed, shutdown

    dev = init_distributed()
    try:
        mesh = init_device_mesh(dev.type, (2, 2), mesh_dim_names=("dp", "tp"))
        model = apply_fsdp(apply_tp(make_transformer(seed).to(dev), tp_mesh=mesh["tp"]), dp_mesh=mesh["dp"])
        opt, losses, dp = _optimizer(model, lr, momentum), [], mesh["dp"].get_local_rank()
        for i, tokens in enumerate(batches(steps=steps, batch=batch, seq=seq, vocab=model.cfg.vocab)):
            with CollectiveRecorder() as rec:  # the last step's record is kept: the first two warm up
                loss = next_token_loss(model, tokens.chunk(mesh["dp"].size())[dp].to(dev))
                loss.backward()
                held = measured_bytes(model, opt) if i == steps - 1 else None
                opt.step()
                opt.zero_grad()
            losses.append(loss.item())
        held["optimizer"] = measured_bytes(model, opt)["optimizer"]  # the momentum exists after a step
        shape = dict(seed=seed, steps=steps, batch=batch, seq=seq, lr=lr, momentum=momentum)
        reference = reference_run(**shape) if with_reference and mesh.get_rank() == 0 else None
        return {"reference": reference, "rank": mesh.get_rank(), "coordinate": mesh.get_coordinate(), "losses": losses,
                "weights": {n: w.cpu() for n, w in _full_weights(model).items()},
                "shapes": {n: (tuple(p.shape), tuple(local_tensor(p).shape), str(p.placements))
                           for n, p in model.named_parameters()},
                "held": held, "ops": [(op.kind, op.bytes, op.shape) for op in rec.ops],
                "group_sizes": {"dp": mesh["dp"].size(), "tp": mesh["tp"].size()}}
    finally:
        shutdown()


def run_mesh2d(timeout: float = 120, **kwargs) -> list[dict]:
    """Launch :func:`mesh2d_job` on 4 ranks (``distlab.runtime.launch.torchrun``); every rank's report."""
    from distlab.runtime.launch import torchrun

    return torchrun(mesh2d_job, 4, kwargs=kwargs, timeout=timeout).results


def parity(runs: list[dict], ref: dict) -> dict:
    """Largest differences of the run from the reference: each step's loss (the mean over the ranks: a
    tensor-parallel pair shares its half of the batch, and the mean of the two halves' losses is the whole
    batch's) and every rank's final weights, absolute and relative to the largest entry of that weight."""
    losses = [sum(r["losses"][i] for r in runs) / len(runs) for i in range(len(ref["losses"]))]
    diffs = {(r["rank"], n): (w - ref["weights"][n]).abs().max().item() for r in runs for n, w in r["weights"].items()}
    return {"loss": max(abs(a - b) for a, b in zip(losses, ref["losses"])), "losses": losses,
            "weight_abs": max(diffs.values()),
            "weight_rel": max(d / ref["weights"][n].abs().max().item() for (_, n), d in diffs.items())}


def comm_by_dimension(ops: list[tuple], group_sizes: dict[str, int]) -> dict:
    """The recorded ops of one step by mesh dimension (:data:`DIMENSION_OF`) and kind: calls, bytes (the
    nccl-tests size ``S``) and the bytes this rank sent (ring, in its dimension's group)."""
    out: dict = {}
    for kind, nbytes, _shape in ops:
        dim = DIMENSION_OF[kind]
        row = out.setdefault(dim, {}).setdefault(label(kind), {"calls": 0, "bytes": 0, "wire_bytes": 0.0})
        row["calls"] += 1
        row["bytes"] += nbytes
        row["wire_bytes"] += wire_bytes(kind, nbytes, group_sizes[dim])
    return out

