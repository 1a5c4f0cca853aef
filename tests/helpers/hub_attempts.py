"""What a learner of the class's JupyterHub may try against another, each tried for real: as the learner's user (a
shell, as the learner's terminal or kernel would run it), with the learner's API token, or in the learner's
browser. Each returns what happened; tests/tiers/test_hub.py asserts the refusal."""
from __future__ import annotations

import json
import shlex
import secrets
import urllib.error
import urllib.request
from pathlib import Path

from tests.helpers.hub import INSTRUCTOR, Hub, poll
from tests.helpers.hub_browser import ms

ASSIGNMENT = "ex01_ddp"


def call(url: str, token: str, method: str = "GET", body: dict | None = None) -> tuple[int, str]:
    """``(status, text)`` of a request with ``Authorization: token TOKEN`` (any status)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={
        "Authorization": f"token {token}", **({"Content-Type": "application/json"} if data else {})})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def refused(done) -> bool:
    """A shell attempt the system refused: it failed, saying so."""
    return done.returncode != 0 and ("Permission denied" in done.stderr or "Operation not permitted" in done.stderr)


def craft(hub: Hub, user: str, claimed: str, clock: str, extra: str = "") -> dict:
    """As ``user``, make a submission folder in inbound by hand, named as ``claimed``'s with ``clock`` for its
    time (what nbgrader's submit makes, but named as one likes); return the sealer's record of it."""
    name = f"{claimed}+{ASSIGNMENT}+{clock}+{secrets.token_hex(6)}"
    folder = hub.exchange / "inbound" / name
    source = Path("/home") / user / ASSIGNMENT
    files = " ".join(shlex.quote(str(source / f"{ASSIGNMENT}{ext}")) for ext in (".py", ".ipynb"))
    script = (f"set -e; d={shlex.quote(str(folder))}; mkdir \"$d\"; cp {files} \"$d\"/; "
              f"printf %s {shlex.quote(clock)} > \"$d/timestamp.txt\"; "
              "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > \"$d/submission_secret.txt\"; "
              f"{extra} chmod 777 \"$d\"")
    done = hub.as_user(user, script)
    assert done.returncode == 0, f"making {name} as {user}: {done.stderr}"
    record = poll(lambda: next((r for r in seal_log(hub) if r["entry"] == name), None), timeout=30)
    assert record, f"the sealer never dealt with {name}"
    return record


def seal_log(hub: Hub) -> list[dict]:
    log = hub.exchange / "seal.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def at_anothers_submission(hub: Hub, intruder: str, victim: str) -> dict:
    """``intruder`` at ``victim``'s sealed submission, whose path they are given (the worst case)."""
    target = hub.submissions(victim)[-1]
    inbound = hub.exchange / "inbound"
    q = shlex.quote
    module = q(str(target / f"{ASSIGNMENT}.py"))
    tries = {
        "list inbound": f"ls {q(str(inbound))}",
        "read": f"cat {module}",
        "overwrite": f"echo 'def train_ddp(*a): pass' > {module}",
        "delete": f"rm -rf {q(str(target))}",
        "rename": f"mv {q(str(target))} {q(str(inbound / (intruder + '+' + ASSIGNMENT + '+stolen')))}",
    }
    before = (target / f"{ASSIGNMENT}.py").read_bytes()
    found = {what: hub.as_user(intruder, command) for what, command in tries.items()}
    found["unchanged"] = target.is_dir() and (target / f"{ASSIGNMENT}.py").read_bytes() == before
    return found


def at_anothers_home(hub: Hub, intruder: str, victim: str) -> dict:
    home = Path("/home") / victim
    return {"list": hub.as_user(intruder, f"ls {shlex.quote(str(home))}"),
            "read": hub.as_user(intruder, f"cat {shlex.quote(str(home / ASSIGNMENT / (ASSIGNMENT + '.py')))}"),
            "through the server": call(f"{hub.base}/user/{intruder}/api/contents/..%2F{victim}",
                                       hub.server_token(intruder))}


def with_anothers_token(hub: Hub, holder: str, other: str) -> dict:
    """``holder``'s server token (any code of ``holder``'s can read it) used on ``other``, and ``other``'s
    token read from ``holder``'s side."""
    token = hub.server_token(holder)
    base = hub.base
    return {
        "whoami": call(f"{base}/hub/api/user", token),
        "own server": call(f"{base}/user/{holder}/api/contents", token),
        "other's user": call(f"{base}/hub/api/users/{other}", token),
        "other's server": call(f"{base}/user/{other}/api/contents", token),
        "stop other's server": call(f"{base}/hub/api/users/{other}/server", token, method="DELETE"),
        "other's token": hub.as_user(holder, f"cat /proc/{hub.server_pid(other)}/environ"),
    }


def at_the_formgrader(hub: Hub, learner, teacher) -> dict:
    """The instructor's formgrader (a control: it lists the assignment), then a learner at it, and at the
    gradebook; ``learner`` and ``teacher`` are tests.helpers.hub_browser.Learner, logged in."""
    found = {}
    response = teacher.page.goto(f"{hub.base}/user/{INSTRUCTOR}/formgrader", timeout=ms(120))
    teacher.page.locator("tr", has_text=ASSIGNMENT).first.wait_for(timeout=ms(60))  # Manage Assignments' table
    found["teacher"] = (response.status, teacher.page.locator("body").inner_text())
    teacher.shot("formgrader")
    for what, whose in (("teacher's", INSTRUCTOR), ("own", learner.user)):
        response = learner.page.goto(f"{hub.base}/user/{whose}/formgrader", timeout=ms(120))
        found[what] = (response.status, learner.page.locator("body").inner_text())
        learner.shot(f"formgrader-of-{whose}")
    found["api"] = call(f"{hub.base}/user/{INSTRUCTOR}/formgrader/api/assignments", hub.server_token(learner.user))
    found["gradebook"] = hub.as_user(learner.user, f"cat {shlex.quote(str(hub.course / 'gradebook.db'))}")
    return found


def over_the_size_limit(hub: Hub, learner: str, kb: int) -> dict:
    """A file of ``kb`` kB in the learner's assignment folder: submitted through their server (the endpoint
    the Assignments tab's Submit calls), then handed in by hand, past nbgrader's own check."""
    big = Path("/home") / learner / ASSIGNMENT / "data.bin"
    made = hub.as_user(learner, f"head -c {kb * 1000} /dev/urandom > {shlex.quote(str(big))}")
    assert made.returncode == 0, made.stderr
    count = len(hub.submissions(learner))
    try:
        found = {"endpoint": call(f"{hub.base}/user/{learner}/assignments/submit", hub.server_token(learner),
                                  method="POST", body={"course_id": "distlab", "assignment_id": ASSIGNMENT})}
        found["by hand"] = craft(hub, learner, learner, now(), extra=f"cp {shlex.quote(str(big))} \"$d\"/;")
        found["kept"] = len(hub.submissions(learner)) == count
        return found
    finally:
        big.unlink(missing_ok=True)


def backdated(hub: Hub, learner: str) -> dict:
    """A submission made by hand, named and dated 2000-01-01 (long before any due date)."""
    return craft(hub, learner, learner, "2000-01-01 00:00:00.000000 UTC")


def now() -> str:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f UTC")
