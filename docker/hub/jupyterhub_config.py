"""The class's JupyterHub: ``make hub`` (docker/hub/install.sh, then docker/hub/start.sh) runs it with this file.

One machine, one course, as nbgrader's "Using nbgrader with JupyterHub" deploys it:

* learners and the instructor are local users (docker/hub/add-users.sh), logged in with PAM, allowed by
  group: ``distlab-learners`` and ``distlab-instructors``;
* each one's server is a process of their own user (JupyterHub's LocalProcessSpawner), the course's
  JupyterLab from /opt/distlab-hub/venv with nbgrader's lab extensions, opening on their home:
  learners get the Assignments tab and not the instructor's tools (``jupyter/learner``); the
  instructor gets the formgrader, and JupyterLab on the course directory (its ``nbgrader_config.py``);
* the exchange is /srv/nbgrader/exchange, and ``seal_exchange.py``, a service the hub runs as root,
  makes each submission the instructor's as soon as it is complete (the module says why);
* grading runs outside the hub, as root, with learners' code as the sandbox's user (docker/hub/class.sh).

Every path and port is a setting (environment), so the tests run this same file with their own
(tests/tiers/test_hub.py): DISTLAB_HUB_PREFIX, DISTLAB_HUB_STATE, DISTLAB_HUB_COURSE, DISTLAB_EXCHANGE,
DISTLAB_HUB_IP and DISTLAB_HUB_PORT (where learners connect: 127.0.0.1:8000 by default; a class on a network
puts the hub behind HTTPS), DISTLAB_HUB_API_PORT (and DISTLAB_HUB_API_IP, below), DISTLAB_HUB_PROXY_API_PORT
(on 127.0.0.1 only),
DISTLAB_HUB_MAX_SUBMISSION_KB (the most a submission may hold), DISTLAB_HUB_SPAWNER (where servers run: below).
"""
import grp
import os
import pwd
import runpy
from pathlib import Path

c = get_config()  # noqa: F821  (JupyterHub provides it when it loads this file)
env = os.environ.get
prefix = Path(env("DISTLAB_HUB_PREFIX", "/opt/distlab-hub"))
state = Path(env("DISTLAB_HUB_STATE", "/srv/jupyterhub"))
course = env("DISTLAB_HUB_COURSE", "/srv/nbgrader/distlab")
exchange = env("DISTLAB_EXCHANGE", "/srv/nbgrader/exchange")
max_kb = env("DISTLAB_HUB_MAX_SUBMISSION_KB", "5000")
src = prefix / "src"  # the course's code as learners get it (install.sh copies it there, without solutions/)
venv = prefix / "venv"
LEARNERS, INSTRUCTORS = "distlab-learners", "distlab-instructors"

c.JupyterHub.bind_url = f"http://{env('DISTLAB_HUB_IP', '127.0.0.1')}:{env('DISTLAB_HUB_PORT', '8000')}"
# The hub itself (its API, which servers call): on 127.0.0.1, where local servers and containers in the host's
# network reach it. Servers on other hosts (Slurm nodes) need DISTLAB_HUB_API_IP, an address of this host that
# they reach, and that only the cluster's network reaches (plain HTTP); the servers are told to connect there.
api_url = f"http://{env('DISTLAB_HUB_API_IP', '127.0.0.1')}:{env('DISTLAB_HUB_API_PORT', '8081')}"
c.JupyterHub.hub_bind_url = c.JupyterHub.hub_connect_url = api_url
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{env('DISTLAB_HUB_PROXY_API_PORT', '8001')}"
c.ConfigurableHTTPProxy.command = [str(prefix / "node/node_modules/.bin/configurable-http-proxy")]
c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(state / "jupyterhub.pid")
c.ConfigurableHTTPProxy.pid_file = str(state / "jupyterhub-proxy.pid")
# Learners' servers end with the hub: a class's machine keeps no server of a learner who is not served.
c.JupyterHub.cleanup_servers = True

