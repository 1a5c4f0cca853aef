"""Feedback measured on mistakes nobody listed: mutants generated from the reference solutions' lines.

The checks' tests hold the *anticipated* mistakes to their messages; this measures the others. For each
line of each graded function of ``solutions/exNN_*.py`` (inside its solution block), one plausible edit,
the kind a learner makes (mutation testing's operators, DeMillo, Lipton and Sayward 1978, and
"are mutants a valid substitute for real faults", Just et al. 2014):

* a numeric or boolean literal changed to a neighbouring legal value (``1 -> 2``, ``0.1 -> 0.2``,
  ``True -> False``);
* otherwise, on odd lines, the statement moved one statement down (swapped with the next, both single lines);
* otherwise the line dropped (``pass`` in its place, so the line numbers stay the learner's).

Edits that do not parse or leave the function's AST unchanged are skipped. Each exercise's mutants are
graded in one ``grade`` call (``divergence.grade``: with the first divergence where no cause is named).
A mutant that still earns full marks is *not caught* (an equivalent mutant, or a gap in the check).
Of the caught ones, the rows give the share whose feedback names the edited line (``file:L`` or
``line L``), and the share that names the line, a declared cause (a check's table), or shows the error the
edit raised at the learner's line where it surfaced (a dropped assignment: the ``NameError`` where the
name is used), or the first divergence from the reference at a learner's line (a dropped ``backward()``:
"your code stepped the optimizer (line 70) where the reference called backward()"). Only the first is
strict; the others say what went wrong and where it showed, not always the edited line.

A third row counts the messages, over all the mutants, that advise a step the file's trace shows was taken
(:func:`autograder.grader.advice.violations`: "call sampler.set_epoch(epoch)" where it was called), or state
what the trace or the file contradicts (:func:`autograder.grader.facts.contradictions`: "scaler.update() was
never called" where it was, a line quoted with code it does not hold); the goal is none.

A second family, ``benchmarks/realistic/`` (issue 37), is mistakes people make, each with its source, written
by someone who had not read the checks, and correct solutions in other legal styles. Its rows: the wrong
solutions at full marks (goal 0), the caught ones whose feedback names them (as above; goal 90%), the legal
variants short of full marks (goal 0), and the advice about steps the trace shows were taken (goal 0).

``python -m benchmarks feedback`` (minutes: exercise 5's mutants run its fresh-job and reshard scenarios only).
``DISTLAB_BENCH_EXERCISES=5,7`` restricts the exercises, ``DISTLAB_BENCH_FAMILY=lines|realistic`` the family,
and ``DISTLAB_BENCH_KEEP=DIR`` writes each realistic mutant's feedback to ``DIR/exNN.md``.
"""
from __future__ import annotations

import ast
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks import Row

MARKS = ("### BEGIN SOLUTION", "### END SOLUTION")
SIMPLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Return)
# What a grading of each exercise's line edits passes to its check: exercise 5's restarts cost a launch per
# file (the fresh job and the reshard ride in launches the files share), ~3 s for each of its 47 edits. The
# realistic family runs every scenario: three of its mistakes show only under the restarts' kills.
GRADE_KWARGS = {5: {"scenarios": ("fresh", "reshard")}}


@dataclass(frozen=True)
class Mutant:
    """One edit of a solution: its source, the lines it touched (the learner's numbering), and what it did."""

    source: str
    lines: tuple[int, ...]
    edit: str


def _solution_span(lines: list[str]) -> list[tuple[int, int]]:
    """The 1-based line ranges inside ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` blocks."""
    spans, start = [], None
    for i, ln in enumerate(lines, 1):
        if MARKS[0] in ln:
            start = i
        elif MARKS[1] in ln and start is not None:
            spans.append((start, i))
            start = None
    return spans


