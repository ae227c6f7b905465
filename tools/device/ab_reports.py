"""One revision A/B of a suite that also keeps each side as a run report, for kernellab-audit.

    python3 tools/device/ab_reports.py --suite gpu-norm-backward --baseline COMMIT [--impls cute] [--rounds 4]
                                       [--samples 10] [--cases ...] [--fresh-workers] --out DIR

What ``kernellab-bench --suite S --baseline COMMIT`` runs (one worker per revision, every case by both sides
back to back, the side order alternating by round), with the baseline checked out as a git worktree, so
that its worker records the baseline's commit as a checkout would (a materialized archive has no .git and
records none, which the audit then cannot locate). Writes DIR/<suite>-ab.json (the comparison report),
DIR/<suite>-reference.json and DIR/<suite>-candidate.json (the two sides as run reports, from the same
rounds), then prints the comparison's table. Run it from a clean checkout on the GPU host. Ctrl-C or SIGTERM (a
device call's ``timeout``) keeps the rounds completed before it in the same three files named ``-partial``.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import tempfile
from pathlib import Path

from kernellab.harness import assemble, provenance, registry, table
from kernellab.harness import report as report_io
from kernellab.harness.cli import config_for
from kernellab.harness.revision import run_sides, terminate_as_interrupt


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", required=True)
    ap.add_argument("--baseline", required=True, help="a commit of this checkout")
    ap.add_argument("--impls")
    ap.add_argument("--cases")
    ap.add_argument("--modes")
    for name in ("rounds", "samples", "warmup", "iterations"):
        ap.add_argument(f"--{name}", type=int)
    ap.add_argument("--rotation-limit", type=int, help="MiB for the rotated input sets (kernellab-bench's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fresh-workers", action="store_true", help="a new worker a side every round (kernellab-bench's)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    repo = provenance.find_repo_root(Path.cwd())
    suites, broken = registry.discover(impls=False)  # contenders are imported in the workers only
    if args.suite not in suites:
        raise SystemExit(f"unknown suite {args.suite!r} ({broken.get(args.suite, 'not registered')})")
    suite = suites[args.suite]
    config = config_for(suite, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    commit = git(repo, "rev-parse", "--verify", f"{args.baseline}^{{commit}}")
    state = provenance.git_state(repo)
    with tempfile.TemporaryDirectory(prefix="kernellab-baseline-") as tmp:
        base = Path(tmp) / "tree"
        git(repo, "worktree", "add", "--detach", str(base), commit)
        try:
            request = {"suite": suite.name, "config": config.to_json(), "cases": args.cases, "impls": args.impls}
            with terminate_as_interrupt():  # a device call's timeout keeps the completed rounds, as Ctrl-C does
                sides = run_sides({"reference": base, "candidate": repo}, request, config.rounds)
        finally:
            git(repo, "worktree", "remove", "--force", str(base))
    sides["reference"]["revision"] = {"revision": args.baseline, "kind": "git", "commit": commit,
                                      "zip_sha256": None, "root": str(base)}
    sides["candidate"]["revision"] = {"revision": "working tree", "kind": "local", "commit": state["commit"],
                                      "dirty": state["dirty"], "root": str(repo)}
    stopped = sides["candidate"].get("interrupted")
    if stopped and not stopped["rounds_completed"]:
        print("ab_reports: interrupted before a round completed; nothing saved", file=sys.stderr)
        return 130
    # the rounds each side ran: those completed before an interrupt, or an A/B's even count (an odd --rounds runs
    # one more), which a run report's config must state
    cfg = dataclasses.replace(config, rounds=len(sides["candidate"]["rounds"])).to_json()
    reports = {"ab": assemble.comparison_report(suite, cfg, sides["reference"], sides["candidate"]),
               "reference": assemble.run_report(suite, cfg, sides["reference"]),
               "candidate": assemble.run_report(suite, cfg, sides["candidate"])}
    tag = "-partial" if stopped else ""  # the rounds completed before Ctrl-C or SIGTERM, named as such
    for name, report in reports.items():
        if stopped:
            report["interrupted"] = stopped
        report_io.write(report_io.seal(report), out / f"{suite.name}-{name}{tag}.json")
    print(table.render(reports["ab"]))
    if stopped:
        print(f"ab_reports: interrupted; the {stopped['rounds_completed']} of {stopped['rounds_planned']} rounds "
              f"that completed are in {out}/{suite.name}-*{tag}.json", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
