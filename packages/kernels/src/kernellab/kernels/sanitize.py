"""compute-sanitizer (memcheck, racecheck, synccheck, initcheck) over every GPU kernel variant.

    python -m kernellab.kernels.sanitize [--out DIR] [--tools memcheck,racecheck]

Runs a small driver (``--driver``) that launches each op / dtype / N class / flag variant once at a
small shape and checks its result against the float64 reference, once under each tool, in its own
subprocess. Parses each tool's error (and racecheck hazard) counts, writes ``DIR/sanitize.json``
({tool: {errors, warnings, returncode, driver_ok, log}}) and prints a table. Exit status: 0 clean,
1 any error or failed driver, 2 no CUDA device or no compute-sanitizer here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
TOOL_FLAGS = {"memcheck": ["--report-api-errors", "no"]}  # the libraries' cuGetProcAddress probes

# (op, dtype, M, N, weight dtype ("x" = x's dtype), bias, residual, row stride pad): each N class
# reaches one code path: one thread per row, a narrow alignment class, a scalar tail over several
# warps, 128-bit rows, a cluster of CTAs per row, streamed rows
N_CLASSES = (1, 20, 1537, 4096, 40000, 140000)
DRIVER_CASES = [
    *[(op, dt, 3, n, "x", op == "layernorm", False, 0)
      for op in ("softmax", "rmsnorm", "layernorm") for dt in ("float32", "bfloat16") for n in N_CLASSES],
    ("softmax", "float16", 5, 1000, None, False, False, 8),
    ("rmsnorm", "float16", 5, 2048, "float32", False, True, 8),
    ("rmsnorm", "bfloat16", 2, 40000, None, False, True, 0),
    ("rmsnorm", "float32", 2, 140000, "float32", False, True, 0),
    ("layernorm", "bfloat16", 5, 4096, "float32", True, False, 16),
]


def find_sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.access(os.path.join(root, "bin", "compute-sanitizer"), os.X_OK):
            return os.path.join(root, "bin", "compute-sanitizer")
    return None


def run_driver() -> int:
    """Launch every variant once and compare with the float64 reference; non-zero on a mismatch."""
    import torch

    from kernellab.harness.suites import reference

    from . import gpu

    def host(t):  # the float64 truth is computed on the CPU, so the tools see our kernels alone
        return None if t is None else t.cpu()

    failures = 0
    for op, dt, m, n, wdt, has_bias, has_res, pad in DRIVER_CASES:
        dtype = getattr(torch, dt)
        g = torch.Generator(device="cuda").manual_seed(m * 1_000_003 + n)
        x = torch.randn(m, n + pad, device="cuda", generator=g).to(dtype)[:, :n]
        wdtype = None if wdt is None else dtype if wdt == "x" else getattr(torch, wdt)
        w = None if wdtype is None else torch.randn(n, device="cuda", generator=g).to(wdtype)
        b = torch.randn(n, device="cuda", generator=g).to(w.dtype if w is not None else dtype) if has_bias else None
        r = torch.randn(m, n, device="cuda", generator=g).to(dtype) if has_res else None
        if op == "softmax":
            got, want = gpu.softmax(x), reference.softmax(host(x))
        elif op == "rmsnorm":
            got, want = gpu.rmsnorm(x, w, 1e-6, r), reference.rmsnorm(host(x), host(w), 1e-6, host(r))
            want = want if r is not None else want[0]
        else:
            got, want = gpu.layernorm(x, w, b, 1e-5), reference.layernorm(host(x), host(w), host(b), 1e-5)
        torch.cuda.synchronize()
        tol = 1e-4 if dt == "float32" else 3e-2
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        for a, e in zip(got, want, strict=True):
            if not torch.allclose(a.double(), e.to(a.device), rtol=tol, atol=tol):
                failures += 1
                print(f"MISMATCH {op} {dt} {m}x{n} w={wdt} b={has_bias} res={has_res}", flush=True)
    print(f"driver: {len(DRIVER_CASES)} variants, {failures} mismatches", flush=True)
    return 1 if failures else 0


def parse(tool: str, log: str) -> dict:
    """Error and warning counts from a compute-sanitizer log (None where no summary was printed)."""
    summary = re.findall(r"ERROR SUMMARY:\s*(\d+)\s+error", log)
    errors = int(summary[-1]) if summary else None
    warnings = 0
    if tool == "racecheck":
        hazards = re.findall(r"RACECHECK SUMMARY:\s*\d+ hazards? displayed \((\d+) errors?, (\d+) warnings?\)", log)
        if hazards:
            errors = max(errors or 0, int(hazards[-1][0]))
            warnings = int(hazards[-1][1])
    return {"errors": errors, "warnings": warnings}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernellab.kernels.sanitize", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="reports/sanitize", help="directory for sanitize.json and the tool logs")
    ap.add_argument("--tools", default=",".join(TOOLS), help=f"comma-separated subset of {','.join(TOOLS)}")
    ap.add_argument("--driver", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.driver:
        return run_driver()
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    unknown = sorted(set(tools) - set(TOOLS))
    if unknown:
        ap.error(f"unknown tools {unknown}; tools are {list(TOOLS)}")

    import torch

    if not torch.cuda.is_available():
        print("sanitize: no CUDA device here; compute-sanitizer needs a GPU", file=sys.stderr)
        return 2
    sanitizer = find_sanitizer()
    if sanitizer is None:
        print("sanitize: compute-sanitizer not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {}
    for tool in tools:
        cmd = [sanitizer, "--tool", tool, *TOOL_FLAGS.get(tool, []), sys.executable, "-m",
               "kernellab.kernels.sanitize", "--driver"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        log = proc.stdout + proc.stderr
        path = out / f"{tool}.log"
        path.write_text(log)
        counts = parse(tool, log)
        summary[tool] = {**counts, "returncode": proc.returncode,
                         "driver_ok": "0 mismatches" in log and proc.returncode == 0, "log": str(path)}
    (out / "sanitize.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    print(f"{'tool':<10} {'errors':>7} {'warnings':>8} {'driver':>7}")
    for tool, s in summary.items():
        errors = "?" if s["errors"] is None else s["errors"]
        print(f"{tool:<10} {errors:>7} {s['warnings']:>8} {'ok' if s['driver_ok'] else 'FAILED':>7}")
    print(f"summary: {out / 'sanitize.json'}")
    clean = all(s["errors"] == 0 and s["driver_ok"] for s in summary.values())
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
