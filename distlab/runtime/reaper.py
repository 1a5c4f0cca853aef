"""Run one command and leave nothing of it alive: ``python reaper.py [OPTIONS] -- CMD [ARGS...]``.

Every job that may run a learner's code (torchrun and its ranks, the grading
subprocess, a notebook kernel in the grading image) is started through this
small program. It

1. makes itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``, the
   mechanism of tini and systemd): a process that double-forks, calls
   ``setsid`` and ``execve``\\ s with an empty environment is still re-parented
   to us, not to init, so it cannot leave the tree;
2. with ``--user``, forks the command as that unprivileged user, with no new
   privileges and the given rlimits, while the reaper itself stays root, so
   the learner can neither kill it nor escape it;
3. when the command exits (or on SIGTERM, which is how a time limit ends a
   job), gives what is left a short grace period, then freezes every
   descendant with SIGSTOP (a stopped process cannot fork: a fork bomb
   converges) and SIGKILLs them, until none is left;
4. with ``--kill-user``, then ends every process of that user as well
   (``kill(-1)`` issued *as* the user), for the paths where learners' code ran
   outside our tree (a notebook kernel that jupyter killed outright);
5. exits with the command's status (128+N if signal N ended it).

It imports the standard library only and runs as ``python -I -S reaper.py``
(no site-packages, no environment), so it starts in milliseconds and works
from an interpreter the learner user could not otherwise use.

The shell scripts of the grading image call it through two subcommands, so which
flags they mean is written here, once (:data:`SUBCOMMANDS`):

* ``reaper.py as-learner USER -- CMD...`` (``docker/as-student.sh``): CMD as the
  learner ``USER`` with the sandbox's rlimits, then every process of ``USER`` ended;
* ``reaper.py end-user USER`` (``docker/grade.sh``, after a step): every process
  of ``USER`` ended, nothing run.
"""
from __future__ import annotations

import ctypes
import os
import pwd
import resource
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
RLIMITS = {name: getattr(resource, f"RLIMIT_{name}") for name in ("NPROC", "NOFILE", "CORE", "AS")}


def prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}): {os.strerror(err)}")


def _proc_table() -> dict[int, tuple[int, bytes]]:
    """``{pid: (ppid, state)}`` of every process, read from ``/proc``."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rindex(b")") + 2:].split()  # the command name may hold spaces and ')'
        table[int(entry)] = (int(fields[1]), fields[0])
    return table


def descendants(root: int) -> list[int]:
    """Every live (non-zombie) descendant of ``root``."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            stack.append(child)
            if table[child][1] != b"Z":
                found.append(child)
    return found


