"""distlab: the small runtime shared by the course notebooks, the solutions and the grader."""
from .distributed import backend, device, init_distributed, pick_backend, rank, shutdown, world_size
from .launch import LaunchError, LaunchTimeout, RankFailure, RunResult, torchrun


def load_ipython_extension(ipython):  # ``%load_ext distlab`` registers ``%%torchrun``
    from .magic import load_ipython_extension as load

    load(ipython)


__all__ = [
    "LaunchError", "LaunchTimeout", "RankFailure", "RunResult", "backend", "device",
    "init_distributed", "pick_backend", "rank", "shutdown", "torchrun", "world_size",
]
