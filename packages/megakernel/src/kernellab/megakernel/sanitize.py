"""Every megakernel kernel under compute-sanitizer: ``python -m kernellab.megakernel.sanitize [--out DIR]``.

Runs memcheck (``--report-api-errors no``: the libraries' cuGetProcAddress probes are not ours),
racecheck, synccheck and initcheck, each over a child process that launches every kernel variant
once at small shapes (an aligned one for the tensor-core engines, an odd one for the CUDA-core
engines, both hidden placements and both weight placements of the persistent kernel, the prologue
kernels, both forms and every row tile of the fused persistent-stack kernel) and checks each output.
Writes ``DIR/sanitize.json`` ({tool: {errors or hazards: n}} and the run's provenance: the report's
``sanitizers`` block, via ``report --sanitizers DIR/sanitize.json``) and one log per tool.
``--cases TEXT`` keeps the cases whose label contains TEXT (a quick rerun of one kernel after a fix; the record
lists the cases that ran). Exits 2 where there is no GPU or no compute-sanitizer, or no case matches; 1 when a tool
reports anything.
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

TOOLS = {
    "memcheck": ["--tool", "memcheck", "--report-api-errors", "no", "--leak-check", "no"],
    "racecheck": ["--tool", "racecheck", "--racecheck-report", "all"],
    "synccheck": ["--tool", "synccheck"],
    "initcheck": ["--tool", "initcheck"],
}
ALIGNED, ODD = (33, 32, 72), (5, 19, 37)


STACK = "persistent-stack"  # compile_model's opt-in whole-stack engine
PROLOGUES = "compiled two-block stack with prologues"


def stack_cases():
    """(label, spec, rows, forced fused plan): every persistent-stack variant family at a small model: every form,
    each row tile, gated and plain, every norm and activation, odd sizes, a final norm, multi-tile CTAs."""
    gated = {"activation": "silu", "norm": "rmsnorm", "gated": True, "bias": False}
    plain = [{"hidden": 100, "activation": "gelu", "norm": {"kind": "layernorm", "bias": True}},
             {"hidden": 64, "activation": "gelu_erf"}, {"hidden": 37, "activation": "relu", "norm": "rmsnorm"}]
    return [
        ("persistent-stack grid form, gated, final norm, 3 row tiles", {"channels": 72, "final_norm": "rmsnorm",
         "blocks": [{"hidden": 200, **gated}, {"hidden": 130, **gated}]}, 40,
         {"engine": STACK, "stack_form": "grid", "stack_tile_rows": 16}),
        ("persistent-stack grid form, 64-row tile, plain, two chunks a CTA", {"channels": 64, "blocks": [
         {"hidden": 500, "activation": "silu", "norm": "rmsnorm"}] * 2}, 50, {"engine": STACK, "stack_form": "grid"}),
        ("persistent-stack grid form, plain, every norm and activation, one row", {"channels": 19, "blocks": plain},
         1, {"engine": STACK, "stack_form": "grid"}),
        ("persistent-stack rows form, 16-row tiles, 2 tiles for some CTAs", {"channels": 19, "blocks": plain,
         "final_norm": "layernorm"}, 2240, {"engine": STACK, "stack_form": "rows", "stack_tile_rows": 16}),
        ("persistent-stack rows form, 32-row tiles, gated", {"channels": 64, "blocks": [{"hidden": 96, **gated}] * 2},
         70, {"engine": STACK, "stack_form": "rows", "stack_tile_rows": 32}),
        ("persistent-stack rows form, 64-row tiles, partial tile", {"channels": 130, "blocks": plain}, 100,
         {"engine": STACK, "stack_form": "rows", "stack_tile_rows": 64}),
        ("persistent-stack gemv form, one row, gated, final norm", {"channels": 72, "final_norm": "rmsnorm",
         "blocks": [{"hidden": 200, **gated}, {"hidden": 130, **gated}]}, 1, {"engine": STACK, "stack_form": "gemv"}),
        ("persistent-stack gemv form, 4-row tiles over 5 rows, plain, every norm and activation",
         {"channels": 200, "blocks": plain, "final_norm": "layernorm"}, 5,
         {"engine": STACK, "stack_form": "gemv", "stack_tile_rows": 4}),
        ("persistent-stack mma form, 16-row tiles over 20 rows, gated, final norm", {"channels": 72,
         "final_norm": "rmsnorm", "blocks": [{"hidden": 200, **gated}, {"hidden": 130, **gated}]}, 20,
         {"engine": STACK, "stack_form": "mma", "stack_tile_rows": 16}),
    ]


def cases():
    """(label, engine, shape, forced plan choices): every kernel variant at a small shape; forced
    choices reach the multi-tile loop and the three weight placements of the persistent kernels."""
    return [
        ("conventional", "conventional", ODD, {}),
        ("persistent, weights in smem", "persistent", ODD, {"weights": "smem"}),
        ("persistent, global weights, 3 tiles per CTA", "persistent", (67, 19, 37), {"tile_rows": 8, "grid": 3,
                                                                                       "weights": "global"}),
        ("persistent-global, weights in smem, 3 tiles per CTA", "persistent-global", (67, 19, 37),
         {"tile_rows": 8, "grid": 3}),
        ("persistent-global, global weights", "persistent-global", ODD, {"weights": "global"}),
        ("persistent, weights staged by 16-byte cp.async, 3 tiles per CTA", "persistent", (67, 24, 40),
         {"tile_rows": 8, "grid": 3, "weights": "smem"}),
        ("persistent-global, weights staged by 16-byte cp.async", "persistent-global", ALIGNED, {"weights": "smem"}),
        ("persistent, eight lanes an output (one row, 7 channels)", "persistent", (1, 7, 13), {}),
        ("persistent, weights in registers, 6 tiles per CTA, partial last tile", "persistent", (67, 25, 40),
         {"tile_rows": 4, "grid": 3, "weights": "registers"}),
        ("persistent-global, weights in registers, 6-8 elements a lane", "persistent-global", (129, 31, 47), {}),
        ("persistent, one thread an output (32-row tiles), 3 tiles per CTA", "persistent", (67, 19, 37),
         {"tile_rows": 32, "grid": 1}),
        ("conventional-tc", "conventional-tc", ALIGNED, {}),
        ("persistent-tc, 32-row tiles, two chunk buffers", "persistent-tc", ALIGNED, {}),
        ("persistent-tc, 64-row mma.sync tiles, partial chunk, 2 tiles per CTA", "persistent-tc", (130, 136, 200),
         {"tile_rows": 64, "grid": 2, "mma": "mma.sync"}),
        ("persistent-tc, one chunk buffer, partial chunk, 2 tiles per CTA", "persistent-tc", (130, 136, 200),
         {"grid": 2, "stages": 1, "split": 1}),
        ("persistent-tc, four chunk buffers, partial chunk, 2 tiles per CTA", "persistent-tc", (70, 40, 200),
         {"grid": 2, "split": 1}),
        ("persistent-tc, element loads (odd sizes), three chunk buffers, 2 tiles per CTA", "persistent-tc",
         (67, 19, 150), {"grid": 2}),
        ("persistent-tc wgmma, 64-row tiles split by columns, 2 tiles per CTA", "persistent-tc", (130, 64, 200),
         {"grid": 2, "mma": "wgmma"}),
        ("persistent-tc wgmma, 128-row tiles split by rows, partial tile", "persistent-tc", (200, 136, 72),
         {"tile_rows": 128, "mma": "wgmma"}),
        ("persistent-tc, hidden split over a 2-CTA cluster, odd chunk count, 3 tiles per cluster", "persistent-tc",
         (200, 64, 200), {"split": 2, "grid": 6}),
        ("persistent-tc, hidden split, one chunk (one CTA of the pair has none)", "persistent-tc", (70, 40, 40),
         {"split": 2}),
        ("persistent-tc, hidden split over a 4-CTA cluster, a chunk a CTA, 2 tiles per cluster", "persistent-tc",
         (200, 64, 200), {"split": 4, "grid": 8}),
        ("persistent-tc, hidden split over an 8-CTA cluster, 3 CTAs without a chunk", "persistent-tc",
         (70, 128, 320), {"split": 8}),
        ("persistent-tc wgmma, cp.async weight loads, hidden split, 2 tiles per cluster", "persistent-tc",
         (130, 64, 200), {"split": 2, "grid": 2, "mma": "wgmma", "loads": "cp.async"}),
        ("persistent-tc wgmma, TMA weight loads, hidden split, odd chunk count, 4 tiles per cluster",
         "persistent-tc", (200, 64, 200), {"mma": "wgmma", "loads": "tma", "split": 2, "grid": 2}),
        ("persistent-tc wgmma, TMA weight loads, hidden split over a 4-CTA cluster, partial chunk, 2 tiles per "
         "cluster", "persistent-tc", (130, 136, 520), {"mma": "wgmma", "loads": "tma", "split": 4, "grid": 8}),
        ("persistent-tc wgmma, TMA weight loads, hidden split over an 8-CTA cluster, 3 CTAs without a chunk",
         "persistent-tc", (70, 128, 320), {"mma": "wgmma", "loads": "tma", "split": 8}),
        ("persistent-tc, programmatic dependent launch, 32-row tiles (cp.async)", "persistent-tc", (257, 64, 128),
         {"pdl": True}),
        ("persistent-tc wgmma, programmatic dependent launch, hidden split over 4 CTAs", "persistent-tc",
         (1024, 256, 1024), {"pdl": True}),
        ("persistent-tc wgmma, weight multicast over a 2-CTA cluster, 2 tiles per CTA, one empty tile",
         "persistent-tc", (130, 64, 200), {"mma": "wgmma", "multicast": 2, "grid": 2}),
        ("persistent-tc wgmma, weight multicast, partial channel tile, an idle CTA's empty tile", "persistent-tc",
         (130, 136, 200), {"mma": "wgmma", "multicast": 2}),
        ("persistent-tc wgmma, weight multicast over a 4-CTA cluster, 2 tiles per CTA, empty tiles", "persistent-tc",
         (300, 128, 264), {"mma": "wgmma", "multicast": 4, "grid": 4}),
        ("persistent-tc wgmma, overlapped chunk schedule, partial chunk, 2 tiles per CTA", "persistent-tc",
         (130, 136, 200), {"mma": "wgmma", "loads": "tma", "split": 1, "overlap": True, "grid": 2}),
        ("persistent-tc wgmma, overlapped schedule, hidden split, odd chunk count, 2 tiles per cluster",
         "persistent-tc", (200, 64, 200), {"mma": "wgmma", "loads": "tma", "split": 2, "overlap": True, "grid": 2}),
        ("persistent-tc wgmma, overlapped schedule, a single chunk", "persistent-tc", (70, 40, 40),
         {"mma": "wgmma", "loads": "tma", "split": 1, "overlap": True}),
        ("persistent-tc register form, element loads, 3 tiles per CTA", "persistent-tc", (40, 7, 13),
         {"registers": True, "grid": 1}),
        ("persistent-tc register form, element loads, a last 16-block alone, partial tile", "persistent-tc",
         (21, 37, 29), {"registers": True}),
        ("persistent-tc register form, 16-byte runs, a last 16-block alone, 2 tiles per CTA", "persistent-tc",
         (35, 40, 24), {"registers": True, "grid": 2}),
    ]


def wanted(label: str, text: str | None) -> bool:
    """Whether ``--cases TEXT`` keeps the case of this label (every case where it is None)."""
    return text is None or text in label


def child(text: str | None = None) -> int:
    """Launch every case (whose label contains ``text``) once and validate it; returns the number of failed
    validations."""
    import torch

    from . import bench, engines, planning, validation
    from .compiler.runner import compile_model

    failures = 0
    device = planning.current_device()
    for label, engine, shape, choices in cases():
        if not wanted(label, text):
            continue
        problem = bench.ResidualMLP(shape)
        plan = planning.forced(engine, *shape, device, **choices)
        run = engines.launcher(plan.engine, plan, problem.activation)
        inputs = problem.make_inputs(1)
        y = problem.make_outputs(inputs)["y"]
        run(inputs["x"], inputs["x"], inputs["w1"], inputs["b1"], inputs["w2"], inputs["b2"], y)
        torch.cuda.synchronize()
        tol = problem.tolerance()
        check = validation.error_summary(y, problem.reference(inputs)["y"], tol.rtol, tol.atol,
                                         problem.slack(inputs)["y"])
        failures += not check["passed"]
        print(f"{label} ({shape}): passed={check['passed']} max_abs={check['max_abs_error']}", flush=True)
    if wanted(PROLOGUES, text):
        stack = {"channels": 24, "blocks": [{"hidden": 40, "norm": True}, {"hidden": 48, "activation": "silu"}]}
        compiled = compile_model(stack, rows=9, engine="persistent")
        out = compiled(torch.randn(9, 24, device="cuda").half())
        torch.cuda.synchronize()
        finite = bool(torch.isfinite(out).all())
        failures += not finite
        print(f"{PROLOGUES}: finite={finite}", flush=True)
    from . import stack as stacks
    from .models import STACK_TOLERANCE

    for label, spec, rows, forced in stack_cases():
        if not wanted(label, text):
            continue
        compiled = compile_model(spec, rows=rows, seed=1, **forced)
        x = torch.randn(rows, spec["channels"], device="cuda").half()
        out = torch.full((rows, spec["channels"]), float("nan"), device="cuda")
        compiled(x, out=out)
        torch.cuda.synchronize()
        truth = stacks.reference_stack(x, compiled.program.blocks, compiled.parameters, compiled.program.final_norm,
                                       compiled.final_parameters)
        check = validation.error_summary(out, truth, STACK_TOLERANCE, STACK_TOLERANCE)
        failures += not check["passed"]
        print(f"{label}: passed={check['passed']} max_abs={check['max_abs_error']}", flush=True)
    return failures


def provenance(device: str = "cuda") -> dict | str:
    """What ran (device, packages, commit, our sources' hashes): the harness's record, where it is installed."""
    try:
        from kernellab.harness.provenance import of_check
    except ImportError:
        return "not recorded: kernellab-harness is not installed"
    return of_check(device, Path(__file__).resolve().parent, ["megakernel"])


def count(tool: str, log: str) -> dict:
    """The tool's own summary line, as numbers."""
    if tool == "racecheck":
        m = re.search(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", log)
        if m:
            return {"hazards": int(m.group(1)), "errors": int(m.group(2)), "warnings": int(m.group(3))}
        return {"hazards": 0 if "RACECHECK SUMMARY" not in log and "ERROR SUMMARY: 0" in log else None}
    m = re.search(r"ERROR SUMMARY: (\d+) errors?", log)
    return {"errors": int(m.group(1)) if m else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernellab.megakernel.sanitize", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="reports/h200/sanitize", help="directory for sanitize.json and the logs")
    p.add_argument("--tools", default=",".join(TOOLS), help=f"comma-separated subset of {list(TOOLS)}")
    p.add_argument("--cases", metavar="TEXT", help="only the cases whose label contains TEXT")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    labels = [label for label in [c[0] for c in cases()] + [PROLOGUES] + [c[0] for c in stack_cases()]
              if wanted(label, args.cases)]
    if not labels:
        print(f"sanitize: --cases {args.cases!r} matches no case label", file=sys.stderr)
        return 2
    if args.child:
        return 1 if child(args.cases) else 0
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if not has_gpu:
        print("sanitize: no CUDA device; compute-sanitizer needs a GPU", file=sys.stderr)
        return 2
    sanitizer = shutil.which("compute-sanitizer") or next(
        (str(c) for c in (Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "compute-sanitizer",)
         if c.exists()), None)
    if sanitizer is None:
        print("sanitize: compute-sanitizer not found on PATH or in $CUDA_HOME/bin", file=sys.stderr)
        return 2
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    unknown = sorted(set(tools) - set(TOOLS))
    if unknown:
        print(f"sanitize: unknown tools {unknown}; known: {list(TOOLS)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # compile everything once outside the sanitizer (the DSL's disk cache serves the children)
    child_cmd = [sys.executable, "-m", "kernellab.megakernel.sanitize", "--child",
                 *(["--cases", args.cases] if args.cases else [])]
    warm = subprocess.run(child_cmd, capture_output=True, text=True)
    (out / "plain.log").write_text(warm.stdout + warm.stderr)
    results: dict = {"cases": labels,
                     "plain_run_exit_code": warm.returncode}
    bad = warm.returncode != 0
    # the tools run side by side, each in its own process and context on the one GPU
    commands = {tool: [sanitizer, *TOOLS[tool], *child_cmd] for tool in tools}
    print(f"sanitize: {', '.join(tools)} ...", file=sys.stderr, flush=True)
    procs = {}
    for tool, cmd in commands.items():
        with open(out / f"{tool}.log", "w") as log:
            procs[tool] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    for tool, proc in procs.items():
        code = proc.wait()
        counted = count(tool, (out / f"{tool}.log").read_text())
        tool_args = commands[tool][:-len(child_cmd)]
        results[tool] = {**counted, "exit_code": code, "command": " ".join(tool_args + ["<child>"])}
        found = counted.get("hazards") if tool == "racecheck" else counted.get("errors")
        bad |= found != 0 or code != 0
        print(f"sanitize: {tool}: {counted} (exit {code})", file=sys.stderr, flush=True)
    results["provenance"] = provenance()
    (out / "sanitize.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k != "provenance"}, indent=2))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
