"""A rank program with three graded parts, for ``autograder.grader.parts``' own tests.

Each path is a name, not a file: ``behaviour[path][part]`` says what a rank does in that part, ``"ok"`` (keep
its observation), ``"raise on 0"`` or ``"loop on 1"`` (on that rank only). The observation of a part is where
it ran: the launch's number (``outdir``'s name, one folder per launch) and how many files that launch had. A rank
that raises waits first until every rank kept the file's parts before that one: what the others had kept when the
launch ended is then the code's, not a race.
"""
from pathlib import Path

from autograder.rank.parts import Parts, kept_path

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
                _others_kept(outdir, i, PARTS[:PARTS.index(part)])
                raise ValueError(f"part {part} of {path} raised on rank {rank}")
            while what == f"loop on {rank}":  # never returns, never advances: a time-out, not a hang
                pass
            kept.keep(part, [int(Path(outdir).name), len(paths)])
        kept.finished()
        out.append(kept.ran)
    return out


def _others_kept(outdir: str, file: int, parts: tuple[str, ...], limit_s: float = 60.0) -> None:
    """Wait until every rank has kept ``parts`` of file ``file`` (the test asserts what a launch kept before a
    rank raised: which parts the others had kept when the launch was ended would otherwise be a race)."""
    import os
    import time

    world = int(os.environ["WORLD_SIZE"])
    deadline = time.monotonic() + limit_s
    while not all(kept_path(outdir, file, r, p).is_file() for r in range(world) for p in parts):
        if time.monotonic() > deadline:
            return
        time.sleep(0.01)
