"""Every notebook runs top to bottom (built from its jupytext source, executed with nbclient)."""
from __future__ import annotations

import jupytext
import nbclient
import pytest

from tests.helpers import REPO

NOTEBOOKS = sorted((REPO / "course").glob("[0-9][0-9]_*.py"))


@pytest.mark.parametrize("source", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(source):
    nb = jupytext.read(source)
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                                     resources={"metadata": {"path": str(source.parent)}})
    client.execute()  # raises CellExecutionError, naming the cell, on the first error
    errors = [o for cell in nb.cells for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    assert errors == []
