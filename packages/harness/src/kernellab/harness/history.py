"""The run history: one row per (report, case, mode) of every committed run report, in a JSON-lines
file that git holds (``reports/history.jsonl``), so a case can be followed across commits.

The store is derived: ``kernellab-bench history index`` rebuilds it from the reports, and a test checks
that the committed store is that rebuild. Its first line is a header naming the schema; rows are
sorted, so two branches that add reports touch different lines.

Two report formats are read: the harness's sealed ``run`` and ``comparison`` reports (one row per side
of a comparison, at that side's commit), and the megakernel engine report (per shape and engine, the
stream and host summaries), recognized by its fields so that the harness never imports the megakernel.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
from pathlib import Path
from typing import Any

from . import provenance, stats
from . import report as report_io

SCHEMA = "kernellab.history/1"
DEFAULT_STORE = "reports/history.jsonl"
DEFAULT_REPORTS = "reports"
SKIPPED_DIRS = ("runs",)  # local, git-ignored runs land in reports/runs
FIELDS = ("report", "report_sha256", "format", "suite", "device", "commit", "dirty", "created_at", "side",
          "case", "impl", "mode", "p50_us", "interval_us", "interval", "torch_ratio", "ceiling_fraction")
ENGINE_CONTROL = "torch-cublas"
ENGINE_MODES = {"stream": "stream_summary", "host": "host_summary"}


class HistoryError(ValueError):
    """A store or report the history cannot read; the message names the file and what was expected."""


# ---- reading reports ---------------------------------------------------------------------------------
def report_format(data: Any) -> str | None:
    """Which indexed format a JSON document is in, or None for what is not a report of a run."""
    if not isinstance(data, dict):
        return None
    if data.get("schema") == report_io.SCHEMA and data.get("kind") in ("run", "comparison"):
        return f"harness-{data['kind']}"
    if {"development", "source_commit", "device"} <= data.keys():
        return "megakernel-engines"
    return None


def rows_of(report: dict, path: str) -> list[dict]:
    """The history rows of one report (``path`` as the store records it); [] for what is not a run."""
    reader = {"harness-run": _run_rows, "harness-comparison": _comparison_rows,
              "megakernel-engines": _engine_rows}.get(report_format(report))
    return reader(report, path) if reader else []


def _row(**kw) -> dict:
    row = dict.fromkeys(FIELDS)
    row.update(kw)
    return row


def _device_name(prov: dict) -> str:
    return (prov.get("device") or {}).get("name") or "unknown"


def _harness_rows(report: dict, path: str, cases: list[dict], prov: dict, revision: dict, side: str | None,
                  ratios: dict) -> list[dict]:
    git = prov.get("git") or {}
    commit = (revision or {}).get("commit") or git.get("commit")
    dirty = (revision or {}).get("dirty", git.get("dirty"))
    rows = []
    for c in cases:
        for mode, m in sorted(c["modes"].items()):
            meds = m["round_medians_us"]
            rows.append(_row(
                report=path, report_sha256=report.get(report_io.HASH_FIELD), format=report_format(report),
                suite=report["suite"], device=_device_name(prov), commit=commit, dirty=dirty,
                created_at=report["created_at"], side=side, case=c["name"], impl=c["impl"], mode=mode,
                p50_us=m["summary_us"]["p50"], interval_us=[min(meds), max(meds)], interval="round medians",
                torch_ratio=ratios.get((c["name"], c["impl"], mode)), ceiling_fraction=m.get("ceiling_fraction")))
    return rows


def _run_rows(report: dict, path: str) -> list[dict]:
    ratios = {(r["name"], r["impl"], mode): v["native_torch_ratio"]
              for r in report.get("versus_control", []) for mode, v in r.items() if isinstance(v, dict)}
    for c in report["cases"]:  # the control against itself, so that every row has its ratio
        if c["impl"] == report.get("control"):
            ratios.update({(c["name"], c["impl"], mode): 1.0 for mode in c["modes"]})
    return _harness_rows(report, path, report["cases"], report["provenance"], report.get("revision"), None, ratios)


def _comparison_rows(report: dict, path: str) -> list[dict]:
    rows = []
    control = report.get("control")
    for side in ("reference", "candidate"):
        data = report["sides"][side]
        by_id = {c["id"]: c for c in data["cases"]}
        ratios = {}
        for c in data["cases"]:
            ctrl = by_id.get(f"{c['name']}/{control}")
            for mode, m in c["modes"].items():
                if ctrl and mode in ctrl["modes"]:
                    ratios[(c["name"], c["impl"], mode)] = stats.ratio_stats(
                        m["rounds_us"], ctrl["modes"][mode]["rounds_us"])["value"]
        rows += _harness_rows(report, path, data["cases"], data["provenance"], data.get("revision"), side, ratios)
    return rows


def _engine_rows(report: dict, path: str) -> list[dict]:
    rows = []
    for split in ("development", "assessment"):
        for item in report.get(split) or []:
            s = item["shape"]
            case = f"{s['rows']}x{s['channels']}x{s['hidden']}"
            engines = item["engines"]
            for engine, e in sorted(engines.items()):
                for mode, key in ENGINE_MODES.items():
                    summary = e.get(key)
                    if not summary or summary.get("p50_ms") is None:
                        continue
                    control = (engines.get(ENGINE_CONTROL) or {}).get(key) or {}
                    ratio = summary["p50_ms"] / control["p50_ms"] if control.get("p50_ms") else None
                    rows.append(_row(
                        report=path, report_sha256=report.get("sha256"), format="megakernel-engines",
                        suite="megakernel", device=report["device"], commit=report["source_commit"], dirty=None,
                        created_at=report.get("recorded_on"), side=None, case=case, impl=engine, mode=mode,
                        p50_us=summary["p50_ms"] * 1e3,
                        interval_us=[summary["min_ms"] * 1e3, summary["p95_ms"] * 1e3], interval="min..p95",
                        torch_ratio=ratio, ceiling_fraction=None))
    return rows


def load_report(path: Path) -> dict | None:
    """A report whose sha256 matches its content, or None for JSON that is not a report of a run."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise HistoryError(f"{path}: not readable JSON: {e}") from None
    if report_format(data) is None:
        return None
    recorded = data.get(report_io.HASH_FIELD)
    if recorded != report_io.report_hash(data):
        raise HistoryError(f"{path}: sha256 mismatch (recorded {recorded}); the report was edited after it "
                           "was written and cannot be indexed")
    return data


