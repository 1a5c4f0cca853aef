"""Tensor parallelism through PyTorch's API: DeviceMesh, DTensor placements, ``parallelize_module``.

Megatron-LM (Shoeybi et al., 2019, sec. 3) splits a transformer's MLP ``Z = relu(X A) B`` over
``t`` ranks: ``A`` by columns (each rank computes ``2h/t`` hidden features; the elementwise
nonlinearity needs nothing from the other ranks) and ``B`` by rows (each rank holds the
matching ``2h/t`` inputs and produces a *partial* sum of ``Z``). One all-reduce sums the
partials in the forward (Megatron's ``g``); one at the block's input sums the input gradients
in the backward (``f``). ``torch.distributed.tensor.parallel`` says the same with placements:
``ColwiseParallel`` shards ``nn.Linear.weight`` on dim 0 (its rows are the output features,
Megatron's columns of ``A``), ``RowwiseParallel`` on dim 1.

Sequence parallelism (Korthikanti et al., 2022) keeps the activations *between* the linears
sharded on the sequence: the all-reduce becomes an all-gather before the column-parallel linear
and a reduce-scatter after the row-parallel one, the same bytes on a ring, and the norm in
between (``SequenceParallel``) works on ``s/t`` positions. The helpers notebook 08, its
benchmark and tests share; exercise 8's autograd Functions ``f``/``g`` are not here.
"""
from __future__ import annotations

import logging
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                               parallelize_module)

from distlab.measure.comm import CollectiveRecorder
from distlab.measure.memory import local_tensor, saved_tensor_bytes
from distlab.resmlp import Block


def mlp_plan(prefix: str = "", sequence_parallel: bool = False) -> dict:
    """The Megatron plan for one :class:`~distlab.resmlp.Block` (``prefix``: its name in the parent).

    With ``sequence_parallel`` the block's input and output stay sharded on dim 1 (the
    sequence): ``fc1`` all-gathers its input, ``fc2`` reduce-scatters its output and hands
    back a DTensor, so the residual add also works on the shard.
    """
    if not sequence_parallel:
        return {f"{prefix}fc1": ColwiseParallel(), f"{prefix}fc2": RowwiseParallel()}
    return {f"{prefix}fc1": ColwiseParallel(input_layouts=Shard(1)),
            f"{prefix}fc2": RowwiseParallel(output_layouts=Shard(1), use_local_output=False)}


def parallelize_blocks(model: nn.Module, mesh) -> nn.Module:
    """Column- then row-parallel ``fc1``/``fc2`` in every block of a ResidualMLP (in place);
    the input layer and the head stay whole on every rank (small, and every rank needs them)."""
    for block in model.blocks:
        parallelize_module(block, mesh, mlp_plan())
    return model


