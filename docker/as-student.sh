#!/usr/bin/env bash
# as-student.sh [--user NAME] [--readable FILE]... -- CMD [ARGS...]
#
# Runs CMD as the unprivileged student user, the way the grader image runs
# every learner's code that does not go through the grader's own launcher
# (the Jupyter kernel, and through it the grading subprocess and the torchrun
# ranks): a different uid from the instructor's (root in the container), so
# the gradebook, the course's source/ and the grader's code are read-only to
# it; no new privileges (setuid binaries do not help); the sandbox's rlimits
# (distlab/runtime/sandbox.py: processes, open files, address space, no core files).
# CMD runs under `distlab/runtime/reaper.py as-learner`, which stays root: when CMD exits, every
# process it left behind is ended, and then every process of the student
# user, so nothing a learner's notebook started outlives it.
# Memory, network and wall time are also limited by the container
# (docker/compose.yaml) and by docker/grade.sh.
# --readable FILE hands FILE (the kernel's connection file, written 0600 by
# jupyter_client) to the student user first.
set -euo pipefail
user="${DISTLAB_STUDENT_USER:-student}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${DISTLAB_PYTHON:-$(command -v python3)}"
readable=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --user) user="$2"; shift 2 ;;
        --readable) readable+=("$2"); shift 2 ;;
        --) shift; break ;;
        *) break ;;
    esac
done
if [[ $# -eq 0 ]]; then
    echo "as-student.sh: no command given" >&2
    exit 2
fi
if [[ "$(id -u)" -ne 0 ]]; then
    echo "as-student.sh: must start as root to switch to the user '$user' (running as uid $(id -u))" >&2
    exit 3
fi
if ! id -u "$user" >/dev/null 2>&1; then
    echo "as-student.sh: no user '$user' (the grader image creates 'student')" >&2
    exit 3
fi
for f in "${readable[@]}"; do
    chown "$user" "$f"
done
home="$(getent passwd "$user" | cut -d: -f6)"
if [[ ! -d "$home" ]]; then
    # One home per user, made once (a new folder per kernel would pile up in /tmp).
    home="/tmp/distlab-home-$user"
    if [[ -L "$home" ]]; then
        echo "as-student.sh: $home is a symbolic link: refusing to use it" >&2
        exit 3
    fi
    [[ -d "$home" ]] || mkdir -m 0700 "$home"
    chown -h "$user" "$home"
fi
export DISTLAB_LEARNER_HOME="$home"
exec "$python" -I -S "$here/../distlab/runtime/reaper.py" as-learner "$user" -- "$@"
