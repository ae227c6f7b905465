"""``kernellab-audit REFERENCE.json CANDIDATE.json [--out AUDIT.json]``, or
``kernellab-audit --check REPORT...`` to check reports of any kind without replaying them.

Exit codes: 0 pass, 1 fail, 2 inconclusive, 64 bad arguments, 130 interrupted (--check: 0 every report
holds, 1 not).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kernellab.harness import consistency, provenance, signing
from kernellab.harness import report as report_io

from .audit import FAIL, INCONCLUSIVE, PASS, Audit, Options, integrity

EXIT = {PASS: 0, FAIL: 1, INCONCLUSIVE: 2}
EXIT_USAGE = 64
EXIT_INTERRUPTED = 130
MARKS = {True: "ok  ", False: "FAIL", None: "??  "}


class UsageError(Exception):
    pass


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kernellab-audit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("reports", nargs="*", metavar="REPORT",
                   help="REFERENCE.json CANDIDATE.json; none: the two newest run reports of one suite under reports/")
    p.add_argument("--out", help="write the audit JSON here (default: reports/runs/audit-<candidate>.json)")
    p.add_argument("--repo", help="the KernelLab checkout whose history holds the reports' commits (default: here)")
    p.add_argument("--rounds", type=int, help="replay rounds (default: the candidate report's)")
    p.add_argument("--samples", type=int, help="replay samples per round (default: the candidate report's)")
    p.add_argument("--tolerance", type=float, default=0.10,
                   help="how far a claimed gain may sit outside the replay's interval, as a fraction (default 0.10)")
    p.add_argument("--max-rounds", type=int, help="replay rounds at most, extra ones going to pairs whose interval is "
                   "still wide (default: three times the report's rounds)")
    p.add_argument("--time-limit", type=float, default=600.0, help="seconds after which no extra replay round "
                   "starts (default 600)")
    p.add_argument("--ray", metavar="ADDRESS", nargs="?", const="", help="replay on a Ray cluster, one problem per "
                   "task, each on a device of the name its reports recorded (or said not to be replayed): the "
                   "cluster at ADDRESS ('auto': the one running on this host), or a local one without ADDRESS")
    p.add_argument("--case-timeout", type=float, default=3600.0, metavar="SECONDS", help="with --ray: a replayed "
                   "case running longer kills its task, which is retried once (default 3600)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--trusted-keys", metavar="PATH", help="Ed25519 public keys (a PEM file, or a directory of "
                   ".pem/.pub files) one of which must have signed each report; unsigned reports then fail")
    p.add_argument("--check", nargs="+", metavar="REPORT", help="check reports of any kind without replaying: "
                   "hash, schema, internal consistency, signature; exit 0 when all hold, 1 when not")
    return p


def newest_pair(root: Path) -> tuple[Path, Path]:
    """The two newest run reports, by when their files were written, of the suite of the newest one under ``root``
    (not by the ``created_at`` a report states: a copy of an old report dated ahead would be taken for the new)."""
    found = []
    for path in root.rglob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("schema") == report_io.SCHEMA and data.get("kind") == "run":
            found.append((path.stat().st_mtime_ns, data.get("suite"), path))
    if not found:
        raise UsageError(f"no run reports under {root}; give REFERENCE.json CANDIDATE.json")
    found.sort()
    suite = found[-1][1]
    same = [f for f in found if f[1] == suite]
    if len(same) < 2:
        raise UsageError(f"only one run report of suite {suite!r} under {root}; give REFERENCE.json CANDIDATE.json")
    return same[-2][2], same[-1][2]


def check_inputs(reference: Path, candidate: Path, out: Path) -> None:
    """The user's mistakes, refused before any replay: a path that is not a file, a report that loads
    but is not shaped as one, two reports with no case in common (their case list would be empty, and
    an empty case filter selects every case), an --out that cannot be written. A report that fails its
    hash or schema is left to the audit, which records that as a failed check."""
    loaded = {}
    for side, path in (("reference", reference), ("candidate", candidate)):
        if not path.is_file():
            raise UsageError(f"{side} report {path} " + ("is a directory" if path.is_dir() else "does not exist"))
        try:
            loaded[side] = report_io.load(path)
        except report_io.ReportError:
            continue
        try:
            report_io.check_contents(loaded[side])
        except report_io.ReportError as e:
            raise UsageError(f"{side} report {path}: {e}") from None
    if len(loaded) == 2 and all(r["kind"] == "run" for r in loaded.values()):
        names = [{c["name"] for c in r["cases"]} for r in loaded.values()]
        if not names[0] & names[1]:
            raise UsageError(f"the reports have no case in common, so there is nothing to replay (reference: "
                             f"{sorted(names[0])}, candidate: {sorted(names[1])})")
    if out.is_dir():
        raise UsageError(f"--out {out} is a directory; name the audit's .json file")
    existing = out.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"--out {out}: {existing} is a file, so the directory {out.parent} cannot be made")


def check_reports(paths: list[Path], trusted: dict | None) -> bool:
    """Print each report's checks; True when every one holds. A before/after report given with the
    comparison it was made from is also checked against that comparison."""
    ok, loaded = True, {}
    for path in paths:
        try:
            rep = report_io.load(path)
        except report_io.ReportError as e:
            print(f"{path}: [FAIL] hash and schema: {e}")
            ok = False
            continue
        loaded[rep[report_io.HASH_FIELD]] = rep
        print(f"{path}: {rep['kind']} report, [ok  ] hash and schema")
        for name, passed, detail in integrity(rep, trusted):
            print(f"  [{MARKS[passed]}] {name}: {detail}")
            ok &= passed is not False
    for rep in loaded.values():
        comparison = loaded.get(rep.get("comparison_sha256")) if rep["kind"] == "before_after" else None
        if comparison is not None:
            found = consistency.check_before_after(rep, comparison)
            print(f"before/after {rep[report_io.HASH_FIELD][:16]} against its comparison: "
                  + ("[ok  ]" if not found else "[FAIL] " + "; ".join(map(str, found))))
            ok &= not found
    return ok


def main(argv: list[str] | None = None) -> int:
    try:
        return run(argv)
    except KeyboardInterrupt:
        print("\nkernellab-audit: interrupted; no audit written", file=sys.stderr)
        return EXIT_INTERRUPTED


def run(argv: list[str] | None) -> int:
    args = parser().parse_args(argv)
    try:
        trusted = signing.load_trusted(args.trusted_keys) if args.trusted_keys else None
    except signing.SigningError as e:
        print(f"kernellab-audit: error: --trusted-keys: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.check:
        if args.reports:
            print("kernellab-audit: error: --check takes the reports to check; give no other reports",
                  file=sys.stderr)
            return EXIT_USAGE
        return 0 if check_reports([Path(p) for p in args.check], trusted) else 1
    try:
        repo = Path(args.repo) if args.repo else provenance.find_repo_root(Path.cwd())
        if repo is None or not (repo / "packages").is_dir():
            raise UsageError("run inside a KernelLab checkout or pass --repo")
        if len(args.reports) == 2:
            reference, candidate = map(Path, args.reports)
        elif not args.reports:
            reference, candidate = newest_pair(repo / "reports")
        else:
            raise UsageError(f"give two reports (REFERENCE CANDIDATE) or none, got {len(args.reports)}")
        for name in ("rounds", "samples", "max_rounds"):
            value = getattr(args, name)
            if value is not None and value < 1:
                raise UsageError(f"--{name} must be >= 1, got {value}")
        if not args.case_timeout > 0:
            raise UsageError(f"--case-timeout must be > 0 seconds, got {args.case_timeout}")
        if not 0 <= args.tolerance < 10:
            raise UsageError(f"--tolerance must be in [0, 10), got {args.tolerance}")
        out = Path(args.out) if args.out else repo / "reports" / "runs" / f"audit-{candidate.stem}.json"
        check_inputs(reference, candidate, out)
    except UsageError as e:
        print(f"kernellab-audit: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(f"auditing {reference} (reference) against {candidate} (candidate)", file=sys.stderr)
    keys = Path(args.trusted_keys) if args.trusted_keys else None
    result = Audit(reference, candidate, repo, Options(rounds=args.rounds, samples=args.samples,
                                                       tolerance=args.tolerance, progress=not args.quiet,
                                                       max_rounds=args.max_rounds, time_limit_s=args.time_limit,
                                                       trusted_keys=keys, ray=args.ray,
                                                       case_timeout_s=args.case_timeout)).run()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report_io.clean(result), indent=1, sort_keys=True) + "\n")
    print(summary(result))
    print(f"audit: {out}")
    return EXIT[result["status"]]


def summary(result: dict) -> str:
    lines = [f"status: {result['status']}"]
    for c in result["checks"]:
        mark = MARKS[c["passed"]]
        lines.append(f"  [{mark}] {c['name']}")
    for field in ("replay_pairs", "executed_output_validations", "output_validations_by_driver",
                  "recorded_unchanged_artifacts", "current_artifacts_checked", "torch_probe_control_ratio_range"):
        if field in result:
            lines.append(f"  {field}: {result[field]}")
    if result.get("validated_in_worker_only"):
        lines.append(f"  validated in the worker only (results over the ship limit): "
                     f"{', '.join(result['validated_in_worker_only'])}")
    if result["reasons"]:
        lines.append("reasons:")
        lines += [f"  - {r}" for r in result["reasons"]]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
