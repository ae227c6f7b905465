"""What a cluster run costs over a run in one process: the same cases of a suite measured by
``kernellab-bench`` in this process's worker, then by ``kernellab-bench --ray`` on a local cluster whose
one worker takes the whole machine (one task at a time), each timed around the call; Ray's start-up is
timed apart and left out of the ratio.

    python tools/ray_overhead.py [--suite cpu-ops] [--cases PATTERNS] [--out DIR] [-- BENCH OPTIONS...]

Prints one JSON object: single_s, ray_s, ray_startup_s, ratio (ray_s / single_s; the issue's target is
<= 1.15). Timings of a loaded machine move run to run: compare several.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default="cpu-ops")
    p.add_argument("--cases", help="--cases for kernellab-bench (default: the whole suite)")
    p.add_argument("--out", help="keep the two reports here (default: a temporary directory)")
    p.add_argument("bench", nargs=argparse.REMAINDER, help="more kernellab-bench options, after --")
    args = p.parse_args(argv)
    try:
        import ray
    except ImportError:
        print("ray_overhead: Ray is not installed: pip install 'kernellab-harness[ray]'", file=sys.stderr)
        return 2
    from kernellab.harness import cli

    extra = [a for a in args.bench if a != "--"]
    common = ["--suite", args.suite, *(["--cases", args.cases] if args.cases else []), "--no-plot", "--quiet", *extra]
    cpus = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="kernellab-overhead-") as tmp:
        out = args.out or tmp
        t0 = time.monotonic()
        code = cli.main([*common, "--out", os.path.join(out, "single.json")])
        single = time.monotonic() - t0
        if code != 0:
            print(f"ray_overhead: the single-process run exited {code}", file=sys.stderr)
            return code
        t0 = time.monotonic()
        ray.init(num_cpus=cpus, include_dashboard=False)
        startup = time.monotonic() - t0
        try:
            t0 = time.monotonic()
            code = cli.main([*common, "--ray", "--ray-cpus", str(cpus), "--out", os.path.join(out, "ray.json")])
            on_ray = time.monotonic() - t0
        finally:
            ray.shutdown()
        if code != 0:
            print(f"ray_overhead: the cluster run exited {code}", file=sys.stderr)
            return code
    print(json.dumps({"suite": args.suite, "cases": args.cases, "single_s": round(single, 2), "ray_s": round(on_ray, 2),
                      "ray_startup_s": round(startup, 2), "ratio": round(on_ray / single, 3), "worker_cpus": cpus}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
