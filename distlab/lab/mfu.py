"""Model FLOPs utilisation (MFU): the FLOPs a step needs, counted, over the FLOPs the hardware can do.

Chowdhery et al., 2022 ("PaLM: Scaling Language Modeling with Pathways",
appendix B) define MFU as the model FLOPs a step needs times the steps per
second, over the hardware's *datasheet* peak FLOP/s: recomputation and padding
do not count as useful work, and the figure compares across systems. Their
*hardware FLOPs utilisation* (HFU) counts the FLOPs the hardware really does,
the recomputed forward included: ``8 N`` per token with full recomputation
(:func:`hardware_flops_per_token`), so HFU >= MFU. On a CPU there is no
datasheet, so the course also divides by the *measured* matmul peak
(:func:`matmul_peak`): that ratio is the "fraction of the measured matmul
peak", higher than PaLM's MFU wherever the measured peak is below the datasheet's. Kaplan et al., 2020 ("Scaling
Laws for Neural Language Models", section 2.1) estimate the FLOPs as
``6 N`` per token for ``N`` parameters: ``2 N`` forward (a multiply and an add
per weight), ``4 N`` backward (the gradient of the input and of the weight).

* :func:`step_flops` counts a step with ``torch.utils.flop_counter.FlopCounterMode``
  (matrix products only: ``mm``, ``addmm``, ``bmm``, convolutions, attention);
* :func:`six_n_rule` is Kaplan's estimate and :func:`exact_mlp_flops` what the
  counter must find for an MLP, which differs from ``6 N`` in two ways: ``N``
  counts biases, whose adds are not matrix products, and the first layer's
  input needs no gradient, so its backward is ``2`` FLOPs per weight, not ``4``;
* :func:`matmul_peak` measures the peak: the best rate of large matrix products
  on this device, in the same run as the step, so both see the same machine;
* :data:`DATASHEET` has vendors' dense peaks for some GPUs (:func:`datasheet_peak`);
* :func:`training_seconds` turns ``6 N D``, a peak and an MFU into the time a training run takes.
"""
from __future__ import annotations

import re
import time

import torch
from torch import nn

from distlab.measure.flops import flop_counter

