"""Run every ``benchmarks/bench_*.py`` (or those named on the command line) and print one table."""
from __future__ import annotations

import importlib
import json
import pkgutil
import sys
import time
from dataclasses import asdict

import benchmarks


def main(argv: list[str]) -> int:
    wanted = [a for a in argv if not a.startswith("--")]
    names = sorted(i.name for i in pkgutil.iter_modules(benchmarks.__path__) if i.name.startswith("bench_"))
    names = [n for n in names if not wanted or any(w in n for w in wanted)]
    rows = []
    for name in names:
        start = time.perf_counter()
        print(f"# {name} ...", file=sys.stderr, flush=True)
        rows += importlib.import_module(f"benchmarks.{name}").rows()
        print(f"# {name} took {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    if "--json" in argv:
        print(json.dumps([asdict(r) for r in rows], indent=2))
        return 0
    header = ("topic", "measurement", "value", "unit", "note")
    table = [header] + [(r.topic, r.what, f"{r.value:.4g}", r.unit, r.note) for r in rows]
    widths = [max(len(t[i]) for t in table) for i in range(4)]
    for i, t in enumerate(table):
        print("  ".join(c.ljust(w) for c, w in zip(t[:4], widths)) + "  " + t[4])
        if i == 0:
            print("  ".join("-" * w for w in widths))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
