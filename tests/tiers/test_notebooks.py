"""Every notebook runs top to bottom (built from its jupytext source, executed with nbclient).

Through ``tests/helpers/notebook_exec.py``: nbclient without its lost wake-up (issue 24: a widget cell
whose ``execute_reply`` sat unread in the client's socket while the kernel was idle), each cell
under its own hang guard, well under the notebook's, and a hang reported as where and why:
"03_mixed_precision cell 4 (line 63, ...): not complete after 90 s (its hang guard); kernel idle (...);
client waiting for execute_reply, ...", then the kernel's and the client's stacks.
"""
from __future__ import annotations

import re

import jupytext
import pytest
from nbclient.exceptions import CellExecutionError

from tests.helpers import REPO
from tests.helpers.notebook_exec import NOTEBOOK_GLOB, Cell, CellHang, cell_lines, execute

pytestmark = [pytest.mark.notebook, pytest.mark.slow]

NOTEBOOKS = sorted((REPO / "course").glob(NOTEBOOK_GLOB))
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Hang guards, not speed limits (both x DISTLAB_TIME_SCALE). Measured on 2 cores: the slowest cell
# of the course takes 12 s (09's first launch) and the slowest notebook 20 s, so a stuck cell is
# named after CELL_TIMEOUT, long before pytest-timeout would stop the notebook without saying where.
CELL_TIMEOUT = 90
NOTEBOOK_TIMEOUT = 300


def _describe(source, nb, index: int, error: dict) -> str:
    """Which notebook, which cell (its number and first line), the error and the end of its traceback."""
    cell = nb.cells[index]
    first = next((ln for ln in cell.source.splitlines() if ln.strip()), "")
    tb = [ANSI.sub("", ln) for ln in error.get("traceback", [])]
    tail = "\n".join("\n".join(tb).splitlines()[-12:])
    # where the cell starts in the jupytext source, when every cell has its "# %%" marker
    line = cell_lines(source, nb)[index]
    where = f"{source.name} line {line}" if line else source.name
    return (f"{where}: cell {index} (execution count {cell.get('execution_count')}, starting "
            f"{first!r}) raised {error.get('ename')}: {error.get('evalue')}\n{tail}")


@pytest.mark.timeout(NOTEBOOK_TIMEOUT)
@pytest.mark.parametrize("source", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(source, tmp_path):
    nb = jupytext.read(source)
    lines = cell_lines(source, nb)

    def label(index: int) -> str:
        return Cell(source, index, nb.cells[index].source, lines[index]).where()

    try:  # stops at the first cell that raises; its error output is in nb by then
        execute(nb, name=source.stem, cell_timeout=lambda cell, index: CELL_TIMEOUT, cwd=source.parent,
                label=label, workdir=tmp_path)
    except CellHang as hang:
        pytest.fail(str(hang), pytrace=False)
    except CellExecutionError as exc:
        raised = exc
    else:
        raised = None
    errors = [(i, o) for i, cell in enumerate(nb.cells) for o in cell.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, "\n\n".join(_describe(source, nb, i, o) for i, o in errors)
    assert raised is None, f"{source.name}: {raised}"  # raised without an error output: say what nbclient said
