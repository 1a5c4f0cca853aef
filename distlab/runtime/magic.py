"""``%%torchrun``: run a notebook cell's code on several ranks.

    %load_ext distlab
    %%torchrun -n 2
    import torch.distributed as dist
    from distlab import init_distributed
    init_distributed()
    print("hello from", dist.get_rank())

The cell becomes a script run under :func:`distlab.torchrun`; its output is
shown live, one ``[rankN]`` prefix per line. With ``--result NAME``, whatever
each rank leaves in a global called ``result`` (tensors, numbers, lists,
dicts) comes back to the notebook as the list ``NAME``, in rank order. Names defined in the notebook
are *not* visible inside the cell: every rank is a fresh Python process,
which is exactly what torchrun gives you outside a notebook too.
"""
from __future__ import annotations

import argparse
import shlex
import tempfile
from pathlib import Path

from distlab.runtime.failures import LaunchError
from distlab.runtime.launch import torchrun


class TorchrunCellError(RuntimeError):
    """A ``%%torchrun`` cell's job failed; the message names the rank and its exception."""


def _parse(line: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="%%torchrun", add_help=False)
    parser.add_argument("-n", "--nproc-per-node", dest="n", type=int, default=2)
    parser.add_argument("-t", "--timeout", type=float, default=120.0)
    parser.add_argument("--max-restarts", type=int, default=0)
    parser.add_argument("--result", metavar="NAME", help="store the ranks' `result` globals in NAME")
    return parser.parse_args(shlex.split(line))


def torchrun_cell(line: str, cell: str, namespace: dict | None = None) -> None:
    """Body of ``%%torchrun [-n N] [-t SECONDS] [--max-restarts K] [--result NAME]``."""
    opts = _parse(line)
    with tempfile.TemporaryDirectory(prefix="distlab-cell-") as tmp:
        script = Path(tmp) / "cell.py"
        script.write_text(cell)
        try:
            run = torchrun(str(script), opts.n, timeout=opts.timeout,
                           max_restarts=opts.max_restarts, stream=True)
            if opts.result and namespace is not None:
                namespace[opts.result] = run.results
        except LaunchError as exc:
            # One clear line instead of a traceback into the launcher's internals; raising
            # stops "run all" here, as a failing cell should.
            raise TorchrunCellError(f"torchrun: {exc}") from None


def load_ipython_extension(ipython) -> None:
    def magic(line: str, cell: str) -> None:
        torchrun_cell(line, cell, ipython.user_ns)

    ipython.register_magic_function(magic, magic_kind="cell", magic_name="torchrun")
