"""A file's graded parts on one rank, each kept on disk as soon as it returns (``autograder.grader.parts`` reads
them back).

A part that ends its launch (gloo's SIGABRT on a message larger than its buffer, a hang, an error raised on
some ranks only) takes the rank's memory with it, and every part of every file observed so far with it. So
each part's observation is written the moment it is complete, and the file's end is marked: the grading
process grades what was kept, names the part that was running when the launch ended, and launches the file
again without it, so that a crash costs the marks of its own part and of no other.

A check's ``rank_main(paths, ..., outdir, skip)`` makes one :class:`Parts` per file and runs each part
through it::

    kept = Parts(outdir, i, skip)
    for name, observe in PARTS.items():
        if kept.starts(name):
            kept.keep(name, observe(...).to_wire())
    kept.finished()
    observed.append(kept.ran)
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

_SAVE = torch.save  # bound before any spy replaces it: the grader's files are not the learner's saves


def kept_path(outdir: str | Path, file: int, rank: int, part: str) -> Path:
    """Where rank ``rank`` keeps part ``part`` of the launch's file number ``file``."""
    return Path(outdir) / f"file{file}-rank{rank}-{part}.pt"


def started_path(outdir: str | Path, file: int, rank: int, part: str) -> Path:
    """The mark that rank ``rank`` began part ``part`` of the launch's file number ``file``."""
    return Path(outdir) / f"file{file}-rank{rank}-{part}.started"


def finished_path(outdir: str | Path, file: int, rank: int) -> Path:
    """The mark that rank ``rank`` got past the end of the launch's file number ``file``."""
    return Path(outdir) / f"file{file}-rank{rank}.finished"


class Parts:
    """The parts of one file on this rank: which to run (``skip``: the grading process's, per file number as a
    string), each one's observation kept (:meth:`keep`), and what ran in this launch (:attr:`ran`)."""

    def __init__(self, outdir: str | Path, file: int, skip: dict[str, list[str]] | None = None):
        self.outdir, self.file, self.rank = Path(outdir), file, int(os.environ.get("RANK", "0"))
        self.skip = set((skip or {}).get(str(file), ()))
        self.ran: dict[str, Any] = {}

    def starts(self, part: str) -> bool:
        """Whether ``part`` runs now, in this launch (not: an earlier one kept it, or it ended one); if it does,
        that is marked, so that a launch that ends before it is kept names it, and one that ends before any
        part began is the file's own failure (its import, its set-up)."""
        if part in self.skip:
            return False
        started_path(self.outdir, self.file, self.rank, part).touch()
        return True

    def keep(self, part: str, wire: Any) -> Any:
        """``part``'s observation, as plain data: kept on disk whole or not at all (a rank can die at any
        moment), and returned with the others at the end (:attr:`ran`). Returns ``wire``."""
        path = kept_path(self.outdir, self.file, self.rank, part)
        _SAVE(wire, path.with_suffix(".tmp"))
        path.with_suffix(".tmp").replace(path)
        self.ran[part] = wire
        return wire

    def finished(self) -> None:
        """The file is over on this rank: a launch that ends later ended in another file."""
        finished_path(self.outdir, self.file, self.rank).touch()
