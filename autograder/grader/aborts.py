"""What a rank that a signal killed was doing, read from the job's output: issue 37's "a native abort is
translated with what the ranks were doing".

A rank that gloo aborts (``SIGABRT``, at times ``SIGSEGV``: a message longer than the buffer that receives
it, a collective of unequal pieces) raises no Python exception, so the launcher can only say that it was
killed. Two things it printed say more, and both are facts of the run:

* gloo's own message, before ``abort()``: ``[enforce fail at .../pair.cc:456] op.preamble.length <=
  op.nbytes. 8192 vs 4096`` (the bytes that arrived, the bytes the buffer holds);
* the Python stack of the aborting thread, which ``faulthandler`` prints (torch elastic enables it in every
  rank): the innermost frame in the learner's file is the line that was receiving.

Each is used only where the output holds exactly one of it: two ranks aborting at once interleave theirs.
"""
from __future__ import annotations

import ast
import linecache
import re
from pathlib import Path

# gloo's tcp pair, a message longer than the receive buffer posted for it
_TOO_LONG = re.compile(r"op\.preamble\.length <= op\.nbytes\. (\d+) vs (\d+)")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<fn>\S+)\s*$')
_FATAL = re.compile(r"Fatal Python error: (Aborted|Segmentation fault)")  # what faulthandler says of each


def abort_details(output: str, path: Path) -> str:
    """The learner's line a rank aborted at (and the ``if`` on the rank it is inside, where it is a collective),
    and what gloo said of the message (``""``: nothing certain)."""
    lines = output.splitlines()
    where = _learner_line(lines, path) if sum(bool(_FATAL.search(line)) for line in lines) == 1 else ""
    sizes = [m for line in lines for m in _TOO_LONG.finditer(line)]
    said = ""
    if len(sizes) == 1:
        got, room = (int(g) for g in sizes[0].groups())
        said = (f"\n  gloo received a message of {got:,} bytes into a buffer of {room:,} bytes and aborted the "
                "process: a send and its receive, and a collective on every rank, move tensors of one size")
    return where + said


def _learner_line(lines: list[str], path: Path) -> str:
    """``"\\n  at ex07_pipeline.py line 140 in one_f_one_b_step: dist.recv(...)"``: the innermost frame in the
    learner's file of the aborting rank's stack (faulthandler prints the most recent call first)."""
    start = next(i for i, line in enumerate(lines) if _FATAL.search(line))
    target = Path(path).resolve()
    linecache.checkcache(str(target))  # a file graded again in this process may have changed since
    for line in lines[start + 1:]:
        m = _FRAME.match(line)
        if m and Path(m["file"]).resolve() == target:
            code = linecache.getline(str(target), int(m["line"])).strip()
            return (f"\n  at {target.name} line {m['line']} in {m['fn']}" + (f": {code}" if code else "")
                    + rank_guard(target, int(m["line"])))
    return ""


# A collective's call in a line of source (not a send or a receive, which run on some ranks by design)
_COLLECTIVE = re.compile(r"\b(all_reduce|all_gather\w*|reduce_scatter\w*|broadcast\w*|barrier|all_to_all\w*|"
                         r"gather|scatter|reduce)\s*\(")


def rank_guard(target: Path, line: int) -> str:
    """Where line ``line`` of ``target`` calls a collective inside an ``if`` whose test reads the rank (``if rank
    == 0:``): that fact, from the learner's source (``""`` where it does not)."""
    if not _COLLECTIVE.search(linecache.getline(str(target), line)):
        return ""
    try:
        source = target.read_text()
        tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError):
        return ""
    guards = [node for node in ast.walk(tree) if isinstance(node, ast.If) and node.test.lineno < line
              <= node.end_lineno and "rank" in (ast.get_source_segment(source, node.test) or "")]
    if not guards:
        return ""
    guard = max(guards, key=lambda node: node.lineno)  # the innermost
    return (f"\n  that collective is inside `if {ast.get_source_segment(source, guard.test)}:` (line "
            f"{guard.lineno}): only the ranks that test lets through call it, and on them it meets whatever "
            "collective the others make next")