def _statements(tree: ast.AST):
    """Every statement list in ``tree`` (bodies, else branches...), so siblings can be swapped."""
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def _literal_edit(line: str, st: ast.stmt) -> str | None:
    """The line with its first numeric or boolean literal changed to a neighbouring legal value."""
    for node in ast.walk(st):
        if isinstance(node, ast.Constant) and node.lineno == st.lineno == node.end_lineno:
            v = node.value
            if isinstance(v, bool):
                new = repr(not v)
            elif isinstance(v, int):
                new = repr(v + 1)
            elif isinstance(v, float):
                new = repr(v * 2 if v else 1e-3)
            else:
                continue
            a, b = node.col_offset, node.end_col_offset
            return line[:a] + new + line[b:]
    return None


def mutants(solution: Path) -> list[Mutant]:
    """One edit per statement line of the solution blocks of ``solution`` (see the module's docstring)."""
    src = solution.read_text()
    lines, tree = src.splitlines(), ast.parse(src)
    spans = _solution_span(lines)
    original = ast.dump(tree)
    out: list[Mutant] = []
    for block in _statements(tree):
        for k, st in enumerate(block):
            if not isinstance(st, SIMPLE) or not any(a < st.lineno < b for a, b in spans):
                continue
            edited, touched, what = list(lines), (st.lineno,), ""
            literal = _literal_edit(lines[st.lineno - 1], st)
            nxt = block[k + 1] if k + 1 < len(block) else None
            if literal is not None:
                edited[st.lineno - 1], what = literal, "literal changed"
            elif st.lineno % 2 and isinstance(nxt, SIMPLE) and st.lineno == st.end_lineno \
                    and nxt.lineno == nxt.end_lineno:
                a, b = st.lineno - 1, nxt.lineno - 1
                edited[a], edited[b] = lines[b], lines[a]
                touched, what = (st.lineno, nxt.lineno), "moved down"
            else:
                indent = re.match(r"\s*", lines[st.lineno - 1]).group()
                edited[st.lineno - 1] = indent + "pass"
                for j in range(st.lineno, st.end_lineno):
                    edited[j] = ""
                what = "dropped"
            source = "\n".join(edited) + "\n"
            try:
                if ast.dump(ast.parse(source)) == original:
                    continue
            except SyntaxError:
                continue
            out.append(Mutant(source, touched, f"line {st.lineno} {what}: {lines[st.lineno - 1].strip()[:60]}"))
    return out


def names_line(feedback: str, filename: str, lines: tuple[int, ...]) -> bool:
    """Whether ``feedback`` points at one of the edited ``lines`` of the learner's file."""
    return any(f"{filename}:{n}" in feedback or f"{filename} line {n} " in feedback or f"(line {n}: " in feedback
               for n in lines)  # the harness's frames, the divergence's, and exercise 3's "(line N: code)


def _grade(check, paths: list[Path], kept: dict, **kwargs) -> list:
    """All in one call; where a check's launch cannot survive one file that raises (it raises for the batch),
    one call per file, each launch error explained as ``grader.main`` does."""
    from autograder.grader import divergence
    from autograder.grader.main import explain
    from distlab import LaunchError

    try:
        return divergence.grade(check, paths, kept=kept, **kwargs)
    except LaunchError:
        pass
    reports = []
    for path in paths:
        try:
            reports += divergence.grade(check, [path], kept=kept, **kwargs)
        except LaunchError as exc:
            reports.append(check.EXERCISE.new_report().did_not_run(
                explain(exc, path, getattr(check, "KNOWN_ERRORS", ()))))
    return reports


