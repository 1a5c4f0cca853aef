"""The Gradescope autograder zip, run in the learner image laid out as Gradescope's container is.

``python -m autograder gradescope --exercise 2`` builds the zip here. One container of the learner image
(``make images``), as root as Gradescope's harness is, then does what Gradescope does: it unpacks the zip into
``/autograder/source`` (keeping the files' modes, as unzip does), copies ``run_autograder`` to
``/autograder/run_autograder`` and runs ``setup.sh`` there; then, for each submission in turn, fills
``/autograder/submission``, runs ``/autograder/run_autograder`` from ``/autograder`` and keeps
``/autograder/results/results.json``. The image already holds the pinned packages (its requirements.txt must be
this checkout's, or the test is refused), so ``setup.sh`` runs with ``DISTLAB_PYTHON`` naming its interpreter and
skips its pip install: everything else of it (the learner's user, the modes) and ``run_autograder`` run as
written. The code that grades is the zip's, not the image's copy of the course (``autograder from
/autograder/source`` says so on its stdout).

Three submissions of exercise 2 (one 2-rank launch each): the reference solution, uploaded at the top; the stub
as released; and a known mistake (``zero_grad()`` never called), uploaded in an ``exercises/`` folder as from a
repository. Each results.json is checked against Gradescope's specification (tests/helpers/gradescope_spec.py)
and for its scores, statuses and outputs: full marks; 0 with "not implemented yet"; 2.86 with the named cause and
the first tier of the hint under each failed criterion. The mistake also tries, in every rank, to write a
results.json of its own: its ranks ran as the learner's user (not root), and were refused. About 20 s here.
Skipped with the reason without root, an engine or the image, unless ``DISTLAB_REQUIRE_CONTAINERS=1`` (CI), where
that fails.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from autograder.__main__ import main
from autograder.grader.registry import exercises, hints
from autograder.grader.stubs import generate
from tests.helpers import EXERCISES, REPO, mutant
from tests.helpers.gradescope_spec import problems

pytestmark = [pytest.mark.container, pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(600)]
LEARNER = "distlab-learner"
EX = exercises()[2]  # one 2-rank launch: the cheapest of the exercises not being edited elsewhere
NEVER_ZEROED = {"        optimizer.step()\n        optimizer.zero_grad()\n": "        optimizer.step()\n"}
# Added to the mistake, run on import in every rank: it tries to write its own results.json, and records its uid
# and what it was told in /drop (a folder of the test's that anyone may write).
INTRUDER = '''
import os as _os
try:
    with open("/autograder/results/results.json", "w") as _f:
        _f.write('{"score": 10}')
    _said = "wrote results.json"
except OSError as _e:
    _said = type(_e).__name__
with open(f"/drop/{_os.getpid()}", "w") as _f:
    _f.write(f"{_os.getuid()} {_said}")
'''

# Inside the container, as root: Gradescope's layout, setup.sh once, then run_autograder per submission.
GRADESCOPE = r'''
set -u
mkdir -p /autograder/source /autograder/submission /autograder/results
cd /autograder/source
python3 - /in/autograder.zip <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for info in z.infolist():
        os.chmod(z.extract(info), info.external_attr >> 16 & 0o7777)
PY
cp /autograder/source/run_autograder /autograder/run_autograder
DISTLAB_PYTHON="$(command -v python3)"
export DISTLAB_PYTHON
bash ./setup.sh > /out/setup.log 2>&1 || { echo "setup.sh failed: $?"; exit 3; }
for case in "$@"; do
    find /autograder/submission /autograder/results -mindepth 1 -delete
    cp -R "/in/submissions/$case/." /autograder/submission/
    status=0
    (cd /autograder && ./run_autograder) > "/out/$case.stdout" 2>&1 || status=$?
    echo "$status" > "/out/$case.status"
    stat -c '%U %a' /autograder/results > "/out/$case.results-folder"
    if [ -f /autograder/results/results.json ]; then cp /autograder/results/results.json "/out/$case.json"; fi
done
'''


def engine() -> str | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "info"], capture_output=True, timeout=60).returncode == 0:
        return docker
    return shutil.which("podman")


def why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (a rootful engine: run_autograder switches to the learner's user)"
    eng = engine()
    if eng is None:
        return "needs docker with a daemon, or podman (apt-get install podman)"
    done = subprocess.run([eng, "image", "inspect", LEARNER], capture_output=True, timeout=60)
    if done.returncode != 0:
        return f"no image {LEARNER}: make images (BASE=local where base images cannot be pulled)"
    pins = subprocess.run([eng, "run", "--rm", *run_flags(eng), "--network", "none", "--entrypoint", "cat", LEARNER,
                           "requirements.txt"], capture_output=True, text=True, timeout=120)
    if pins.stdout != (REPO / "requirements.txt").read_text():
        return f"{LEARNER} holds other pins than this checkout's requirements.txt: make images"
    return None


def run_flags(eng: str) -> list[str]:
    """With podman, rlimits within this host's hard limits (as tests/tiers/test_containers.py gives them)."""
    if Path(eng).name != "podman":
        return []
    nofile = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 1 << 20)
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 32768)
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    why = why_not()
    if why:
        if os.environ.get("DISTLAB_REQUIRE_CONTAINERS") == "1":
            pytest.fail(f"DISTLAB_REQUIRE_CONTAINERS=1 but {why}")
        pytest.skip(why)
    eng = engine()
    root = tmp_path_factory.mktemp("gradescope")
    inputs, out = root / "in", root / "out"
    subs = inputs / "submissions"
    for case in ("reference", "stub", "mistake"):
        (subs / case).mkdir(parents=True)
    assert main(["gradescope", "--exercise", str(EX.number), "-o", str(inputs / "autograder.zip")]) == 0
    shutil.copy(REPO / "solutions" / EX.filename, subs / "reference")
    (subs / "stub" / EX.filename).write_text(generate()[EXERCISES / EX.filename])
    (subs / "mistake" / "exercises").mkdir()
    mistake = mutant(subs / "mistake" / "exercises", EX.filename, NEVER_ZEROED)
    mistake.write_text(mistake.read_text() + INTRUDER)
    out.mkdir()
    for d in [root, *root.rglob("*")]:
        d.chmod(0o755 if d.is_dir() else 0o644)
    (root / "drop").mkdir(mode=0o1777)
    (root / "drop").chmod(0o1777)
    name = f"distlab-test-{uuid.uuid4().hex[:12]}"
    try:
        mounts = ["-v", f"{inputs}:/in:ro", "-v", f"{out}:/out", "-v", f"{root / 'drop'}:/drop"]
        done = subprocess.run([eng, "run", "--rm", "--name", name, *run_flags(eng), "--network", "none", "--user", "0",
                               *mounts, "--entrypoint", "bash", LEARNER, "-c", GRADESCOPE, "gradescope", "reference",
                               "stub", "mistake"],
                              capture_output=True, text=True, timeout=500)
    finally:
        subprocess.run([eng, "rm", "-f", "-t", "5", name], capture_output=True, timeout=120)
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-4000:]}" for p in sorted(out.iterdir()) if p.suffix != ".json")
    print(done.stdout[-3000:], done.stderr[-3000:], logs, sep="\n")  # shown when a test fails
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:] + logs
    return out


