"""Learners' servers in containers: DockerSpawner against podman's Docker-compatible API (``make hub SPAWNER=podman``).

docker/hub/jupyterhub_config.py runs this file and calls :func:`configure` after its own settings, which stay
as they are (PAM, the roles, the exchange and its sealer); only where a server runs changes. Each server is a
container of the image ``distlab-hub-learner`` (``make images IMAGES="learner hub-learner"``: the learner image
with the hub's pins, so ``jupyterhub-singleuser`` is the hub's version), started by podman as root and run as
the learner's own uid and gid, so that everything the exchange's design rests on holds unchanged: files keep
their owner's uid, umask 077 (docker/hub/singleuser.sh), the sealer recognises each submission's owner.

What a container holds: the image's course code and Python; the learner's home at its own path (and nothing
of any other home: a container cannot read what it does not mount); the exchange, at its own path; the course
directory for the instructor only; this machine's /etc/passwd and /etc/group read-only, so that the uid has
its name (nbgrader names a submission after it, and the sealer checks that name against the owner; podman's
own entry would be the bare number). Limits per server, each a setting: memory (swap included),
processes and threads (a grading's ranks are threads too), CPUs.

The API: ``podman system service`` on a socket in the hub's state folder (root's, 0700), a service the hub
starts and restarts like the sealer. No learner reaches that socket, which is root over the machine.

The network: the host's. The hub listens on 127.0.0.1 (docker/hub/jupyterhub_config.py), and a server must
reach the hub's API there, and the proxy must reach the server: in the host's network both hold with no
bridge, NAT or firewall rules (which this machine's podman may not be allowed to make). Each server
listens on 127.0.0.1 on a port of its own, chosen when it starts, behind the learner's token as a local
server is. A hub on several machines puts the servers on a podman network instead and sets
``JupyterHub.hub_connect_ip`` (DockerSpawner's ``network_name``); not run here.
"""
from __future__ import annotations

import os
import pwd
import resource
import shutil
import subprocess
from pathlib import Path

from dockerspawner import DockerSpawner
from jupyterhub.utils import random_port

IMAGE_CODE = Path("/home/learner/distlab")  # the course's code in the learner image (docker/learner.Dockerfile)
IMAGE_PYTHON = Path("/usr/local/python")  # its Python's prefix (docker/make-base.sh; python:3.11's is /usr/local)


class HostNetworkSpawner(DockerSpawner):
    """DockerSpawner in the host's network: a free port at each start, and the server found at 127.0.0.1
    (DockerSpawner's own lookup asks the engine for a published port, which a host-network container has not)."""

    async def start(self):
        self.port = random_port()
        return await super().start()

    async def get_ip_and_port(self):
        return "127.0.0.1", self.port


def _ulimits() -> list[dict]:
    """The hub's own hard limits as the container's: podman's defaults (nofile 1048576) are refused by a
    kernel or a sandbox whose hard limit is lower, and no container needs more than the hub was given."""
    nofile = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 1 << 20)
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 32768)
    return [{"Name": "nofile", "Soft": nofile, "Hard": nofile}, {"Name": "nproc", "Soft": nproc, "Hard": nproc}]


def configure(c, *, src, venv, state, course, exchange, max_kb, role_environment) -> None:
    env = os.environ.get
    socket = Path(state) / "podman.sock"
    engine, image = env("DISTLAB_HUB_PODMAN", "podman"), env("DISTLAB_HUB_IMAGE", "localhost/distlab-hub-learner")
    # said once, at the hub's start, rather than as a failed spawn at each learner's login
    if shutil.which(engine) is None:
        raise SystemExit(f"SPAWNER=podman: no {engine} on PATH (apt-get install podman)")
    if subprocess.run([engine, "image", "exists", image], timeout=120).returncode != 0:
        raise SystemExit(f"SPAWNER=podman: no image {image}: make images IMAGES=\"learner hub-learner\"")
    c.JupyterHub.services.append({
        "name": "podman-api",
        # --time=0: the service never exits for idleness; the hub ends it when it stops
        "command": [engine, "system", "service", "--time=0", f"unix://{socket}"],
    })
    c.JupyterHub.spawner_class = HostNetworkSpawner
    c.DockerSpawner.client_kwargs = {"base_url": f"unix://{socket}"}
    c.DockerSpawner.image = image
    c.DockerSpawner.pull_policy = "never"  # an image of this machine's (make images), never one from a registry
    c.DockerSpawner.network_name = "host"
    c.DockerSpawner.use_internal_ip = True  # no published port (a host-network container has none to publish)
    c.DockerSpawner.ip = "127.0.0.1"
    c.DockerSpawner.remove = True  # a stopped server leaves no container; a learner's files are in their home
    # the user name as it is (a local user's name fits a container's), not DockerSpawner's escaped one
    c.DockerSpawner.name_template = "distlab-hub-{raw_username}"
    c.DockerSpawner.mem_limit = env("DISTLAB_HUB_MEMORY", "4G")
    c.DockerSpawner.cpu_limit = float(env("DISTLAB_HUB_CPUS", "2"))
    # the hub's own start (umask 077) instead of the learner image's entrypoint, which starts a JupyterLab of
    # its own; env(1) as the entrypoint, because DockerSpawner passes the command as the container's CMD
    c.DockerSpawner.cmd = [str(IMAGE_CODE / "docker/hub/singleuser.sh")]
    c.DockerSpawner.extra_host_config = {
        "memswap_limit": env("DISTLAB_HUB_MEMORY", "4G"),  # the same as memory: no swap beyond it
        "pids_limit": int(env("DISTLAB_HUB_PIDS", "2048")),
        "cap_drop": ["ALL"],  # a learner's server needs none: it runs as the learner, on ports above 1024
        "security_opt": ["no-new-privileges"],
        "ulimits": _ulimits(),
    }

    def start_as_learner(spawner) -> None:
        """The role's settings, with the image's paths; then the learner's uid, home and mounts."""
        role_environment(spawner, code=IMAGE_CODE, python=IMAGE_PYTHON)
        user = pwd.getpwnam(spawner.user.name)
        spawner.environment.update({"HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name,
                                    "SHELL": "/bin/bash"})
        mounts = {user.pw_dir: {"bind": user.pw_dir, "mode": "rw"}, exchange: {"bind": exchange, "mode": "rw"},
                  "/etc/passwd": {"bind": "/etc/passwd", "mode": "ro"},
                  "/etc/group": {"bind": "/etc/group", "mode": "ro"}}
        if spawner.notebook_dir == course:  # the instructor's (role_environment): the course directory
            mounts[course] = {"bind": course, "mode": "rw"}
        spawner.volumes = mounts
        spawner.extra_create_kwargs = {"user": f"{user.pw_uid}:{user.pw_gid}", "working_dir": user.pw_dir,
                                       "entrypoint": ["/usr/bin/env"]}

    c.Spawner.pre_spawn_hook = start_as_learner
