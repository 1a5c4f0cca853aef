"""A real two-node Slurm cluster on one host, on loopback only: for trying course/slurm/ by hand, for the
Slurm tier (tests/tiers/test_slurm_cluster.py) and for ``make bench``'s class row.

Debian's slurm-wlm and munge (``.ci/run`` installs them). One ``munged`` with a
key and socket of its own, one ``slurmctld`` and one ``slurmd -N NAME`` per node,
each daemon in the foreground (``-D``/``-F``) as a child of the caller, each on its
own port, everything (config, state, spool, logs, the GPU device nodes) in one
temp folder that :meth:`SlurmCluster.stop` removes. Nothing touches the machine's
own Slurm or munge (``/etc/slurm``, ``/run/munge``): clients find this cluster
through ``SLURM_CONF`` (:meth:`SlurmCluster.env`).

The two nodes are two names for this host, both resolving to a loopback address:
the host name and ``localhost`` (the batch script's rendezvous goes to the first
node *by name*, so a node name must resolve). ``SlurmdParameters=config_overrides``
lets each node claim the 16 CPUs the script asks for, whatever this host has;
``Gres=gpu:4`` per node, backed by character devices made with ``mknod`` (Slurm
drops a GPU without a device file), answers ``--gpus-per-node=4``: Slurm sets
``SLURM_GPUS_ON_NODE=4`` and the script starts 4 workers per node. Every daemon and
client binds to that loopback address (``CommunicationParameters=NoCtldInAddrAny,
NoInAddrAny``), not to all interfaces.

By hand (root, from the repository): ``.venv/bin/python -m distlab.runtime.slurm_cluster CMD...`` runs CMD
against a fresh cluster, with the interpreter's folder first on PATH, then stops it, e.g.
``.venv/bin/python -m distlab.runtime.slurm_cluster sbatch --wait --chdir=/tmp course/slurm/train.sbatch
"$PWD/tests/helpers/targets/slurm_train.py" /tmp``.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from .process import environ_of

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scontrol", "sinfo", "srun")
CPUS, GPUS = 16, 4  # what course/slurm/train.sbatch asks of each node
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
            "DEADLINE", "PREEMPTED"}


def node_names() -> list[str]:
    """This host's two node names: its host name, then ``localhost`` (in this order: listed first,
    ``NodeHostname=localhost`` is taken for the host name, and slurmctld refuses the duplicate)."""
    return list(dict.fromkeys([socket.gethostname(), "localhost"]))


def _loopback(name: str) -> str | None:
    try:
        addr = socket.gethostbyname(name)
    except OSError:
        return None
    return addr if addr.startswith("127.") else None


def missing() -> str | None:
    """Why a cluster cannot be started here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root (slurmd starts each job's processes as the job's user)"
    absent = [p for p in (*DAEMONS, *CLIENTS) if shutil.which(p, path=_path()) is None]
    if absent:
        return f"{', '.join(absent)} not found (apt-get install slurm-wlm munge)"
    names = node_names()
    if len(names) < 2:
        return "the host name is 'localhost': two node names are needed"
    addrs = {n: _loopback(n) for n in names}
    if None in addrs.values() or len(set(addrs.values())) != 1:
        return f"the node names must resolve to one loopback address: {addrs}"
    return None


