"""What a learner's module can do at import to escape, or to cheat, the grader; for the containment tests.

Each snippet is Python source put into a learner's file (after its imports).
It runs on rank 0 of every job that imports the file, and writes the pid of
each process it starts to ``<pid_dir>/<name>.<pid>`` so the test can check
that none of them survived the grading. A snippet that pushes against a
limit also records what it reached (:func:`recorded`), and every rank fails
only once it has: so the test knows the limit was reached, and no time is
spent after that.
"""
from __future__ import annotations

from pathlib import Path

import psutil

from tests.helpers import SOLUTIONS

_PRELUDE = '''
import os as _os, subprocess as _sp, sys as _sys
_PIDS = {pid_dir!r}
_FIRST_RANK = _os.environ.get("RANK") == "0"
def _note(name, pid):
    open(_os.path.join(_PIDS, f"{{name}}.{{pid}}"), "w").close()
_DAEMONIZER = (  # run in a fresh interpreter: forking a rank itself (torch's threads) can deadlock the child
    "import os, sys\\n"
    "if os.fork() == 0:\\n"
    "    os.setsid()\\n"
    "    pid = os.fork()\\n"
    "    if pid == 0:\\n"
    "        os.execve(sys.executable, [sys.executable, '-c', sys.argv[1]], {{}})\\n"
    "    open(os.path.join(sys.argv[2], f'daemon.{{pid}}'), 'w').close()\\n"
    "    os._exit(0)\\n"
    "os.wait()\\n")
def _daemonize(program):
    _sp.run([_sys.executable, "-c", _DAEMONIZER, program, _PIDS], check=True)
def _record(name, value=""):
    _tmp = _os.path.join(_PIDS, f".record-{{name}}.{{_os.getpid()}}")
    with open(_tmp, "w") as _f:
        _f.write(str(value))
    _os.replace(_tmp, _os.path.join(_PIDS, "record-" + name))
def _wait_for_record(name, timeout=120):
    import time as _time
    _end = _time.monotonic() + timeout
    while not _os.path.exists(_os.path.join(_PIDS, "record-" + name)) and _time.monotonic() < _end:
        _time.sleep(0.02)  # polling interval
'''

# A helper the learner starts and forgets: a new session, and our stdout pipe still open.
DETACHED = '''
if _FIRST_RANK:
    _p = _sp.Popen([_sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    _note("detached", _p.pid)
'''

# A real daemon: double fork, setsid, and execve with an empty environment (no job tag to find it by).
DAEMON = '''
if _FIRST_RANK:
    _daemonize("import time; time.sleep(600)")
'''

# A daemon that rewrites every grading report it can find into full marks, for a minute.
FAKE_REPORTS = '''
_FAKE = ("import json, os, time\\n"
         "fake = json.dumps({{'exercise': 1, 'name': 'ddp', 'max_score': 10, 'criteria': "
         "[{{'name': 'runs', 'points': 10, 'earned': 10, 'feedback': 'hacked'}}]}})\\n"
         "end = time.time() + 60\\n"
         "while time.time() < end:\\n"
         "    for root, dirs, files in os.walk('/tmp'):\\n"
         "        if root.count(os.sep) > 4: dirs[:] = []\\n"
         "        for f in files:\\n"
         "            if f.endswith('.json') and 'report' in f:\\n"
         "                try: open(os.path.join(root, f), 'w').write(fake)\\n"
         "                except OSError: pass\\n"
         "    time.sleep(0.02)\\n")
_daemonize(_FAKE)  # on every rank: the first rank to fail has started its daemon (torchrun then ends the others)
'''

EXIT_AT_IMPORT = '''
_sys.exit(0)
'''

BROKEN = '''
raise RuntimeError("this submission does not work")
'''


# Tries to write the gradebook, another learner's submission and the grader's code.
WRITER = '''
for _target in {targets!r}:
    try:
        with open(_target, "ab") as _f:
            _f.write(b"HACKED")
    except OSError:
        pass
raise RuntimeError("tried to write what is not mine")
'''

