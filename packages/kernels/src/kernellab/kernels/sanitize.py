"""compute-sanitizer (memcheck, racecheck, synccheck, initcheck) over every GPU kernel variant.

    python -m kernellab.kernels.sanitize [--out DIR] [--tools memcheck,racecheck]

Runs a small driver (``--driver``) that launches each op / dtype / N class / flag variant once at a
small shape, forward and (through autograd) backward, and checks its results against the float64
reference: once plainly (compiling every variant into the DSL's disk cache), then under each tool, the
tools side by side in their own subprocesses.
Parses each tool's error (and racecheck hazard) counts, writes ``DIR/sanitize.json`` ({tool: {errors,
warnings, returncode, driver_ok, log}}, and the run's provenance) and prints a table. Exit status: 0 clean,
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

# (op, dtype, M, N, weight dtype ("x" = x's dtype), bias, residual, row stride pad, plan): each N class
# reaches one code path: one thread per row, a narrow alignment class, a scalar tail over several
# warps, 128-bit rows, a cluster of CTAs per row, streamed rows. ``plan``: None runs what the ops choose;
# Tuning knobs run that explicit plan (ones the heuristic may not pick, which norm_sweep measures)
N_CLASSES = (1, 20, 1537, 4096, 40000, 140000)
DRIVER_CASES = [
    *[(op, dt, 3, n, "x", op == "layernorm", False, 0, None)
      for op in ("softmax", "rmsnorm", "layernorm") for dt in ("float32", "bfloat16") for n in N_CLASSES],
    ("softmax", "float16", 5, 1000, None, False, False, 8, None),
    ("rmsnorm", "float16", 5, 2048, "float32", False, True, 8, None),
    ("rmsnorm", "bfloat16", 2, 40000, None, False, True, 0, None),
    ("rmsnorm", "float32", 2, 140000, "float32", False, True, 0, None),
    ("layernorm", "bfloat16", 5, 4096, "float32", True, False, 16, None),
    # 768 rows of 6144 take a little more than one wave of the heuristic plan on a 132-SM H200: the ops
    # run it under a launch bound (compiler.Plans); the driver counts the bounded plans it ran
    ("rmsnorm", "bfloat16", 768, 6144, "x", False, False, 0, None),
    ("layernorm", "bfloat16", 3, 12280, "x", True, False, 0, None),  # 16-bit LayerNorm rows streamed on one CTA
    ("layernorm", "bfloat16", 3, 16384, "x", True, False, 0, {"tile_values": 0}),  # held in registers
    ("rmsnorm", "float32", 3, 16384, "x", False, False, 0, {"tile_values": 8, "ctas_per_sm": 4}),  # streamed
    ("softmax", "bfloat16", 3, 16384, None, False, False, 0,
     {"accesses": 2, "register_values": 16, "resident_threads": 1536}),  # a cluster of two CTAs
]
# Backward variants, each reached through autograd (so the forwards that store rstd / mean run too):
# (op, dtype, M, N, weight dtype, bias, residual, row stride pad). The N classes as above (140000: streamed
# rows, the vector gradients' partials in global memory; 40000: a row split over a cluster); 5000x64 and
# 300x20000 loop the persistent grid over more row blocks than one wave holds (rows held by one CTA and by a
# cluster).
BACKWARD_CASES = [
    *[(op, dt, 3, n, None if op == "softmax" else "x", op == "layernorm", False, 0)
      for op in ("softmax", "rmsnorm", "layernorm") for dt in ("float32", "bfloat16") for n in N_CLASSES],
    ("rmsnorm", "float16", 5, 2048, "float32", False, True, 8),
    ("rmsnorm", "bfloat16", 4, 1537, None, False, True, 0),
    ("layernorm", "float16", 5, 1000, None, True, False, 8),
    ("layernorm", "bfloat16", 5000, 64, "float32", True, False, 0),
    ("rmsnorm", "bfloat16", 300, 20000, "x", False, False, 0),
    ("layernorm", "float32", 300, 20000, "x", True, False, 0),
    # rows split over a cluster, each cluster looping over several rows (both phases of its barriers)
    ("rmsnorm", "bfloat16", 300, 16384, "x", False, True, 0),
    ("layernorm", "float32", 300, 12289, "float32", True, False, 0),
    ("layernorm", "bfloat16", 3, 65536, None, True, False, 0),  # a cluster of 8, dbias alone
    # more partial rows than a warp's lanes sum at PARTIAL_ROWS_PER_LANE each: the sum by CTAs (compiler.spread_sum_of)
    ("rmsnorm", "bfloat16", 20000, 1024, "x", False, False, 0),
    ("layernorm", "float32", 9000, 1537, "float32", True, False, 0),
    # 512-thread CTAs: the vector gradients' sums in shared memory, the weight re-read per row
    ("layernorm", "float32", 200, 8192, "x", True, False, 0),
    ("rmsnorm", "float32", 200, 8192, "float32", False, True, 0),
    # 16-bit norm rows from base.WIDE_BACKWARD_N: 32 values a thread in CTAs of at most 256 threads, a cluster
    # past them (LayerNorm at 8192 is the one plan with stack bytes)
    ("layernorm", "bfloat16", 200, 8192, "x", True, False, 0),
    ("rmsnorm", "float16", 130, 8192, "float32", False, True, 0),
]


def find_sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.access(os.path.join(root, "bin", "compute-sanitizer"), os.X_OK):
            return os.path.join(root, "bin", "compute-sanitizer")
    return None


def case_inputs(dt: str, m: int, n: int, wdt: str | None, has_bias: bool, has_res: bool, pad: int, salt: int):
    """One driver case's (x, weight, bias, residual) on the GPU, and the generator they were drawn from (for
    further draws): x rows ``pad`` elements apart, the weight in ``wdt`` ("x": x's dtype; None: no weight),
    seeded by the shape and ``salt``."""
    import torch

    dtype = getattr(torch, dt)
    g = torch.Generator(device="cuda").manual_seed(m * salt + n)
    x = torch.randn(m, n + pad, device="cuda", generator=g).to(dtype)[:, :n]
    wdtype = None if wdt is None else dtype if wdt == "x" else getattr(torch, wdt)
    w = None if wdtype is None else torch.randn(n, device="cuda", generator=g).to(wdtype)
    b = torch.randn(n, device="cuda", generator=g).to(w.dtype if w is not None else dtype) if has_bias else None
    r = torch.randn(m, n, device="cuda", generator=g).to(dtype) if has_res else None
    return x, w, b, r, g


def run_driver() -> int:
    """Launch every variant once and compare with the float64 reference; non-zero on a mismatch."""
    import torch

    from kernellab.harness.suites import reference

    from . import gpu

    def host(t):  # the float64 truth is computed on the CPU, so the tools see our kernels alone
        return None if t is None else t.cpu()

    failures = 0
    for op, dt, m, n, wdt, has_bias, has_res, pad, plan in DRIVER_CASES:
        x, w, b, r, _ = case_inputs(dt, m, n, wdt, has_bias, has_res, pad, salt=1_000_003)
        if plan is not None:
            got = explicit_plan(op, x, w, b, plan)
        elif op == "softmax":
            got = gpu.softmax(x)
        elif op == "rmsnorm":
            got = gpu.rmsnorm(x, w, 1e-6, r)
        else:
            got = gpu.layernorm(x, w, b, 1e-5)
        if op == "softmax":
            want = reference.softmax(host(x))
        elif op == "rmsnorm":
            want = reference.rmsnorm(host(x), host(w), 1e-6, host(r))
            want = want if r is not None else want[0]
        else:
            want = reference.layernorm(host(x), host(w), host(b), 1e-5)
        torch.cuda.synchronize()
        tol = 1e-4 if dt == "float32" else 3e-2
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        for a, e in zip(got, want, strict=True):
            if not torch.allclose(a.double(), e.to(a.device), rtol=tol, atol=tol):
                failures += 1
                print(f"MISMATCH {op} {dt} {m}x{n} w={wdt} b={has_bias} res={has_res} plan={plan}", flush=True)
    failures += run_backward_cases()
    from .gpu import ops

    bounded = sum(any(fn is not plans.fn for fn in plans.by_rows.values()) for plans in ops._FUNCTIONS.values())
    print(f"driver: {len(DRIVER_CASES)} variants ({bounded} under a launch bound for M) and {len(BACKWARD_CASES)} "
          f"backward cases, {failures} mismatches", flush=True)
    return 1 if failures else 0


def run_backward_cases() -> int:
    """Forward and backward through autograd for each backward case, against float64 autograd on the CPU;
    returns the number of mismatching gradients."""
    import torch

    from kernellab.harness.suites import reference

    from . import gpu

    forwards = {"softmax": (lambda x, w, b, r: gpu.softmax(x), lambda x, w, b, r: reference.softmax(x)),
                "rmsnorm": (lambda x, w, b, r: gpu.rmsnorm(x, w, 1e-6, r),  # (y, h) with a residual, else y
                            lambda x, w, b, r: reference.rmsnorm(x, w, 1e-6, r)[:1 if r is None else 2]),
                "layernorm": (lambda x, w, b, r: gpu.layernorm(x, w, b, 1e-5),
                              lambda x, w, b, r: reference.layernorm(x, w, b, 1e-5))}
    failures = 0
    for op, dt, m, n, wdt, has_bias, has_res, pad in BACKWARD_CASES:
        x, w, b, r, g = case_inputs(dt, m, n, wdt, has_bias, has_res, pad, salt=1_000_033)
        inputs = (x, w, b, r)
        given = [i for i, t in enumerate(inputs) if t is not None]
        ours, truth = forwards[op]
        leaves = [None if t is None else t.detach().requires_grad_() for t in inputs]
        outs = ours(*leaves)
        outs = outs if isinstance(outs, tuple) else (outs,)
        grads_out = [torch.randn(o.shape, device="cuda", generator=g).to(o.dtype) for o in outs]
        got = torch.autograd.grad(outs, [leaves[i] for i in given], grads_out)
        host = [None if t is None else t.detach().cpu().double().requires_grad_() for t in inputs]
        want_outs = truth(*host)
        want_outs = want_outs if isinstance(want_outs, tuple) else (want_outs,)
        want = torch.autograd.grad(want_outs, [host[i] for i in given], [t.cpu().double() for t in grads_out])
        torch.cuda.synchronize()
        tol = 1e-4 if dt == "float32" else 5e-2
        for i, a, e in zip(given, got, want, strict=True):
            scale = 1.0 if i in (0, 3) else m ** 0.5  # a vector gradient sums M rows
            if not torch.allclose(a.double().cpu(), e, rtol=tol, atol=tol * scale):
                failures += 1
                print(f"MISMATCH backward {op} {dt} {m}x{n} w={wdt} b={has_bias} res={has_res} d{'xwbr'[i]}",
                      flush=True)
    return failures


def explicit_plan(op: str, x, w, b, knobs: dict):
    """An explicit plan's compiled function, called as the ops call it, into a poisoned output."""
    import torch

    from .gpu.base import Tuning
    from .gpu.compiler import Variant, compiled, widest_vector

    def name(t):
        return None if t is None else str(t.dtype).removeprefix("torch.")

    n, dt = x.shape[1], name(x)
    fn = compiled(Variant(op, dt, n, widest_vector(n, dt), weight=name(w), bias=name(b), tuning=Tuning(**knobs)))
    y = torch.full_like(x, float("nan"))
    fn(*{"softmax": (x, y), "rmsnorm": (x, w, None, y, None, None, 1e-6),
         "layernorm": (x, w, b, y, None, None, 1e-5)}[op])
    return y


def provenance(device: str = "cuda") -> dict | str:
    """What ran (device, packages, commit, our sources' hashes): the harness's record, where it is installed."""
    try:
        from kernellab.harness.provenance import of_check
    except ImportError:
        return "not recorded: kernellab-harness is not installed"
    return of_check(device, Path(__file__).resolve().parent, ["kernels"])


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
    driver = [sys.executable, "-m", "kernellab.kernels.sanitize", "--driver"]
    # one plain run first: it compiles every variant into the DSL's disk cache, which the tools' runs then load
    warm = subprocess.run(driver, capture_output=True, text=True)
    (out / "plain.log").write_text(warm.stdout + warm.stderr)
    print(f"plain run: exit {warm.returncode}, {warm.stdout.strip().splitlines()[-1:]}", flush=True)
    procs = {}  # the tools run side by side, each in its own process and context on the one GPU
    for tool in tools:
        with open(out / f"{tool}.log", "w") as log:
            procs[tool] = subprocess.Popen([sanitizer, "--tool", tool, *TOOL_FLAGS.get(tool, []), *driver],
                                           stdout=log, stderr=subprocess.STDOUT)
    summary = {}
    for tool, proc in procs.items():
        code = proc.wait()
        path = out / f"{tool}.log"
        log = path.read_text()
        summary[tool] = {**parse(tool, log), "returncode": code,
                         "driver_ok": "0 mismatches" in log and code == 0, "log": str(path)}
    record = {**summary, "provenance": provenance()}
    (out / "sanitize.json").write_text(json.dumps(record, indent=2, sort_keys=True))
    print(f"{'tool':<10} {'errors':>7} {'warnings':>8} {'driver':>7}")
    for tool, s in summary.items():
        errors = "?" if s["errors"] is None else s["errors"]
        print(f"{tool:<10} {errors:>7} {s['warnings']:>8} {'ok' if s['driver_ok'] else 'FAILED':>7}")
    print(f"summary: {out / 'sanitize.json'}")
    clean = warm.returncode == 0 and all(s["errors"] == 0 and s["driver_ok"] for s in summary.values())
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