def _path() -> str:
    return os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _jobs_of(conf: Path) -> list[psutil.Process]:
    """Every process of this cluster's jobs outside the daemons' trees: slurmd starts each job step's slurmstepd
    as a daemon of its own (its parent is init), and the step's processes under it; they carry the cluster's
    ``SLURM_CONF`` in their environment (read whole: slurmstepd's title hides it from psutil's reading)."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(OSError, psutil.Error):
            if environ_of(proc).get("SLURM_CONF") == str(conf):
                found += [proc, *proc.children(recursive=True)]
    return found


def _free_port(host: str, avoid: set[int]) -> int:
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in avoid:
            avoid.add(port)
            return port


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))  # the script's rendezvous store listens on every address
        except OSError:
            return False
    return True


class SlurmCluster:
    """``with SlurmCluster() as cluster: cluster.sbatch(...)``: started on entry, stopped on exit."""

    def __init__(self, timeout: float = 60.0):
        self.timeout = timeout * float(os.environ.get("DISTLAB_TIME_SCALE", "1") or 1)
        self.names = node_names()
        self.addr = _loopback(self.names[0]) or "127.0.0.1"
        self.root: Path | None = None
        self.procs: dict[str, subprocess.Popen] = {}

    # -- start and stop -------------------------------------------------------------------------
    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        why = missing()
        if why:
            raise RuntimeError(f"cannot start a Slurm cluster here: {why}")
        try:
            for attempt in range(3):  # a port taken between choosing it and the daemon's bind: new ports
                self._write_config()
                self._start_daemons()
                if self._wait_until_idle():
                    return
                self._stop_daemons()
            raise RuntimeError(f"the Slurm cluster did not come up:\n{self.logs()}")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """End every daemon (TERM, then KILL after a bound), then remove the folder."""
        self._stop_daemons()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def _stop_daemons(self) -> None:
        # A job still running (a test that failed before its job ended) lives in the slurmds' process trees
        # and under the slurmstepds they daemonized, which do not end it when their slurmd goes: collect
        # them first, end them last.
        jobs = [c for proc in self.procs.values() if proc.poll() is None
                for c in _descendants(proc.pid)]
        if self.root is not None:
            daemons = {proc.pid for proc in self.procs.values()}
            jobs += [p for p in _jobs_of(self.root / "slurm.conf") if p.pid not in daemons and p not in jobs]
        for name in reversed(list(self.procs)):  # slurmds, then slurmctld, then munged
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.timeout
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
            for stream in (proc.stdout,):
                if stream:
                    stream.close()
        for child in jobs:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        psutil.wait_procs(jobs, timeout=30)
        self.procs = {}

    # -- configuration --------------------------------------------------------------------------
    def _write_config(self) -> None:
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
        root = self.root = Path(tempfile.mkdtemp(prefix="distlab-slurm-"))
        root.chmod(0o755)  # munged wants its socket's folder searchable by every user
        for sub in ("munge", "state", "log", "dev", "jobs", *(f"spool/{n}" for n in self.names)):
            (root / sub).mkdir(parents=True, exist_ok=True)
        (root / "munge").chmod(0o755)
        key = root / "munge-key"
        key.mkdir(mode=0o700)
        (key / "munge.key").write_bytes(os.urandom(1024))
        (key / "munge.key").chmod(0o600)
        ports: set[int] = set()
        ctld, nodes = _free_port(self.addr, ports), {n: _free_port(self.addr, ports) for n in self.names}
        # The script's rendezvous port is 20000 + job id % 20000: start the job ids where it is free.
        first = next(j for j in range(1000 + os.getpid() % 9000, 20000) if _port_is_free(20000 + j))
        gres, node_lines = [], []
        for name, port in nodes.items():
            for i in range(GPUS):
                dev = root / "dev" / f"{name}-gpu{i}"
                os.mknod(dev, 0o600 | 0o020000, os.makedev(195, i))  # a character device, like /dev/nvidiaN
            gres.append(f"NodeName={name} Name=gpu File={root}/dev/{name}-gpu[0-{GPUS - 1}]")
            node_lines.append(f"NodeName={name} NodeAddr={self.addr} NodeHostname={name} Port={port} "
                              f"CPUs={CPUS} RealMemory=4000 Gres=gpu:{GPUS} State=UNKNOWN")
        conf = f"""\
