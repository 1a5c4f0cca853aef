#!/usr/bin/env bash
# learner-entrypoint.sh [CMD...]   (the learner image's entrypoint)
#
# Builds the course notebooks from their jupytext sources (as `make notebooks`
# does; a notebook already run keeps its outputs), then runs CMD:
# by default JupyterLab on the repository, opening on course/. $DISTLAB_HOME is the learner's copy
# of the repository (default: the one this script is in). JupyterLab gets the configuration of
# $DISTLAB_ROLE (learner, the default, or instructor), as `make lab ROLE=...` does (jupyter/README.md).
set -euo pipefail
home="${DISTLAB_HOME:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
cd "$home"
shopt -s nullglob
sources=(course/[0-9]*.py)
if [[ ${#sources[@]} -gt 0 ]]; then
    python -m distlab.lab.build_notebooks "${sources[@]}"
fi
case "${DISTLAB_ROLE:-learner}" in
    learner) config="$home/jupyter/learner:$home/jupyter/common" ;;
    instructor) config="$home/nbgrader:$home/jupyter/common" ;;
    *) echo "learner-entrypoint.sh: DISTLAB_ROLE=$DISTLAB_ROLE: use learner or instructor" >&2; exit 2 ;;
esac
export JUPYTER_CONFIG_PATH="$config${JUPYTER_CONFIG_PATH:+:$JUPYTER_CONFIG_PATH}"
if [[ $# -eq 0 ]]; then
    # the repository root, so exercises/ is in the file browser; it opens on course/ (as `make lab`)
    set -- jupyter lab --ip=0.0.0.0 --port=8888 --no-browser --ServerApp.root_dir="$home" \
        --LabApp.default_url=/lab/tree/course
fi
exec "$@"
