#!/usr/bin/env bash
# make-images.sh [learner|grader|hub-learner]...   (`make images`; default: learner and grader)
# make-images.sh --source-id           the checkout's id, as the images are labelled with it
#
# Builds distlab-learner and distlab-grader from docker/learner.Dockerfile and
# docker/grader.Dockerfile (and distlab-hub-learner, distlab-learner with the hub's pins, for
# the hub's container spawner: docker/hub-learner.Dockerfile), with docker when a Docker daemon answers and with
# podman otherwise (ENGINE=docker|podman to choose). Settings (environment):
#   LEARNER_BASE     the learner image's base (default python:3.11-slim-bookworm)
#   GRADER_BASE      the grading image's base (default nvidia/cuda:12.8.1-runtime-ubuntu24.04,
#                    the CUDA one; any Debian or Ubuntu image with apt works for a CPU grader)
#   TORCH_INDEX_URL  passed to the learner image (default: its Dockerfile's, PyTorch's CPU index)
#   BASE=local       for a machine that cannot pull base images: docker/make-base.sh makes
#                    both bases from Debian's packages (a CPU grader), and with podman the
#                    builds use this host's pip configuration (see below)
#   PIP_FROM_HOST=1  (podman only; on with BASE=local) the builds' pip reads this host's pip
#                    configuration (pip config list: index, extra indexes, find-links, CA
#                    bundle), whose local paths are mounted read-only into each RUN
# Rebuilds are cached by the engine's layer cache: only the layers after a changed file run.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
cd "$repo"

engine="${ENGINE:-}"
if [[ -z "$engine" ]]; then
    if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
        engine=docker
    elif command -v podman >/dev/null; then
        engine=podman
    else
        echo "make-images.sh: neither a Docker daemon nor podman (apt-get install podman)" >&2
        exit 3
    fi
fi
# The checkout an image is built from, as a label (distlab.source): the commit, plus a digest of
# uncommitted changes to tracked files (untracked ones are not counted: tests write some).
# tests/tiers/test_containers.py refuses an image of another checkout.
source_id() {
    if ! git rev-parse --git-dir >/dev/null 2>&1; then
        echo unknown
    elif git diff HEAD --quiet; then
        git rev-parse HEAD
    else
        echo "$(git rev-parse HEAD)+$(git diff HEAD --binary | sha256sum | cut -c1-12)"
    fi
}
if [[ "${1:-}" == --source-id ]]; then
    source_id
    exit 0
fi

learner_base="${LEARNER_BASE:-python:3.11-slim-bookworm}"
grader_base="${GRADER_BASE:-nvidia/cuda:12.8.1-runtime-ubuntu24.04}"
pip_from_host="${PIP_FROM_HOST:-0}"
if [[ "${BASE:-}" == local ]]; then
    "$here/make-base.sh" "$engine"
    learner_base="${LEARNER_BASE:-distlab-base:python3.11}"
    grader_base="${GRADER_BASE:-distlab-base:debian-bookworm}"
    pip_from_host="${PIP_FROM_HOST:-1}"
fi

common=()
learner_args=()
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if [[ "$engine" == podman ]]; then
    # RUN steps share the host's network: apt and pip reach what the host reaches
    common+=(--network host)
fi
if [[ "$pip_from_host" == 1 ]]; then
    [[ "$engine" == podman ]] || { echo "make-images.sh: PIP_FROM_HOST=1 needs podman (build-time mounts)" >&2; exit 2; }
    # The host's pip settings as one pip.conf, and every local path they name, mounted as it is.
    python3 - "$tmp/pip.conf" "$tmp/mounts" "$tmp/index" <<'PY'
import subprocess, sys, os
out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
conf = {}
for line in out.splitlines():
    key, _, value = line.partition("=")
    name = key.split(".", 1)[-1]
    if name in ("index-url", "extra-index-url", "find-links", "cert", "trusted-host", "timeout", "default-timeout"):
        conf[name] = value.strip().strip("'\"")   # environment (:env:) entries come last and win
conf.setdefault("cert", os.environ.get("PIP_CERT", "") or "")
mounts = set()
if conf["cert"] and os.path.isfile(conf["cert"]):
    # mounted beside, not over, the image's own bundle (ca-certificates' postinst replaces that file)
    mounts.add(f"{os.path.realpath(conf['cert'])}:/run/distlab-host-ca.crt")
    conf["cert"] = "/run/distlab-host-ca.crt"
for name in ("index-url", "extra-index-url", "find-links"):
    for item in conf.get(name, "").split():
        path = item[len("file://"):] if item.startswith("file://") else item
        if not (path.startswith("/") and os.path.exists(path)):
            continue
        if name.endswith("index-url"):  # a local index links its files beside it (../files/...)
            path = os.path.dirname(path.rstrip("/"))
        mounts.add(f"{path}:{path}")
with open(sys.argv[1], "w") as f:
    f.write("[global]\n" + "".join(f"{k} = {v}\n" for k, v in conf.items() if v))
with open(sys.argv[2], "w") as f:
    f.write("".join(f"{m}\n" for m in sorted(mounts)))
with open(sys.argv[3], "w") as f:
    f.write(conf.get("index-url", "https://pypi.org/simple"))
PY
    common+=(-v "$tmp/pip.conf:/etc/pip.conf:ro")
    while read -r mount; do
        common+=(-v "$mount:ro")
    done < "$tmp/mounts"
    # the learner image's extra index: the host's main index instead of PyTorch's (unreachable from
    # such a host), unless one is given; torch's CPU wheel then comes from the host's find-links
    learner_args+=(--build-arg "TORCH_INDEX_URL=${TORCH_INDEX_URL:-$(cat "$tmp/index")}")
elif [[ -n "${TORCH_INDEX_URL:-}" ]]; then
    learner_args+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
fi

build() {  # build NAME BASE [ARGS...]
    local name="$1" base="$2" start
    shift 2
    local ignore=()
    # BuildKit reads docker/NAME.Dockerfile.dockerignore by itself; podman is told
    [[ "$engine" == podman ]] && ignore=(--ignorefile "docker/$name.Dockerfile.dockerignore")
    start=$SECONDS
    echo "make-images.sh: $engine build distlab-$name (FROM $base)"
    "$engine" build "${common[@]}" "${ignore[@]}" --build-arg "BASE_IMAGE=$base" "$@" \
        --label "distlab.source=$source" \
        -f "docker/$name.Dockerfile" -t "distlab-$name" .
    echo "make-images.sh: distlab-$name built in $((SECONDS - start)) s," \
        "$("$engine" image inspect --format '{{.Size}}' "distlab-$name") bytes"
}

source="$(source_id)"
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(learner grader)
for t in "${targets[@]}"; do
    case "$t" in
        learner) build learner "$learner_base" "${learner_args[@]}" ;;
        grader) build grader "$grader_base" ;;
        hub-learner) build hub-learner distlab-learner ;;
        *) echo "make-images.sh: no image '$t' (learner, grader, hub-learner)" >&2; exit 2 ;;
    esac
done
