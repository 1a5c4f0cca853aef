"""Exercise 11's dispatch and combine on float64 rows (``probes._widened``): each returns rows in its input's dtype.

The graded step runs in float32, torch's default dtype, where a buffer made with ``torch.zeros(n, h)`` or
``torch.empty(n, h)`` (no ``dtype=``) is right by chance; a bf16 or float64 layer then fails, and on a GPU such a
buffer is on the CPU. Each function was run again after the step, where it was right on every rank; where it was
wrong, its rows' criterion says so, and this one does not judge it (one mistake, one criterion).
"""
from __future__ import annotations

from ...grader.report import Verdict, criterion, failed, passed
from .observations import Run

__all__ = ["keeps_dtype"]


@criterion("[W={world}] dispatch and combine return rows in their input's dtype", points=1)
def keeps_dtype(run: Run) -> Verdict:
    unjudged = []
    for name, rows in (("dispatch", "x_slots"), ("combine", "y_recv")):
        said = {o.rank: o.wide.get(name) for o in run.ranks}
        if any(v is None for v in said.values()):  # its rows were wrong: that criterion, not this one, says so
            unjudged.append(name)
            continue
        r, got = next(((r, v) for r, v in said.items() if v != "float64"), (None, None))
        if r is None:
            continue
        if got.startswith("raised "):
            return failed(f"given float64 {rows}, rank {r}'s {name} {got}: the rows it returns are its input's, in "
                          "their dtype")
        default = ", torch's default dtype," if got == "float32" else ""
        return failed(f"given float64 {rows}, rank {r}'s {name} returned {got} rows{default} not float64: a buffer "
                      f"made without dtype= (torch.zeros(n, h)) takes the default; make it from the input "
                      f"({rows}.new_zeros(...), torch.zeros_like) so that it has the input's dtype and device")
    judged = [n for n in ("dispatch", "combine") if n not in unjudged]
    return passed((f"float64 rows in, float64 rows out, in {' and '.join(judged)}" if judged else "") +
                  ("; " if judged and unjudged else "") +
                  (f"{' and '.join(unjudged)} not run again on float64 rows: its float32 rows were wrong, which "
                   "its own criterion says" if unjudged else ""))
