#!/usr/bin/env bash
# docker/hub/add-users.sh [--instructor] [--passwords FILE] NAME...   (root)
#
# Adds learners (or, with --instructor, the instructor) as local users of this machine, whom the class's
# JupyterHub logs in with PAM (docker/hub/jupyterhub_config.py): a user each, in the group distlab-learners
# (or distlab-instructors), with a home of its own that no one else can read.
#   --passwords FILE  lines NAME:PASSWORD (as chpasswd reads them) for the users named; without it each
#                     new user gets a random password, printed once as "NAME PASSWORD" to hand out
#   --instructor      also hands the nbgrader course directory ($DISTLAB_HUB_COURSE, default
#                     /srv/nbgrader/distlab) to the user: their formgrader reads and writes it
# Idempotent: an existing user keeps its password (unless FILE names it) and gets the group and a 0700 home.
#
# Why chmod 0700: Debian's `useradd -m` makes homes 0755 (HOME_MODE in /etc/login.defs), and every learner
# could then read every other's notebooks and modules, before and after the deadline.
set -euo pipefail
course="${DISTLAB_HUB_COURSE:-/srv/nbgrader/distlab}"
group=distlab-learners
instructor=0
passwords=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --instructor) instructor=1; group=distlab-instructors; shift ;;
        --passwords) passwords="$2"; shift 2 ;;
        --) shift; break ;;
        -*) echo "docker/hub/add-users.sh: unknown option $1" >&2; exit 2 ;;
        *) break ;;
    esac
done
if [[ $# -eq 0 ]]; then
    echo "usage: docker/hub/add-users.sh [--instructor] [--passwords FILE] NAME..." >&2
    exit 2
fi
[[ "$(id -u)" -eq 0 ]] || { echo "docker/hub/add-users.sh: needs root (useradd)" >&2; exit 1; }
getent group "$group" >/dev/null || { echo "docker/hub/add-users.sh: no group $group: run make hub first" >&2; exit 1; }

for name in "$@"; do
    # nbgrader takes the user name as the learner's id: no '+' or '*' (its exchange splits names on '+')
    if [[ ! "$name" =~ ^[a-z_][a-z0-9_-]*$ ]]; then
        echo "docker/hub/add-users.sh: '$name' is not a user name this hub accepts ([a-z_][a-z0-9_-]*)" >&2
        exit 2
    fi
    new=0
    if ! id -u "$name" >/dev/null 2>&1; then
        useradd --create-home --shell /bin/bash --groups "$group" "$name"
        new=1
    else
        usermod --append --groups "$group" "$name"
    fi
    home="$(getent passwd "$name" | cut -d: -f6)"
    chmod 0700 "$home"
    password=""
    if [[ -n "$passwords" ]]; then
        password="$(awk -F: -v n="$name" '$1 == n { sub(/^[^:]*:/, ""); print; exit }' "$passwords")"
    fi
    if [[ -n "$password" ]]; then
        printf '%s:%s\n' "$name" "$password" | chpasswd
    elif [[ $new -eq 1 ]]; then
        password="$(head -c 12 /dev/urandom | base64 | tr -d '/+=')"
        printf '%s:%s\n' "$name" "$password" | chpasswd
        printf '%s %s\n' "$name" "$password"
    fi
done

if [[ $instructor -eq 1 ]]; then
    if [[ ! -d "$course" ]]; then
        echo "docker/hub/add-users.sh: no course directory $course: run make hub first" >&2
        exit 1
    fi
    # group distlab-grading: the grading sandbox reads the submissions it grades (docker/hub/class.sh)
    chown -R "$1:distlab-grading" "$course"
    chmod 0750 "$course"
fi
