#!/usr/bin/env bash
# as-student.sh [--user NAME] [--readable FILE]... -- CMD [ARGS...]
#
# Runs CMD as the unprivileged student user, the way the grader image runs
# every learner's code (the Jupyter kernel, and through it the grading
# subprocess and the torchrun ranks): a different uid from the instructor's
# (root in the container), so the gradebook, the course's source/ and the
# grader's code are read-only to it; no new privileges (setuid binaries do
# not help); a cap on the number of processes (RLIMIT_NPROC counts all of
# the student user's processes, so a fork bomb stops there) and on open
# files. Memory, network and wall time are limited by the container
# (docker/compose.yaml) and by docker/grade.sh.
# --readable FILE hands FILE (the kernel's connection file, written 0600 by
# jupyter_client) to the student user first.
set -euo pipefail
user="${DISTLAB_STUDENT_USER:-student}"
max_procs="${DISTLAB_STUDENT_MAX_PROCS:-512}"
max_files="${DISTLAB_STUDENT_MAX_FILES:-4096}"
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
if [[ ! -d "$home" || ! -w "$home" ]]; then
    home="$(mktemp -d /tmp/student-home.XXXXXX)"
    chown "$user" "$home"
fi
ulimit -u "$max_procs"
ulimit -n "$max_files"
exec setpriv --reuid="$(id -u "$user")" --regid="$(id -g "$user")" --init-groups --no-new-privs \
    env HOME="$home" USER="$user" LOGNAME="$user" "$@"
