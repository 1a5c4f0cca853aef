"""ruff, the version requirements.txt pins, on the whole repository with pyproject.toml's config
(pyflakes and pycodestyle; what the notebooks and the generated stubs are allowed, and why, is there)."""
from __future__ import annotations

import re
import subprocess

from tests.helpers import REPO, pinned_tool


def _ruff() -> str:
    return pinned_tool("ruff", "ruff")


def test_ruff_is_the_pinned_version():
    pinned = re.search(r"^ruff==(\S+)$", (REPO / "requirements.txt").read_text(), flags=re.M)
    assert pinned, "requirements.txt does not pin ruff"
    version = subprocess.run([_ruff(), "--version"], capture_output=True, text=True, timeout=60, check=True)
    assert version.stdout.split() == ["ruff", pinned.group(1)]


def test_ruff_check_passes():
    # --no-cache: nothing written into the tree; ruff reads pyproject.toml and skips what .gitignore does
    done = subprocess.run([_ruff(), "check", "--no-cache", "--output-format=concise", "."], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"ruff check (see [tool.ruff] in pyproject.toml):\n{done.stdout}{done.stderr}"
