"""Exercise 1's ``evaluate_ddp``: every sample counted once despite the sampler's padding, against one process over
the whole evaluation set; and the model run without autograd (the contract's "do not train": a forward that
records a graph keeps what it saves for a backward that never comes). Each rank's forwards are counted by a
forward pre-hook on the model, with whether ``torch.is_grad_enabled()`` was true in each.
"""
from __future__ import annotations

from ...grader.diagnosis import diagnose
from ...grader.report import Verdict, criterion, failed, passed
from .causes import (eval_close, eval_drop_last, eval_mean_of_means, eval_not_reduced, eval_padding_counted,
                     eval_whole_set)
from .observations import EVEN, Run
from .probes import EVAL

EVALUATION = [eval_whole_set, eval_padding_counted, eval_drop_last, eval_not_reduced, eval_mean_of_means]


@criterion(f"[W={{world}}] evaluate_ddp counts each of {EVAL['n']} samples once despite the sampler's padding",
           points=2)
def evaluates_once(run: Run) -> Verdict:
    if errors := [(r.rank, r.eval_error) for r in run.ranks if r.eval_error]:
        return failed(f"evaluate_ddp raised on rank {errors[0][0]}: {errors[0][1]}")
    if bad := [r for r in run.ranks if r.eval is None]:
        return failed(f"evaluate_ddp returned {bad[0].eval_returned} on rank {bad[0].rank}, not a pair of "
                      "floats (loss, accuracy)")
    n, limit = EVAL["n"], -(-EVAL["n"] // run.world)
    ref = run.eval_candidates["reference"]
    measured = {f"W{run.world}_eval_loss": run.ranks[0].eval[0], f"W{run.world}_eval_reference_loss": ref[0]}
    if greedy := [r for r in run.ranks if len(r.eval_accessed) > limit]:
        return failed(diagnose([eval_whole_set], run) or f"rank {greedy[0].rank} read "
                      f"{len(greedy[0].eval_accessed)} samples, more than its shard of {limit}", **measured)
    if all(eval_close(r.eval, ref) for r in run.ranks):
        return _even(run) or passed(f"loss {ref[0]:.4f}, accuracy {ref[1]:.3f}, as one process", **measured)
    loss, acc = run.ranks[0].eval
    return failed(diagnose(EVALUATION, run) or f"rank 0 returned loss {loss:.5f}, accuracy {acc:.4f}; one process "
                  f"over the {n} samples has {ref[0]:.5f}, {ref[1]:.4f}", **measured)


def _even(run: Run) -> Verdict | None:
    """The second call, on the first ``EVEN`` digits, which the ranks divide: ``None`` where it is one process's."""
    ref = run.eval_even_reference
    bad = next((r for r in run.ranks if r.eval_even is None or not eval_close(r.eval_even, ref)), None)
    if bad is None:
        return None
    got = (f"returned loss {bad.eval_even[0]:.5f}, accuracy {bad.eval_even[1]:.4f}" if bad.eval_even
           else "returned no pair of floats, or raised")
    return failed(f"on the first {EVEN} samples, which {run.world} ranks divide ({EVEN // run.world} each), rank "
                  f"{bad.rank}'s evaluate_ddp {got}; one process has {ref[0]:.5f}, {ref[1]:.4f} (on the "
                  f"{EVAL['n']}-sample set it was right): where the ranks divide the set the sampler adds no repeats, "
                  "and every sample a rank reads counts")


@criterion("[W={world}] evaluate_ddp runs the model without autograd", points=1)
def evaluates_without_autograd(run: Run) -> Verdict:
    if errors := [(r.rank, r.eval_error) for r in run.ranks if r.eval_error]:
        return failed(f"not checked: evaluate_ddp raised on rank {errors[0][0]} (see "
                      f"'{evaluates_once.rule.name.format(world=run.world)}')")
    recorded = next((r for r in run.ranks if r.eval_recorded), None)
    if recorded is None:
        return passed(f"{sum(r.eval_forwards for r in run.ranks)} forwards, none recorded by autograd")
    return failed(f"rank {recorded.rank} ran {recorded.eval_recorded} of its {recorded.eval_forwards} forwards of the "
                  "model with autograd recording (torch.is_grad_enabled() was True): evaluation trains nothing, so "
                  "run it under torch.no_grad() or torch.inference_mode(); otherwise every batch's forward records a "
                  "graph and keeps the activations it saves, for a backward that never comes")
