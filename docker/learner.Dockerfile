# syntax=docker/dockerfile:1
# The learner image: JupyterLab on the course, CPU PyTorch by default.
#   docker build -f docker/learner.Dockerfile -t distlab-learner .
#   docker run --rm -p 8888:8888 -v "$PWD/exercises:/home/learner/distlab/exercises" distlab-learner
# GPU build: --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 (run with --gpus all).
# The reference solutions stay out of the image unless --build-arg INCLUDE_SOLUTIONS=1 (a demo image).

# BASE_IMAGE: any image with Python 3.11 and pip first on PATH (docker/make-base.sh makes one from
# Debian's packages for a machine that cannot pull this one; `make images BASE=local`).
ARG BASE_IMAGE=python:3.11-slim-bookworm

# Stage 1: the course files learners receive (a separate stage, so no layer of the image holds solutions/).
# The checks' tests and the realistic family go too: they hold independent correct solutions and edits of
# the reference ones (what docker/hub/install.sh leaves out of a hub's copy as well).
FROM ${BASE_IMAGE} AS course
ARG INCLUDE_SOLUTIONS=0
COPY . /src
RUN if [ "${INCLUDE_SOLUTIONS}" != 1 ]; then \
        rm -rf /src/solutions /src/tests/exercises /src/benchmarks/realistic; \
    fi

FROM ${BASE_IMAGE}
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1

RUN useradd --create-home --uid 1000 --shell /bin/bash learner
WORKDIR /home/learner/distlab

# The same exact pins as the pip path (tests/tiers/test_docker.py checks): requirements.txt only.
# The extra index offers torch==2.13.0+cpu, which satisfies the torch==2.13.0 pin.
COPY requirements.txt ./
RUN pip install --no-cache-dir --extra-index-url "${TORCH_INDEX_URL}" -r requirements.txt

COPY --from=course --chown=learner:learner /src .
RUN pip install --no-cache-dir --no-deps --no-build-isolation -e . \
    && chown -R learner:learner /home/learner/distlab

USER 1000:1000
EXPOSE 8888
ENTRYPOINT ["/home/learner/distlab/docker/learner-entrypoint.sh"]
