"""Learners' servers as Slurm jobs: batchspawner's SlurmSpawner (``make hub SPAWNER=slurm``).

docker/hub/jupyterhub_config.py runs this file and calls :func:`configure` after its own settings, which stay
as they are (PAM, the roles, the exchange and its sealer); only where a server runs changes. Each server is a
batch job of one task that the hub submits with ``sbatch`` as the learner (``runuser``: the hub runs as root,
and sudo need not be installed; runuser keeps the environment but for HOME, SHELL, USER and LOGNAME, which it
sets to the learner's), so Slurm runs it as the learner's uid, in their home, on the node it picks. The job is
the server: ``batchspawner-singleuser`` (which tells the hub the port it chose; the node comes from
``squeue``) around ``jupyterhub-singleuser``, with umask 077 as docker/hub/singleuser.sh sets it. Stopping the
server, or the hub (``cleanup_servers``), cancels the job with ``scancel``, as the learner.

Settings (the hub's environment): DISTLAB_HUB_SLURM_PARTITION (default: the cluster's default partition),
DISTLAB_HUB_SLURM_TIME (04:00:00, a session; the job ends then, and the server with it), DISTLAB_HUB_SLURM_CPUS
(4: a grading's ranks share them), DISTLAB_HUB_SLURM_MEMORY (3G), DISTLAB_HUB_SLURM_GRES (none; ``gpu:1`` for
a GPU each), DISTLAB_HUB_SLURM_OPTIONS (more ``sbatch`` options, e.g. ``--account=cs101 --qos=class``),
DISTLAB_HUB_SLURM_START_TIMEOUT (300 s: a job may wait in the queue; the hub stops the server, and so
cancels the job, after that). The cluster: the Slurm clients on the hub's PATH, and its ``SLURM_CONF`` when set
(the test cluster's is not /etc/slurm), which reaches ``sbatch`` and the job: a learner's own ``sbatch``, from
their server's terminal, finds the same cluster.

The network, as batchspawner has it: the server listens on every address of its node (batchspawner's start()
sets ``ip`` to 0.0.0.0 whatever is configured: the hub on another host must reach it), behind the hub's
tokens as a local server is; the proxy reaches it at the node's name as ``squeue`` prints it; and it reaches
the hub's API at the hub's ``hub_bind_url`` (127.0.0.1 unless DISTLAB_HUB_API_IP says otherwise: see
jupyterhub_config.py).
"""
from __future__ import annotations

import json
import os
import shutil

import batchspawner  # registers its API handler (/hub/api/batchspawner), which :class:`PortOnly` replaces
from batchspawner.api import BatchSpawnerAPIHandler
from jupyterhub.apihandlers import default_handlers
from tornado import web

# The job's script (Jinja, batchspawner's variables: req_X is {{X}}). Not batchspawner's own: its
# --get-user-env (and --export of a list of names, which implies it) has slurmd run the learner's login shell
# at each start, whose files may change the server's environment; its srun adds a job step for the one task
# the batch step can run itself. --export=ALL: sbatch's environment, which is the server's as the hub builds it
# (the spawner runs sbatch with that environment only; runuser adds LOGNAME), and Slurm's own variables.
BATCH_SCRIPT = """#!/bin/bash
#SBATCH --job-name=distlab-hub-server
#SBATCH --nodes=1 --ntasks=1
#SBATCH --chdir={{homedir}}
#SBATCH --output={{homedir}}/.distlab-hub-server.log
#SBATCH --export=ALL
{% if partition %}#SBATCH --partition={{partition}}
{% endif %}{% if runtime %}#SBATCH --time={{runtime}}
{% endif %}{% if nprocs %}#SBATCH --cpus-per-task={{nprocs}}
{% endif %}{% if memory %}#SBATCH --mem={{memory}}
{% endif %}{% if gres %}#SBATCH --gres={{gres}}
{% endif %}{% if options %}#SBATCH {{options}}
{% endif %}set -euo pipefail
umask 077
exec {{cmd}}
"""


