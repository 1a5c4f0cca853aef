"""docker/hub/z2jh-values.yaml, the class on Kubernetes, checked as far as a machine without Kubernetes can.

* As helm checks it: merged over the chart's defaults (helm's rule: maps merge key by key, anything else is
  replaced, a null removes the key), then validated against the chart's schema. Both come from the chart's
  repository, vendored in tests/data/z2jh (its NOTICE says which commit): no chart can be downloaded here.
* Its Python (``hub.extraConfig``), run as the hub would run it, on a roster of two learners and an
  instructor: who may log in, each pod's uid, gid and fsGid, the command; and each role's settings equal to
  what docker/hub/jupyterhub_config.py's ``role_environment`` gives the same role on one machine, with the
  image's paths (a parity check between the two deployments).
* The paths it names in the image are the course's files.

Not checked: a real cluster (the pods, the volumes, the identity provider), KubeSpawner itself (not
installed here: its trait names are taken from its documentation), the sealer on NFS.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest
import yaml
from traitlets.config import Config

from tests.helpers import REPO

VALUES = REPO / "docker" / "hub" / "z2jh-values.yaml"
CHART = REPO / "tests" / "data" / "z2jh"
CODE = Path("/home/learner/distlab")  # the course's code in the image
ROSTER = {"alice": 2001, "bob": 2002, "teacher": 2003}


def helm_merge(base, override):
    """helm's coalescing of a values file over the chart's defaults."""
    if not (isinstance(base, dict) and isinstance(override, dict)):
        return override
    merged = dict(base)
    for key, value in override.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = helm_merge(base.get(key), value)
    return merged


def values() -> dict:
    return yaml.safe_load(VALUES.read_text())


def test_the_values_are_valid_for_the_charts_schema_over_its_defaults():
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    merged = helm_merge(defaults, values())
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(merged), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)


@pytest.fixture
def hub_config(tmp_path, monkeypatch):
    """``hub.extraConfig`` run as the hub runs it, on a roster in ``tmp_path``: ``(config, namespace)``."""
    (tmp_path / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n" + "".join(
        f"{name}:x:{uid}:{uid}::/home/{name}:/bin/bash\n" for name, uid in ROSTER.items()))
    (tmp_path / "group").write_text("root:x:0:\ndistlab-learners:x:3000:alice,bob\n"
                                    "distlab-instructors:x:3001:teacher\n")
    monkeypatch.setenv("DISTLAB_ROSTER", str(tmp_path))
    c = Config()
    namespace = {"c": c, "get_config": lambda: c}
    for name, code in values()["hub"]["extraConfig"].items():
        exec(compile(code, f"z2jh-values.yaml:hub.extraConfig.{name}", "exec"), namespace)
    return c, namespace


def spawner(name: str) -> SimpleNamespace:
    return SimpleNamespace(user=SimpleNamespace(name=name), environment={}, volumes=[], volume_mounts=[],
                           notebook_dir="~")


def test_the_roster_decides_who_logs_in_and_each_pods_own_uid(hub_config):
    c, _ = hub_config
    assert c.Authenticator.allowed_users == set(ROSTER)
    for name, uid in ROSTER.items():
        s = spawner(name)
        assert (c.KubeSpawner.uid(s), c.KubeSpawner.gid(s), c.KubeSpawner.fs_gid(s)) == (uid, uid, uid)
    assert c.KubeSpawner.extra_container_config == {"command": ["/usr/bin/env"]}
    assert values()["singleuser"]["cmd"] == [str(CODE / "docker/hub/singleuser.sh")]


def one_machine_role_environment(monkeypatch, instructors: set[str]):
    """docker/hub/jupyterhub_config.py's ``role_environment``, loaded as JupyterHub loads the file, with the
    Kubernetes deployment's course and exchange paths and the given instructors."""
    monkeypatch.setenv("DISTLAB_HUB_COURSE", "/srv/nbgrader/distlab")
    monkeypatch.setenv("DISTLAB_EXCHANGE", "/srv/nbgrader/exchange")
    monkeypatch.delenv("DISTLAB_HUB_SPAWNER", raising=False)
    monkeypatch.delenv("DISTLAB_HUB_MAX_SUBMISSION_KB", raising=False)
    path = REPO / "docker/hub/jupyterhub_config.py"
    namespace = {"get_config": Config, "__file__": str(path)}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    namespace["in_group"] = lambda name, group: (name in instructors) == (group == "distlab-instructors")
    return namespace["role_environment"]


@pytest.mark.parametrize("name", ["alice", "teacher"])
def test_each_role_gets_what_the_one_machine_hub_gives_it(hub_config, monkeypatch, name):
    _, namespace = hub_config
    on_k8s, on_one_machine = spawner(name), spawner(name)
    namespace["distlab_role"](on_k8s)
    one_machine_role_environment(monkeypatch, {"teacher"})(on_one_machine, code=CODE,
                                                           python=Path("/usr/local/python"))
    assert {k: on_k8s.environment[k] for k in on_one_machine.environment} == on_one_machine.environment
    assert on_k8s.environment["HOME"] == f"/home/{name}" and on_k8s.notebook_dir == on_one_machine.notebook_dir
    course_mounted = [m["mountPath"] for m in on_k8s.volume_mounts] == ["/srv/nbgrader/distlab"]
    assert course_mounted == (name == "teacher")  # the course directory: the instructor's pod only


def test_the_paths_it_names_in_the_image_are_the_courses_files():
    v = values()
    (sealer,) = v["hub"]["extraContainers"]
    in_image = [Path(p) for p in (*v["singleuser"]["cmd"], *sealer["command"]) if str(p).startswith(str(CODE))]
    assert in_image and all((REPO / p.relative_to(CODE)).is_file() for p in in_image), in_image
    assert sealer["image"] == f"{v['singleuser']['image']['name']}:{v['singleuser']['image']['tag']}"
    assert os.access(REPO / "docker/hub/singleuser.sh", os.X_OK)
