"""Launches of files whose graded parts are isolated: a crash in one part costs that part's marks alone.

Issue 37's rule: where an exercise grades several parts (GPipe and 1F1B, a ring's forward and backward), a
native abort, a hang or an error in one leaves the others graded exactly as they would be alone. The ranks
keep each part's observation on disk as it returns (:mod:`autograder.rank.parts`). When a launch ends early,
:func:`launch_parts` reads what every rank kept, names the part that was running (where a rank failed, the part
it began and did not keep; where all waited, the first a rank began and not all kept) in the learner's terms
(``grader.main.explain``), and launches that file again, and the files after it, without the parts already
kept and without that one. A part that needs the one that ended (a backward through the forward's output)
is not run either, and says so. A launch that ended in a file before any of its parts began (its import, its
set-up) or after all of them (a stub's ``NotImplementedError``) still ends the grading.

A launch that ran out of time while no rank advanced (``LaunchTimeout``: a loop that never returns) ends the
part that was running like a hang does. One whose ranks were still advancing is the machine's problem
(``MachineTooSlow``, not a ``LaunchError``), and ends the grading unscored, as it always did.
"""
from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from distlab import LaunchError, RankFailure
from distlab.runtime.failures import RankKilled
from distlab.runtime.process import Budget

from ..rank.parts import finished_path, kept_path, started_path
from .launches import launch_files


@dataclass
class Parted:
    """One file's parts at one world size: each rank's observation of each part (``None``: not observed), how
    each part that ended a launch ended, in the learner's terms (``ended``), and each part not run because a
    part it needs ended (``unrun``: part -> the part it needed)."""

    ranks: list[dict[str, Any]]
    ended: dict[str, str] = field(default_factory=dict)
    unrun: dict[str, str] = field(default_factory=dict)

    def part(self, name: str) -> list[Any] | None:
        """Every rank's observation of part ``name`` (rank order), or ``None`` where it ended a launch or did
        not run."""
        return None if name in self.ended or name in self.unrun else [r[name] for r in self.ranks]


def _kept(outdir: Path, file: int, rank: int, parts: Sequence[str]) -> dict[str, Any]:
    found = {p: kept_path(outdir, file, rank, p) for p in parts}
    return {p: torch.load(f, weights_only=True) for p, f in found.items() if f.is_file()}


def launch_parts(rank_main: Callable, paths: Sequence[str | Path], *, world: int, timeout: Budget,
                 parts: Sequence[str], args: tuple = (), known: Sequence = (),
                 needs: Mapping[str, Sequence[str]] | None = None,
                 scratch: str | Path | None = None) -> tuple[list[Parted], float | None]:
    """Every file's parts on ``world`` ranks, in as many launches as it takes: ``rank_main(paths, *args, outdir,
    skip)`` runs the parts of each file that ``skip`` (file number as a string -> part names) does not name,
    through :class:`autograder.rank.parts.Parts`, and returns per file ``{part: observation}``. ``known``: the
    check's ``KNOWN_ERRORS``, for the words of a part that ended a launch. ``needs``: part -> the parts it cannot
    run without (where one of those ends a launch, it is not run again). ``scratch``: an existing folder for the
    launches' ``outdir`` (``scratch/<launch>``), which the caller removes, where the files the ranks write there
    (an export) are read after the grading; by default a temporary folder, removed on return. Returns per file
    its :class:`Parted`, and the seconds of the launch when one launch did it all (else ``None``)."""
    from .main import explain

    kept: dict[int, list[dict]] = {i: [{} for _ in range(world)] for i in range(len(paths))}
    ended: dict[int, dict[str, str]] = {i: {} for i in range(len(paths))}
    unrun: dict[int, dict[str, str]] = {i: {} for i in range(len(paths))}
    todo, wall_s = list(range(len(paths))), None
    with contextlib.nullcontext(scratch) if scratch else tempfile.TemporaryDirectory(prefix="parts-") as tmp:
        for attempt in range(len(paths) * len(parts) + 1):  # each launch but the last ends a part of a file
            outdir = Path(tmp) / str(attempt)
            outdir.mkdir()  # here, before the launch hands the scratch space to the learner user
            skip = {str(j): sorted({*kept[i][0], *ended[i], *unrun[i]}) for j, i in enumerate(todo)
                    if kept[i][0] or ended[i]}
            try:
                got, wall_s = launch_files(rank_main, [paths[i] for i in todo], world=world, timeout=timeout,
                                           args=(*args, str(outdir), skip), untraced=[int(j) for j in skip])
            except LaunchError as err:
                todo, wall_s = _after(err, outdir, todo, world, parts, kept, ended,
                                      lambda i, e=err: explain(e, Path(paths[i]), known)), None
                _not_run(todo, parts, needs or {}, kept, ended, unrun, world)
                if todo:
                    continue
                break
            for i, ranks in zip(todo, got):
                for mine, ran in zip(kept[i], ranks):
                    mine.update(ran)
            wall_s = None if attempt else wall_s
            break
    return [Parted([{p: r.get(p) for p in parts} for r in kept[i]], ended[i], unrun[i])
            for i in range(len(paths))], wall_s


