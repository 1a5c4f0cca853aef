"""Seal each submission in nbgrader's exchange as soon as it is complete (the hub runs this as root).

nbgrader's own exchange does not keep learners apart. ``nbgrader submit`` leaves each submission folder
in ``<exchange>/<course>/inbound`` 0777 and its files 0644, owned by the learner; only a random suffix in
the folder's name hides it. A learner who has the path can read another's work and delete it, or
rename it (inbound has no sticky bit), and the owner can change it after the deadline. The learner also
names the folder (``--student`` and the clock are theirs): a folder can claim to be another learner's,
or be dated before the deadline. And nbgrader's size limit is checked by the learner's own process.

Why this and not a pluggable exchange: ngshare's nbgrader plugin (ngshare_exchange 0.5.3, its latest)
requires jupyter-core < 4.11.2, which JupyterLab 4 and the course's pins (jupyter_core 5) exclude, and
nbexchange is not on PyPI at all; both replace the exchange with a web service, which a hub whose
learners share one file system does not need. This keeps nbgrader's exchange and its lab extension as
they are, and fixes the permissions after each submit, where they are wrong. What is left: the moment
between nbgrader writing a submission and this service sealing it (at most ``--interval`` s), in which
a learner would need its name, which cannot be listed (inbound is 0733) and has 72 random bits.

Each complete entry of every course's inbound (nbgrader writes ``timestamp.txt`` and
``submission_secret.txt``, then makes the folder 0777, last) is

1. moved out of every learner's reach, into ``<exchange>/<course>/sealing/`` (root's, 0700);
2. checked: a name ``student+assignment+time+random``; the folder and everything in it owned by that
   student; only plain files and folders (no symbolic or hard links); at most ``--max-kb`` kB in all.
   One that fails is moved to ``<exchange>/<course>/rejected/`` and never collected;
3. sealed: every file the instructor's (the owner of inbound), 0600; every folder 0700;
4. dated by this machine: the latest change time (ctime) of anything in it, which its owner can move
   forward but never back, replaces the learner's clock in ``timestamp.txt`` and in the folder's name
   (nbgrader's collect and its late-submission check read both); and moved back into inbound.

inbound also gets the sticky bit. A signal stops the service between two scans, never halfway through
a submission; one found half sealed (the service was killed) is rejected, with that reason.
Each submission sealed or rejected is a JSON line in ``<exchange>/<course>/seal.log`` (the instructor's).
"""
from __future__ import annotations

import argparse
import json
import os
import pwd
import signal
import stat
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

FORMAT = "%Y-%m-%d %H:%M:%S.%f %Z"  # nbgrader's Exchange.timestamp_format, in UTC (its Exchange.timezone)


class Rejected(Exception):
    """The submission cannot be collected; the message says why (the learner's instructor reads it)."""


def stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime(FORMAT)


def complete(entry: Path, st: os.stat_result) -> bool:
    return stat.S_IMODE(st.st_mode) == 0o777 and all(
        (entry / name).is_file() for name in ("timestamp.txt", "submission_secret.txt"))


def check_tree(entry: Path, uid: int, max_bytes: int) -> float:
    """Check everything under the (locked) ``entry``; return the latest ctime in it."""
    latest, total = 0.0, 0
    for folder, dirs, files in os.walk(entry):
        for name in dirs + files:
            path = Path(folder) / name
            st = os.lstat(path)
            where = path.relative_to(entry)
            if st.st_uid != uid:
                raise Rejected(f"{where} belongs to {owner(st.st_uid)}, not to the learner")
            if stat.S_ISREG(st.st_mode):
                if st.st_nlink > 1:
                    raise Rejected(f"{where} is a hard link")
                total += st.st_size
            elif not stat.S_ISDIR(st.st_mode):
                raise Rejected(f"{where} is not a plain file or folder (a symbolic link?)")
            latest = max(latest, st.st_ctime)
    if total > max_bytes:
        raise Rejected(f"over the size limit: {total / 1000:.0f} kB, at most {max_bytes / 1000:.0f} kB")
    return latest


def owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def give(entry: Path, uid: int, gid: int) -> None:
    """Everything under ``entry`` to ``uid:gid``: files 0600, folders 0700 (links are not followed)."""
    for folder, dirs, files in os.walk(entry):
        for name in dirs + files:
            path = os.path.join(folder, name)
            os.chown(path, uid, gid, follow_symlinks=False)
            if not os.path.islink(path):
                os.chmod(path, 0o700 if os.path.isdir(path) else 0o600)


