#!/usr/bin/env bash
# .ci/prepare-tiers.sh: what the slurm and container test tiers need, before `make test` (CI runs it).
#   slurm      Debian's slurm-wlm and munge (tests/slurm_cluster.py starts its own daemons)
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