def _not_run(todo: list[int], parts: Sequence[str], needs: Mapping[str, Sequence[str]], kept: dict[int, list[dict]],
             ended: dict[int, dict[str, str]], unrun: dict[int, dict[str, str]], world: int) -> None:
    """In the files to launch again (``todo``), the parts not kept that need a part that ended, or one not run
    (in ``parts``' order, so that a need of a need counts), go in ``unrun``; a file left with nothing to run is
    taken out of ``todo``."""
    for i in list(todo):
        for part in parts:
            gone = [n for n in needs.get(part, ()) if n in ended[i] or n in unrun[i]]
            if gone and part not in ended[i] and not all(part in kept[i][r] for r in range(world)):
                unrun[i][part] = gone[0]
        if len({*kept[i][0], *ended[i], *unrun[i]}) == len(parts):
            todo.remove(i)


def _after(err: LaunchError, outdir: Path, todo: list[int], world: int, parts: Sequence[str],
           kept: dict[int, list[dict]], ended: dict[int, dict[str, str]], explain: Callable[[int], str]) -> list[int]:
    """A launch that ended early: what its ranks kept goes in ``kept``, the part that was running in
    ``ended``; returns the files to launch again (from the one it ended in), or raises ``err`` where nothing
    more can be graded."""
    for j, i in enumerate(todo):
        for rank in range(world):
            kept[i][rank].update(_kept(outdir, j, rank, parts))
        running = _running(err, outdir, j, world, parts, kept[i])
        everywhere = {p for p in parts if all(p in kept[i][r] for r in range(world))}
        for r in range(world):  # what one rank kept and another did not runs again
            kept[i][r] = {p: v for p, v in kept[i][r].items() if p in everywhere}
        if all(finished_path(outdir, j, r).exists() for r in range(world)):
            continue
        if running is None:  # before any part began (its import, its set-up), or after its parts: as always
            raise err
        ended[i][running] = explain(i)
        return todo[j:]  # this file again (unless nothing is left of it: _not_run), and those after it
    return []


def _running(err: LaunchError, outdir: Path, file: int, world: int, parts: Sequence[str],
             kept: list[dict]) -> str | None:
    """The part that was running when the launch ended in file ``file``: where one rank failed (it raised, a
    signal killed it), the part it began and did not keep; where all waited (a hang), the first part a rank
    began and not every rank kept. ``None``: the failing rank was in none (its import, its set-up)."""
    def began(rank: int, part: str) -> bool:
        return started_path(outdir, file, rank, part).exists()

    rank = err.rank if isinstance(err, (RankFailure, RankKilled)) else None
    if rank is not None and 0 <= rank < world:
        return next((p for p in parts if began(rank, p) and p not in kept[rank]), None)
    return next((p for p in parts if any(began(r, p) for r in range(world))
                 and not all(p in kept[r] for r in range(world))), None)


def report_ended(report, criteria: Sequence, fn: str, how: str, **names) -> None:
    """A part that ended its launch (``how``, in the learner's terms), on ``report``: its first criterion says
    how, in full; the others point to it. ``names`` fill the criteria's names (``world=2``)."""
    if not criteria:
        return
    report.check(criteria[0].rule.name.format(**names), criteria[0].rule.points, False, f"{fn} did not finish: {how}",
                 key=criteria[0].__name__)
    report_unrun(report, criteria[1:], fn, criteria[0].rule.name.format(**names), **names)


def report_unrun(report, criteria: Sequence, fn: str, said: str, **names) -> None:
    """Criteria not checked because ``fn`` did not finish, which the criterion named ``said`` tells in full."""
    for c in criteria:
        report.check(c.rule.name.format(**names), c.rule.points, False,
                     f"not checked: {fn} did not finish (see '{said}')", key=c.__name__)


def judge_parts(report, parts: dict[str, tuple[str, Sequence]], ended: dict[str, str], subject, *,
                unrun: Mapping[str, str] | None = None, default=None, **names) -> None:
    """Each part's criteria on ``subject`` (``parts``: part -> (the function it grades, its criteria), in the
    report's order), or, for a part that ended its launch (``ended``), how it ended (:func:`report_ended`), and
    for one not run because a part it needs ended (``unrun``: :attr:`Parted.unrun`), which part that was."""
    for part, (fn, criteria) in parts.items():
        if part in ended:
            report_ended(report, criteria, fn, ended[part], **names)
        elif part in (unrun or {}):
            needed_fn, needed = parts[unrun[part]]
            report_unrun(report, criteria, needed_fn, needed[0].rule.name.format(**names) if needed else "", **names)
        else:
            # ``subject`` may be per part (a dict), ``default`` for the parts it does not name
            report.judge(criteria, subject.get(part, default) if isinstance(subject, dict) else subject, **names)
