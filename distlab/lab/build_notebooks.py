"""Build the course's notebooks from their jupytext sources: ``python -m distlab.lab.build_notebooks SOURCE...``
(``make notebooks`` and the learner image's entrypoint run it).

A source (``course/01_ddp.py``, py:percent, paired with ``ipynb``) becomes ``course/01_ddp.ipynb``. A notebook
already built keeps its outputs (jupytext's ``--update``): a learner's run survives a rebuild.

The built notebook also carries the metadata JupyterLab would otherwise write into it the moment a kernel
starts: the kernelspec as this environment's kernel names it ("Python 3 (ipykernel)", where the sources say
"Python 3") and the kernel's ``language_info`` (its Python's version). Without them a notebook shows as modified
as soon as it is opened, and closing it asks to save changes the learner never made. ``language_info`` is
this machine's, which is why it is written here and not kept in the sources.
"""
from __future__ import annotations

import sys
from pathlib import Path

import jupytext
import nbformat

KERNEL = "python3"


def kernel_metadata(name: str = KERNEL) -> dict:
    """``{"kernelspec": ..., "language_info": ...}`` as the kernel ``name`` of this environment reports them
    when JupyterLab starts it (ipykernel's own ``language_info``; no kernel is started here)."""
    from ipykernel.ipkernel import IPythonKernel
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec(name)
    return {"kernelspec": {"name": name, "display_name": spec.display_name, "language": spec.language},
            "language_info": dict(IPythonKernel.language_info)}


def build(source: Path, metadata: dict) -> Path:
    """Write ``source``'s notebook beside it, keeping the outputs of the one already there; return its path."""
    notebook = jupytext.read(source)
    target = source.with_suffix(".ipynb")
    if target.exists():
        # jupytext --update: the inputs (and cell order) from the source, the outputs from the built notebook
        from jupytext.combine import combine_inputs_with_outputs

        notebook = combine_inputs_with_outputs(notebook, nbformat.read(target, as_version=4), fmt="py:percent")
    notebook.metadata.update(metadata)
    jupytext.write(notebook, target)
    return target


def main(argv: list[str] | None = None) -> int:
    sources = [Path(a) for a in (sys.argv[1:] if argv is None else argv)]
    missing = [str(s) for s in sources if not s.is_file()]
    if not sources or missing:
        print(f"usage: python -m distlab.lab.build_notebooks SOURCE.py...; not a file: {', '.join(missing)}"
              if missing else "usage: python -m distlab.lab.build_notebooks SOURCE.py...", file=sys.stderr)
        return 2
    metadata = kernel_metadata()
    for source in sources:
        build(source, metadata)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
