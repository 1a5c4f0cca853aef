"""Every notebook runs top to bottom (built from its jupytext source, executed with nbclient)."""
from __future__ import annotations

import re

import jupytext
import nbclient
import pytest
from nbclient.exceptions import CellExecutionError

from distlab.launch import time_scale
from tests.helpers import REPO

pytestmark = [pytest.mark.notebook, pytest.mark.slow]

NOTEBOOKS = sorted((REPO / "course").glob("[0-9][0-9]_*.py"))
ANSI = re.compile(r"\x1b\[[0-9;]*m")
CELL_MARKER = re.compile(r"# %%( |$)")


def _describe(source, nb, index: int, error: dict) -> str:
    """Which notebook, which cell (its number and first line), the error and the end of its traceback."""
    cell = nb.cells[index]
    first = next((ln for ln in cell.source.splitlines() if ln.strip()), "")
    tb = [ANSI.sub("", ln) for ln in error.get("traceback", [])]
    tail = "\n".join("\n".join(tb).splitlines()[-12:])
    # where the cell starts in the jupytext source, when every cell has its "# %%" marker
    # ("# %%torchrun" and "# %%time" are cell magics inside a cell, not markers)
    markers = [n for n, ln in enumerate(source.read_text().splitlines(), 1) if CELL_MARKER.match(ln)]
    where = f"{source.name} line {markers[index]}" if len(markers) == len(nb.cells) else source.name
    return (f"{where}: cell {index} (execution count {cell.get('execution_count')}, starting "
            f"{first!r}) raised {error.get('ename')}: {error.get('evalue')}\n{tail}")


@pytest.mark.parametrize("source", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(source):
    nb = jupytext.read(source)
    # A hang guard, not a speed limit: scaled like every launch's (DISTLAB_TIME_SCALE).
    client = nbclient.NotebookClient(nb, timeout=int(240 * time_scale()), kernel_name="python3",
                                     resources={"metadata": {"path": str(source.parent)}})
    try:
        client.execute()  # stops at the first cell that raises; its error output is in nb by then
    except CellExecutionError as exc:
        raised = exc
    else:
        raised = None
    errors = [(i, o) for i, cell in enumerate(nb.cells) for o in cell.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, "\n\n".join(_describe(source, nb, i, o) for i, o in errors)
    assert raised is None, f"{source.name}: {raised}"  # raised without an error output: say what nbclient said
