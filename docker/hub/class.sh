#!/usr/bin/env bash
# docker/hub/class.sh STEP ...   (root; `make hub-class STEP=... EX=...` runs it)
# The instructor's steps on the class's JupyterHub machine, each as the user it must run as:
#   release N...        generate exercise N's assignment from solutions/ (as root: only root reads them in
#                       the hub's copy of the code), then release it to the exchange as the instructor
#   duedate ID WHEN     the assignment's due date, e.g. duedate ex01_ddp "2026-03-01 17:00:00 UTC"; a
#                       submission received after it is recorded as late (nbgrader's late-submission check)
#   grade N...          collect as the instructor; autograde, generate feedback and export grades.csv with
#                       docker/grade.sh (root), every learner's code (the notebook's kernel, the torchrun
#                       ranks) running as the sandbox's user distlab-grading; then release the feedback as
#                       the instructor. The learners then fetch it from their Assignments tab.
# The instructor is the owner of the course directory (docker/hub/add-users.sh --instructor NAME).
# Settings: DISTLAB_HUB_PREFIX, DISTLAB_HUB_COURSE, DISTLAB_EXCHANGE (docker/hub/install.sh's defaults).
# Why not the formgrader's own "autograde" button: it runs learners' notebooks as the instructor, whose
# user can write the gradebook; here their code runs as a user that can write nothing of the course.
set -euo pipefail
prefix="${DISTLAB_HUB_PREFIX:-/opt/distlab-hub}"
course="${DISTLAB_HUB_COURSE:-/srv/nbgrader/distlab}"
exchange="${DISTLAB_EXCHANGE:-/srv/nbgrader/exchange}"
src="$prefix/src"
python="$prefix/venv/bin/python"
export DISTLAB_EXCHANGE="$exchange"
step="${1:-}"
[[ $# -gt 0 ]] && shift

die() { echo "docker/hub/class.sh: $*" >&2; exit 2; }
[[ "$(id -u)" -eq 0 ]] || die "needs root (it runs steps as the instructor and as the grading sandbox's user)"
[[ -f "$course/nbgrader_config.py" ]] || die "no course in $course: run make hub first"
instructor="$(stat -c %U "$course")"
[[ "$instructor" != root ]] || die "$course has no instructor yet: docker/hub/add-users.sh --instructor NAME"
home="$(getent passwd "$instructor" | cut -d: -f6)"

as_instructor() {  # as_instructor CMD...: in the course directory, in a clean environment with the venv first
    # on PATH (nbgrader runs alembic from it)
    (cd "$course" && runuser -u "$instructor" -- env -i HOME="$home" USER="$instructor" LANG=C.UTF-8 \
        DISTLAB_EXCHANGE="$exchange" JUPYTER_CONFIG_PATH="$src/docker/hub/instructor" \
        PATH="$prefix/venv/bin:/usr/local/bin:/usr/bin:/bin" "$@")
}
exercises() {  # exercises N...: --exercise N for each
    local n
    for n in "$@"; do
        [[ "$n" =~ ^[0-9]+$ ]] || die "exercise numbers, e.g. 1 (got '$n')"
        printf -- '--exercise\n%s\n' "$n"
    done
}
assignments() {  # assignments N...: the assignment ids of exercises N... (from the course's assignments.json)
    "$python" - "$course/assignments.json" "$@" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))["assignments"]
wanted = {int(n) for n in sys.argv[2:]}
print("\n".join(a for a, s in spec.items() if not wanted or s["exercise"] in wanted))
PY
}

case "$step" in
    release)
        [[ $# -gt 0 ]] || die "release N...: which exercises"
        mapfile -t opts < <(exercises "$@")
        (cd "$src" && "$python" -m autograder nbgrader generate --course-dir "$course" "${opts[@]}")
        chown -R "$instructor:distlab-grading" "$course"
        chmod 0600 "$course/gradebook.db"  # the grading sandbox's group reads the course, never the gradebook
        as_instructor "$python" -m autograder nbgrader release --course-dir "$course" --force "${opts[@]}"
        ;;
    duedate)
        [[ $# -eq 2 ]] || die "duedate ASSIGNMENT 'YYYY-MM-DD HH:MM:SS UTC'"
        as_instructor "$prefix/venv/bin/nbgrader" db assignment add "$1" --duedate="$2"
        ;;
    grade)
        [[ $# -gt 0 ]] || die "grade N...: which exercises"
        mapfile -t opts < <(exercises "$@")
        as_instructor "$python" -m autograder nbgrader collect --course-dir "$course" "${opts[@]}"
        # The sealed submissions are 0600 (seal_exchange.py) and collect keeps their modes: the sandbox's user
        # must read what it grades. Readable by all inside the course directory, which only the instructor and
        # the group distlab-grading enter (0750).
        [[ -d "$course/submitted" ]] && chmod -R a+rX "$course/submitted"
        scratch="$(mktemp -d)"
        trap 'rm -rf "$scratch"' EXIT
        status=0
        DISTLAB_COURSE="$course" DISTLAB_PYTHON="$python" DISTLAB_STUDENT_USER=distlab-grading \
            DISTLAB_KERNELS="$scratch/kernels" JUPYTER_RUNTIME_DIR="$scratch/runtime" \
            "$src/docker/grade.sh" mark "${opts[@]}" || status=$?
        mapfile -t ids < <(assignments "$@")
        for a in "${ids[@]}"; do
            as_instructor "$prefix/venv/bin/nbgrader" release_feedback "$a" || status=1
        done
        exit "$status"
        ;;
    *)
        die "STEP: release N... | duedate ASSIGNMENT WHEN | grade N..."
        ;;
esac