def dropped(out: Path) -> list[str]:
    return sorted(p.read_text() for p in (out.parent / "drop").iterdir())


def outcome(out: Path, case: str) -> dict:
    status = (out / f"{case}.status").read_text().strip()
    stdout = (out / f"{case}.stdout").read_text()
    assert status == "0", f"run_autograder exited {status}:\n{stdout[-4000:]}"
    assert "autograder from /autograder/source: exercise(s) 2 of /autograder/submission" in stdout
    assert (out / f"{case}.results-folder").read_text().split() == ["root", "755"]
    doc = json.loads((out / f"{case}.json").read_text())
    assert problems(doc) == [], doc
    assert isinstance(doc["execution_time"], int) and doc["execution_time"] >= 0
    assert all(t["visibility"] == "visible" and t["name"].startswith("Exercise 2 (accumulation): ")
               for t in doc["tests"])
    return doc


def test_setup_sh_made_the_learners_user_and_installed_nothing(graded):
    log = (graded / "setup.log").read_text()
    assert "nothing is installed" in log and "ready: learners' code runs as 'student'" in log, log


def test_the_reference_solution_scores_full_marks_on_every_criterion(graded):
    doc = outcome(graded, "reference")
    assert doc["score"] == EX.max_score
    assert len(doc["tests"]) >= 5 and {t["status"] for t in doc["tests"]} == {"passed"}
    assert sum(t["max_score"] for t in doc["tests"]) == pytest.approx(EX.max_score, abs=0.05)
    assert all(t["score"] == t["max_score"] for t in doc["tests"])


def test_the_stub_scores_0_as_not_implemented(graded):
    doc = outcome(graded, "stub")
    assert doc["score"] == 0
    (test,) = doc["tests"]
    assert test["name"] == "Exercise 2 (accumulation): runs" and test["status"] == "failed"
    assert test["output"].startswith("not implemented yet (ex02_accumulation.py line ")
    assert "Exercise 2 (accumulation): 0/10 (stub)" in doc["output"]


def test_the_known_mistake_is_named_with_the_first_tier_of_its_hint(graded):
    doc = outcome(graded, "mistake")
    assert "/autograder/submission/exercises/ex02_accumulation.py" in (graded / "mistake.stdout").read_text()
    assert doc["score"] == pytest.approx(2.86, abs=0.01)  # its W=2 criteria and the W=4 one of the same step
    failed = {t["name"].split(": ", 1)[1]: t for t in doc["tests"] if t["status"] == "failed"}
    params = failed["[equal sizes, k=4] parameters after 3 optimizer steps equal the big-batch run"]
    assert params["score"] == 0 and "zero_grad() ran 0 times in 3 windows" in params["output"]
    assert f"hint 1/3 (why it matters) for '[equal sizes, k=4] parameters after 3 optimizer steps equal the " \
           f"big-batch run': {hints(2)['equal_parameters'][0]}" in params["output"]
    assert all("hint 1/3 (why it matters)" in t["output"] for t in failed.values())
    assert "next: check(2, hint=2) in the course's notebook gives the mechanism" in doc["output"]


def test_the_learners_code_ran_as_the_learners_user_and_could_not_write_the_results(graded):
    """Every rank of the mistake (each launch of its grading: 2 ranks and 4) imported it as the unprivileged user
    setup.sh made, and was refused /autograder/results: the results.json kept is the grader's (2.86, not 10)."""
    said = dropped(graded)
    assert len(said) >= 2, said
    assert {s.split()[1] for s in said} == {"PermissionError"}, said
    assert all(s.split()[0] != "0" for s in said) and len({s.split()[0] for s in said}) == 1, said
