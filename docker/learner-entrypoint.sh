#!/usr/bin/env bash
# learner-entrypoint.sh [CMD...]   (the learner image's entrypoint)
#
# Builds the course notebooks from their jupytext sources (as `make notebooks`
# does; --update keeps the outputs of a notebook already run), then runs CMD:
# by default JupyterLab on the repository, opening on course/. $DISTLAB_HOME is the learner's copy
# of the repository (default: the one this script is in).
set -euo pipefail
home="${DISTLAB_HOME:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
cd "$home"
shopt -s nullglob
sources=(course/[0-9]*.py)
if [[ ${#sources[@]} -gt 0 ]]; then
    jupytext --quiet --update --to ipynb "${sources[@]}"
fi
if [[ $# -eq 0 ]]; then
    # the repository root, so exercises/ is in the file browser; it opens on course/ (as `make lab`)
    set -- jupyter lab --ip=0.0.0.0 --port=8888 --no-browser --ServerApp.root_dir="$home" \
        --LabApp.default_url=/lab/tree/course
fi
exec "$@"