ClusterName=distlabtest
SlurmctldHost={self.names[0]}({self.addr})
SlurmctldPort={ctld}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
FirstJobId={first}
KillWait=5
GresTypes=gpu
{chr(10).join(node_lines)}
PartitionName=debug Nodes={",".join(self.names)} Default=YES MaxTime=INFINITE State=UP
"""
        (root / "slurm.conf").write_text(conf)
        (root / "gres.conf").write_text("\n".join(gres) + "\n")

    def env(self, **extra: str) -> dict[str, str]:
        """The environment for Slurm's clients (and the jobs they submit) to use this cluster."""
        assert self.root is not None
        return {**os.environ, "PATH": _path(), "SLURM_CONF": str(self.root / "slurm.conf"), **extra}

    # -- daemons ----------------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> None:
        assert self.root is not None
        out = open(self.root / "log" / f"{name}.out", "wb")
        try:
            self.procs[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                                env=self.env(), start_new_session=True)
        finally:
            out.close()

    def _start_daemons(self) -> None:
        root = self.root
        assert root is not None
        self._spawn("munged", ["munged", "-F", f"--key-file={root}/munge-key/munge.key",
                               f"--socket={root}/munge/munge.socket", f"--pid-file={root}/munge/munged.pid",
                               f"--seed-file={root}/munge/munged.seed", f"--log-file={root}/log/munged.log"])
        if not self._poll(lambda: (root / "munge" / "munge.socket").exists() or self._dead()):
            return
        self._spawn("slurmctld", ["slurmctld", "-D", "-c"])
        for name in self.names:
            self._spawn(f"slurmd-{name}", ["slurmd", "-D", "-N", name])

    def _dead(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is not None]

    def _poll(self, condition, interval: float = 0.1):
        deadline = time.monotonic() + self.timeout
        while True:
            value = condition()
            if value or time.monotonic() >= deadline:
                return value
            time.sleep(interval)  # the polling interval, not a guess at how long the event takes

    def nodes(self) -> dict[str, str]:
        """``{node: state}`` as sinfo reports it (``idle``; ``idle*`` is not responding)."""
        done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=self.env(), capture_output=True,
                              text=True, timeout=30)
        return dict(line.split() for line in done.stdout.splitlines() if len(line.split()) == 2)

    def _wait_until_idle(self) -> bool:
        want = {n: "idle" for n in self.names}
        self._poll(lambda: self._dead() or self.nodes() == want)
        return not self._dead() and self.nodes() == want

    def pids(self) -> dict[str, int]:
        return {n: p.pid for n, p in self.procs.items() if p.poll() is None}

    def logs(self) -> str:
        if self.root is None:
            return ""
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted((self.root / "log").glob("*")))

    # -- jobs -------------------------------------------------------------------------------------
    def sbatch(self, *args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
        """Submit; return the job id."""
        done = subprocess.run(["sbatch", "--parsable", *args], cwd=cwd, env=env or self.env(), capture_output=True,
                              text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"sbatch failed: {done.stderr}\n{self.logs()}")
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (``JobState``, ``ExitCode``, ``NodeList``...)."""
        done = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=self.env(), capture_output=True,
                              text=True, timeout=30)
        fields = {}
        for word in done.stdout.split():
            key, _, value = word.partition("=")
            fields.setdefault(key, value)
        return fields

    def hostnames(self, nodelist: str) -> list[str]:
        done = subprocess.run(["scontrol", "show", "hostnames", nodelist], env=self.env(), capture_output=True,
                              text=True, timeout=30)
        return done.stdout.split()

    def wait(self, job_id: str, timeout: float) -> dict[str, str]:
        """Poll until the job has ended (or ``timeout`` s, times DISTLAB_TIME_SCALE); its last fields."""
        old, self.timeout = self.timeout, timeout * float(os.environ.get("DISTLAB_TIME_SCALE", "1") or 1)
        try:
            self._poll(lambda: self.job(job_id).get("JobState") in TERMINAL, interval=0.2)
        finally:
            self.timeout = old
        return self.job(job_id)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m distlab.runtime.slurm_cluster CMD [ARGS...]  (CMD runs with SLURM_CONF set)",
              file=sys.stderr)
        return 2
    why = missing()
    if why:
        print(f"distlab.runtime.slurm_cluster: {why}", file=sys.stderr)
        return 3
    with SlurmCluster() as cluster, contextlib.suppress(KeyboardInterrupt):
        print(f"cluster up: nodes {', '.join(cluster.names)}; SLURM_CONF={cluster.env()['SLURM_CONF']}", flush=True)
        # the interpreter's folder first on PATH, as with the venv activated: the job's srun finds torchrun
        path = f"{Path(sys.executable).parent}{os.pathsep}{cluster.env()['PATH']}"
        return subprocess.run(argv, env=cluster.env(PATH=path)).returncode
    return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
