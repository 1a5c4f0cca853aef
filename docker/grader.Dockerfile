# syntax=docker/dockerfile:1
# The instructor's grader image: nbgrader autograde on GPUs (NCCL), learners' code sandboxed.
#   docker build -f docker/grader.Dockerfile -t distlab-grader .
#   cd docker && docker compose run --rm grader        # grades ../nbgrader/submitted
# The CUDA runtime image ships NCCL; the torch wheel from PyPI is the CUDA build with its own NCCL.
# BASE_IMAGE: a CPU grader (CI, a machine without GPUs) builds on any Debian or Ubuntu image, e.g.
# --build-arg BASE_IMAGE=debian:bookworm-slim, or docker/make-base.sh's (`make images BASE=local`).
ARG BASE_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
FROM ${BASE_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    DISTLAB_STUDENT_USER=student

# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv util-linux \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

# The same exact pins as the pip path (tests/tiers/test_docker.py checks): requirements.txt only.
COPY requirements.txt /opt/distlab/requirements.txt
RUN pip install --no-cache-dir -r /opt/distlab/requirements.txt

# The grader's code belongs to root and is read-only to the student user that runs learners' code;
# the reference solutions are not even readable (a learner's module could import them otherwise).
COPY . /opt/distlab
RUN pip install --no-cache-dir --no-deps --no-build-isolation -e /opt/distlab \
    && chmod -R go-w /opt/distlab /opt/venv \
    && chmod -R go-rwx /opt/distlab/solutions \
    && useradd --create-home --uid 2000 --shell /usr/sbin/nologin student

WORKDIR /opt/distlab
ENTRYPOINT ["/opt/distlab/docker/grade.sh"]
CMD ["mark"]