class PortOnly(BatchSpawnerAPIHandler):
    """batchspawner's handler, restricted to what batchspawner-singleuser sends: its port, once per start.
    batchspawner's own sets every attribute of the spawner that the request names, for whoever holds the
    server's token, which is in the learner's environment: ``exec_prefix`` or ``job_id``, which the hub (root)
    then runs in a shell, would make any learner root."""

    @web.authenticated
    def post(self):
        token = self.get_auth_token()
        spawners = getattr(self.current_user, "spawners", {}).values()  # a service's token has none
        spawner = next((s for s in spawners if s.api_token == token), None)
        body = self.get_json_body()
        port = body["port"] if isinstance(body, dict) and list(body) == ["port"] else None
        # start() sets the port to 0 and waits for this; a started server's port stays
        if spawner is None or type(port) is not int or not 0 < port < 65536 or spawner.port != 0:
            raise web.HTTPError(400, "only the port of a server being started can be set")
        spawner.port = port
        self.set_status(201)
        self.finish(json.dumps({"message": "port set"}))


def _tool(name: str) -> str:
    """``name``'s full path on the hub's PATH (sbatch then runs with the server's PATH, which need not have it)."""
    found = shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))
    if found is None:
        raise SystemExit(f"DISTLAB_HUB_SPAWNER=slurm: {name} not found (Slurm's clients: apt-get install slurm-client)")
    return found


def configure(c, *, src, venv, state, course, exchange, max_kb, role_environment) -> None:
    env = os.environ.get
    default_handlers[:] = [(path, PortOnly) if path == "/api/batchspawner" else (path, *rest)
                           for path, *rest in default_handlers]
    c.JupyterHub.spawner_class = batchspawner.SlurmSpawner
    spawner = c.SlurmSpawner
    spawner.batch_script = BATCH_SCRIPT
    spawner.req_partition = env("DISTLAB_HUB_SLURM_PARTITION", "")
    spawner.req_runtime = env("DISTLAB_HUB_SLURM_TIME", "04:00:00")
    spawner.req_nprocs = env("DISTLAB_HUB_SLURM_CPUS", "4")
    spawner.req_memory = env("DISTLAB_HUB_SLURM_MEMORY", "3G")
    spawner.req_gres = env("DISTLAB_HUB_SLURM_GRES", "")
    spawner.req_options = env("DISTLAB_HUB_SLURM_OPTIONS", "")
    # every Slurm command as the learner: sbatch makes the job theirs; squeue and scancel see and end only theirs.
    # umask 077 before sbatch: Slurm gives the job sbatch's umask, from its output file (created before the
    # script runs, in the learner's home) on; the script sets it again, as singleuser.sh does
    spawner.exec_prefix = f"umask 077 && {_tool('runuser')} -u {{username}} --"
    spawner.batch_submit_cmd = f"{_tool('sbatch')} --parsable"
    spawner.batch_query_cmd = f"{_tool('squeue')} -h -j {{job_id}} -o '%T %B'"  # "RUNNING node"
    spawner.batch_cancel_cmd = f"{_tool('scancel')} {{job_id}}"
    # the wrapper runs the next word as a Python script (runpy): jupyterhub-singleuser itself, not singleuser.sh,
    # whose umask the batch script sets instead
    spawner.batchspawner_singleuser_cmd = str(venv / "bin/batchspawner-singleuser")
    spawner.cmd = [str(venv / "bin/jupyterhub-singleuser")]
    spawner.env_keep = [*c.Spawner.env_keep, "SLURM_CONF"]
    # start_timeout counts the queue's wait (the hub then stops the server: scancel); then the server has
    # http_timeout to answer on its node, as a local one has
    spawner.start_timeout = int(env("DISTLAB_HUB_SLURM_START_TIMEOUT", "300"))
    spawner.http_timeout = 120

    def submit_as_configured(spawner) -> None:
        """The role's settings (role_environment), and no user_options: batchspawner puts a spawn request's
        options into the batch script over the hub's (``{"runtime": ..., "options": ...}`` from the REST API),
        where a learner would set their own job's time, partition and resources."""
        spawner.user_options = {}
        role_environment(spawner, code=src, python=venv)

    spawner.pre_spawn_hook = submit_as_configured
