"""Nsight Compute profile of persistent-tc plans (and torch-cublas) at one shape, on the GPU host: where the
time of one call goes (SM and memory throughput, tensor-pipe use, occupancy, warp stalls), so that the
next kernel change aims at the bound that holds and not at a guess.

    python3 tools/device/megakernel_profile.py --shape 1x7x13 [--plans 'planned,torch-cublas']
                                               [--name NAME | --out PATH]
    python3 tools/device/megakernel_profile.py --shape 257x64x128 --plans persistent --source [--name NAME]
    python3 tools/device/megakernel_profile.py --model mlp8-c512-h2048-rms-silu --rows 1 [--plans 'stack*,chain']
    python3 tools/device/megakernel_profile.py --show PROFILE.json... [--markdown]   (anywhere: a short table of
                                                                                  written ones)

The plans are ``megakernel_sweep.PLANS``' labels plus ``torch-cublas``; with ``--model`` (a model of the report's
models section at ``--rows``), ``MODEL_PLANS``: the fused stack as planned, each of its forms forced, and the
per-block chain. Each label runs in its own child
process under ``ncu --profile-from-start off``: the child validates its plan, makes one untimed call (the
compile), then profiles one call between ``cudaProfilerStart`` and ``cudaProfilerStop``, so only that call's
kernels are measured. Clocks are left to the GPU (``--clock-control none``, as the timing harness runs).
Besides the sections, every warp-stall metric (``STALLS``, a regular expression over ncu's metric names:
the average warps stalled per issued instruction, by reason), so that the table can name the reasons a
kernel waits on most (instruction fetch, a barrier, a memory load). Writes $OUT/NAME.json (``--name``,
default megakernel_profile) or ``--out PATH``, with the harness's provenance and every metric ncu printed, and
prints a short table last.

``--source`` profiles the SASS instead (ncu's SourceCounters, exported as its source page): per kernel launch, the
warp instructions executed, in all and per warp (the plan's grid times its warps), by opcode, and the lines that
ran most and that the warp-state sampler caught most. It says where a kernel's instructions go (its loops against
the code that runs once a warp) where the sections only say how fast they issue.
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import io
import json
import os
import re
import subprocess
import sys
import tempfile

from records import add_arguments, path_of  # this folder

SECTIONS = ("SpeedOfLight", "MemoryWorkloadAnalysis", "ComputeWorkloadAnalysis", "Occupancy", "LaunchStats",
            "WarpStateStats", "SchedulerStats")
STALLS = r"regex:smsp__average_warps?_.*issue_stalled_.*"
STALL_PER_ISSUE = ("smsp__average_warps_issue_stalled_", "_per_issue_active.ratio")  # name = prefix + reason + suffix
SHOWN = {  # table column -> the (section, metric) ncu prints in its details page
    "us": ("GPU Speed Of Light Throughput", "Duration"),
    "sm %": ("GPU Speed Of Light Throughput", "Compute (SM) Throughput"),
    "mem %": ("GPU Speed Of Light Throughput", "Memory Throughput"),
    "l2 %": ("GPU Speed Of Light Throughput", "L2 Cache Throughput"),
    "regs": ("Launch Statistics", "Registers Per Thread"),
    "ctas": ("Launch Statistics", "Grid Size"),
    "threads": ("Launch Statistics", "Block Size"),
    "sms": ("Launch Statistics", "# SMs"),
    "occ %": ("Occupancy", "Achieved Occupancy"),
    "cyc/issue": ("Warp State Statistics", "Warp Cycles Per Issued Instruction"),
    "issue %": ("Scheduler Statistics", "Issue Slots Busy"),
}


def parse_details(text: str) -> list[dict]:
    """ncu's ``--csv --page details`` output -> one {"kernel", "metrics": {section: {name: (value, unit)}}}
    per profiled kernel launch, in launch order (ncu's ``ID`` column)."""
    start = text.find('"ID"')
    if start < 0:
        return []
    launches: dict[str, dict] = {}
    for row in csv.DictReader(io.StringIO(text[start:])):
        if not (row.get("ID") or "").isdigit() or row.get("Metric Name") is None:
            continue  # a line the profiled program printed after ncu's table
        launch = launches.setdefault(row["ID"], {"kernel": row["Kernel Name"], "metrics": {}})
        section = launch["metrics"].setdefault(row["Section Name"], {})
        section[row["Metric Name"]] = (row["Metric Value"], row["Metric Unit"])
    return [launches[k] for k in sorted(launches, key=int)]


def _number(value: str, unit: str) -> float | None:
    try:
        number = float(value.replace(",", ""))
    except ValueError:
        return None
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(unit)
    return number * scale if scale else number


COUNTS = ("ctas", "threads", "sms", "regs")  # columns printed as whole numbers


def cells(numbers: dict, columns) -> str:
    """The table's cells of ``columns`` ('-' where ncu printed no such metric)."""
    return " ".join(f"{'-' if numbers[c] is None else format(numbers[c], '.0f' if c in COUNTS else '.1f'):>9s}"
                    for c in columns)


def summary(launch: dict) -> dict:
    """The table's numbers of one kernel launch (None where ncu printed no such metric)."""
    out = {}
    for column, (section, metric) in SHOWN.items():
        value, unit = launch["metrics"].get(section, {}).get(metric, ("", ""))
        out[column] = _number(value, unit)
    return out


def top_stalls(launch: dict, count: int = 3) -> str:
    """The ``count`` stall reasons with the most warps stalled per issued instruction, as reason=value."""
    prefix, suffix = STALL_PER_ISSUE
    found = {}
    for section in launch["metrics"].values():
        for name, (value, unit) in section.items():
            if name.startswith(prefix) and name.endswith(suffix):
                number = _number(value, unit)
                if number is not None:
                    found[name[len(prefix):-len(suffix)]] = number
    best = sorted(found.items(), key=lambda kv: -kv[1])[:count]
    return " ".join(f"{reason}={value:.1f}" for reason, value in best)


def child(shape: tuple, label: str) -> None:
    from megakernel_sweep import labelled_call

    from kernellab.megakernel import bench, planning

    problem = bench.ResidualMLP(shape, activation=bench.DEFAULT_ACTIVATION)
    try:
        description, call = labelled_call(problem, label, bench.DEFAULT_ACTIVATION, planning.current_device())
    except ValueError as e:
        sys.exit(f"{label} does not run at {shape}: {e}")
    profile_one_call(problem, call, description)


def profile_one_call(problem, call, description: dict) -> None:
    """The profiled program's part: one untimed call (the compile), then one call between cudaProfilerStart and
    cudaProfilerStop, then the plan as a ``PLAN`` line for the parent."""
    import torch

    inputs = problem.make_inputs(1)
    outputs = problem.make_outputs(inputs)
    call(inputs, outputs)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    call(inputs, outputs)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print("PLAN " + json.dumps(description), flush=True)


MODEL_PLANS = {"stack": None, "stack-grid": "grid", "stack-rows": "rows", "stack-gemv": "gemv", "stack-mma": "mma",
               "chain": None}
"""--model labels -> the fused stack's forced form (None: as planned; "chain": the per-block persistent-tc chain)."""


def model_child(name: str, rows: int, label: str) -> None:
    """One model's call under the profiler, as ``child`` does for a shape: compile, validate as the models
    section does (the harness's check of the float64 reference, poisoned outputs), then ``profile_one_call``."""
    from kernellab.harness import validate
    from kernellab.harness.case import seed_for
    from kernellab.megakernel import models
    from kernellab.megakernel.compiler.runner import compile_model
    from kernellab.megakernel.planning.stack import STACK_ENGINE

    case = {c.name: c for c in models.REPORT_MODELS}[name]
    engine = "persistent-tc" if label == "chain" else STACK_ENGINE
    compiled = compile_model(case.spec, rows=rows, engine=engine, stack_form=MODEL_PLANS[label])
    problem = models.StackProblem(case, rows)

    def call(inputs, outputs):
        compiled(inputs["x"], out=outputs["y"])
        return outputs

    check = validate.validate_call(problem, call, seed_for(problem.name, 0))
    if not check["passed"]:
        sys.exit(f"{label} of {name} at {rows} rows does not pass validation: {check}")
    profile_one_call(problem, call, {"plan": str(compiled.plan()), "validation": check})


def _child_command(shape: tuple, label: str) -> list[str]:
    """This script as the profiled program: one label's call at the shape, or (``shape`` = (model, rows)) at
    the model (``child``, ``model_child``)."""
    if isinstance(shape[0], str):
        return [sys.executable, os.path.abspath(__file__), "--child", "--model", shape[0], "--rows", str(shape[1]),
                "--plans", label]
    return [sys.executable, os.path.abspath(__file__), "--child", "--shape", "x".join(map(str, shape)),
            "--plans", label]


def _printed_plan(stdout: str) -> dict | None:
    """The plan the child printed (its ``PLAN`` line), or None where it printed none."""
    return next((json.loads(line[5:]) for line in stdout.splitlines() if line.startswith("PLAN ")), None)


def profile(shape: tuple, label: str) -> dict:
    """One label's ncu run: its plan, its kernels' metrics, or the error ncu or the child printed."""
    ncu = ["ncu", "--clock-control", "none", "--profile-from-start", "off", "--csv", "--page", "details",
           *[arg for s in SECTIONS for arg in ("--section", s)]]
    program = _child_command(shape, label)
    done = subprocess.run([*ncu, "--metrics", STALLS, *program], capture_output=True, text=True, timeout=300)
    if done.returncode:  # an ncu that knows none of the stall metrics: the sections alone
        done = subprocess.run([*ncu, *program], capture_output=True, text=True, timeout=300)
    plan = _printed_plan(done.stdout)
    launches = parse_details(done.stdout)
    record = {"plan": plan, "launches": launches, "returncode": done.returncode}
    if done.returncode or not launches:
        record["error"] = (done.stderr or done.stdout)[-2000:]
    return record


SOURCE_SECTIONS = ("SourceCounters", "WarpStateStats")
EXECUTED, SAMPLES = "Instructions Executed", "Warp Stall Sampling (All Samples)"


def parse_source(text: str) -> list[dict]:
    """ncu's ``--csv --page source --print-source sass`` output -> one {"kernel", "lines"} per kernel launch, each
    line {"address", "sass", "executed", "samples"} (warp-level counts; 0 where ncu printed none)."""
    kernels, columns = [], {}
    rows = list(csv.reader(io.StringIO(text)))
    for i, row in enumerate(rows):
        if row[:1] == ["Kernel Name"]:
            kernels.append({"kernel": row[1] if len(row) > 1 else "", "lines": []})
            columns = {name: j for j, name in enumerate(rows[i + 1] if i + 1 < len(rows) else [])}
        elif kernels and row[:1] != ["Address"] and len(row) > 1:
            kernels[-1]["lines"].append({"address": row[0], "sass": row[columns.get("Source", 1)].strip(),
                                         "executed": _cell(row, columns, EXECUTED),
                                         "samples": _cell(row, columns, SAMPLES)})
    return kernels


def _cell(row: list, columns: dict, name: str) -> float:
    j = columns.get(name)
    return (_number(row[j], "") or 0.0) if j is not None and j < len(row) else 0.0


def opcode(sass: str) -> str:
    """The mnemonic of a SASS line without its predicate and modifiers: '@!P0 BRA 0x..' -> 'BRA'."""
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def source_summary(kernel: dict, warps: int | None, top: int = 12) -> dict:
    """Totals of one launch's source page: warp instructions executed (and per warp, given the launch's warps),
    by opcode (most first), sampler hits, and the ``top`` lines by executed count and by samples."""
    lines = kernel["lines"]
    executed = sum(line["executed"] for line in lines)
    by_opcode: dict[str, float] = {}
    for line in lines:
        if line["executed"]:
            by_opcode[opcode(line["sass"])] = by_opcode.get(opcode(line["sass"]), 0.0) + line["executed"]
    return {
        "kernel": kernel["kernel"], "sass_lines": len(lines), "executed": executed,
        "executed_per_warp": executed / warps if warps else None, "warps": warps,
        "samples": sum(line["samples"] for line in lines),
        "by_opcode": dict(sorted(by_opcode.items(), key=lambda kv: -kv[1])),
        "most_executed": sorted(lines, key=lambda line: -line["executed"])[:top],
        "most_sampled": sorted(lines, key=lambda line: -line["samples"])[:top],
    }


def plan_warps(plan: dict | None) -> int | None:
    """Warps one launch of the plan runs: grid x threads a CTA / 32 (None for torch's kernels)."""
    if not plan or "grid" not in plan or "tile_threads" not in plan:
        return None
    return plan["grid"] * plan["tile_threads"] // 32


def profile_source(shape: tuple, label: str, work: str) -> dict:
    """One label's ncu run for the source page: its plan and each launch's ``source_summary``."""
    report = os.path.join(work, f"{label}.ncu-rep")
    done = subprocess.run(["ncu", "--clock-control", "none", "--profile-from-start", "off", "--import-source", "no",
                           *[arg for s in SOURCE_SECTIONS for arg in ("--section", s)], "-f", "-o", report,
                           *_child_command(shape, label)], capture_output=True, text=True, timeout=300)
    plan = _printed_plan(done.stdout)
    record = {"plan": plan, "returncode": done.returncode, "source": []}
    if done.returncode == 0:
        page = subprocess.run(["ncu", "-i", report, "--page", "source", "--csv", "--print-source", "sass"],
                              capture_output=True, text=True, timeout=300)
        record["source"] = [source_summary(k, plan_warps(plan)) for k in parse_source(page.stdout)]
        done = page
    if done.returncode or not record["source"]:
        record["error"] = (done.stderr or done.stdout)[-2000:]
    return record


SHOWN_BRIEF = ("us", "ctas", "threads", "sms", "mem %", "l2 %", "occ %", "regs", "cyc/issue")


def kernel_label(name: str) -> str:
    """A kernel's name short enough for a table: our engines' class (``engines<module><Class>_object...``), else
    the first 40 characters (torch's)."""
    found = re.search(r"engines([A-Za-z0-9_]+?)_object", name)
    return found.group(1) if found else name[:40]


def show(paths: list[str], markdown: bool = False) -> None:
    """One line per kernel launch of written profiles: shape, plan, a few of the table's numbers, top stalls
    (with ``markdown``, as a markdown table's rows, for a README's generated block)."""
    if markdown:
        print("| shape | plan | kernel | " + " | ".join(SHOWN_BRIEF) + " | top stalls |")
        print("|---|---|---|" + "---|" * len(SHOWN_BRIEF) + "---|")
    else:
        print(f"{'shape':16s} {'plan':12s} " + " ".join(f"{c:>9s}" for c in SHOWN_BRIEF) + "  top stalls")
    for path in paths:
        with open(path) as f:
            record = json.load(f)
        shape = "x".join(map(str, record["shape"]))
        for label, result in record["plans"].items():
            for launch in result.get("launches", []):
                numbers, stalls = summary(launch), top_stalls(launch)
                if markdown:
                    values = " | ".join(cells(numbers, (c,)).strip() for c in SHOWN_BRIEF)
                    print(f"| {shape} | {label} | `{kernel_label(launch['kernel'])}` | {values} | {stalls} |")
                else:
                    print(f"{shape:16s} {label:12s} {cells(numbers, SHOWN_BRIEF)}  {stalls}")
            for launch in result.get("source", []):
                print(f"| {shape} | {label} | {source_line(launch)} |" if markdown
                      else f"{shape:16s} {label:12s} {source_line(launch)}")


def source_line(launch: dict) -> str:
    """A source profile's launch in one line: warp instructions per warp (in all for torch's kernels, whose warps
    the plan does not give) and the opcodes most of them are."""
    scale, unit = (launch["warps"], "a warp") if launch["warps"] else (1, "in all")
    ops = " ".join(f"{op}={n / scale:.0f}" for op, n in list(launch["by_opcode"].items())[:8])
    return f"{launch['executed'] / scale:.0f} instructions {unit}: {ops}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--show", nargs="+", metavar="PROFILE", help="print written profiles' table and stop")
    ap.add_argument("--markdown", action="store_true", help="with --show: a markdown table")
    ap.add_argument("--shape", help="RxCxH (required unless --show or --model)")
    ap.add_argument("--model", help="a model of the report's models section (kernellab.megakernel.models)")
    ap.add_argument("--rows", type=int, default=1, help="the model's rows per call (with --model)")
    ap.add_argument("--plans", default="planned,torch-cublas",
                    help="comma-separated shell patterns over megakernel_sweep.PLANS' labels and torch-cublas")
    add_arguments(ap, "megakernel_profile")
    ap.add_argument("--source", action="store_true",
                    help="profile the SASS (instructions executed by line and opcode) instead of the sections")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.show:
        show(args.show, args.markdown)
        return
    if args.model:
        from kernellab.megakernel import models

        known = [c.name for c in models.REPORT_MODELS]
        if args.model not in known:
            sys.exit(f"--model must be one of {known}, got {args.model!r}")
        if args.rows < 1:
            sys.exit(f"--rows must be >= 1, got {args.rows}")
        if args.child:
            model_child(args.model, args.rows, args.plans)
            return
        shape, names = (args.model, args.rows), list(MODEL_PLANS)
        if args.plans == ap.get_default("plans"):
            args.plans = "stack,chain"
    else:
        if not args.shape:
            ap.error("--shape is required (or --model MODEL, or --show PROFILE...)")
        from megakernel_sweep import PLANS  # this script's folder is on sys.path

        shape = tuple(int(v) for v in args.shape.split("x"))
        if len(shape) != 3 or min(shape) < 1:
            sys.exit(f"--shape must be RxCxH with every size >= 1, got {args.shape!r}")
        if args.child:
            child(shape, args.plans)
            return
        names = [*PLANS, "torch-cublas"]
    labels = [label for label in names if any(fnmatch.fnmatch(label, p) for p in args.plans.split(","))]
    if not labels:
        sys.exit(f"--plans {args.plans!r} matches none of {names}")
    path = path_of(args)

    from kernellab.harness import provenance

    record = {"provenance": provenance.of_check("cuda", __file__, ["megakernel"]), "shape": shape,
              "sections": SOURCE_SECTIONS if args.source else SECTIONS, "plans": {}}
    rows = []
    work = tempfile.mkdtemp() if args.source else None  # where ncu writes its reports for the source page
    for label in labels:
        result = profile_source(shape, label, work) if args.source else profile(shape, label)
        record["plans"][label] = result
        for launch in result.get("launches", []):
            rows.append((label, launch["kernel"][:40], summary(launch), top_stalls(launch)))
        for launch in result.get("source", []):
            print(f"{label:14s} {launch['kernel'][:40]:40s} {source_line(launch)}", flush=True)
        if "error" in result:
            print(f"{label}: ncu exit {result['returncode']}: {result['error'][-300:]}", flush=True)
        with open(path, "w") as f:
            json.dump(record, f, indent=1)
    print(f"{'plan':14s} {'kernel':40s} " + " ".join(f"{c:>9s}" for c in SHOWN) + "  top stalls")
    for label, kernel, numbers, stalls in rows:
        print(f"{label:14s} {kernel:40s} {cells(numbers, SHOWN)}  {stalls}")


if __name__ == "__main__":
    main()
