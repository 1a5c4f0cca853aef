"""Gradescope's ``results.json`` specification, as a checker: every field a document holds is one the
specification defines, of the type and values it allows (gradescope-autograders.readthedocs.io, "Autograder
Specifications": the output format, test case visibility and status, output string formatting). Shared by
tests/autograder/test_gradescope.py and tests/tiers/test_gradescope_container.py.
"""
from __future__ import annotations

VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}
FORMATS = {"text", "html", "simple_format", "md", "ansi"}
NUMBER = (int, float)
TOP = {"score": NUMBER, "execution_time": NUMBER, "output": str, "output_format": str, "test_output_format": str,
       "test_name_format": str, "visibility": str, "stdout_visibility": str, "extra_data": dict, "tests": list,
       "leaderboard": list}
TEST = {"score": NUMBER, "max_score": NUMBER, "status": str, "name": str, "name_format": str, "number": str,
        "output": str, "output_format": str, "tags": list, "visibility": str, "extra_data": dict}


def _typed(where: str, doc: dict, fields: dict) -> list[str]:
    problems = [f"{where}: {key!r} is not a field of the specification" for key in doc if key not in fields]
    for key, kind in fields.items():
        if key in doc and (not isinstance(doc[key], kind) or isinstance(doc[key], bool)):
            problems.append(f"{where}: {key!r} is {type(doc[key]).__name__}, not {kind}")
    for key in ("visibility", "stdout_visibility"):
        if key in doc and doc[key] not in VISIBILITY:
            problems.append(f"{where}: {key!r} is {doc[key]!r}, not one of {sorted(VISIBILITY)}")
    for key in ("output_format", "test_output_format", "test_name_format", "name_format"):
        if key in doc and doc[key] not in FORMATS:
            problems.append(f"{where}: {key!r} is {doc[key]!r}, not one of {sorted(FORMATS)}")
    return problems


def problems(doc) -> list[str]:
    """What in ``doc`` (a parsed results.json) the specification does not allow; ``[]`` when nothing."""
    if not isinstance(doc, dict):
        return [f"results.json is a {type(doc).__name__}, not an object"]
    found = _typed("results", doc, TOP)
    tests = doc.get("tests", [])
    if "score" not in doc and (not tests or any("score" not in t for t in tests if isinstance(t, dict))):
        found.append("no top-level score, and not every test has one")
    for i, test in enumerate(tests if isinstance(tests, list) else []):
        if not isinstance(test, dict):
            found.append(f"tests[{i}] is not an object")
            continue
        found += _typed(f"tests[{i}]", test, TEST)
        if test.get("status", "passed") not in ("passed", "failed"):
            found.append(f"tests[{i}]: status {test['status']!r} is neither 'passed' nor 'failed'")
        if isinstance(test.get("tags", []), list) and not all(isinstance(t, str) for t in test.get("tags", [])):
            found.append(f"tests[{i}]: tags must be strings")
    return found
