"""Exercise 6, written independently of the reference: each rank times its own window between two
barriers and the slowest one wins (an in-place MAX all-reduce), clocks and collectives imported by
name, the optimizer built before the wrapper, DDP's all-reduce hook registered by hand, and the
results written with json.dump and matplotlib's object API. Graded by tests/test_ex06_scaling.py."""
from __future__ import annotations

import json
from pathlib import Path
from time import perf_counter
from typing import Callable

import torch
from torch import nn
from torch.distributed import ReduceOp, all_reduce, barrier, get_world_size
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

import distlab
from distlab.models import make_mlp


def _sync_device() -> None:
    if torch.cuda.is_available() and distlab.device().type == "cuda":
        torch.cuda.synchronize()


def measure_throughput(step: Callable[[], None], batch_size: int, *, warmup: int, iters: int) -> float:
    """Global samples per second of ``step`` over the iters steps after the warm-up, on every rank."""
    done = 0
    while done < warmup:
        step()
        done += 1
    _sync_device()
    barrier()
    began = perf_counter()
    for _ in range(iters):
        step()
    _sync_device()
    barrier()
    window = torch.tensor([perf_counter() - began], dtype=torch.float64, device=distlab.device())
    all_reduce(window, op=ReduceOp.MAX)  # the slowest rank's window, the same on every rank
    samples = batch_size * iters * get_world_size()
    print(f"timed {iters} steps in {window.item():.4f} s")
    return samples / float(window)


def make_ddp_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, lr: float) -> Callable[[], None]:
    """One DDP training step on ``(x, y)`` as a function of no arguments."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)  # DDP keeps the very same parameters
    ids = [x.device.index] if x.device.type == "cuda" else None
    wrapped = DistributedDataParallel(model, device_ids=ids)
    wrapped.register_comm_hook(state=None, hook=allreduce_hook)
    loss_fn = nn.CrossEntropyLoss()

    def step() -> None:
        for p in wrapped.parameters():
            p.grad = None
        loss_fn(wrapped(x), y).backward()
        optimizer.step()

    return step


def scaling_efficiency(throughput: dict[int, float]) -> dict[int, float]:
    """Throughput at W workers over W times one worker's."""
    one = throughput[1]
    result = {}
    for workers in sorted(throughput):
        result[workers] = throughput[workers] / one / workers
    return result


def write_results(throughput: dict[int, float], efficiency: dict[int, float], out_dir: str | Path) -> dict:
    """``scaling.json`` and ``scaling.png`` in ``out_dir``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"throughput": {str(w): v for w, v in throughput.items()},
           "efficiency": {str(w): v for w, v in efficiency.items()}}
    with open(folder / "scaling.json", "w") as f:
        json.dump(doc, f)
    workers = sorted(throughput)
    fig = Figure(figsize=(4, 3))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(workers, [throughput[w] for w in workers], marker="s", label="measured")
    ax.plot(workers, [throughput[1] * w for w in workers], linestyle=":", label="linear")
    ax.set_xlabel("workers")
    ax.set_ylabel("samples/s")
    ax.legend()
    fig.savefig(folder / "scaling.png")
    return {"json": str(folder / "scaling.json"), "plot": str(folder / "scaling.png")}


def bench_rank(*, batch_size: int = 128, hidden: int = 256, warmup: int = 5, iters: int = 30) -> float:
    """One worker of the benchmark (given)."""
    device = distlab.init_distributed()
    torch.manual_seed(torch.distributed.get_rank())
    model = make_mlp(seed=0, hidden=hidden).to(device)
    x = torch.randn(batch_size, 64, device=device)
    y = torch.randint(0, 10, (batch_size,), device=device)
    figure = measure_throughput(make_ddp_step(model, x, y, lr=0.01), batch_size, warmup=warmup, iters=iters)
    distlab.shutdown()
    return figure
