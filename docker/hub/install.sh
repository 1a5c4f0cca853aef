#!/usr/bin/env bash
# docker/hub/install.sh: set up, or bring up to date, the class's JupyterHub on this machine (`make hub` runs it,
# then docker/hub/start.sh). Root. Idempotent: a later run re-copies the course's code and does nothing else
# that is already done. Settings (environment), with their defaults:
#   DISTLAB_HUB_PREFIX  /opt/distlab-hub         venv/ (the hub's and the learners' Python), node/ (the proxy),
#                                                src/ (the course's code; its solutions/ root's only)
#   DISTLAB_HUB_PYTHON  /usr/bin/python3         the interpreter the venv is made from (see below)
#   DISTLAB_HUB_STATE   /srv/jupyterhub          the hub's database, cookie secret and logs (root only)
#   DISTLAB_HUB_COURSE  /srv/nbgrader/distlab    the nbgrader course directory (owned by the instructor)
#   DISTLAB_EXCHANGE    /srv/nbgrader/exchange   nbgrader's exchange
#   TORCH_INDEX_URL     (none)                   an extra index for torch, as the learner image takes
#
# Why a venv of its own, from Debian's /usr/bin/python3: the learners' servers and kernels run as the
# learners' own users, and an interpreter under a 0700 home (a pyenv Python in /root, like the repository's
# .venv here) cannot be executed by them. The venv lives under /opt, world-readable; it holds
# requirements.txt's pins and the hub's (docker/hub/requirements.txt).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
prefix="${DISTLAB_HUB_PREFIX:-/opt/distlab-hub}"
python="${DISTLAB_HUB_PYTHON:-/usr/bin/python3}"
state="${DISTLAB_HUB_STATE:-/srv/jupyterhub}"
course="${DISTLAB_HUB_COURSE:-/srv/nbgrader/distlab}"
exchange="${DISTLAB_EXCHANGE:-/srv/nbgrader/exchange}"
grading_user=distlab-grading   # the sandbox user grading runs learners' code as (docker/hub/class.sh)

say() { echo "docker/hub/install.sh: $*"; }
die() { echo "docker/hub/install.sh: $*" >&2; exit 1; }

[[ "$(id -u)" -eq 0 ]] || die "needs root (it makes users, /opt and /srv folders): sudo make hub"
for tool in useradd groupadd runuser npm node; do
    command -v "$tool" >/dev/null || die "$tool is missing (apt-get install passwd util-linux nodejs)"
done
# The learners must be able to run the interpreter the venv points at: try it as an unprivileged user.
runuser -u nobody -- "$python" -c 'import venv, ensurepip' 2>/dev/null \
    || die "$python cannot be run by other users, or lacks venv (apt-get install python3-venv); set DISTLAB_HUB_PYTHON"

# 1. The Python environment, reinstalled only when a requirements file changed.
mkdir -p "$prefix"
chmod 0755 "$prefix"
stamp="$prefix/venv/.installed-$(cat "$repo/requirements.txt" "$here/requirements.txt" | cksum | cut -d' ' -f1)"
if [[ ! -e "$stamp" ]]; then
    say "installing the pinned packages into $prefix/venv (minutes, the first time)"
    [[ -x "$prefix/venv/bin/python" ]] || "$python" -m venv "$prefix/venv"
    pip_args=(--quiet --disable-pip-version-check -r "$here/requirements.txt")
    [[ -n "${TORCH_INDEX_URL:-}" ]] && pip_args+=(--extra-index-url "$TORCH_INDEX_URL")
    "$prefix/venv/bin/python" -m pip install "${pip_args[@]}"
    rm -f "$prefix"/venv/.installed-*
    touch "$stamp"
fi

# 2. configurable-http-proxy, from npm with the npm that comes with this machine's Node (Debian's own npm
#    package conflicts with a Node from elsewhere), exactly as package-lock.json pins it.
if ! cmp -s "$here/package-lock.json" "$prefix/node/package-lock.json" \
        || [[ ! -x "$prefix/node/node_modules/.bin/configurable-http-proxy" ]]; then
    say "installing configurable-http-proxy into $prefix/node"
    mkdir -p "$prefix/node"
    cp "$here/package.json" "$here/package-lock.json" "$prefix/node/"
    (cd "$prefix/node" && npm ci --omit=dev --no-audit --no-fund --loglevel=error)
fi

# 3. The course's code: as the grading image holds it, solutions/ readable by root only (`class.sh release`
#    generates the assignments from it, and the grading compares with it, as root); without the tests and
#    benchmarks, which hold independent solutions and edits of them. Copied afresh, then swapped in.
new="$prefix/src.new"
rm -rf "$new" "$prefix/src.old"
mkdir -p "$new"
tar -C "$repo" --exclude=./.venv --exclude=./.git --exclude=./tests --exclude=./benchmarks \
    --exclude=__pycache__ --exclude=./runs --exclude=./build \
    --exclude=./.pytest_cache --exclude=.ruff_cache --exclude='*.egg-info' --exclude='./course/*.ipynb' \
    --exclude=.ipynb_checkpoints --exclude='./nbgrader/*' -cf - . | tar -C "$new" -xf -
cp "$repo/nbgrader/nbgrader_config.py" "$new/nbgrader/"
chown -R root:root "$new"
chmod -R u+rwX,go+rX,go-w "$new"
chmod -R go-rwx "$new/solutions"
[[ -d "$prefix/src" ]] && mv "$prefix/src" "$prefix/src.old"
mv "$new" "$prefix/src"
rm -rf "$prefix/src.old"
# What `pip install -e` would do, without writing an .egg-info into src/: the packages importable from there.
site="$("$prefix/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$prefix/src" > "$site/distlab-hub-src.pth"

# 4. Groups, the grading sandbox's user, and the folders. Learners and instructors are added by
#    docker/hub/add-users.sh (local users: the hub logs them in with PAM).
groupadd -f distlab-learners
groupadd -f distlab-instructors
id -u "$grading_user" >/dev/null 2>&1 \
    || useradd --system --user-group --no-create-home --shell /usr/sbin/nologin "$grading_user"
install -d -m 0700 "$state"
install -d -m 0755 "$(dirname "$exchange")"
# 1777: nbgrader needs the exchange writable by every learner; the sticky bit keeps each from
# renaming or deleting the others' entries (docker/hub/seal_exchange.py seals each submission).
install -d -m 1777 "$exchange"
chmod 1777 "$exchange"
if [[ ! -d "$course" ]]; then
    # the instructor's (add-users.sh --instructor takes it); group: the grading sandbox reads what it grades
    install -d -m 0750 -g "$grading_user" "$course"
fi
cp "$prefix/src/nbgrader/nbgrader_config.py" "$course/nbgrader_config.py"
chown --reference="$course" "$course/nbgrader_config.py"
# The checkout this runs from is on the same machine: if learners can read its solutions/, hiding the copy's
# is worth nothing. Said, not changed: the checkout is the instructor's, and its tests read it as it is.
if [[ -n "$(runuser -u nobody -- find "$repo/solutions" -maxdepth 1 -name '*.py' -readable 2>/dev/null)" ]]; then
    say "WARNING: every user of this machine can read $repo/solutions, the learners too:" \
        "chmod -R go-rwx $repo/solutions, or keep the checkout where only root enters" >&2
fi
say "ready: $prefix (code from $repo), course $course, exchange $exchange"