def write_private(path: Path, text: str, uid: int, gid: int) -> None:
    """Replace ``path`` (never through a link) with ``text``, owned by ``uid:gid``, 0600."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chown(path, uid, gid)


class Sealer:
    def __init__(self, exchange: Path, max_kb: int, grace_s: float):
        self.exchange, self.max_bytes, self.grace_s = exchange, max_kb * 1000, grace_s

    def scan(self) -> None:
        for course in sorted(p for p in self.exchange.iterdir() if (p / "inbound").is_dir()):
            inbound = course / "inbound"
            st = inbound.stat()
            if not st.st_mode & stat.S_ISVTX:  # no learner renames or deletes another's entry
                os.chmod(inbound, stat.S_IMODE(st.st_mode) | stat.S_ISVTX)
            staging = course / "sealing"  # root's alone: what is being sealed is out of every learner's reach
            staging.mkdir(mode=0o700, exist_ok=True)
            for entry in sorted(staging.iterdir()):  # left by a sealer that was killed while sealing it
                self.seal(course, entry, inbound, st.st_uid, st.st_gid)
            for entry in sorted(inbound.iterdir()):
                try:
                    est = os.lstat(entry)
                    if est.st_uid == st.st_uid:
                        continue  # sealed already (no learner can make an entry the instructor's)
                    if stat.S_ISDIR(est.st_mode) and not complete(entry, est):
                        if time.time() - est.st_ctime < self.grace_s:
                            continue  # nbgrader is still writing it
                    os.rename(entry, staging / entry.name)
                except FileNotFoundError:  # its owner removed it before it was sealed
                    continue
                self.seal(course, staging / entry.name, inbound, st.st_uid, st.st_gid)

    def seal(self, course: Path, entry: Path, inbound: Path, uid: int, gid: int) -> None:
        """Seal ``entry`` (in the staging folder) into ``inbound`` as ``uid:gid``'s, or reject it."""
        st = os.lstat(entry)
        record = {"course": course.name, "entry": entry.name}
        try:
            if not stat.S_ISDIR(st.st_mode):
                raise Rejected("not a folder")
            if st.st_uid == uid:
                raise Rejected("its sealing was interrupted (the sealer was killed): look at it, and move it "
                               "back into inbound by hand if it is whole")
            if not complete(entry, st):
                raise Rejected(f"incomplete after {self.grace_s:g} s (no timestamp.txt, or not made 0777)")
            parts = entry.name.split("+")
            if len(parts) not in (3, 4) or not all(parts):
                raise Rejected("the name is not student+assignment+time+random")
            student, assignment = parts[0], parts[1]
            record.update(student=student, assignment=assignment, learner_clock=parts[2])
            if owner(st.st_uid) != student:
                raise Rejected(f"claims to be {student}'s but was made by {owner(st.st_uid)}")
            received = check_tree(entry, st.st_uid, self.max_bytes) or st.st_ctime
            give(entry, uid, gid)
            os.chown(entry, uid, gid)
            os.chmod(entry, 0o700)
            write_private(entry / "timestamp.txt", stamp(received), uid, gid)
            name = "+".join([student, assignment, stamp(received), parts[3] if len(parts) == 4 else "sealed"])
            if (inbound / name).exists():
                raise Rejected(f"{name} exists already")
            os.rename(entry, inbound / name)
            record.update(action="sealed", received=stamp(received), name=name)
        except Rejected as why:
            record.update(action="rejected", reason=str(why))
            self.reject(course, entry, uid, gid)
        self.log(course, record, uid, gid)

    def reject(self, course: Path, entry: Path, uid: int, gid: int) -> None:
        rejected = course / "rejected"
        rejected.mkdir(mode=0o700, exist_ok=True)
        os.chown(rejected, uid, gid)
        target = rejected / f"{entry.name}.{time.time_ns()}"
        os.rename(entry, target)
        os.chown(target, uid, gid, follow_symlinks=False)
        if target.is_dir() and not target.is_symlink():
            give(target, uid, gid)
            os.chmod(target, 0o700)

    @staticmethod
    def log(course: Path, record: dict, uid: int, gid: int) -> None:
        line = json.dumps({"time": stamp(time.time()), **record})
        print(f"seal_exchange: {line}", flush=True)
        log = course / "seal.log"
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "a") as out:
            out.write(line + "\n")
        os.chown(log, uid, gid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="seal_exchange.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--exchange", default=os.environ.get("DISTLAB_EXCHANGE", "/srv/nbgrader/exchange"))
    parser.add_argument("--max-kb", type=int, default=int(os.environ.get("DISTLAB_HUB_MAX_SUBMISSION_KB", 5000)),
                        help="the most a submission may hold, in kB of 1000 bytes (nbgrader's max_dir_size unit)")
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between two scans")
    parser.add_argument("--grace", type=float, default=60.0,
                        help="seconds an incomplete submission may take before it is rejected")
    parser.add_argument("--once", action="store_true", help="one scan, then exit")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("seal_exchange.py: needs root (it gives each submission to the instructor)", file=sys.stderr)
        return 1
    # The hub stops a service with SIGINT, then SIGTERM: both end this one at once, even when it was started
    # from a shell that ignores SIGINT for its background jobs (inherited through the hub).
    # A signal is taken between two scans, never in the middle of sealing a submission.
    stopping = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.append(True))
    sealer = Sealer(Path(args.exchange), args.max_kb, args.grace)
    print(f"seal_exchange: watching {args.exchange} every {args.interval:g} s", flush=True)
    while not stopping:
        if Path(args.exchange).is_dir():
            try:
                sealer.scan()
            except OSError as exc:  # a course folder removed mid-scan, say: the next scan sees the new state
                print(f"seal_exchange: {exc}", flush=True)
        if args.once:
            break
        time.sleep(args.interval)  # a poll: inbound is written by learners' processes, not this one
    print("seal_exchange: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
