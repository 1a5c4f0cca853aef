#!/usr/bin/env bash
# setup.sh: Gradescope runs it once, as root, in /autograder/source (the autograder zip, unpacked), when it
# builds the autograder's image from its Ubuntu base. Made by `python -m autograder gradescope`
# (autograder/commands/gradescope.py; docs/gradescope.md).
#  1. Python and the exact pins of requirements.txt (the same file as the repository's), torch as the CPU
#     wheel from PyTorch's CPU index, in a virtual environment every user can run: /opt/distlab-venv.
#     DISTLAB_PYTHON=PATH instead names an interpreter that already has them (the learner image does), and
#     nothing is installed.
#  2. The unprivileged user learners' code runs as (DISTLAB_STUDENT_USER, default student): run_autograder
#     runs as root, and the grader runs every rank of a learner's code as that user (distlab/runtime/sandbox.py).
#  3. The grader's code read-only to that user, and the reference solutions not even readable (a learner's
#     module could import them otherwise), as in the grading image (docker/grader.Dockerfile).
set -euo pipefail
source_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv=/opt/distlab-venv
cpu_index="${DISTLAB_TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
user="${DISTLAB_STUDENT_USER:-student}"

if [[ -n "${DISTLAB_PYTHON:-}" ]]; then
    echo "setup.sh: DISTLAB_PYTHON=$DISTLAB_PYTHON: its packages are used as they are, nothing is installed"
else
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends python3 python3-venv
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --no-cache-dir --upgrade pip
    # The extra index offers torch==X+cpu, which satisfies the torch==X pin (the CUDA build is not needed).
    "$venv/bin/python" -m pip install --no-cache-dir --extra-index-url "$cpu_index" \
        -r "$source_dir/requirements.txt"
    chmod -R a+rX "$venv"
fi

if ! id -u "$user" >/dev/null 2>&1; then
    useradd --create-home --shell /usr/sbin/nologin "$user"
fi
home="$(getent passwd "$user" | cut -d: -f6)"
[[ -d "$home" ]] && chmod 0700 "$home"

chmod -R a+rX,go-w "$source_dir"
chmod -R go-rwx "$source_dir/solutions"
chmod o+x "$(dirname "$source_dir")"  # the user reaches the grader's code (listing /autograder is not needed)
echo "setup.sh: ready: learners' code runs as '$user'"
