"""Exercise 4's part 2, the loop's contract around the training: what ``train_step`` returns, and which rank prints.

``train_step`` returns the detached loss: a number for the caller, not a handle on the step's autograd graph.
``train_fsdp`` prints the last loss on rank 0 only: the log of W ranks is one line, not W (nanoGPT's
``master_process``). Both are judged from what every rank's ``train_fsdp`` printed (stdout and stderr) and the
loss its last ``train_step`` returned: a printed number that rounds to a rank's own last loss is that loss.
"""
from __future__ import annotations

import re

from ...grader.diagnosis import mistake
from ...grader.report import Verdict, failed, passed
from .observations import FsdpRank, Run

# a number with a fractional part, as print and f-strings write one ("2.2911", "2.29e+00", "tensor(2.2911)")
NUMBER = re.compile(r"[-+]?\d*\.(\d+)(?:[eE]([-+]?\d+))?")


def shows(line: str, value: float) -> bool:
    """Whether ``line`` holds a number that ``value`` rounds to, at the number's own precision."""
    for m in NUMBER.finditer(line):
        decimals = len(m.group(1)) - int(m.group(2) or 0)
        if abs(float(m.group(0)) - value) <= 0.5 * 10.0 ** -decimals * (1 + 1e-6) + 1e-12:
            return True
    return False


def _printed_loss(r: FsdpRank) -> list[str]:
    """The lines rank ``r``'s train_fsdp printed that show its own last loss."""
    return [ln for ln in r.printed if r.last_loss is not None and shows(ln, r.last_loss)]


@mistake("train_step returns the loss with its graph")
def loss_attached(run: Run) -> str | None:
    r = next((r for r in run.ranks if r.returned), None)
    if r is None or r.train_step_error:
        return None
    return (f"train_step returned {r.returned} on rank {r.rank}: its contract returns the detached loss "
            "(loss.detach()), a value for the caller rather than a handle on the step's autograd graph, which a caller "
            "that adds up the losses (total += loss) would chain from step to step")


@mistake("the last loss printed on every rank")
def printed_everywhere(run: Run) -> str | None:
    others = [(r, lines) for r in run.ranks[1:] if (lines := _printed_loss(r))]
    if not others:
        return None
    r, lines = others[0]
    ranks = [o.rank for o, _ in others]
    who = f"rank {r.rank} printed its" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))} printed their"
    return (f"{who} own last loss (rank {r.rank}: '{lines[-1].strip()[:80]}'): print it on rank 0 only "
            f"(if dist.get_rank() == 0), so that the {run.world} ranks log one line, not one each")


def rank0_silent(run: Run) -> str | None:
    r0 = run.ranks[0]
    if r0.last_loss is None or _printed_loss(r0):
        return None
    said = f"printed {len(r0.printed)} line(s), none showing it" if r0.printed else "printed nothing"
    return f"rank 0's train_fsdp {said}: it prints the last loss ({r0.last_loss:.4g}) there"


def loop_contract(run: Run) -> Verdict:
    """The verdict of ``train_fsdp``'s loop criterion."""
    if why := loss_attached(run) or printed_everywhere(run):
        return failed(why)
    if run.export_ended and rank0_silent(run):  # a print after the export may have been the last loss: unseen
        return failed("not checked: rank 0 had printed no loss when its export began, and the export did not finish "
                      f"(see '[W={run.world}] rank 0 exports the full state dict once')")
    if why := rank0_silent(run):
        return failed(why)
    last = run.ranks[0].last_loss
    if last is None:  # a detached tensor of more than one element: no one loss to look for in what was printed
        return failed("train_step returned a tensor of more than one element on rank 0: its contract returns the "
                      "step's loss, one number (the mean cross-entropy), detached")
    return passed(f"a detached loss from each step; rank 0 alone printed its last loss ({last:.4g})")
