"""The program torchrun starts on every rank: ``python -m distlab.runtime.worker SPEC``.

It loads the job spec written by :func:`distlab.runtime.launch.torchrun`, prefixes
everything this rank prints with ``[rankN]``, calls the target, and writes
what the target returned to ``result-<rank>.pt`` for the launching process (and what the
call cost, ``cost-<rank>.json``: :mod:`distlab.runtime.costs`).
If the target raises, it writes ``error-<rank>-<attempt>.json`` (exception
type, message, the last lines of the traceback, and when) so the launcher can
name the rank that failed first and why, instead of torchrun's wall of text.

Why prefix here rather than with torchrun's ``--tee``: ``--tee`` tails per-rank
log files on a polling thread, needs a log directory, and reorders lines
between ranks; writing the prefix in-process keeps each rank's lines whole and
in order, for scripts and functions alike.
"""
from __future__ import annotations

import atexit
import io
import json
import os
import pickle
import runpy
import sys
import time
import traceback
from pathlib import Path

from distlab.runtime import costs
from distlab.runtime.importing import resolve


class _Prefixed(io.TextIOBase):
    """A text stream that writes ``[rankN] `` before every line it forwards.

    It forwards whole lines only, each in one ``write`` to the pipe (atomic
    below 4 KiB), so the lines of different ranks never interleave mid-line;
    a trailing partial line waits for its newline or for :meth:`close_line`.
    """

    MAX_PARTIAL = 8192

    def __init__(self, inner, prefix: str):
        self._inner, self._prefix, self._partial = inner, prefix, ""

    def write(self, s: str) -> int:
        text = self._partial + s
        *whole, self._partial = text.split("\n")
        if len(self._partial) > self.MAX_PARTIAL:  # no newline in sight: forward it in pieces
            whole.append(self._partial)
            self._partial = ""
        if whole:
            self._inner.write("".join(f"{self._prefix}{line}\n" for line in whole))
            self._inner.flush()
        return len(s)

    def close_line(self) -> None:
        """Forward a trailing partial line (at exit)."""
        if self._partial:
            self.write("\n")

    def flush(self) -> None:
        self._inner.flush()

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self):
        return getattr(self._inner, "encoding", "utf-8")


def _changed_torchrun_vars() -> dict:
    """torchrun's variables the job set again (see :func:`distlab.runtime.heartbeat.changed_torchrun_vars`)."""
    heartbeat = sys.modules.get("distlab.runtime.heartbeat")
    return heartbeat.changed_torchrun_vars() if heartbeat else {}


def _write_error(outdir: Path, rank: int, attempt: int, exc: BaseException) -> None:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    record = {
        "env_changed": _changed_torchrun_vars(),
        "rank": rank,
        "attempt": attempt,
        "type": type(exc).__name__,
        "message": f"sys.exit({exc.code!r}) was called" if isinstance(exc, SystemExit) else str(exc),
        "traceback": "".join(tb)[-4000:],
        "time": time.time(),
    }
    tmp = outdir / f".error-{rank}-{attempt}.json.tmp"
    tmp.write_text(json.dumps(record))
    tmp.replace(outdir / f"error-{rank}-{attempt}.json")


def main(spec_path: str) -> int:
    spec = pickle.loads(Path(spec_path).read_bytes())
    outdir = Path(spec["outdir"])
    rank = int(os.environ.get("RANK", "0"))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    prefix = f"[rank{rank}] "
    sys.stdout = _Prefixed(sys.__stdout__, prefix)
    sys.stderr = _Prefixed(sys.__stderr__, prefix)
    atexit.register(sys.stdout.close_line)
    atexit.register(sys.stderr.close_line)
    for p in spec.get("sys_path", []):
        if p not in sys.path:
            sys.path.insert(0, p)
    if spec.get("heartbeat", True):
        from distlab.runtime import heartbeat

        heartbeat.start(outdir, rank)  # before the target is imported: the launcher tells slow from stuck
    started, cpu = time.time(), time.process_time()
    try:
        if spec["kind"] == "script":
            sys.argv = [spec["target"], *spec.get("argv", [])]
            # A script returns whatever it leaves in a global named ``result`` (None if none).
            result = runpy.run_path(spec["target"], run_name="__main__").get("result")
        else:
            result = resolve(spec["target"])(*spec["args"], **spec["kwargs"])
    except SystemExit as exc:
        # A script may end with sys.exit(0); a function that exits never returned its result.
        if spec["kind"] == "function":
            _write_error(outdir, rank, attempt, exc)
            print(f"SystemExit: sys.exit({exc.code!r}) was called inside {spec['target']}", file=sys.stderr)
            return 1
        if exc.code not in (None, 0):
            _write_error(outdir, rank, attempt, exc)
            raise
        result = None
    except BaseException as exc:
        _write_error(outdir, rank, attempt, exc)
        traceback.print_exc()
        sys.stdout.flush()
        return 1
    costs.write_rank_cost(outdir, rank, started, time.process_time() - cpu)
    import torch  # imported late: a script target may be about to measure import time

    tmp = outdir / f".result-{rank}.pt.tmp"
    try:
        torch.save(result, tmp)
        torch.load(tmp, weights_only=True)  # what the launcher will do: fail here, on this rank, by name
    except Exception as exc:
        err = TypeError(f"the function returned a {type(result).__name__} the launcher cannot load safely "
                        f"({type(exc).__name__}): return tensors, numbers, strings, lists or dicts of those")
        _write_error(outdir, rank, attempt, err)
        print(err, file=sys.stderr)
        return 1
    tmp.replace(outdir / f"result-{rank}.pt")
    return 0


def _exit_now(code: int) -> None:
    """Leave without running C++ static destructors.

    With gloo in torch 2.13 a rank sometimes aborted *after* its work was done
    and the process group destroyed ("terminate called without an active
    exception", SIGABRT, about 1 exit in 10 here): a background thread torn
    down during interpreter shutdown. Everything a rank owes its launcher is on
    disk by now, so flush the streams, run the atexit handlers, and exit
    without the destructors.
    """
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _fresh_signal_handlers() -> None:
    """SIGTERM, SIGHUP and SIGQUIT end the rank at once, and SIGINT raises KeyboardInterrupt, as in a new interpreter.

    The fork inherits its agent's handlers: torch elastic's ``_terminate_process_handler``, a Python
    handler, which runs only when the main thread is back in the interpreter. A rank blocked in C++
    (waiting on the store for a peer that died) then outlived its agent's SIGTERM by the agent's
    30 s grace before SIGKILL, at every elastic restart and every stop.
    """
    import signal

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def entry(spec_path: str) -> int:
    """The same program as a function: torchrun's entry point in a warm launch (:mod:`distlab.runtime.agent`).

    The rank is a fork of the warm server, not a new interpreter, so first it is made one as far as
    the job can tell: it dies with its agent (as a CLI rank dies with its pipe), reads
    ``OMP_NUM_THREADS`` as a new interpreter would, reseeds NumPy's global generator (Python's
    ``random`` reseeds itself after a fork), and has a new interpreter's signal handlers
    (:func:`_fresh_signal_handlers`). A rank that failed exits with its code here; one
    that succeeded runs its exit handlers and returns, so torchrun collects its return value.
    """
    from distlab.runtime import reaper

    reaper.prctl(reaper.PR_SET_PDEATHSIG, 9)
    _fresh_signal_handlers()
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        import torch

        torch.set_num_threads(max(1, int(os.environ["OMP_NUM_THREADS"])))
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    code = main(spec_path)
    if code:
        _exit_now(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    return 0


if __name__ == "__main__":
    _exit_now(main(sys.argv[1]))
