"""The first process of a warm job: torchrun's agent (the same engine, the same arguments, forked
ranks), or ``python -m MODULE`` (a grading process).

:func:`run` executes in a process forked from :mod:`distlab.runtime.forkserver` (torch
already imported). It becomes the job's process (its environment, folder,
output and, in the sandbox, the learner user with the learner's rlimits and no
new privileges) and then does what ``python -m torch.distributed.run ARGV``
does: ``config_from_args`` of the same arguments and ``elastic_launch``. Only
two things differ, both torchrun options: ``--start-method=fork`` (the ranks
are forks of this warm process, not new interpreters) and a function entry
point, :func:`distlab.runtime.worker.entry`, where the CLI would run
``python -m distlab.runtime.worker SPEC``. The rendezvous (c10d on ``localhost:0`` for
``--standalone``), the environment every rank sees (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``TORCHELASTIC_*``), the
restarts and the failure summary are torchrun's own.

:func:`run_module` is ``python -m MODULE ARGS`` in the same warm process: the grader's
per-exercise grading process (``autograder.grader.main``), which would otherwise spend
seconds importing torch before its first launch. It runs as the server's user, as the
subprocess it replaces would, and never runs a learner's code (only its ranks do).
"""
from __future__ import annotations

import atexit
import io
import json
import os
import runpy
import signal
import sys
import tempfile
import traceback
import uuid

from distlab.runtime import reaper


def _fresh_stdio() -> None:
    """Text streams on descriptors 1 and 2 (the job's output pipe), unbuffered as ``python -u``."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        stream = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", line_buffering=True, write_through=True)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def become_job(request: dict) -> None:
    """This process as a fresh interpreter started for the job would be: environment, folder, import
    path, and (as root, in the sandbox) the learner user under the learner's rlimits."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    tempfile.tempdir = None  # read TMPDIR again: the job's own temp folder
    # python -m puts the working folder first, then PYTHONPATH.
    front = [request["cwd"], *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    sys.path[:] = front + [p for p in sys.path if p not in front]
    _fresh_stdio()
    reaper.become(request.get("user"), {int(k): v for k, v in request.get("rlimits", {}).items()})
    import torch.distributed

    # torch.distributed reads TORCH_DISTRIBUTED_DEBUG when it is imported: read the job's.
    torch.distributed.set_debug_level_from_env()


def launch_config(argv: list[str]):
    """torchrun's ``LaunchConfig`` for ``argv`` (the CLI's arguments), with forked ranks.

    ``--standalone`` is expanded as :func:`torch.distributed.run.run` expands it.
    """
    from torch.distributed.run import config_from_args, parse_args

    args = parse_args([*argv, "--start-method=fork", "distlab-worker"])
    if args.standalone:
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    config, _, _ = config_from_args(args)
    return config


def record_exits(outdir: str) -> None:
    """Write each rank's exit code when torchrun closes a failed attempt: ``exits-<pid>-<attempt>-<n>.json``
    (``attempt``: its ``TORCHELASTIC_RESTART_COUNT``; ``n``: the agent's n-th close, as it may close one twice).

    torchrun's summary for function entry points names only the first failure it noticed, and with
    two ranks down in one poll (one killed, its peer then losing the connection) that may be the
    peer. Before torchrun signals the survivors, every rank that has already exited has its code:
    the launcher then names a rank killed by a signal (:func:`distlab.runtime.failures.failure`), as it does
    from the CLI's summary of every failed process.
    """
    from torch.distributed.elastic.multiprocessing.api import MultiprocessContext

    original, attempts = MultiprocessContext.close, []

    def close(self, *args, **kwargs):
        exits = {int(self.envs[i].get("RANK", i)): p.exitcode
                 for i, p in enumerate(getattr(self._pc, "processes", None) or [])}
        attempts.append(1)
        attempt = int(self.envs[0].get("TORCHELASTIC_RESTART_COUNT", 0)) if self.envs else 0
        path = os.path.join(outdir, f"exits-{os.getpid()}-{attempt}-{len(attempts)}.json")
        with open(path, "w") as f:
            json.dump({str(r): c for r, c in exits.items() if c is not None}, f)
        return original(self, *args, **kwargs)

    MultiprocessContext.close = close


def no_join_skew() -> None:
    """No random sleep before the first rendezvous round. torchrun's c10d rendezvous sleeps 0 to 0.3 s there
    so that many nodes' agents do not reach the store at once; a one-node job has one agent, and paid it
    (0.15 s on average) at every launch, about a third of a trivial warm 2-rank launch. Its fixed delays
    (polling a rendezvous still filling) are kept. Only this agent's process is patched: it runs one job."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    original = dynamic_rendezvous._delay

    def delay(seconds: float | tuple[float, float]) -> None:
        if not isinstance(seconds, tuple):  # the skew is its one randomised delay
            original(seconds)

    dynamic_rendezvous._delay = delay


def cheap_event_names() -> None:
    """The rendezvous's event names from the caller's frame. Each event it records (nine a launch, evaluated
    even where no handler keeps them) is named by ``get_method_name``, which calls ``inspect.stack()`` twice:
    that reads every frame's source file and searches ``sys.modules`` for each, which in a process that
    imported torch took most of the agent's time before its ranks started. The name is the same."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    def get_method_name(depth: int = 2) -> str:
        try:
            return sys._getframe(depth).f_code.co_name  # inspect.stack()[depth].function, without the sources
        except ValueError:
            return "no_method_name"

    dynamic_rendezvous.get_method_name = get_method_name


def run(request: dict) -> int:
    """The agent: torchrun's ``elastic_launch`` of :func:`distlab.runtime.worker.entry` on the request's spec.

    Exit 0 when every rank returned; 1 when a rank failed, after printing torchrun's failure
    summary (rank, exit code, signal) as the CLI does.
    """
    become_job(request)
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    from distlab.runtime.worker import entry

    record_exits(os.path.dirname(request["spec"]))
    try:
        config = launch_config(request["argv"])
        cheap_event_names()
        if config.max_nodes == 1:
            no_join_skew()
        elastic_launch(config, entrypoint=entry)(request["spec"])
    except ChildFailedError as exc:
        print(f"torch.distributed.elastic.multiprocessing.errors.ChildFailedError: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # the rendezvous, or torchrun's arguments
        print(f"distlab: torchrun's agent failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


def run_module(request: dict) -> int:
    """``python -m MODULE ARGS`` (the request's ``module`` and ``args``) in this process: its exit status.

    As the interpreter would: ``SystemExit``'s code, 1 with the traceback on stderr for any other
    exception, and the ``atexit`` handlers run before the job root's ``os._exit``.
    """
    become_job(request)
    sys.argv = [request["module"], *request.get("args", [])]
    code = 0
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException:  # noqa: BLE001 - what the interpreter prints, and its status
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    return code
