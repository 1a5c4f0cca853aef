"""nbgrader configuration of the distlab course; this folder is the course root.

Run nbgrader here, or use ``python -m autograder.nbgrader`` which does.
``source/`` and ``assignments.json`` are generated from the registry and
``solutions/`` (``python -m autograder.nbgrader generate``), one assignment
per exercise; ``release/``, ``submitted/``, ``autograded/``, ``feedback/``,
``gradebook.db`` and ``grades.csv`` are the class's data, not the
repository's (``.gitignore`` here). The exchange is ``$DISTLAB_EXCHANGE``
(default ``/srv/nbgrader/exchange``).
"""
import json
import os
from pathlib import Path

c = get_config()  # noqa: F821  (nbgrader provides it when it loads this file)
here = Path(__file__).resolve().parent
manifest = here / "assignments.json"  # written by `generate`; read here so nbgrader need not import torch
spec = json.loads(manifest.read_text()) if manifest.is_file() else {}

c.CourseDirectory.root = str(here)
c.CourseDirectory.course_id = os.environ.get("DISTLAB_COURSE_ID", "distlab")
c.Exchange.root = os.environ.get("DISTLAB_EXCHANGE", "/srv/nbgrader/exchange")

# A test cell grades one exercise in a subprocess limited to that exercise's
# time_limit; the cell's own limit is above it, so the subprocess stops first
# with a clear message. Either way only that cell scores 0.
c.Execute.timeout = spec.get("cell_timeout_s", 300)
# The learner's module (exNN_name.py) is graded as submitted, not replaced by the released stub.
c.Autograde.exclude_overwriting = spec.get("exclude_overwriting", {})
# A deleted test cell is put back from the instructor's copy and graded (nbgrader issue #1682).
c.OverwriteCells.add_missing_cells = True
