"""Progress of a grading, from the grading subprocess to whoever waits for it.

Grading one exercise takes 10-60 s, most of it in torchrun launches. The grading subprocess
(``grader.main``) announces each launch or scenario as it starts and ends, one line on its stdout
with :data:`PREFIX`; the runner passes those lines (and only those: the ranks' own output never
reaches that stdout) to an ``on_progress`` callback, which the notebook's ``check(N)`` prints in
the running cell and the CLI prints on stderr.

Kept free of torch: the CLI and ``check(N)`` import it.
"""
from __future__ import annotations

import contextlib
import sys
import time
from typing import Callable, Iterator, Optional

PREFIX = "[grading] "
Callback = Optional[Callable[[str], None]]


@contextlib.contextmanager
def step(what: str) -> Iterator[None]:
    """Announce ``what`` (a launch, a scenario) as it starts, and how it ended with its seconds."""
    start = time.monotonic()
    _say(f"{what} ...")
    try:
        yield
    except BaseException:
        _say(f"{what}: stopped after {time.monotonic() - start:.0f} s")
        raise
    _say(f"{what}: done in {time.monotonic() - start:.0f} s")


def _say(text: str) -> None:
    # One write per line: a check's launches run in threads (exercise 1's two world sizes at once),
    # and print() writes the text and its newline separately, so two lines could interleave.
    sys.stdout.write(f"{PREFIX}{text}\n")
    sys.stdout.flush()


def relay(on_progress: Callback) -> Callback:
    """An ``on_line`` callback for the grading subprocess's output that passes progress lines on."""
    if on_progress is None:
        return None

    def on_line(line: str) -> None:
        if line.startswith(PREFIX):
            on_progress(line[len(PREFIX):])
    return on_line


def to_stderr(text: str) -> None:
    print(f"  {text}", file=sys.stderr, flush=True)