def report_files(roots: list[Path]) -> list[Path]:
    """Every .json under ``roots`` (files given as such), skipping ``reports/runs``."""
    out = []
    for root in roots:
        if root.is_file():
            out.append(root)
            continue
        if not root.is_dir():
            raise HistoryError(f"{root}: no such file or directory")
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
            out += [Path(dirpath) / f for f in sorted(filenames) if f.endswith(".json")]
    return out


def index(roots: list[Path], base: Path) -> list[dict]:
    """The rows of every run report under ``roots``, paths relative to ``base``, sorted."""
    rows = []
    for path in report_files(roots):
        report = load_report(path)
        if report is not None:
            rows += rows_of(report, Path(os.path.relpath(path, base)).as_posix())
    return sorted(rows, key=sort_key)


def sort_key(row: dict) -> tuple:
    return (row["report"], row["side"] or "", row["case"], row["impl"], row["mode"])


# ---- the store -------------------------------------------------------------------------------------
def write_store(rows: list[dict], path: str | os.PathLike) -> Path:
    """Header line, then one row per line, keys in FIELDS order."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"schema": SCHEMA, "fields": list(FIELDS)})]
    for row in sorted(rows, key=sort_key):
        missing = set(FIELDS) - row.keys()
        if missing:
            raise HistoryError(f"a history row lacks {sorted(missing)}")
        lines.append(json.dumps({k: _rounded(report_io.clean(row[k])) for k in FIELDS}, allow_nan=False))
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)
    return path


def _rounded(value: Any) -> Any:
    """Seven significant digits: the store is for reading trends, the report keeps every digit."""
    if isinstance(value, float):
        return float(f"{value:.7g}")
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def read_store(path: str | os.PathLike) -> list[dict]:
    """The rows of a store, its schema checked."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise HistoryError(f"history store {path} does not exist; build it with `kernellab-bench history "
                           "index`") from None
    if not lines:
        raise HistoryError(f"history store {path} is empty; expected a header line naming {SCHEMA!r}")
    try:
        header = json.loads(lines[0])
        rows = [json.loads(line) for line in lines[1:] if line.strip()]
    except json.JSONDecodeError as e:
        raise HistoryError(f"history store {path}: a line is not JSON: {e}") from None
    if not isinstance(header, dict) or header.get("schema") != SCHEMA:
        found = header.get("schema") if isinstance(header, dict) else header
        raise HistoryError(f"history store {path} has schema {found!r}; this harness reads {SCHEMA!r}")
    for n, row in enumerate(rows, start=2):
        if set(row) != set(FIELDS):
            raise HistoryError(f"history store {path} line {n}: fields {sorted(row)}, expected {list(FIELDS)}")
    return rows


