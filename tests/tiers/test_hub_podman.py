"""The class's JupyterHub with each learner's server in a container (``make hub SPAWNER=podman``:
docker/hub/spawners/podman.py, DockerSpawner against podman's Docker API).

One run, the hub started by ``make hub`` as in tests/tiers/test_hub.py, a learner logged in through the hub's
login form over HTTP (no browser: what JupyterLab shows is test_hub.py's). Asserted, each as a fact of the run:

* the learner's server is a container of the image distlab-hub-learner, made by the hub's own podman
  service, with the limits configured (memory and swap, processes, CPUs, no capabilities, no new privileges)
  and the host's network; its process runs as the learner's uid, in the container's cgroup, with umask 077
  (which the terminals and kernels it starts inherit);
* it answers through the hub's proxy, with the learner's login;
* inside it, as the learner's terminal would: the learner's home and the exchange are there, no other
  learner's home (the image's own, with the course's code, is), nor the hub's state (the podman socket);
  the cgroup's memory limit is the one configured; and nbgrader's fetch and submit work through the
  mounted exchange, the submission sealed by the hub's sealer as the learner's (its name checked against
  its owner);
* stopping the server removes its container, and stopping the hub leaves no container and no process.

Not tested here: the instructor's server in a container (the same hook with the course directory mounted),
and a grading inside the learner's container (the learner image's grading is tests/tiers/test_containers.py's).
Needs root, the hub installed (docker/hub/install.sh) and the image (``make images IMAGES="learner hub-learner"``);
skipped with the reason otherwise, failed instead under ``DISTLAB_REQUIRE_HUB=1``.
"""
from __future__ import annotations

import json
import pwd
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.helpers import hub as hubs
from tests.helpers.hub_http import HubUser
from tests.tiers.test_containers import why_not

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(400)]
IMAGE = "distlab-hub-learner"
ALICE = hubs.LEARNERS[0]
CONTAINER = f"distlab-hub-{ALICE}"


def podman(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=120)


def exec_as(uid: int, gid: int, script: str) -> subprocess.CompletedProcess:
    """``sh -c SCRIPT`` in the learner's container as the learner, with the container's environment (what a
    terminal of the learner's JupyterLab runs)."""
    return podman("exec", "--user", f"{uid}:{gid}", "--workdir", f"/home/{ALICE}", CONTAINER, "sh", "-c", script)


@pytest.fixture(scope="module")
def hub():
    hubs.require()
    why = why_not(IMAGE)
    if why:
        if __import__("os").environ.get("DISTLAB_REQUIRE_HUB") == "1":
            pytest.fail(f"DISTLAB_REQUIRE_HUB=1 but {why.replace('make images', 'make images IMAGES=hub-learner')}")
        pytest.skip(why)
    with hubs.class_hub(spawner="podman") as hub:
        yield hub


def test_a_learners_server_is_a_container_of_their_own_uid_with_the_limits(hub, leftover_processes):
    alice = HubUser(hub.base, ALICE, hub.passwords[ALICE])
    alice.log_in()
    assert alice.wait_ready(), f"{ALICE}'s server never became ready:\n{hubs.log_tail(hub.log)}"
    user = pwd.getpwnam(ALICE)

    inspected = podman("inspect", CONTAINER)
    assert inspected.returncode == 0, inspected.stderr
    (container,) = json.loads(inspected.stdout)
    host, config = container["HostConfig"], container["Config"]
    assert config["User"] == f"{user.pw_uid}:{user.pw_gid}"
    assert container["ImageName"].endswith(IMAGE) or IMAGE in config.get("Image", ""), container.get("ImageName")
    assert host["Memory"] == host["MemorySwap"] == 4 << 30 and host["PidsLimit"] == 2048
    assert host["NanoCpus"] == 2 * 10**9 or host["CpuQuota"] == 2 * host["CpuPeriod"], host
    assert host["NetworkMode"] == "host" and "no-new-privileges" in host["SecurityOpt"]
    assert len(host["CapDrop"]) > 10 and not host["CapAdd"], host["CapDrop"]
    mounted = {Path(b.split(":")[1]) for b in host["Binds"]}
    assert mounted == {Path(user.pw_dir), hub.exchange.parent, Path("/etc/passwd"), Path("/etc/group")}, mounted

    server = hub.server_pid(ALICE)  # found by the learner's user name, on this host
    assert container["Id"] in Path(f"/proc/{server}/cgroup").read_text()
    status = alice.get("api/status")
    assert status.status_code == 200, (status.url, [r.url for r in status.history], status.text[:800])

    umask = next(line.split()[1] for line in Path(f"/proc/{server}/status").read_text().splitlines()
                 if line.startswith("Umask:"))
    assert umask == "0077"  # docker/hub/singleuser.sh's: the terminals and kernels it starts inherit it

    # cgroup v2's file, or v1's (a hybrid host's)
    state = hub.env["DISTLAB_HUB_STATE"]
    inside = exec_as(user.pw_uid, user.pw_gid, f"id -un; echo $(ls /home); test -e {state} && echo state-visible; "
                     "cat /sys/fs/cgroup/memory.max 2>/dev/null || "
                     "cat /sys/fs/cgroup/memory/memory.limit_in_bytes")
    assert inside.returncode == 0, inside.stderr
    name, homes, *rest = inside.stdout.split("\n")
    assert name == ALICE, inside.stdout
    # the learner's home, and the image's own (its course code): no other learner's
    assert sorted(homes.split()) == sorted([ALICE, "learner"]) and "state-visible" not in rest, inside.stdout
    assert rest[0] == str(4 << 30), inside.stdout

    fetched = exec_as(user.pw_uid, user.pw_gid, "nbgrader fetch_assignment ex01_ddp --course distlab && "
                      "nbgrader submit ex01_ddp --course distlab")
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    assert hubs.poll(lambda: hub.sealed(ALICE, 1)), f"the submission was not sealed: {hub.submissions(ALICE)}"

    assert alice.stop_server() in (202, 204)
    assert hubs.poll(lambda: podman("container", "exists", CONTAINER).returncode == 1, timeout=60)
    assert not [p for p in psutil.process_iter(["username"]) if p.info["username"] == ALICE]
    hubs.stop(hub)
    assert podman("ps", "-a", "--filter", "name=distlab-hub-", "--format", "{{.Names}}").stdout.split() == []
    assert leftover_processes() == []
