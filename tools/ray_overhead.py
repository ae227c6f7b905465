"""What a cluster run costs over a run in one process (issue 35's overhead target: <= 1.15x).

The same cases of a suite are benched by ``kernellab-bench`` as a plain run and as ``--ray`` on a local
cluster of this one machine (one task at a time: a CPU task takes the node's cores), each a fresh
process timed around the whole call, in pairs whose order alternates so that a machine drifting
during the pairs moves both sides alike. Ray's start-up, which the cluster report records, is left out
of the ratio and reported apart.

    python tools/ray_overhead.py --pairs 3 --out DIR [--suite cpu-ops] [--cases P] [-- BENCH OPTIONS]
    python tools/ray_overhead.py --show RECORD.json   (a written record as a markdown table)

Writes ``ray-overhead.json`` (every pair's wall times, the ratios, the two reports of each pair by name
and sha256, the machine's provenance, and a sha256 over it as reports carry) with the reports beside it, and prints a
short table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET = 1.15


def bench(common: list[str], out: Path, on_ray: bool) -> tuple[float, dict]:
    """One ``kernellab-bench`` process: its wall time and its report."""
    env = {**os.environ, "RAY_worker_niceness": "0"}
    cmd = [sys.executable, "-m", "kernellab.harness", *common, *(["--ray"] if on_ray else []), "--out", str(out)]
    t0 = time.monotonic()
    res = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - t0
    if res.returncode != 0:
        raise SystemExit(f"ray_overhead: {' '.join(cmd)} exited {res.returncode}:\n{res.stderr[-2000:]}")
    return wall, json.loads(out.read_text())


def table(record: dict) -> str:
    """A record as a markdown table: each pair's wall times and ratio, then the median against the target."""
    lines = ["| pair | order | single s | cluster s | Ray start-up s (apart) | ratio |", "|---|---|---|---|---|---|"]
    for i, q in enumerate(record["pairs"]):
        lines.append(f"| {i + 1} | {' then '.join(q['order'])} | {q['single_s']:.1f} | {q['ray_s']:.1f} | "
                     f"{q['ray_startup_s']:.1f} | {q['ratio']:.3f} |")
    verdict = "met" if record["meets_target"] else "missed"
    lines.append(f"\nmedian ratio {record['ratio_median']:.3f} (range {record['ratio_range'][0]:.3f}-"
                 f"{record['ratio_range'][1]:.3f}), target <= {record['target_ratio']}: {verdict}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default="cpu-ops")
    p.add_argument("--cases", help="--cases for kernellab-bench (default: the whole suite)")
    p.add_argument("--pairs", type=int, default=3, help="pairs of runs, alternating which goes first (default 3)")
    p.add_argument("--out", help="folder for the record and the reports")
    p.add_argument("--show", metavar="RECORD", help="print a written record as a markdown table and stop")
    p.add_argument("bench", nargs=argparse.REMAINDER, help="more kernellab-bench options, after --")
    args = p.parse_args(argv)
    if args.show:
        with open(args.show) as f:
            print(table(json.load(f)), end="")
        return 0
    if not args.out:
        p.error("--out: a folder for the record is needed (or --show RECORD)")
    if args.pairs < 1:
        p.error(f"--pairs: expected a whole number >= 1, got {args.pairs}")
    try:
        import ray  # noqa: F401
    except ImportError:
        print("ray_overhead: Ray is not installed: pip install 'kernellab-harness[ray]'", file=sys.stderr)
        return 2
    from kernellab.harness import provenance, report

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    extra = [a for a in args.bench if a != "--"]
    common = ["--suite", args.suite, *(["--cases", args.cases] if args.cases else []), "--no-plot", "--quiet", *extra]
    pairs = []
    for i in range(args.pairs):
        order = ("single", "ray") if i % 2 == 0 else ("ray", "single")
        pair: dict = {"order": list(order)}
        for side in order:
            path = out / f"pair{i}-{side}.json"
            wall, rep = bench(common, path, side == "ray")
            pair[f"{side}_report"] = {"file": path.name, "sha256": rep["sha256"]}
            if side == "ray":
                info = rep["provenance"]["cluster"]
                pair.update(ray_wall_s=wall, ray_startup_s=info["ray_startup_s"], ray_run_s=info["run_s"],
                            ray_s=wall - info["ray_startup_s"], ray_nodes=len(info["nodes"]))
            else:
                pair["single_s"] = wall
                cases = sorted(c["id"] for c in rep["cases"])
        pair["ratio"] = pair["ray_s"] / pair["single_s"]
        pairs.append(pair)
        print(f"pair {i + 1}/{args.pairs} ({' then '.join(order)}): single {pair['single_s']:.1f} s, "
              f"ray {pair['ray_s']:.1f} s (+ start-up {pair['ray_startup_s']:.1f} s), ratio {pair['ratio']:.3f}",
              file=sys.stderr)
    ratios = [q["ratio"] for q in pairs]
    record = {
        "kind": "ray-overhead",
        "what": "wall time of `kernellab-bench --ray` on a local one-node cluster over the same plain run, "
                "each a fresh process; Ray's start-up (the cluster report's ray_startup_s) left out",
        "command": ["python", "tools/ray_overhead.py", *(argv if argv is not None else sys.argv[1:])],
        "suite": args.suite, "cases": cases, "bench_args": common, "target_ratio": TARGET,
        "pairs": pairs, "ratio_median": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)],
        "meets_target": statistics.median(ratios) <= TARGET,
        "provenance": {"device": provenance.collect("cpu", None, [], [], [])["device"],
                       "git": provenance.git_state(Path.cwd()), "load_average": list(os.getloadavg())},
    }
    record["sha256"] = report.report_hash(record)  # the harness's canonical hash: an edit shows
    path = out / "ray-overhead.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(table(record), end="")
    print(f"record: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