def graded(number: int, found: list[Mutant] | None = None,
           every_scenario: bool = False) -> tuple[Path, list[Mutant], list, dict]:
    """Exercise ``number``'s mutants (default: every generated one), graded in one ``grade`` call: the
    solution's path, the mutants, their reports and, for each, its advice about steps its trace shows were taken
    (:func:`autograder.grader.advice.violations`) and its statements that the run or the file contradicts
    (:func:`autograder.grader.facts.contradictions`)."""
    from autograder.grader import divergence
    from autograder.grader.advice import violations
    from autograder.grader.facts import contradictions
    from autograder.grader.registry import check_module

    check = check_module(number)
    solution = divergence.solution_path(check)
    found = mutants(solution) if found is None else found
    with tempfile.TemporaryDirectory(prefix=f"ex{number:02d}-mutants-") as tmp:
        paths = []
        for i, m in enumerate(found):
            (Path(tmp) / str(i)).mkdir()
            paths.append(Path(tmp) / str(i) / solution.name)
            paths[-1].write_text(m.source)
        kept: dict = {}
        reports = _grade(check, paths, kept, **({} if every_scenario else GRADE_KWARGS.get(number, {})))
        wrong = {i: violations(r, kept.get(str(p), [])) + contradictions(r, kept.get(str(p), []), found[i].source,
                                                                          solution.name)
                 for i, (p, r) in enumerate(zip(paths, reports))}
    return solution, found, reports, wrong


def how_named(m: Mutant, report, filename: str) -> str | None:
    """How a caught mutant's feedback names it: ``line`` (the edited line), ``cause`` (a declared cause),
    ``error_line`` (the error the edit raised, at a line of the learner's), ``divergence`` (the first divergence
    from the reference), or ``None``."""
    from autograder.grader.diagnosis import named

    if names_line(report.feedback, filename, m.lines):
        return "line"
    if named(report.feedback):
        return "cause"
    if re.search(rf"raised .*({re.escape(filename)}:|\bline )\d+", report.feedback, flags=re.S):
        return "error_line"
    return "divergence" if "first difference" in report.feedback else None


def measure(number: int, keep: Path | None = None) -> dict:
    """Grade every generated mutant of exercise ``number`` in one ``grade`` call; the counts."""
    solution, found, reports, advice = graded(number)
    wrong = [v for vs in advice.values() for v in vs]
    caught = [(m, r) for m, r in zip(found, reports) if not r.passed and not r.not_graded]
    kinds = [how_named(m, r, solution.name) for m, r in caught]
    if keep is not None:
        keep.write_text("\n\n".join(f"## {m.edit}\n{r.feedback}" for m, r in zip(found, reports))
                        + "\n\n## advice about steps taken\n" + "\n".join(wrong))
    return {"mutants": len(found), "caught": len(caught), **{k: kinds.count(k) for k in
                                                              ("line", "cause", "error_line", "divergence")},
            "violations": len(wrong), "violation_examples": wrong[:3]}


def rows() -> list[Row]:
    """The line-edit family's rows, then the realistic family's (``DISTLAB_BENCH_FAMILY=lines`` or ``realistic``
    for one of them)."""
    family = os.environ.get("DISTLAB_BENCH_FAMILY", "")
    return (line_edit_rows() if family in ("", "lines") else []) + (
        realistic_rows() if family in ("", "realistic") else [])


def _numbers(available) -> list[int]:
    wanted = os.environ.get("DISTLAB_BENCH_EXERCISES")
    return [int(n) for n in wanted.split(",") if int(n) in available] if wanted else sorted(available)


def line_edit_rows() -> list[Row]:
    from autograder.grader.registry import exercises

    out = []
    for n in _numbers(exercises()):
        got = measure(n)
        caught = max(got["caught"], 1)
        named = got["line"] + got["cause"] + got["error_line"] + got["divergence"]
        note = (f"{got['caught']} of {got['mutants']} generated mutants caught; of them {got['line']} name the "
                f"edited line, {got['cause']} a declared cause, {got['error_line']} an error at another line of "
                f"theirs, {got['divergence']} a first divergence at another line")
        out += [Row("feedback", f"ex{n:02d}: caught mutants whose feedback names the edited line",
                    100 * got["line"] / caught, "%", note),
                Row("feedback", f"ex{n:02d}: ... the line, a declared cause, or an error or divergence at a line",
                    100 * named / caught, "%", "goal of issue 25: >= 80%"),
                Row("feedback", f"ex{n:02d}: messages advising a step taken or stating what the run contradicts",
                    got["violations"],
                    "messages", "goal of issue 25: 0 (autograder.grader.advice); first: "
                    + ("; ".join(got["violation_examples"]) or "none"))]
    return out


