"""Grade one exercise and write its report as JSON: ``python -m autograder.grader.main N FILE OUT``.

The CLI runs this in a subprocess per exercise, with a time limit, so one
exercise that hangs or crashes the interpreter costs only its own marks.
The learner's code never runs in this process: only in the torchrun ranks
it launches. Verdicts are computed here from what the ranks returned.
"""
from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import Sequence

from distlab import LaunchError, LaunchHang, LaunchTimeout, MachineTooSlow, RankFailure
from distlab.runtime import costs
from distlab.runtime.failures import RankKilled
from distlab.runtime.process import PROGRESS_VAR, note_progress
from distlab.runtime.sandbox import SandboxError

from . import divergence
from .aborts import abort_details, rank_guard
from .diagnosis import KnownError, translate
from ..rank.errors import learner_frame, values_noted
from .registry import check_module


def explain(exc: LaunchError, path: Path, known: Sequence[KnownError] = ()) -> str:
    """One learner-facing paragraph for a launch that failed while grading the file at ``path``.

    An error that ``known`` (the check's ``KNOWN_ERRORS``) or the common ones recognise is named as
    its mistake first, with PyTorch's own words after it.
    """
    if isinstance(exc, RankFailure):
        where = str(learner_frame(exc.traceback, path) or "")  # "ex01_ddp.py line 42 in train_ddp: <code>"
        values = values_noted(exc.traceback)  # the tensors on that line (shapes, requires_grad, .grad)
        at = (f"\n  at {where}" if where else "") + (f"\n  with {values}" if values else "")
        raw = f"{exc.exc_type}: {exc.exc_message.strip()[:500]}"
        if exc.env_changed:
            from distlab.runtime.heartbeat import env_note

            return f"{env_note(exc.rank, exc.env_changed)}\n  (rank {exc.rank} raised {raw}){at}"
        if cause := translate(raw, known):
            return f"{cause}\n  (rank {exc.rank} raised {raw}){at}"
        if exc.exc_type == "NotImplementedError":
            return f"not implemented yet{(' (' + where + ')') if where else ''}"
        if exc.exc_type == "SystemExit":
            return (f"your code called sys.exit() on rank {exc.rank} ({exc.exc_message})" +
                    (f" at {where}" if where else "") + ": the grader imports your file and calls its "
                    "functions, so nothing was graded; remove the exit (and any code that runs at import "
                    "outside a function or an `if __name__ == '__main__':` block)")
        return f"your code raised on rank {exc.rank}: {raw}{at}"
    if isinstance(exc, RankKilled):  # no exception to show: what it printed, its line and gloo's sizes
        return f"{exc}{abort_details(exc.output, path)}"
    if isinstance(exc, LaunchHang):
        if not exc.collective:  # ranks waited for others that never came, in no collective
            return (f"{exc}. No rank was waiting in a collective: the ranks still in your code did not move from the "
                    "lines above while the others waited for them to finish")
        waits = re.finditer(rf"waits in \S+ at {re.escape(path.name)}:(\d+)", exc.where or "")
        guard = next((said for w in waits if (said := rank_guard(path.resolve(), int(w[1])))), "")
        return (f"{exc}. A collective that only some ranks reach, or that ranks reach in a different order, "
                f"waits forever.{guard}")
    if isinstance(exc, LaunchTimeout):
        if exc.where and " waits in " not in exc.where:  # no rank waited in a collective: some ran on, or returned
            still = "the code where each rank still in your code was" if " waited for the other ranks" in exc.where \
                else "the code where each was"
            return f"{exc}. No rank was waiting in a collective: {still} did not return in time."
        return f"{exc}. Look for a collective (all_reduce, barrier) that only some ranks reach."
    return str(exc)


def main(argv: list[str]) -> int:
    entered = time.time()
    number, path, out = int(argv[0]), Path(argv[1]), Path(argv[2])
    note_progress(os.environ.get(PROGRESS_VAR))  # started: the runner's limit counts from here as progress
    module = check_module(number)
    ready = costs.process_account(entered)  # the check's imports, for make bench's breakdown
    ex = module.EXERCISE
    try:
        # with the first divergence where no cause is named, and which function (DISTLAB_LOCALISE=1)
        (report,) = divergence.grade(module, [path], localise=os.environ.get("DISTLAB_LOCALISE") == "1")
    except LaunchError as exc:
        report = ex.new_report().did_not_run(explain(exc, path, getattr(module, "KNOWN_ERRORS", ())))
    except MachineTooSlow as exc:  # slow is not wrong: the code is not scored
        report = ex.new_report().machine_too_slow(str(exc))
    except SandboxError as exc:  # the grading machine's set-up, not the learner's code
        report = ex.new_report().did_not_run(f"the grader is not set up: {exc}")
    out.write_text(__import__("json").dumps(report.to_dict()))
    costs.write_account(entered, ready)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
