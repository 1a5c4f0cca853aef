"""A rank program with three graded parts, for ``autograder.grader.parts``' own tests.

Each path is a name, not a file: ``behaviour[path][part]`` says what a rank does in that part, ``"ok"`` (keep
its observation), ``"raise on 0"`` or ``"loop on 1"`` (on that rank only). The observation of a part is where
it ran: the launch's number (``outdir``'s name, one folder per launch) and how many files that launch had.
"""
from pathlib import Path

from autograder.rank.parts import Parts

PARTS = ("a", "b", "c")


def parted_main(paths: list[str], behaviour: dict[str, dict[str, str]], outdir: str,
                skip: dict[str, list[str]]) -> list[dict]:
    rank = int(__import__("os").environ["RANK"])
    out = []
    for i, path in enumerate(paths):
        kept = Parts(outdir, i, skip)
        for part in PARTS:
            if not kept.starts(part):
                continue
            what = behaviour.get(path, {}).get(part, "ok")
            if what == f"raise on {rank}":
                raise ValueError(f"part {part} of {path} raised on rank {rank}")
            while what == f"loop on {rank}":  # never returns, never advances: a time-out, not a hang
                pass
            kept.keep(part, [int(Path(outdir).name), len(paths)])
        kept.finished()
        out.append(kept.ran)
    return out
