"""The train.py that tests/tiers/test_slurm_cluster.py hands to course/slurm/train.sbatch.

Each rank joins the job the way the script's header says (``distlab.init_distributed()``),
all-reduces ``rank + 1`` and writes what it saw to ``OUTDIR/rank<N>.json``: the torchrun
variables, the Slurm node it ran on, its OMP_NUM_THREADS, the sum.
"""
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import distlab

KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
        "SLURMD_NODENAME", "SLURM_JOB_ID", "SLURM_PROCID", "OMP_NUM_THREADS")


def main(outdir: Path) -> None:
    distlab.init_distributed()
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    seen = {k: os.environ.get(k) for k in KEYS}
    seen.update(sum=t.item(), backend=dist.get_backend(), pid=os.getpid(), world=dist.get_world_size())
    distlab.shutdown()
    tmp = outdir / f".rank{seen['RANK']}.json"
    tmp.write_text(json.dumps(seen))
    tmp.rename(outdir / f"rank{seen['RANK']}.json")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
