# syntax=docker/dockerfile:1
# The learner image as a JupyterHub spawns it (docker/hub/spawners/podman.py): distlab-learner with the hub's
# pins, for jupyterhub-singleuser (a learner's server must speak the hub's own version). Built by
# `make images IMAGES=hub-learner` after distlab-learner; nothing else changes, so a learner's server in a
# container runs the same JupyterLab, nbgrader, torch and grader as `make lab` and the learner image.
ARG BASE_IMAGE=distlab-learner
FROM ${BASE_IMAGE}
USER 0
COPY requirements.txt /tmp/pins/requirements.txt
COPY docker/hub/requirements.txt /tmp/pins/docker/hub/requirements.txt
# requirements.txt's pins are already met (torch's +cpu build satisfies its pin): only the hub's install.
RUN pip install --no-cache-dir -r /tmp/pins/docker/hub/requirements.txt && rm -rf /tmp/pins
USER 1000:1000