def _signal_all(pids, sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def reap() -> list[int]:
    """Collect every exited child (orphans re-parented to us included) so none stays a zombie; return their pids."""
    reaped = []
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append(pid)


def freeze_and_kill(list_pids, rounds: int = 100) -> int:
    """SIGSTOP everything ``list_pids()`` returns until no new process appears, then SIGKILL it all.

    Repeats until nothing is left (or ``rounds`` passes); returns how many were killed.
    """
    killed: set[int] = set()
    for _ in range(rounds):
        stopped: set[int] = set()
        while True:
            pids = set(list_pids())
            if pids <= stopped:
                break
            _signal_all(pids - stopped, signal.SIGSTOP)
            stopped |= pids
        if not stopped:
            break
        _signal_all(stopped, signal.SIGKILL)
        killed |= stopped
        time.sleep(0.01)
        reap()
    return len(killed)


def sweep(grace_s: float) -> list[str]:
    """End every descendant: SIGTERM, up to ``grace_s`` to exit, then freeze and kill."""
    me = os.getpid()
    left = descendants(me)
    names = [_name(p) for p in left]
    _signal_all(left, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while descendants(me) and time.monotonic() < deadline:
        time.sleep(0.02)
        reap()
    freeze_and_kill(lambda: descendants(me))
    reap()
    return names


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def kill_user(uid: int) -> None:
    """End every process of ``uid``: a child that becomes the user stops then kills them all."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.setgroups([])
            os.setgid(pwd.getpwuid(uid).pw_gid)
            os.setuid(uid)
            for _ in range(20):  # kill(-1) reaches every process we may signal, except ourselves
                for sig in (signal.SIGSTOP, signal.SIGKILL):
                    try:
                        os.kill(-1, sig)
                    except ProcessLookupError:
                        os._exit(0)
                time.sleep(0.01)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def become(user: str | None, rlimits: dict[int, int]) -> None:
    """In the forked child: the rlimits, then (as root) the user, then no new privileges."""
    for res, value in rlimits.items():
        resource.setrlimit(res, (value, value))
    if user is not None:
        entry = pwd.getpwnam(user)
        os.initgroups(user, entry.pw_gid)
        os.setgid(entry.pw_gid)
        os.setuid(entry.pw_uid)
        os.environ.update(USER=user, LOGNAME=user)
        os.environ["HOME"] = os.environ.get("DISTLAB_LEARNER_HOME") or os.environ.get("TMPDIR") or entry.pw_dir
        # Cleared by the change of credentials above, so set after it: if the reaper dies, so does the command.
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def _which(program: str) -> str:
    """``program``'s path, found on PATH now: after the switch of user, the reaper's own modules
    (``os.execvp`` imports ``warnings``) may sit where the learner user cannot read them."""
    if os.sep in program:
        return program
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(folder or ".", program)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return program


def start(cmd: list[str], user: str | None, rlimits: dict[int, int]) -> int:
    """Fork and exec ``cmd`` (as ``user``, under ``rlimits``); return its pid."""
    program = _which(cmd[0])
    pid = os.fork()
    if pid:
        return pid
    try:  # pragma: no cover - the child
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)  # SIG_IGN would survive exec
        become(user, rlimits)
        os.execv(program, cmd)
    except BaseException as exc:  # pragma: no cover - the child
        os.write(2, f"reaper: cannot start {cmd[0]}: {exc}\n".encode())
    os._exit(127)


class _Stop(Exception):
    """Raised by the SIGTERM/SIGHUP handler: end the job now."""


def _stop(signum, frame):
    raise _Stop(signum)


def _sandbox():
    """:mod:`distlab.runtime.sandbox`, loaded by path: importing the package would import torch."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_distlab_sandbox", os.path.join(os.path.dirname(
        os.path.abspath(__file__)), "sandbox.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse(argv: list[str]) -> tuple[dict, list[str]]:
    """``[--user U | --learner U] [--kill-user] [--grace S] [--rlimit NAME=N]... -- CMD...`` -> (options, CMD).

    ``--learner U`` is ``--user U`` with the sandbox's rlimits (:func:`distlab.runtime.sandbox.learner_rlimits`).
    """
    opts = {"user": None, "kill_user": False, "grace": 1.0, "rlimits": {}}
    args = list(argv)
    while args and args[0] != "--":
        flag = args.pop(0)
        if flag == "--kill-user":
            opts["kill_user"] = True
        elif flag in ("--user", "--learner", "--grace", "--rlimit") and args:
            value = args.pop(0)
            if flag in ("--user", "--learner"):
                opts["user"] = value
                if flag == "--learner":
                    opts["rlimits"].update(_sandbox().learner_rlimits())
            elif flag == "--grace":
                opts["grace"] = float(value)
            else:
                name, _, number = value.partition("=")
                opts["rlimits"][RLIMITS[name]] = int(number)
        else:
            raise SystemExit(f"reaper: bad option {flag!r}")
    if len(args) < 2:
        raise SystemExit("reaper: no command given (reaper.py [OPTIONS] -- CMD ...)")
    return opts, args[1:]


def _as_learner(args: list[str]) -> list[str]:
    """``as-learner USER -- CMD...``: ``--learner USER --kill-user -- CMD...``."""
    if len(args) < 3 or args[1] != "--":
        raise SystemExit("reaper: usage: reaper.py as-learner USER -- CMD ...")
    return ["--learner", args[0], "--kill-user", *args[1:]]


def _end_user(args: list[str]) -> list[str]:
    """``end-user USER``: ``--user USER --kill-user -- true`` (the reaper runs ``true`` as USER, then
    ends every process of USER)."""
    if len(args) != 1:
        raise SystemExit("reaper: usage: reaper.py end-user USER")
    return ["--user", args[0], "--kill-user", "--", "true"]


SUBCOMMANDS = {"as-learner": _as_learner, "end-user": _end_user}


def expand(argv: list[str]) -> list[str]:
    """``argv`` with a subcommand (:data:`SUBCOMMANDS`) replaced by the options it stands for."""
    if argv and argv[0] in SUBCOMMANDS:
        return SUBCOMMANDS[argv[0]](argv[1:])
    return list(argv)


def main(argv: list[str]) -> int:
    opts, cmd = parse(expand(argv))
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    # Interrupts go to the command's process group (a kernel's, a terminal's): ours to ignore.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGHUP, _stop)
    code, grace = None, opts["grace"]
    try:
        child = start(cmd, opts["user"], opts["rlimits"])
        while code is None:
            pid, status = os.waitpid(-1, 0)  # orphans re-parented to us are reaped here too
            if pid == child:
                code = os.waitstatus_to_exitcode(status)  # -N: ended by signal N
    except _Stop as stop:
        code, grace = -stop.args[0], 0.2
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    left = sweep(grace)
    if left:
        print(f"distlab: ended {len(left)} process(es) the job left running: {', '.join(sorted(set(left)))}",
              file=sys.stderr, flush=True)
    if opts["kill_user"] and opts["user"]:
        kill_user(pwd.getpwnam(opts["user"]).pw_uid)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
