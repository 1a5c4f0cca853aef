#!/usr/bin/env bash
# grade.sh [STEP [OPTIONS...]]   (the grader image's entrypoint; default step: mark)
#
# Grades the nbgrader course mounted at $DISTLAB_COURSE (default /course):
# `python -m autograder.nbgrader STEP --course-dir $DISTLAB_COURSE ...`
# with `mark` = repair + autograde what is in submitted/, generate feedback,
# export grades.csv. It runs as root in the container and
#  1. makes the course directory and the gradebook writable by their owner only
#     (the student user is neither), and the grader's code read-only;
#  2. installs a "python3" kernelspec (in $JUPYTER_PATH) whose kernel starts
#     through docker/as-student.sh, so every learner's code runs as the
#     unprivileged student user with the sandbox's rlimits, under a reaper that
#     stays root; and exports DISTLAB_STUDENT_USER, so the out-of-kernel
#     regrade runs the torchrun ranks as that user too (distlab/runtime/sandbox.py);
#  3. runs the step under `timeout` ($DISTLAB_TIME_LIMIT seconds in all);
#  4. ends every process of the student user that is still running;
#  5. gives the files it wrote back to the owner of the course directory
#     (the instructor's uid on the host).
# DISTLAB_DRY_RUN=1 does 1 and 2 and prints the command of 3 instead of running it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
course="${DISTLAB_COURSE:-/course}"
time_limit="${DISTLAB_TIME_LIMIT:-21600}"
python="${DISTLAB_PYTHON:-$(command -v python3)}"
kernels="${DISTLAB_KERNELS:-/tmp/distlab-jupyter}"
runtime="${JUPYTER_RUNTIME_DIR:-/tmp/distlab-runtime}"
step="${1:-mark}"
[[ $# -gt 0 ]] && shift

if [[ ! -f "$course/nbgrader_config.py" ]]; then
    echo "grade.sh: no nbgrader_config.py in $course: mount the course directory there" >&2
    exit 2
fi
if [[ "$step" != generate && ! -f "$course/assignments.json" ]]; then
    echo "grade.sh: $course/assignments.json is missing: run the generate step first" >&2
    exit 2
fi

# 1. Nothing of the instructor's is writable by anyone but its owner.
chmod -R go-w "$course"
[[ -f "$course/gradebook.db" ]] && chmod 0600 "$course/gradebook.db"
export DISTLAB_STUDENT_USER="${DISTLAB_STUDENT_USER:-student}"

# 2. The kernel every notebook is executed with runs as the student user.
mkdir -p "$kernels/kernels/python3" "$runtime"
chmod 0711 "$runtime"
cat > "$kernels/kernels/python3/kernel.json" <<JSON
{
 "argv": ["$here/as-student.sh", "--readable", "{connection_file}", "--",
          "$python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
 "display_name": "Python 3 (student sandbox)",
 "language": "python"
}
JSON
export JUPYTER_PATH="$kernels${JUPYTER_PATH:+:$JUPYTER_PATH}"
export JUPYTER_RUNTIME_DIR="$runtime"

cmd=(timeout --kill-after=60 "$time_limit" "$python" -m autograder.nbgrader "$step"
     --course-dir "$course" "$@")
if [[ "${DISTLAB_DRY_RUN:-0}" == 1 ]]; then
    printf '%q ' "${cmd[@]}"
    echo
    exit 0
fi
status=0
(cd "$repo" && "${cmd[@]}") || status=$?
# 4. Nothing of a learner's survives the run (the reaper ends the student user's processes).
"$python" -I -S "$repo/distlab/runtime/reaper.py" end-user "$DISTLAB_STUDENT_USER" || true
# 5. The instructor owns what was written.
chown -R "$(stat -c %u:%g "$course")" "$course"
if [[ $status -eq 124 ]]; then
    echo "grade.sh: stopped after $time_limit s (DISTLAB_TIME_LIMIT); rerun to finish: graded work is kept" >&2
fi
exit $status
