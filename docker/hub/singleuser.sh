#!/usr/bin/env bash
# docker/hub/singleuser.sh [ARGS...]: a learner's (or the instructor's) server, as the hub's spawner starts it,
# as that user (docker/hub/jupyterhub_config.py: Spawner.cmd).
# umask 077 first: what JupyterLab, nbgrader and the kernels write (the fetched assignment, a submission's
# copy in nbgrader's cache, a checkpoint) is the user's alone, whatever the home's mode.
set -euo pipefail
umask 077
exec "${DISTLAB_HUB_VENV:-/opt/distlab-hub/venv}/bin/jupyterhub-singleuser" "$@"