# -- the realistic family (benchmarks/realistic/): mistakes people make, written blind to the checks ---------
def _edited_lines(original: str, edited: str) -> tuple[int, ...]:
    """The 1-based lines of ``edited`` that the edit wrote (what a message naming the edited line points at)."""
    import difflib

    matcher = difflib.SequenceMatcher(a=original.splitlines(), b=edited.splitlines(), autojunk=False)
    return tuple(j + 1 for tag, _, _, j1, j2 in matcher.get_opcodes() if tag != "equal" for j in range(j1, j2)) \
        or (1,)


def realistic(number: int) -> dict:
    """Grade exercise ``number``'s realistic mistakes and legal variants in one ``grade`` call; the counts and
    the names of those that went wrong (a mistake at full marks, a legal variant short of them)."""
    from benchmarks.realistic import family, solution

    mistakes, legal = family()[number]
    original = solution(number).read_text()
    found = [Mutant(m.apply(original), _edited_lines(original, m.apply(original)), m.name) for m in mistakes + legal]
    path, found, reports, advice = graded(number, found, every_scenario=True)
    wrong = [(m, f, r) for m, f, r in zip(mistakes, found, reports) if not r.not_graded]
    caught = [(m, f, r) for m, f, r in wrong if not r.passed]
    return {"mistakes": len(mistakes), "graded": len(wrong), "caught": [m.name for m, _, _ in caught],
            "full_marks": [m.name for m, _, r in wrong if r.passed],
            "named": [m.name for m, f, r in caught if how_named(f, r, path.name)],
            "key_terms": [m.name for m, _, r in caught if all(t.lower() in r.feedback.lower() for t in m.key_terms)],
            "not_graded": [m.name for m, r in zip(mistakes, reports) if r.not_graded],
            "legal": len(legal), "legal_short": [m.name for m, r in zip(legal, reports[len(mistakes):])
                                                 if not r.passed],
            "violations": [v for i in range(len(mistakes)) for v in advice.get(i, [])],
            "feedback": {m.name: r.feedback for m, r in zip(mistakes + legal, reports)}}


def realistic_rows() -> list[Row]:
    from benchmarks.realistic import family

    out, keep = [], os.environ.get("DISTLAB_BENCH_KEEP")
    for n in _numbers(family()):
        got = realistic(n)
        if keep:  # every report's feedback, to read what each mistake was told
            Path(keep).mkdir(parents=True, exist_ok=True)
            (Path(keep) / f"ex{n:02d}.md").write_text(
                "\n\n".join(f"## {name}\n{text}" for name, text in got["feedback"].items()))
        named, caught = len(got["named"]), len(got["caught"])
        unnamed = [name for name in got["caught"] if name not in got["named"]]
        full = ", ".join(got["full_marks"]) or "none"
        slow = f"; not graded (the machine): {', '.join(got['not_graded'])}" if got["not_graded"] else ""
        out += [
            Row("feedback", f"ex{n:02d} realistic: wrong solutions at full marks", len(got["full_marks"]), "mistakes",
                f"of {got['graded']} graded ({got['mistakes']} written); goal 0: {full}{slow}"),
            Row("feedback", f"ex{n:02d} realistic: caught mistakes whose feedback names them",
                100 * named / max(caught, 1), "%",
                f"{named} of {caught} (the edited line, a declared cause, an error or a divergence at a line); "
                f"{len(got['key_terms'])} contain the mistake's key terms; goal >= 90%"
                + (f"; unnamed: {', '.join(unnamed)}" if unnamed else "")),
            Row("feedback", f"ex{n:02d} realistic: legal variants short of full marks", len(got["legal_short"]),
                "variants", f"of {got['legal']}; goal 0: " + (", ".join(got["legal_short"]) or "none")),
            Row("feedback", f"ex{n:02d} realistic: messages advising a step taken or stating what the run contradicts",
                len(got["violations"]), "messages", "goal 0; first: " + ("; ".join(got["violations"][:2]) or "none")),
        ]
    return out