# PAM, with real local users; no session opened (JupyterHub's default), so no systemd-logind is needed.
c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.allowed_groups = {LEARNERS, INSTRUCTORS}
# Nobody is an admin: JupyterHub's admins may reach every learner's server, which no one in a class should.
c.Authenticator.admin_users = set()

# Where learners' servers run (DISTLAB_HUB_SPAWNER): "local" (here), processes of their own users, nbgrader's
# one-server deployment; "podman", a container each (docker/hub/spawners/podman.py); "slurm", a Slurm job each
# (docker/hub/spawners/slurm.py). Each of the other two changes only what it says, after this file's settings.
SPAWNERS = ("local", "podman", "slurm")
spawner = env("DISTLAB_HUB_SPAWNER", "local")
if spawner not in SPAWNERS:
    raise SystemExit(f"DISTLAB_HUB_SPAWNER={spawner!r}: it is one of {', '.join(SPAWNERS)}")
c.JupyterHub.spawner_class = "localprocess"
# singleuser.sh: umask 077 (nothing a learner writes is readable by others), then jupyterhub-singleuser.
c.Spawner.cmd = [str(src / "docker/hub/singleuser.sh")]
c.Spawner.notebook_dir = "~"
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 120  # a cold start on a busy 2-core machine: a Python, JupyterLab and nbgrader
c.Spawner.http_timeout = 120
# Of the hub's environment, only these reach a server (the hub runs as root: its PYTHONPATH and the like must
# not); DISTLAB_TIME_SCALE gives every grading limit more time on a busy machine (README, Troubleshooting).
c.Spawner.env_keep = ["LANG", "LC_ALL", "DISTLAB_TIME_SCALE"]


def in_group(name: str, group: str) -> bool:
    try:
        return grp.getgrnam(group).gr_gid in os.getgrouplist(name, pwd.getpwnam(name).pw_gid)
    except KeyError:
        return False


def role_environment(spawner, code: Path = src, python: Path = venv) -> None:
    """The role's JupyterLab configuration (as ``make lab ROLE=...``; jupyter/README.md), and the exchange.
    ``code`` and ``python``: where the server finds the course's code and its Python (a container's differ)."""
    name = spawner.user.name
    if in_group(name, INSTRUCTORS):
        # the course's nbgrader_config.py (the formgrader finds the course), the hub's additions for the instructor
        config = [course, code / "docker/hub/instructor", code / "jupyter/common"]
        # nbgrader's formgrader refuses a course directory outside the server's root ("not a subdirectory of
        # the notebook server root"): the instructor's JupyterLab opens on the course directory itself
        spawner.notebook_dir = course
    else:
        config = [code / "docker/hub/learner", code / "jupyter/learner", code / "jupyter/common"]
    spawner.environment.update({
        "JUPYTER_CONFIG_PATH": os.pathsep.join(map(str, config)),
        "DISTLAB_EXCHANGE": exchange,
        "DISTLAB_HUB_MAX_SUBMISSION_KB": max_kb,
        # the course's Python first: the terminal's python, nbgrader and torchrun are the course's
        "PATH": os.pathsep.join([str(python / "bin"), "/usr/local/bin", "/usr/bin", "/bin"]),
        "DISTLAB_HUB_VENV": str(python),
    })


c.Spawner.pre_spawn_hook = role_environment

# The sealer of the exchange, a managed service: the hub starts it as root and restarts it if it dies.
c.JupyterHub.services = [{
    "name": "exchange-sealer",
    "command": [str(venv / "bin/python"), str(src / "docker/hub/seal_exchange.py"),
                "--exchange", exchange, "--max-kb", max_kb],
}]

if spawner != "local":
    # run_path, not import: docker/hub is no package (a package named docker would hide docker-py, the SDK
    # DockerSpawner imports); each module's configure() receives what it needs of this file.
    configure = runpy.run_path(str(src / "docker/hub/spawners" / f"{spawner}.py"))["configure"]
    configure(c, src=src, venv=venv, state=state, course=course, exchange=exchange, max_kb=max_kb,
              role_environment=role_environment)
