"""Make a collected submission gradable before ``nbgrader autograde``, and say what was wrong.

Learners' notebooks hold instructions and test cells; their work is the
exercise module beside it. So a broken notebook loses nothing if it is
replaced by the released one, and a broken module is still run (and fails
with its own message in the test cell). Each problem becomes one sentence in
a "Grader note" cell at the top of the notebook, which the learner reads in
their feedback, and one line for the instructor:

* notebook missing or not valid notebook JSON: the released notebook is put
  in its place (the original is kept as ``<name>.ipynb.rejected``);
* a test cell deleted: nbgrader puts it back (``OverwriteCells.add_missing_cells``);
* a test cell duplicated: only the first copy is kept (nbgrader would keep
  the last and still run the others: nbgrader issue #1083);
* a test cell edited: nbgrader grades the instructor's version;
* the exercise module missing: the test cell says so and the exercise scores 0.

Repairing twice changes nothing more: the note cell is rewritten, not added.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
from nbformat.v4 import new_markdown_cell

NOTE_KEY = "distlab_grader_note"


def _grade_id(cell) -> str | None:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return meta.get("grade_id") if meta.get("grade") else None


def _read(path: Path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    return nb


def repair_notebook(path: Path, released: Path) -> list[str]:
    """Repair the submitted notebook ``path`` against its ``released`` version; return the notes."""
    notes: list[str] = []
    rejected = path.with_name(path.name + ".rejected")
    if not path.exists():
        notes.append(f"{path.name} was not in your submission: your module was graded with the released "
                     "notebook.")
        shutil.copy(released, path)
    try:
        nb = _read(path)
    except Exception as exc:  # nbformat raises several types for bad JSON and bad structure
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        notes.append(f"{path.name} could not be read as a notebook ({first}); your module was graded "
                     f"with the released notebook, and your file is kept as {rejected.name}.")
        shutil.move(path, rejected)
        shutil.copy(released, path)
        nb = _read(path)
    reference = {_grade_id(c): c.source for c in _read(released).cells if _grade_id(c)}
    old_notes = [n for c in nb.cells if c.metadata.get(NOTE_KEY) for n in c.metadata[NOTE_KEY]]
    seen: set[str] = set()
    kept = []
    for cell in nb.cells:
        if cell.metadata.get(NOTE_KEY):
            continue
        gid = _grade_id(cell)
        if gid in seen:
            notes.append(f"the test cell '{gid}' appeared more than once: only the first copy was graded.")
            continue
        if gid:
            seen.add(gid)
            if gid in reference and cell.source != reference[gid]:
                notes.append(f"the test cell '{gid}' was edited: the original was graded.")
        kept.append(cell)
    for gid in reference:
        if gid not in seen:
            notes.append(f"the test cell '{gid}' was deleted: the original was put back and graded.")
    notes = list(dict.fromkeys(old_notes + notes))
    if notes:
        text = "**Grader note** (your notebook was repaired before grading; nothing you wrote was lost):\n\n"
        note = new_markdown_cell(text + "\n".join(f"- {n}" for n in notes), metadata={NOTE_KEY: notes})
        kept.insert(0, note)
    if notes or len(kept) != len(nb.cells):
        nb.cells = kept
        nbformat.write(nb, path)
    return notes


def repair_submission(submission: Path, release: Path, modules: list[str]) -> list[str]:
    """Repair every released notebook of one learner's submitted assignment; return all notes."""
    notes = []
    for released in sorted(release.glob("*.ipynb")):
        notes += repair_notebook(submission / released.name, released)
    for name in modules:
        if not (submission / name).is_file():
            notes.append(f"{name} was not in your submission: the exercise scores 0.")
    return notes


def repair_course(course_dir: Path, assignments: dict[str, list[str]],
                  student: str | None = None) -> dict[tuple[str, str], list[str]]:
    """Repair ``submitted/<student>/<assignment>/`` for every assignment; ``{(student, assignment): notes}``."""
    found = {}
    for assignment, modules in assignments.items():
        release = course_dir / "release" / assignment
        for submission in sorted((course_dir / "submitted").glob(f"{student or '*'}/{assignment}")):
            if submission.is_dir() and release.is_dir():
                notes = repair_submission(submission, release, modules)
                if notes:
                    found[(submission.parent.name, assignment)] = notes
    return found