def select(rows: list[dict], *, suite=None, device=None, case=None, impl=None, mode=None, commit=None) -> list[dict]:
    """Rows matching every filter given: shell patterns for case and impl, a prefix for commit."""
    out = []
    for r in rows:
        if suite and r["suite"] != suite or mode and r["mode"] != mode:
            continue
        if device and device.lower() not in (r["device"] or "").lower():
            continue
        if case and not fnmatch.fnmatchcase(r["case"], case) or impl and not fnmatch.fnmatchcase(r["impl"], impl):
            continue
        if commit and not (r["commit"] or "").startswith(commit):
            continue
        out.append(r)
    return out


# ---- the command -----------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kernellab-bench history",
                                description="The run history of every committed run report.")
    sub = p.add_subparsers(dest="command", required=True)
    ix = sub.add_parser("index", help="rebuild the store from the reports")
    ix.add_argument("paths", nargs="*", help=f"report files or folders (default: {DEFAULT_REPORTS}/, without runs/)")
    ix.add_argument("--check", action="store_true", help="write nothing; exit 1 when the store differs from a rebuild")
    ls = sub.add_parser("list", help="list and filter the store")
    for name, text in (("suite", "suite name"), ("device", "a part of the device name, e.g. h200"),
                       ("case", "shell pattern over case names"), ("impl", "shell pattern over impls"),
                       ("mode", "timing mode"), ("commit", "commit prefix")):
        ls.add_argument(f"--{name}", help=text)
    ls.add_argument("--format", default="simple", help="tabulate table format ('github' for markdown)")
    for s in (ix, ls):
        s.add_argument("--store", help=f"the store (default: {DEFAULT_STORE} of the checkout)")
    return p


def repo_root() -> Path:
    return provenance.find_repo_root(Path.cwd()) or Path.cwd()


def table(rows: list[dict], fmt: str = "simple") -> str:
    from tabulate import tabulate

    def num(x, spec):
        return "-" if x is None else format(x, spec)

    body = [[r["suite"], r["device"], (r["commit"] or "?")[:10] + ("+" if r["dirty"] else ""),
             (r["created_at"] or "")[:19], r["case"], r["impl"], r["mode"], num(r["p50_us"], ".3f"),
             "-" if not r["interval_us"] else f"{r['interval_us'][0]:.3f}..{r['interval_us'][1]:.3f}",
             num(r["torch_ratio"], ".3f"), r["report"]] for r in rows]
    return tabulate(body, headers=["suite", "device", "commit", "created", "case", "impl", "mode", "p50 us",
                                   "interval us", "x torch", "report"], disable_numparse=True, tablefmt=fmt)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    root = repo_root()
    store = Path(args.store) if args.store else root / DEFAULT_STORE
    try:
        if args.command == "index":
            roots = [Path(p) for p in args.paths] or [root / DEFAULT_REPORTS]
            rows = index(roots, root)
            if args.check:
                current = read_store(store)
                if current != [{k: _rounded(r[k]) for k in FIELDS} for r in rows]:
                    print(f"kernellab-bench history: {store} is stale: {len(current)} rows, a rebuild gives "
                          f"{len(rows)}; run `kernellab-bench history index`", file=sys.stderr)
                    return 1
                print(f"{store}: up to date ({len(rows)} rows)")
                return 0
            write_store(rows, store)
            print(f"{store}: {len(rows)} rows from {len({r['report'] for r in rows})} reports")
            return 0
        rows = select(read_store(store), suite=args.suite, device=args.device, case=args.case, impl=args.impl,
                      mode=args.mode, commit=args.commit)
    except HistoryError as e:
        print(f"kernellab-bench history: error: {e}", file=sys.stderr)
        return 2
    print(table(rows, args.format))
    print(f"{len(rows)} rows")
    return 0
