"""A/B of two code versions from engine reports measured in one sitting: ``python -m kernellab.megakernel.compare``.

    python -m kernellab.megakernel.compare A1.json B1.json B2.json A2.json [--base COMMIT] [--control torch-cublas]
                                           [--json OUT]

The reports (restricted ones: ``report --engines ... --shapes ... --no-compiler``) are run base, change,
change, base, so that a drift of the machine over the sitting falls on both sides alike; they are grouped by
the commit each records, the first report's commit being the base unless ``--base`` names the other
(a commit or its prefix: for runs made change, base, base, change). Per engine and shape: the change's stream
p50 over the base's (each side's mean over its reports); per engine: the geometric mean over the shapes, the
least and the most. An engine whose code neither version changes (``--control``, torch-cublas by default)
shows what the comparison resolves: its ratio is drift and noise alone. Each report's sha256 is checked;
an engine that failed validation anywhere is left out and named, and the command then exits 1.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from . import engines, report


def load(paths: list[str]) -> list[dict]:
    """The reports, each checked against its sha256 (``report.read_sealed``) and complete; SystemExit naming
    the file otherwise."""
    out = []
    for path in paths:
        try:
            data = report.read_sealed(path)
        except ValueError as e:
            raise SystemExit(str(e)) from None
        if "partial" in data:
            raise SystemExit(f"{path}: a partial report (its run stopped before the end)")
        out.append(data)
    return out


def compare(reports: list[dict], control: str | None = "torch-cublas", base: str | None = None) -> dict:
    """{"base", "change": commits, "engines": {name: {"ratios": {shape: change / base}, "geomean", "min",
    "max"}}, "failed": [...], "control"}: see the module docstring. ``base``: the base commit or a prefix of
    it (default: the first report's)."""
    commits = list(dict.fromkeys(r.get("source_commit") for r in reports))
    if len(commits) != 2:
        raise ValueError(f"an A/B needs reports of exactly two commits; these record {commits}")
    if base is not None:
        named = [c for c in commits if c and c.startswith(base)]
        if len(named) != 1:  # an empty prefix names both
            raise ValueError(f"--base {base!r} names neither or both of the reports' commits {commits}")
        commits = [named[0], *(c for c in commits if c != named[0])]
    p50s: dict[tuple[str, str, str], list[float]] = {}  # (commit, engine, shape) -> p50 in us
    failed, shapes = set(), []
    for r in reports:
        for section in ("development", "assessment"):
            for item in r.get(section, []):
                shape = report.shape_label(item["shape"])
                if shape not in shapes:
                    shapes.append(shape)
                for name, entry in item["engines"].items():
                    if not entry.get("passed") or "stream_summary" not in entry:
                        failed.add((name, shape))
                        continue
                    p50s.setdefault((r["source_commit"], name, shape), []).append(
                        entry["stream_summary"]["p50_ms"] * 1e3)
    base, change = commits
    out = {"base": base, "change": change, "engines": {}, "failed": sorted(f"{n} at {s}" for n, s in failed)}
    for name in engines.ENGINES:
        ratios = {}
        for shape in shapes:
            a, b = p50s.get((base, name, shape)), p50s.get((change, name, shape))
            if a and b and (name, shape) not in failed:
                ratios[shape] = (sum(b) / len(b)) / (sum(a) / len(a))
        if ratios:
            logs = [math.log(v) for v in ratios.values()]
            out["engines"][name] = {"ratios": ratios, "geomean": math.exp(sum(logs) / len(logs)),
                                    "min": min(ratios.values()), "max": max(ratios.values())}
    if control and control in out["engines"]:
        out["control"] = {"engine": control, "geomean": out["engines"][control]["geomean"]}
    return out


def printout(result: dict) -> str:
    from tabulate import tabulate

    shapes = list(dict.fromkeys(s for e in result["engines"].values() for s in e["ratios"]))
    rows = [[name, f"{e['geomean']:.3f}", f"{e['min']:.3f}", f"{e['max']:.3f}",
             *(f"{e['ratios'][s]:.3f}" if s in e["ratios"] else "" for s in shapes)]
            for name, e in result["engines"].items()]
    lines = [f"stream p50 of {result['change'][:7]} over {result['base'][:7]} (below 1: the change is faster)",
             tabulate(rows, headers=["engine", "geomean", "min", "max", *shapes], disable_numparse=True)]
    if "control" in result:
        c = result["control"]
        lines.append(f"control: {c['engine']}, unchanged by either, moved {c['geomean']:.3f}: differences of that "
                     "size are within what this comparison resolves")
    if result["failed"]:
        lines.append("FAILED validation (left out): " + ", ".join(result["failed"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernellab.megakernel.compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("reports", nargs="+", help="engine reports of two commits, in the order they were run")
    p.add_argument("--control", default="torch-cublas", help="an engine neither version changes ('' for none)")
    p.add_argument("--base", help="the base's commit or a prefix of it (default: the first report's commit)")
    p.add_argument("--json", help="also write the comparison here")
    args = p.parse_args(argv)
    try:
        result = compare(load(args.reports), args.control or None, args.base)
    except ValueError as e:
        print(f"compare: {e}", file=sys.stderr)
        return 2
    print(printout(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
