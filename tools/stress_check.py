"""Run a set of tests N times under CPU load and record how many runs each test passed.

The trust tests (planted cheats, forged reports, the verdict's noise injector, the end-to-end audit)
must give the same answer on a machine whose cores are all busy. This runs them ``--runs`` times
with ``stress -c LOAD`` spinning beside them and writes one JSON record: per run its wall time and
outcome counts, per test its passes out of the runs, the load average seen, and the commit.

    python tools/stress_check.py --runs 10 --out reports/cpu/trust/stress-check-trust.json -- \\
        -n 2 --dist loadfile packages/harness/tests/test_cheats.py packages/harness/tests/test_consistency.py \\
        packages/harness/tests/test_signing.py packages/audit/tests/test_verdict.py \\
        packages/audit/tests/test_audit.py packages/audit/tests/test_planted_contenders.py
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True).stdout.strip()


def _outcomes(junit: Path) -> dict[str, str]:
    """test id -> passed / failed / skipped, from pytest's JUnit XML."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        tid = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            out[tid] = "failed"
        elif case.find("skipped") is not None:
            out[tid] = "skipped"
        else:
            out[tid] = "passed"
    return out


def _finish(record: dict) -> dict:
    record["every_run_passed"] = bool(record["runs"]) and all(r["exit_code"] == 0 and r["failed"] == 0
                                                              and r["passed"] > 0 for r in record["runs"])
    return record


def run(runs: int, load: int, pytest_args: list[str], out: Path) -> dict:
    """The record, rewritten to ``out`` after every run so that a run stopped midway keeps what it did."""
    if load and shutil.which("stress") is None:
        raise SystemExit("stress_check: --load needs the `stress` program on PATH (apt install stress), or --load 0")
    record = {"kind": "stress_check", "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "commit": _git("rev-parse", "HEAD"), "dirty": bool(_git("status", "--porcelain")),
              "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                          "python": platform.python_version()},
              "load_workers": load, "pytest_args": pytest_args, "runs": [], "tests": {}}
    loader = subprocess.Popen(["stress", "-c", str(load)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) if load else None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(runs):
                junit = Path(tmp) / f"run{i}.xml"
                start = time.monotonic()
                proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                       f"--junitxml={junit}", *pytest_args], cwd=ROOT, capture_output=True, text=True)
                seconds = time.monotonic() - start
                outcomes = _outcomes(junit) if junit.exists() else {}
                counts = {k: sum(v == k for v in outcomes.values()) for k in ("passed", "failed", "skipped")}
                record["runs"].append({"run": i, "seconds": round(seconds, 1), "exit_code": proc.returncode,
                                       "load_average_1min": round(os.getloadavg()[0], 2), **counts,
                                       "failures": sorted(t for t, v in outcomes.items() if v == "failed")})
                for tid, outcome in outcomes.items():
                    t = record["tests"].setdefault(tid, {"passed": 0, "failed": 0, "skipped": 0})
                    t[outcome] += 1
                out.write_text(json.dumps(_finish(record), indent=1) + "\n")
                print(f"run {i + 1}/{runs}: {counts['passed']} passed, {counts['failed']} failed, "
                      f"{counts['skipped']} skipped in {seconds:.0f} s (load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        if loader is not None:
            loader.terminate()
            loader.wait()
    return _finish(record)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="how many times to run the tests (default 10)")
    ap.add_argument("--load", type=int, default=os.cpu_count(),
                    help="stress workers spinning beside the tests (default: one per core; 0: none)")
    ap.add_argument("--out", type=Path, required=True, help="the JSON record to write")
    ap.add_argument("pytest_args", nargs="+", help="test paths and pytest options (after --)")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error(f"--runs must be at least 1, got {args.runs}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = run(args.runs, args.load, args.pytest_args, args.out)
    flaky = {t: v for t, v in record["tests"].items() if v["failed"]}
    print(f"{len(record['tests'])} tests x {args.runs} runs under {args.load} stress workers: "
          + ("every run passed" if record["every_run_passed"] else f"{len(flaky)} test(s) failed in some run: "
             + ", ".join(f"{t} ({v['failed']}/{args.runs})" for t, v in sorted(flaky.items()))))
    print(f"wrote {args.out}")
    return 0 if record["every_run_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
