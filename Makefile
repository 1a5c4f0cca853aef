# make lab   : set up (once) and open JupyterLab on the course
# make test  : set up (once) and run the whole test suite (what CI runs)
# make test-fast : set up (once) and run the unit tests and one launch per exercise (about 2 min on 2 idle cores)
# make lint  : set up (once) and run ruff, the pinned version, on the repository (make test does too)
# make bench : set up (once) and print the benchmark table
# make selftest : set up (once) and check this machine grades correctly (instructors, before grading a class)
# make grade [EX=N] [HINT=K] : grade exercises/ (or DIR=...), exercise N only, with tier K of the hints
# make images : build distlab-learner and distlab-grader (docker, or podman; BASE=local: bases from Debian's packages)
# make hub : (root) install and serve the class's JupyterHub on this machine (docs/hub.md)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat requirements.txt pyproject.toml | cksum | cut -d' ' -f1)
NOTEBOOK_SOURCES := $(wildcard course/[0-9]*.py)

.PHONY: setup lab test test-fast lint bench grade selftest stubs notebooks nbgrader images hub hub-class

setup: $(STAMP)

# Idempotent: re-runs only when requirements.txt or pyproject.toml change.
$(STAMP):
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	rm -f $(VENV)/.installed-*
	touch $@

# Notebooks are built from their jupytext py:percent sources (the .ipynb files are not in git), keeping
# the outputs of a notebook already run (distlab/lab/build_notebooks.py says what else it writes, and why).
notebooks: setup
	$(BIN)/python -m distlab.lab.build_notebooks $(NOTEBOOK_SOURCES)

# JupyterLab serves the repository root, so exercises/ is in the file browser next to course/,
# and opens on course/ (the learner image does the same: docker/learner-entrypoint.sh).
# make lab [PORT=8888] [IP=127.0.0.1] [LAB_ARGS_EXTRA="--no-browser ..."]: on this machine only, unless IP
# says otherwise (IP=0.0.0.0 on a remote machine, behind its firewall); as root (a container, a cloud VM)
# JupyterLab needs --allow-root, which is passed, and said.
# tests/tiers/test_browser.py starts JupyterLab with these arguments (from `make -n lab`).
PORT ?= 8888
IP ?= 127.0.0.1
AS_ROOT := $(filter 0,$(shell id -u))
LAB_ARGS := --ServerApp.root_dir="$(CURDIR)" --LabApp.default_url=/lab/tree/course --ServerApp.ip=$(IP) \
	--ServerApp.port=$(PORT) $(if $(AS_ROOT),--allow-root) $(LAB_ARGS_EXTRA)
# ROLE=learner (default) or instructor: jupyter/README.md says what each is given.
ROLE ?= learner
LAB_CONFIG_learner := $(CURDIR)/jupyter/learner:$(CURDIR)/jupyter/common
LAB_CONFIG_instructor := $(CURDIR)/nbgrader:$(CURDIR)/jupyter/common
LAB_CONFIG = $(or $(LAB_CONFIG_$(ROLE)),$(error ROLE=$(ROLE): use ROLE=learner or ROLE=instructor))
lab: notebooks
	@$(if $(AS_ROOT),echo "make lab: running as root: JupyterLab gets --allow-root")
	JUPYTER_CONFIG_PATH="$(LAB_CONFIG)$(if $(JUPYTER_CONFIG_PATH),:$(JUPYTER_CONFIG_PATH))" $(BIN)/jupyter lab $(LAB_ARGS)

# Two workers: a launch is CPU-bound only part of its time (start-up, rendezvous, containers and
# Slurm waiting), so two modules at a time keep both cores busy. tests/conftest.py keeps each module
# on one worker (its fixtures are set up once) and every module that touches something machine-wide
# (the learner user, containers, the Slurm cluster, the browser) on one worker, one after another.
test: setup
	$(BIN)/python -m pytest -n 2

# The fast loop: no slow tests, notebooks, nbgrader cycles, root-only sandbox tests or the
# JupyterLab-in-Chromium test (markers in pyproject.toml).
FAST := not slow and not notebook and not nbgrader and not root and not browser
test-fast: setup
	$(BIN)/python -m pytest -m "$(FAST)"

# ruff with pyproject.toml's [tool.ruff]; tests/project/test_lint.py runs the same check in make test.
lint: setup
	$(BIN)/ruff check --no-cache .

bench: setup
	$(BIN)/python -m benchmarks

# make grade [DIR=path/to/submission] [EX="1 2"] [HINT=1|2|3]: python -m autograder grade's exit status is
# 0 when every graded exercise passes and 1 when one fails; make then says "Error 1" and exits 2.
DIR ?= exercises
grade: setup
	$(BIN)/python -m autograder grade $(DIR) $(foreach n,$(EX),--exercise $(n)) $(if $(HINT),--hint $(HINT))

# Every solution must get full marks and every stub 0 here; exit status 1 names each surprise.
selftest: setup
	$(BIN)/python -m autograder selftest

stubs: setup
	$(BIN)/python -m autograder stubs

# Instructors: make nbgrader STEP=generate|release|collect|autograde|feedback|export|grade|mark [ARGS="--exercise 1"]
STEP ?= grade
nbgrader: setup
	$(BIN)/python -m autograder nbgrader $(STEP) $(ARGS)

# Both images from docker/*.Dockerfile (docker/make-images.sh says how; IMAGES=learner for one).
# make images BASE=local : for a machine that cannot pull base images (docker/make-base.sh)
images:
	BASE="$(BASE)" docker/make-images.sh $(IMAGES)

# The class's JupyterHub on this machine, as root (docs/hub.md): docker/hub/install.sh sets it up (the first
# time minutes: a venv from Debian's python3, the proxy from npm; later runs re-copy the course's code), then
# docker/hub/start.sh serves it in the foreground. HUB_IP=0.0.0.0 opens it to the network: behind HTTPS only.
# SPAWNER=podman: each server in a container of the image distlab-hub-learner; SPAWNER=slurm: a Slurm job each.
HUB_PORT ?= 8000
HUB_IP ?= 127.0.0.1
SPAWNER ?= local
hub:
	docker/hub/install.sh
	DISTLAB_HUB_PORT=$(HUB_PORT) DISTLAB_HUB_IP=$(HUB_IP) DISTLAB_HUB_SPAWNER=$(SPAWNER) docker/hub/start.sh

# The instructor's steps on the hub's machine, as root: make hub-class STEP=release|grade EX="1 2", or
# STEP=duedate ARGS='ex01_ddp "2026-03-01 17:00:00 UTC"' (docker/hub/class.sh)
hub-class:
	docker/hub/class.sh $(STEP) $(EX) $(ARGS)