def seeded(factory, seed: int, *args, **kwargs) -> nn.Module:
    """``factory(*args, **kwargs)`` with initial weights that depend only on ``seed`` (the same on every rank)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return factory(*args, **kwargs)


def norm_block(hidden: int) -> nn.Sequential:
    """A LayerNorm then a Block: the pre-norm MLP half of a transformer layer (for sequence parallelism)."""
    return nn.Sequential(nn.LayerNorm(hidden), Block(hidden))


#: The recorder under the name notebook 08 was released with (:class:`distlab.measure.comm.CollectiveRecorder`).
CommCounter = CollectiveRecorder


def param_bytes(module: nn.Module) -> tuple[int, int]:
    """``(bytes on this rank, bytes unsplit)`` of a module's parameters (a DTensor's ``numel`` is global)."""
    local = sum(local_tensor(p).numel() * p.element_size() for p in module.parameters())
    return local, sum(p.numel() * p.element_size() for p in module.parameters())


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def grad_diff(model: nn.Module, ref: nn.Module) -> float:
    """Largest absolute difference between the gradients of ``model`` (gathered) and of ``ref``."""
    # FSDP over TP leaves strided shards that gather in two steps; torch logs a warning each time
    quiet = logging.getLogger("torch.distributed.tensor._redistribute")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return max((_full(p.grad) - q.grad).abs().max().item()
                   for p, q in zip(model.parameters(), ref.parameters()))
    finally:
        quiet.setLevel(level)


def step_report(model: nn.Module, ref: nn.Module, x, y, world: int, x_ref=None, y_ref=None) -> dict:
    """One forward and backward of ``model`` (parallelized) and of ``ref`` (unsplit), compared.

    ``x_ref``/``y_ref`` is the unsplit model's batch when it differs (data parallelism: ``x``
    is this rank's slice). Returns the collectives by kind and the bytes each rank sent
    (``world``: the group they run in), the bytes saved for backward on this rank, and the
    largest differences of the loss (same batch only) and of the gradients.
    """
    step: dict = {}
    with CollectiveRecorder() as fwd:  # saved_tensor_bytes counts a DTensor by its shard on this rank
        saved = saved_tensor_bytes(lambda: step.update(loss=F.cross_entropy(model(x), y)), exclude=model.parameters())
    loss = step["loss"]
    with CollectiveRecorder() as bwd:
        loss.backward()
    ref_loss = F.cross_entropy(ref(x if x_ref is None else x_ref), y if y_ref is None else y_ref)
    ref_loss.backward()
    return {"forward": fwd.counts(), "backward": bwd.counts(), "forward_bytes": fwd.ring_bytes(world),
            "backward_bytes": bwd.ring_bytes(world), "saved_bytes": saved,
            "loss_diff": (loss - ref_loss).abs().item() if x_ref is None else float("nan"),
            "grad_diff": grad_diff(model, ref)}


def sequence_parallel_report(mesh, *, batch: int, seq: int, hidden: int, seed: int = 0) -> dict:
    """The pre-norm block (:func:`norm_block`) run tensor-parallel, then sequence-parallel, on one batch.

    Tensor-parallel: the norm whole on every rank, one all-reduce each way. Sequence-parallel:
    the input is this rank's ``seq/t`` positions, ``SequenceParallel`` on the norm, and the
    block's plan with sharded input and output. Returns, per variant, the collectives, the
    bytes each rank sent, the bytes saved for backward, and the largest differences of the
    output and the input gradient from the unsplit block.
    """
    t, r, dev = mesh.size(), mesh.get_local_rank(), torch.device(mesh.device_type)
    x = torch.randn(batch, seq, hidden, generator=torch.Generator().manual_seed(seed + 1)).to(dev)
    ref = seeded(norm_block, seed, hidden).to(dev)
    x_ref = x.clone().requires_grad_()
    out_ref = ref(x_ref)
    out_ref.sum().backward()
    plans = {"tensor parallel": mlp_plan("1."),
             "sequence parallel": {"0": SequenceParallel(), **mlp_plan("1.", sequence_parallel=True)}}
    report = {}
    for name, plan in plans.items():
        sp = name == "sequence parallel"
        model = parallelize_module(seeded(norm_block, seed, hidden).to(dev), mesh, plan)
        xin = (x.chunk(t, dim=1)[r] if sp else x).clone().requires_grad_()
        step: dict = {}
        with CollectiveRecorder() as fwd:
            saved = saved_tensor_bytes(lambda: step.update(out=model(xin)), exclude=model.parameters())
        out = step["out"]
        out = out.to_local() if isinstance(out, DTensor) else out  # (with its autograd history)
        with CollectiveRecorder() as bwd:
            out.sum().backward()
        mine = (lambda z: z.chunk(t, dim=1)[r]) if sp else (lambda z: z)  # noqa: E731
        report[name] = {"forward": fwd.counts(), "backward": bwd.counts(), "saved_bytes": saved,
                        "forward_bytes": fwd.ring_bytes(t), "backward_bytes": bwd.ring_bytes(t),
                        "out_diff": (out - mine(out_ref)).abs().max().item(),
                        "input_grad_diff": (xin.grad - mine(x_ref.grad)).abs().max().item(),
                        "norm_grad": str(getattr(model[0].weight.grad, "placements", "plain tensor"))}
    return report


def _step(model: nn.Module, x, y) -> None:
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()


def _times(model: nn.Module, ref: nn.Module, x, y, calls: int, repeats: int) -> dict:
    """Seconds per training step (forward, backward), the slowest rank's: the unsplit model on every
    rank at once (W=1 per core, as loaded as the parallel run), the parallel model, the parallel
    model on one row (its fixed cost: DTensor's work per op, the collectives' latency), and one
    all-reduce of a block's output (a block adds two). Timed in turn, ``calls`` calls each, the
    median of ``repeats`` rounds: a burst of load from elsewhere hits a round's four alike."""
    import torch.distributed as dist

    from distlab.measure.timing import slowest_rank, synchronize

    buf = torch.zeros(x.shape[0], model.blocks[0].fc2.out_features, device=x.device)
    work = {"unsplit_s": lambda: _step(ref, x, y), "parallel_s": lambda: _step(model, x, y),
            "one_row_s": lambda: _step(model, x[:1], y[:1]), "all_reduce_s": lambda: dist.all_reduce(buf)}
    seen: dict[str, list[float]] = {name: [] for name in work}
    for round_ in range(repeats + 1):  # round 0 warms up (gloo connects lazily, DTensor caches its plans)
        for name, fn in work.items():
            synchronize(x.device)
            dist.barrier()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            synchronize(x.device)
            elapsed = slowest_rank((time.perf_counter() - start) / calls)
            if round_:
                seen[name].append(elapsed)
    return {name: statistics.median(v) for name, v in seen.items()}