# Forks until the learner user's process limit, and keeps it there for a while. The first fork that
# fails records how many processes the user had then; every rank fails once that is recorded, so the
# grader ends the job while the bomb still holds the limit.
FORK_BOMB = '''
_BOMB = ("import os, sys, time\\n"
         "def mine():\\n"
         "    n = 0\\n"
         "    for p in os.listdir('/proc'):\\n"
         "        try:\\n"
         "            n += p.isdigit() and os.stat('/proc/' + p).st_uid == os.getuid()\\n"
         "        except OSError:\\n"
         "            pass\\n"
         "    return n\\n"
         "end, reached = time.time() + 30, os.path.join(sys.argv[1], 'record-forkbomb')\\n"
         "while time.time() < end:\\n"
         "    try:\\n"
         "        os.fork()\\n"
         "    except OSError:\\n"
         "        if not os.path.exists(reached):\\n"
         "            tmp = os.path.join(sys.argv[1], f'.forkbomb.{{os.getpid()}}')\\n"
         "            open(tmp, 'w').write(str(mine()))\\n"
         "            os.replace(tmp, reached)\\n"
         "        time.sleep(0.01)\\n")
if _FIRST_RANK:
    _sp.Popen([_sys.executable, "-c", _BOMB, _PIDS])
_wait_for_record("forkbomb")
raise RuntimeError("fork bomb")
'''

# Reserves memory until the address-space limit stops it, then records the address space it reached.
# The chunks are calloc'd and never written: reaching the limit is the point, not filling the machine.
MEMORY_BOMB = '''
if _FIRST_RANK:
    _hog = []
    try:
        while True:
            _hog.append(bytes(64 << 20))
    except MemoryError:
        _vm = next(l for l in open("/proc/self/status") if l.startswith("VmSize:"))
        _record("membomb", int(_vm.split()[1]) * 1024)
        _hog.clear()
        raise
'''

# 256 MiB on stdout in 64 KiB lines, on rank 0 of the 2-rank job: 16,384 pieces of the launcher's longest
# line (16 KiB), more than the 10,000 it keeps (distlab.runtime.process.Lines). The module fails on every rank once
# all of it is written, so all of it goes through the grader.
SPEW = '''
if _os.environ.get("WORLD_SIZE") == "2":
    if _FIRST_RANK:
        _line = "x" * 65535 + "\\n"
        for _ in range(4096):
            _sys.stdout.write(_line)
        _sys.stdout.flush()
        _record("spew", 4096 * 65536)
    _wait_for_record("spew")
raise RuntimeError("printed 256 MiB")
'''


def submission(folder: Path, pid_dir: Path, *snippets: str, filename: str = "ex01_ddp.py", **fields) -> Path:
    """The reference solution with ``snippets`` (formatted with ``fields``) run at import, written to
    ``folder/filename``."""
    text = (SOLUTIONS / filename).read_text()
    anchor = "\nimport torch\n"
    assert anchor in text, f"no '{anchor.strip()}' line in solutions/{filename}"
    code = _PRELUDE.format(pid_dir=str(pid_dir)) + "".join(s.format(**fields) for s in snippets)
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / filename
    out.write_text(text.replace(anchor, anchor + code, 1))
    return out


def started(pid_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """``{kind: [(pid, when noted), ...]}`` of the processes the snippets started."""
    found: dict[str, list[tuple[int, float]]] = {}
    for f in Path(pid_dir).iterdir():
        if f.name.startswith(("record-", ".")):  # what a snippet recorded (or is writing), not a pid
            continue
        kind, _, pid = f.name.partition(".")
        found.setdefault(kind, []).append((int(pid), f.stat().st_mtime))
    return found


def recorded(pid_dir: Path) -> dict[str, str]:
    """``{snippet: what it recorded}``: the limits the snippets reached (a fork failed; the address space
    in bytes when memory ran out; the bytes printed)."""
    return {f.name.removeprefix("record-"): f.read_text() for f in Path(pid_dir).glob("record-*")}


def alive(noted: list[tuple[int, float]]) -> list[int]:
    """The pids of ``noted`` still running (zombies count as ended; so does a later process that
    reuses a pid, told apart by its start time)."""
    out = []
    for pid, when in noted:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE and p.create_time() <= when + 1:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out
