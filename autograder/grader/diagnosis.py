"""Diagnosis: from what the ranks observed to the mistake that explains it, with numbers.

A failing criterion knows its *symptom* ("weights differ from one process trained on the same
batches"); the learner needs the *cause* ("each rank read 16 of its 32 samples per step"). A check
declares the likely causes of its failures next to its criteria, one function each, named where it
is defined::

    @mistake("forward called on model.module, bypassing DDP")
    def inner_forward(run: Run) -> str | None:
        n = run.ranks[0].inner_forwards
        if run.ranks[0].ddp_forwards == 0 and n:
            return f"all {n} forward passes called model.module(...): ... call model(...)"
        return None                                           # does not explain what was observed

and a criterion that fails asks :func:`diagnose` for the first cause that explains it, in the order
given (most specific first), before falling back on the symptom::

    return failed(diagnose([inner_forward, loss_scaled, ...], run) or f"weights differ ... {diff:.3g}")

A cause must *test* the observation, never guess: advice that names a step the learner did right
("wrap the model in DDP" when it was wrapped) is worse than the symptom alone.

Errors the learner's code raises for a known mistake ("unscale_() is being called after step()")
are translated the same way, by :class:`KnownError` patterns a check lists in ``KNOWN_ERRORS``
(``grader.main.explain`` consults them, and :data:`COMMON_ERRORS`, before showing the raw error).

Every check package's docstring carries a table "mistake -> message" listing its mistakes
(``tests/exercises/test_conformance.py`` holds the tables to the declared names).
"""
from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Optional, Sequence

Cause = Callable[..., Optional[str]]


# Every message a declared cause returned in this process: feedback that contains one names its cause, and
# ``divergence.annotate`` adds the first divergence from the reference only to feedback that names none.
NAMED: set[str] = set()
NAMED_BY: dict[str, str] = {}  # each such message -> the mistake that returned it
# ``make bench`` only (benchmarks/bench_causes.py): the mistakes whose tests answer None, "*" for every one,
# to measure what the general layer (trace, first divergence, errors at the learner's line) names without them;
# KEPT_VAR names those kept all the same (a criterion's own guards: ex06's "no figure returned" before a ratio).
DISABLED_VAR, KEPT_VAR = "DISTLAB_DISABLED_CAUSES", "DISTLAB_KEPT_CAUSES"


def disabled(name: str) -> bool:
    off = os.environ.get(DISABLED_VAR, "")
    return bool(off) and (off == "*" or name in off.split("|")) and name not in os.environ.get(KEPT_VAR, "").split("|")


def mistake(name: str) -> Callable[[Cause], Cause]:
    """Declare the decorated ``f(*subject) -> str | None`` the test for the mistake ``name``.

    It returns the learner-facing message (the cause, with the numbers that show it) when the
    observation is explained by this mistake, and ``None`` otherwise (the messages it returns are
    remembered in :data:`NAMED`).
    """
    def declare(fn: Cause) -> Cause:
        @functools.wraps(fn)
        def cause(*subject: Any, **kwargs: Any) -> str | None:
            if disabled(name):
                return None
            message = fn(*subject, **kwargs)
            if message:
                NAMED.add(str(message))
                NAMED_BY[str(message)] = name
            return message
        cause.mistake = name
        return cause
    return declare


def causes_named(feedback: str) -> set[str]:
    """The declared mistakes whose messages ``feedback`` contains."""
    return {name for message, name in NAMED_BY.items() if message in feedback}


def named(feedback: str) -> bool:
    """Whether ``feedback`` contains the message of a declared cause or of a known error."""
    return any(m in feedback for m in NAMED) or any(f"{e.mistake}: " in feedback for e in COMMON_ERRORS)


def diagnose(causes: Sequence[Cause], *subject: Any) -> str | None:
    """The message of the first of ``causes`` that explains ``subject``, or ``None``."""
    for cause in causes:
        message = cause(*subject)
        if message:
            return message
    return None


def declared_mistakes(check: ModuleType) -> list[str]:
    """The names of the mistakes a check package declares: the ``@mistake`` functions of it and of
    its modules (``causes``, and any other its ``__init__`` imported), and its ``KNOWN_ERRORS``."""
    modules = [check] + [m for m in vars(check).values()
                         if isinstance(m, ModuleType) and m.__name__.startswith(f"{check.__name__}.")]
    names = [fn.mistake for module in modules for fn in vars(module).values()
             if callable(fn) and hasattr(fn, "mistake")]
    return list(dict.fromkeys(names)) + [known.mistake for known in getattr(check, "KNOWN_ERRORS", ())]


@dataclass(frozen=True)
class KnownError:
    """An error PyTorch raises for a known mistake: ``pattern`` (a regex) on ``"Type: message"``."""

    mistake: str
    pattern: str
    message: str

    def matches(self, error: str) -> bool:
        return re.search(self.pattern, error, flags=re.S) is not None


# Errors any exercise can raise, whatever its check.
COMMON_ERRORS = (
    KnownError("a collective called on some ranks only",
               r"Timed out waiting \d+ms for (recv|send)|Connection closed by peer|Socket Timeout",
               "a collective (all_reduce, barrier, a state-dict or checkpoint call) ran on some ranks but "
               "not the others, so they waited for a partner that never came: every rank must make the "
               "same collective calls in the same order (do not put them under `if rank == 0:`)"),
    KnownError("a graded function renamed or missing",
               r"AttributeError: module 'learner_ex\d+_\w+' has no attribute '\w+'",  # rank.load_learner's name
               "the grader imports your file and calls the functions of the stub by their names: keep "
               "every function the stub defines, with its name and arguments (the name it looked for is "
               "in the error below)"),
    KnownError("a tensor or model moved to a GPU index on a machine without GPUs",
               r"Cannot access accelerator device when none is available|Torch not compiled with CUDA enabled|"
               r"Found no NVIDIA driver|No CUDA GPUs are available",
               "`.to(rank)` (or `.cuda()`, `device=rank`) asks for GPU number `rank`, and this machine has none: "
               "the ranks run gloo on the CPU here. Move things to this rank's device instead, "
               "`distlab.device()` (`cuda:LOCAL_RANK` under NCCL, the CPU under gloo), so the same code runs "
               "on both"),
    KnownError("default process group used before init_process_group",
               r"Default process group has not been initialized",
               "a torch.distributed call ran before init_process_group(): set up the process group "
               "first (setup()), then wrap, shard or communicate"),
)


def translate(error: str, known: Sequence[KnownError] = ()) -> str | None:
    """The message of the first known mistake (the check's, then the common ones) ``error`` shows."""
    for entry in (*known, *COMMON_ERRORS):
        if entry.matches(error):
            NAMED.add(message := f"{entry.mistake}: {entry.message}")
            return message
    return None