def tp_job(*, hidden: int = 64, depth: int = 2, batch: int = 8, seq: int = 16, seed: int = 0,
           timed: bool = False, calls: int = 5, repeats: int = 5) -> dict:
    """Runs on every rank: a ResidualMLP with every block tensor-parallel over all ranks, against
    the unsplit model on the same batch (:func:`step_report`); the block's parameter bytes and
    placements; the sequence-parallel comparison (:func:`sequence_parallel_report`); with
    ``timed`` the step times (:func:`_times`). What the tests and the benchmark launch."""
    from torch.distributed.device_mesh import init_device_mesh

    from distlab.data import seeded_batch
    from distlab.resmlp import make_resmlp
    from distlab.runtime.distributed import init_distributed, shutdown, world_size

    dev = init_distributed()
    try:
        mesh = init_device_mesh(dev.type, (world_size(),))
        w, shape = mesh.size(), dict(in_features=hidden, hidden=hidden, depth=depth, out_features=10)
        ref, model = make_resmlp(seed, **shape).to(dev), parallelize_blocks(make_resmlp(seed, **shape).to(dev), mesh)
        # the same batch on every rank: TP ranks share it
        x, y = seeded_batch(batch, hidden, 10, seed=seed + 1, device=dev)
        block = model.blocks[0]
        matrices = [block.fc1.weight, block.fc2.weight]
        out = {"world": w, "step": step_report(model, ref, x, y, w), "block_bytes": param_bytes(block),
               "matrix_bytes": (sum(local_tensor(p).nbytes for p in matrices), sum(p.nbytes for p in matrices)),
               "placements": {n: str(p.placements) for n, p in block.named_parameters()},
               "local_shapes": {n: tuple(local_tensor(p).shape) for n, p in block.named_parameters()},
               "sp": sequence_parallel_report(mesh, batch=2, seq=seq, hidden=hidden, seed=seed)}
        if timed:
            out["time"] = _times(model, ref, x, y, calls, repeats)
        return out
    finally:
        shutdown()


def run_tp_job(nprocs: int, timeout: float = 120, **kwargs) -> list[dict]:
    """Launch :func:`tp_job` on ``nprocs`` ranks; every rank's figures, in rank order."""
    from distlab.runtime.launch import torchrun

    return torchrun(tp_job, nprocs, kwargs=kwargs, timeout=timeout).results


def attention_heads_split(attn: nn.Module, x: torch.Tensor, group) -> torch.Tensor:
    """Megatron's attention block (Shoeybi et al. 2019, sec. 3, fig. 3b) on this rank's heads: ``wq, wk, wv``
    column-parallel (rank ``r`` keeps the rows of its ``n_heads / t`` heads), causal attention on those heads
    alone (heads never mix), ``wo`` row-parallel (the matching columns), and one all-reduce of the partial
    outputs: the same ``g`` as the MLP's. ``attn`` is a :class:`distlab.transformer.Attention`, whole."""
    import torch.distributed as dist

    t, r = dist.get_world_size(group), dist.get_rank(group)
    width = attn.n_heads // t * attn.head_dim  # this rank's heads' features
    rows = slice(r * width, (r + 1) * width)
    b, s, _ = x.shape
    q, k, v = (F.linear(x, w.weight[rows]).view(b, s, -1, attn.head_dim).transpose(1, 2)
               for w in (attn.wq, attn.wk, attn.wv))
    heads = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)
    partial = F.linear(heads, attn.wo.weight[:, rows])
    dist.all_reduce(partial, group=group)  # g: sum the heads' contributions
    return partial


def attention_tp_report(group, *, dim: int = 32, n_heads: int = 4, seq: int = 8, seed: int = 0) -> dict:
    """The head-split attention block against the unsplit one on the same input: the largest difference,
    the collectives of the forward (``CollectiveRecorder``), and the weight bytes this rank holds."""
    from distlab.transformer import Attention

    attn = seeded(Attention, seed, dim, n_heads)
    x = torch.randn(2, seq, dim, generator=torch.Generator().manual_seed(seed + 1))
    with torch.no_grad(), CollectiveRecorder() as comm:
        out = attention_heads_split(attn, x, group)
    with torch.no_grad():
        ref = attn(x)
    t = torch.distributed.get_world_size(group)
    full = sum(p.nbytes for p in attn.parameters())
    return {"max_diff": (out - ref).abs().max().item(), "collectives": comm.counts(),
            "heads_per_rank": n_heads // t, "shard_bytes": full // t, "full_bytes": full}