#: Dense peak FLOP/s from NVIDIA's datasheets (SXM unless named; "sparsity" figures halved).
DATASHEET = [
    (r"H200", {"bf16": 989e12, "tf32": 495e12, "fp32": 67e12}),
    (r"H100 PCIe", {"bf16": 756e12, "tf32": 378e12, "fp32": 51e12}),
    (r"H100", {"bf16": 989e12, "tf32": 495e12, "fp32": 67e12}),
    (r"A100", {"bf16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
    (r"\bL4\b", {"bf16": 121e12, "tf32": 60e12, "fp32": 30.3e12}),
]
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def datasheet_peak(device_name: str, dtype: torch.dtype = torch.float32) -> float | None:
    """The datasheet's dense peak FLOP/s for a device name (``torch.cuda.get_device_name()``), or None."""
    for pattern, peaks in DATASHEET:
        if re.search(pattern, device_name):
            return peaks.get(DTYPE_NAMES.get(dtype, ""))
    return None


def step_flops(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """FLOPs of one forward and backward of ``model`` on ``(x, y)`` with cross-entropy, counted by
    ``FlopCounterMode`` (:func:`distlab.measure.flops.flop_counter`; the optimizer's elementwise update is not
    a matrix product: not counted)."""
    with flop_counter() as counter:
        nn.functional.cross_entropy(model(x), y).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def six_n_rule(model: nn.Module, tokens: int) -> int:
    """Kaplan et al.'s ``6 N`` FLOPs per token, ``N`` every parameter (biases and norms included).
    For an MLP a sample is one token."""
    return 6 * sum(p.numel() for p in model.parameters()) * tokens


def exact_mlp_flops(model: nn.Module, tokens: int) -> int:
    """The matrix-product FLOPs of a step of an MLP (every ``nn.Linear``): ``6`` per weight and token,
    less ``2`` per weight and token for the first layer, whose input needs no gradient."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    weights = sum(m.weight.numel() for m in linears)
    return 6 * weights * tokens - 2 * linears[0].weight.numel() * tokens


def matmul_peak(device: torch.device | None = None, dtype: torch.dtype = torch.float32,
                sizes: tuple[int, ...] | None = None, reps: int = 3) -> dict:
    """The best FLOP/s of ``n x n`` matrix products on ``device`` (this process's threads: one on a
    torchrun worker, ``OMP_NUM_THREADS=1``). Each size: one untimed product, then ``reps`` timed,
    the fastest kept. Returns ``{"flops_per_s", "n", "dtype"}`` of the best size."""
    device = device or torch.device("cpu")
    sizes = sizes or ((4096, 8192) if device.type == "cuda" else (256, 512, 1024))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    best = {"flops_per_s": 0.0, "n": 0, "dtype": DTYPE_NAMES.get(dtype, str(dtype))}
    for n in sizes:
        a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
        (a @ b).sum().item()  # untimed: allocations, the library's kernel choice
        for _ in range(reps):
            sync()
            start = time.perf_counter()
            a @ b
            sync()
            rate = 2 * n ** 3 / (time.perf_counter() - start)
            if rate > best["flops_per_s"]:
                best.update(flops_per_s=rate, n=n)
    return best


def hardware_flops_per_token(n_params: float, recompute: str = "none") -> float:
    """FLOPs the hardware does per token: Kaplan's ``6 N``, plus one more forward (``2 N``) with
    full recomputation. MFU counts ``6 N`` whatever is recomputed; HFU counts these."""
    extra = {"none": 0, "full": 2}
    if recompute not in extra:
        raise ValueError(f"recompute must be one of {tuple(extra)}")
    return (6 + extra[recompute]) * n_params


def training_seconds(n_params: float, tokens: float, *, peak_flops_per_s: float, mfu: float, gpus: int = 1) -> float:
    """Wall seconds to train ``n_params`` parameters on ``tokens`` tokens: Kaplan's ``6 N D`` model FLOPs over
    what ``gpus`` devices achieve, each at ``mfu`` of its datasheet peak. (With full recomputation the hardware
    does ``8 N D``, :func:`hardware_flops_per_token`; an MFU measured on such a run already pays for it.)"""
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu is a fraction of the peak, in (0, 1]; got {mfu}")
    return 6 * n_params * tokens / (gpus * peak_flops_per_s * mfu)


def mfu(flops_per_step: float, step_s: float, peak_flops_per_s: float) -> float:
    """Achieved FLOP/s over a peak: ``flops_per_step / step_s / peak``. PaLM's MFU when the peak is the
    datasheet's and the FLOPs the model's; the fraction of the measured matmul peak with :func:`matmul_peak`."""
    return flops_per_step / step_s / peak_flops_per_s


def scaling_mfu(hidden: int = 1024, batch: int = 32, depth: int = 3, calls: int = 5, repeats: int = 3) -> dict:
    """Runs on every rank of an initialised job: the MFU of exercise 6's workload (notebook 06's
    MLP, ``make_mlp(hidden, depth)``, ``batch`` samples per worker, SGD) at ``W = 1`` (rank 0 alone
    while the others wait in a barrier) and at ``W = world`` (every rank, under DDP).

    Each ``W`` has its own peak, measured by the same ranks at the same time: on a CPU ``W``
    workers share the machine's memory bandwidth and caches, so ``W`` ranks' matmul peak is not
    ``W`` times one rank's. MFU(W) = ``W x flops_per_step / step_s`` over the sum of the ranks'
    peaks. Every rank returns the same dict.
    """
    import copy

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from distlab.data import seeded_batch
    from distlab.runtime.distributed import device as rank_device
    from distlab.models import make_mlp, sgd_step
    from distlab.measure.timing import distributed_median_seconds, median_seconds, synchronize

    dev, rank, world = rank_device(), dist.get_rank(), dist.get_world_size()
    model = make_mlp(seed=0, hidden=hidden, depth=depth).to(dev)
    x, y = seeded_batch(batch, 64, 10, seed=rank, device=dev)
    flops = step_flops(model, x, y)
    out = {"flops_per_step": flops, "six_n": six_n_rule(model, batch), "exact": exact_mlp_flops(model, batch),
           "params": sum(p.numel() for p in model.parameters()), "batch": batch, "hidden": hidden,
           "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"}
    solo = [None]
    if rank == 0:  # one worker with the machine to itself: the others wait, idle, in the barrier below
        peak = matmul_peak(dev)["flops_per_s"]
        step_s = median_seconds(sgd_step(copy.deepcopy(model), x, y, lr=0.01), lambda: synchronize(dev))
        solo[0] = {"world": 1, "step_s": step_s, "peak": peak, "achieved": flops / step_s}
    dist.barrier()
    dist.broadcast_object_list(solo, src=0)
    peak = torch.tensor([matmul_peak(dev)["flops_per_s"]], dtype=torch.float64, device=dev)
    dist.all_reduce(peak)  # the sum of the ranks' peaks, measured at the same time
    ddp = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    step_s = distributed_median_seconds(sgd_step(ddp, x, y, lr=0.01), calls=calls, repeats=repeats, device=dev,
                                        warmup=3)
    rows = [solo[0], {"world": world, "step_s": step_s, "peak": peak.item(), "achieved": world * flops / step_s}]
    sheet = datasheet_peak(out["device"]) if dev.type == "cuda" else None  # fp32: the workload's dtype
    for row in rows:
        row["mfu"] = mfu(row["world"] * flops, row["step_s"], row["peak"])
        row["mfu_datasheet"] = mfu(row["world"] * flops, row["step_s"], row["world"] * sheet) if sheet else None
    out["rows"] = rows
    return out
