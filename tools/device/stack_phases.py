"""Where the fused stack's matrix-vector forms spend a call, on the GPU host: each report model at decode rows,
the gemv and mma forms (forced) timed in a CUDA graph (harness ``graph_throughput``) three ways, each compiled in
a process of its own:

    full      the kernel as shipped, validated first against the float64 reference
    phase_a   phase B's items compiled out (no W2 copies, products or adds into the next stream buffer)
    skeleton  both phases' items compiled out: each block's operand (the norm of the stream), the next stream
              buffer's zeroing and the two grid barriers, then the final rows

The differences are phase B's and phase A's costs; ``skeleton`` is what the form costs however fast its products
get (its latency chain: 2 grid barriers a block), beside the weight floor (the weights' bytes over the copy
bandwidth of the same run). Only ``full`` computes the model; the others are timing probes.

    python3 tools/device/stack_phases.py [--models 'mlp4*'] [--rows 1,16] [--forms gemv,mma] [--name NAME | --out PATH]
    python3 tools/device/stack_phases.py --show RECORD.json    (anywhere: a written record as a table)

Writes $OUT/NAME.json (``--name``, default stack_phases) or ``--out PATH`` (provenance, then one entry per model,
row count and form) and prints a line per entry. A form that cannot be built (or whose full kernel fails
validation) is recorded with why.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import subprocess
import sys
import tempfile

from records import add_arguments, path_of  # this folder

PHASES = ("full", "phase_a", "skeleton")
FORMS = ("gemv", "mma")
PHASE_B = ("copy_slice", "output_slice")  # what phase_a compiles out (methods of each form's kernel class)
PHASE_A = ("copy_unit_batch", "unit_batch", "finish_unit")  # and what skeleton compiles out besides


def compile_out(phase: str, patch=setattr) -> None:
    """Replace the methods a probe leaves out by ones that emit nothing, in both forms' kernel classes (each
    defines them: the mma form overrides the gemv form's). A cp.async wait with fewer groups committed returns at
    once, so the loops still run. ``patch``: how to set them (a test's monkeypatch undoes them)."""
    from kernellab.megakernel.engines import persistent_stack_gemv, persistent_stack_mma

    names = {"full": (), "phase_a": PHASE_B, "skeleton": PHASE_B + PHASE_A}[phase]
    for cls in (persistent_stack_gemv.StackGemv, persistent_stack_mma.StackMma):
        for name in names:
            if name not in vars(cls):  # renamed: the probe would time the whole kernel under a phase's name
                raise AttributeError(f"{cls.__name__} defines no {name}: update stack_phases.PHASE_A/PHASE_B")
            patch(cls, name, lambda self, *args, **kwargs: None)


def probe(phase: str, models: str, rows: list[int], forms: list[str], samples: int) -> list[dict]:
    """One phase's timings, in this process (its kernels compile after ``compile_out``); only ``full`` is validated."""
    from stack_forms import FORMS, time_form  # this script's folder is on sys.path

    from kernellab.harness import timing
    from kernellab.megakernel import models as report_models

    compile_out(phase)
    device = timing.Device("cuda")
    out = []
    for case in report_models.REPORT_MODELS:
        if not any(fnmatch.fnmatch(case.name, p) for p in models.split(",") if p):
            continue
        for r in rows:
            problem = report_models.StackProblem(case, r)
            for form in forms:
                got = time_form(problem, FORMS[form], samples, device, checked=phase == "full")
                out.append({"model": case.name, "rows": r, "form": form, "phase": phase, **got})
    return out


def merged(by_phase: dict[str, list[dict]], floors: dict[str, float]) -> list[dict]:
    """One entry per (model, rows, form): each phase's p50 (or its error) and the model's weight floor."""
    entries: dict[tuple, dict] = {}
    for phase in PHASES:
        for got in by_phase.get(phase, []):
            key = (got["model"], got["rows"], got["form"])
            entry = entries.setdefault(key, {"model": key[0], "rows": key[1], "form": key[2],
                                             "weight_floor_us": floors.get(key[0])})
            entry[phase] = {k: v for k, v in got.items() if k not in ("model", "rows", "form", "phase")}
    return list(entries.values())


def show(path: str) -> None:
    """A written record as a markdown table: per model, rows and form, the skeleton, what phase A and phase B
    add, the whole call and the weight floor (p50 us); '-' where a phase has no time."""
    with open(path) as f:
        record = json.load(f)
    print("| model | rows | form | skeleton | + phase A | + phase B | full | weight floor |")
    print("|---|---|---|---|---|---|---|---|")
    for e in record["entries"]:
        t = {p: e.get(p, {}).get("p50_us") for p in PHASES}
        cells = [t["skeleton"],
                 None if None in (t["phase_a"], t["skeleton"]) else t["phase_a"] - t["skeleton"],
                 None if None in (t["full"], t["phase_a"]) else t["full"] - t["phase_a"],
                 t["full"], e.get("weight_floor_us")]
        text = " | ".join("-" if c is None else f"{c:.1f}" for c in cells)
        print(f"| {e['model']} | {e['rows']} | {e['form']} | {text} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--show", metavar="RECORD", help="print a written record as a markdown table and stop")
    ap.add_argument("--models", default="*", help="comma-separated name patterns of the report's models")
    ap.add_argument("--rows", default="1,16", help="comma-separated row counts")
    ap.add_argument("--forms", default=",".join(FORMS), help=f"comma-separated subset of {FORMS}")
    ap.add_argument("--samples", type=int, default=7)
    ap.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)  # the per-phase subprocess ...
    ap.add_argument("--phase-out", help=argparse.SUPPRESS)  # ... and the file it writes its entries to
    add_arguments(ap, "stack_phases")
    args = ap.parse_args()
    if args.show:
        show(args.show)
        return
    forms = [f for f in args.forms.split(",") if f]
    if not forms or set(forms) - set(FORMS):
        ap.error(f"--forms: a comma-separated subset of {FORMS} expected, got {args.forms!r}")
    try:
        rows = [int(r) for r in args.rows.split(",") if r]
    except ValueError:
        ap.error(f"--rows: comma-separated row counts expected, got {args.rows!r}")
    if not rows or min(rows) < 1:
        ap.error(f"--rows: positive row counts expected, got {args.rows!r}")
    if args.phase:
        with open(args.phase_out, "w") as f:
            json.dump(probe(args.phase, args.models, rows, forms, args.samples), f)
        return
    path = path_of(args)  # the subprocesses write their entries to --phase-out, this process the record
    from kernellab.harness import provenance
    from kernellab.megakernel import models

    bandwidth = models.copy_bandwidth_gbs()
    floors = {case.name: models.floor_entry(case, 0.0, bandwidth)["weight_floor_us"] for case in models.REPORT_MODELS}
    by_phase = {}
    for phase in PHASES:
        env = dict(os.environ)
        if phase != "full":  # a probe's kernels must neither come from nor land in the shipped kernels' caches
            env["CUTE_DSL_DISABLE_FILE_CACHING"] = "1"
            env["KERNELLAB_MEGAKERNEL_CACHE"] = tempfile.mkdtemp(prefix=f"stack-{phase}-")
        entries = os.path.join(tempfile.mkdtemp(prefix="stack-phases-"), f"{phase}.json")
        got = subprocess.run([sys.executable, __file__, "--phase", phase, "--phase-out", entries, "--models",
                              args.models, "--rows", args.rows, "--forms", args.forms, "--samples", str(args.samples)],
                             capture_output=True, text=True, env=env)
        if got.returncode != 0:
            print(f"{phase}: exit {got.returncode}\n{got.stderr[-2000:]}", file=sys.stderr, flush=True)
            continue
        with open(entries) as f:
            by_phase[phase] = json.load(f)
        print(phase, [(e["model"], e["rows"], e["form"], round(e["p50_us"], 1) if "p50_us" in e else e["error"])
                      for e in by_phase[phase]], flush=True)
    record = {"tool": "tools/device/stack_phases.py", "mode": "graph_throughput", "phases": PHASES,
              "provenance": provenance.of_check("cuda", __file__, ["megakernel"]),
              "entries": merged(by_phase, floors)}
    with open(path, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
