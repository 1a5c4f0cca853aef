#!/usr/bin/env bash
# make-base.sh [ENGINE]   (ENGINE: podman or docker; default: what docker/make-images.sh picks)
#
# For a machine that cannot pull the images' bases (no registry, only a Debian
# package archive): makes them locally from Debian's packages.
#   distlab-base:debian-bookworm  Debian 12 minbase, by mmdebstrap from the host's apt
#                                 sources (a CPU stand-in for the grader's CUDA base:
#                                 docker/grader.Dockerfile installs its Python with apt)
#   distlab-base:python3.11       that, plus Debian's Python 3.11 in a venv first on PATH
#                                 (python, pip), ca-certificates and passwd: a stand-in for
#                                 python:3.11-slim-bookworm, the learner image's base
# Then: docker/make-images.sh with LEARNER_BASE=distlab-base:python3.11 and
# GRADER_BASE=distlab-base:debian-bookworm (what `make images BASE=local` does).
# Needs root, mmdebstrap (apt-get install mmdebstrap) and the engine. Idempotent: an
# image already made by this version of the script is kept (label distlab.base).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
engine="${1:-${ENGINE:-}}"
if [[ -z "$engine" ]]; then
    if command -v docker >/dev/null && docker info >/dev/null 2>&1; then engine=docker; else engine=podman; fi
fi
suite="${DISTLAB_BASE_SUITE:-bookworm}"
debian="distlab-base:debian-$suite"
python="distlab-base:python3.11"
# shellcheck disable=SC2016  # "$1" is mmdebstrap's: the root of the new system
debian_recipe=(--variant=minbase --quiet --aptopt='Acquire::Check-Valid-Until "false"'
               --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' "$suite")
python_recipe="FROM $debian
RUN apt-get update -qq \\
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \\
        python3 python3-venv ca-certificates passwd >/dev/null \\
    && rm -rf /var/lib/apt/lists/* \\
    && python3 -m venv /usr/local/python
ENV PATH=/usr/local/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    LANG=C.UTF-8
CMD [\"python3\"]
"
# Each image is labelled with a digest of its recipe: made again only when the recipe changes.
debian_stamp="$(printf '%s\n' "${debian_recipe[@]}" | sha256sum | cut -c1-16)"
python_stamp="$(printf '%s\n%s' "$debian_stamp" "$python_recipe" | sha256sum | cut -c1-16)"

label_of() {
    "$engine" image inspect --format '{{ index .Config.Labels "distlab.base" }}' "$1" 2>/dev/null || true
}

if [[ "$(label_of "$debian")" != "$debian_stamp" ]]; then
    command -v mmdebstrap >/dev/null || { echo "make-base.sh: mmdebstrap is missing (apt-get install mmdebstrap)" >&2; exit 3; }
    tmp="$(mktemp -d)"
    trap 'rm -rf --one-file-system "$tmp"' EXIT
    echo "make-base.sh: mmdebstrap --variant=minbase $suite (a minute or a few)"
    # The host's apt sources (its mirror) serve the build.
    mmdebstrap "${debian_recipe[@]}" "$tmp/rootfs.tar"
    "$engine" import --change 'CMD ["/bin/bash"]' --change "LABEL distlab.base=$debian_stamp" \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        "$tmp/rootfs.tar" "$debian" >/dev/null
fi

if [[ "$(label_of "$python")" != "$python_stamp" ]]; then
    echo "make-base.sh: $python (Debian's Python 3.11 in a venv, first on PATH)"
    # network host: apt reaches the archive as the host does; nothing else is installed from outside
    printf '%s' "$python_recipe" | "$engine" build --network host --label "distlab.base=$python_stamp" \
        -t "$python" -f - "$here"
fi
"$engine" image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep 'distlab-base' || true
