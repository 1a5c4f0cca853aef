"""Crash-proof checkpoint directories: atomic commit, keep the last K, find the latest complete one.

Layout under a checkpoint root::

    root/step_00000010/        a committed checkpoint (DCP's .metadata + shards + extras)
    root/.tmp-step_00000015/   one being written: never loaded, removed by the next prune

A checkpoint is written into its ``.tmp-`` staging directory and becomes
visible only when rank 0 renames it to ``step_N`` after every rank finished
writing (``os.replace`` within one local POSIX file system is atomic; NFS,
Lustre and object stores promise less). The files are fsynced before the
rename and the root directory after it, so the commit is durable as well as
atomic. A crash at any moment therefore leaves either the old set of
checkpoints or the old set plus one complete new one, never a half-written
``step_N``. This is the write-then-rename pattern databases and torchtitan's
checkpointer use. ``dcp.save`` alone already ends with a collective after its
coordinator wrote ``.metadata`` (last), so a barrier is needed before the
commit only for files written after it.
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

METADATA = ".metadata"  # written last by torch.distributed.checkpoint.save, on the coordinator
_FINAL = re.compile(r"^step_(\d+)$")


def final_path(root: str | os.PathLike, step: int) -> Path:
    """Where the checkpoint of ``step`` lives once committed."""
    return Path(root) / f"step_{step:08d}"


def staging_path(root: str | os.PathLike, step: int) -> Path:
    """Where the checkpoint of ``step`` is written before it is committed."""
    return Path(root) / f".tmp-step_{step:08d}"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def commit(root: str | os.PathLike, step: int) -> Path:
    """Make the staged checkpoint of ``step`` visible, atomically. Call on ONE rank, once every rank's
    files are written (after ``dcp.save`` returns, or a barrier after files written later)."""
    staged, final = staging_path(root, step), final_path(root, step)
    if not staged.is_dir():  # never written, or removed since (prune removes every staging directory)
        raise FileNotFoundError(f"{staged} does not exist: nothing was staged for step {step}, or it was removed "
                                "before commit (prune removes staging directories: commit first, then prune)")
    if not (staged / METADATA).is_file():
        raise FileNotFoundError(f"{staged} has no {METADATA}: the write did not finish, not committing")
    if final.exists():  # a re-run of the same step after a crash: replace the old copy
        shutil.rmtree(final)
    for f in staged.iterdir():
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    os.replace(staged, final)
    _fsync_dir(Path(root))
    return final


def complete_checkpoints(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """``[(step, path)]`` of the committed checkpoints under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _FINAL.match(p.name)
        if m and p.is_dir() and (p / METADATA).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_complete(root: str | os.PathLike) -> tuple[int, Path] | None:
    """The newest committed checkpoint, or ``None`` when there is none yet."""
    found = complete_checkpoints(root)
    return found[-1] if found else None


def prune(root: str | os.PathLike, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` committed checkpoints and any stale staging directory.

    Call on one rank, after :func:`commit`, when no write is in flight.
    """
    if keep < 1:
        raise ValueError("keep at least one checkpoint")
    removed = [p for _, p in complete_checkpoints(root)[:-keep]]
    removed += [p for p in Path(root).glob(".tmp-step_*") if p.is_dir()]
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed


def size_bytes(path: str | os.PathLike) -> dict[str, int]:
    """Bytes per file in a checkpoint directory (``__0_0.distcp`` is rank 0's shard file)."""
    return {f.name: f.stat().st_size for f in sorted(Path(path).iterdir()) if f.is_file()}
