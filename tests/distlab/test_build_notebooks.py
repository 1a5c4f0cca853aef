"""``python -m distlab.lab.build_notebooks`` (``make notebooks``): a built notebook carries the kernel's metadata,
so JupyterLab opens it unmodified, and a rebuild keeps the outputs of a notebook already run."""
from __future__ import annotations

import json
import re

import nbformat
import pytest

from distlab.lab.build_notebooks import build, kernel_metadata, main
from tests.helpers import REPO

SOURCES = sorted((REPO / "course").glob("[0-9]*.py"))


def test_built_notebook_has_the_kernels_metadata_and_a_rebuild_keeps_outputs(tmp_path):
    source = tmp_path / "01_demo.py"
    source.write_text((REPO / "course" / "00_why_distribute.py").read_text())
    metadata = kernel_metadata()
    notebook = build(source, metadata)
    built = json.loads(notebook.read_text())
    assert built["metadata"]["kernelspec"] == metadata["kernelspec"]
    assert built["metadata"]["language_info"] == metadata["language_info"]

    run = nbformat.read(notebook, as_version=4)
    code = next(i for i, c in enumerate(run.cells) if c.cell_type == "code")
    run.cells[code].outputs = [nbformat.v4.new_output("stream", name="stdout", text="a learner's run\n")]
    nbformat.write(run, notebook)
    source.write_text(source.read_text() + "\n# %%\nprint('a cell added upstream')\n")
    rebuilt = nbformat.read(build(source, metadata), as_version=4)
    assert rebuilt.cells[code].outputs[0]["text"] == "a learner's run\n"
    assert "a cell added upstream" in rebuilt.cells[-1].source


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_every_source_names_the_kernel_as_the_kernel_does(source):
    """jupytext takes the kernelspec from the paired source when JupyterLab opens the notebook: a name that
    differs from the kernel's own would be rewritten at once, marking the notebook modified."""
    header = source.read_text().split("# ---", 2)[1]
    name = re.search(r"display_name: (.+)", header).group(1).strip()
    assert name == kernel_metadata()["kernelspec"]["display_name"]


def test_a_missing_source_is_one_line_and_exit_2(tmp_path, capsys):
    assert main([str(tmp_path / "nope.py")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope.py" in err
