#!/usr/bin/env bash
# docker/hub/start.sh [JUPYTERHUB_ARGS...]: the class's JupyterHub in the foreground (`make hub` runs it after
# docker/hub/install.sh). Ctrl-C stops it, the exchange's sealer and every learner's server with it.
# It serves the copy of the code that install.sh made (its configuration: docker/hub/jupyterhub_config.py,
# whose settings are the same environment variables as install.sh's).
set -euo pipefail
prefix="${DISTLAB_HUB_PREFIX:-/opt/distlab-hub}"
state="${DISTLAB_HUB_STATE:-/srv/jupyterhub}"
if [[ "$(id -u)" -ne 0 ]]; then
    echo "docker/hub/start.sh: needs root (PAM reads /etc/shadow; each server runs as its learner's user)" >&2
    exit 1
fi
if [[ ! -x "$prefix/venv/bin/jupyterhub" ]]; then
    echo "docker/hub/start.sh: no hub in $prefix: run docker/hub/install.sh (make hub does)" >&2
    exit 1
fi
cd "$state"
exec "$prefix/venv/bin/jupyterhub" -f "$prefix/src/docker/hub/jupyterhub_config.py" "$@"
