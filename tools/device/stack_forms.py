"""The fused stack's forms side by side on the GPU host: per call in a CUDA graph (harness ``graph_throughput``),
each report model at any row counts, the grid, gemv and mma forms forced and the per-block chain (``--forms``:
also the rows form, a CTA a row tile through every block, the planned form past decode rows; ``mma16``, the mma form
on 16-row tiles, a tile after another past 16 rows; ``grid16``, the grid form on 16-row tiles, each its own CTAs;
``chain-pdl``, the chain with programmatic dependent launch between its kernels), every one validated
first against the float64 reference (the models suite's problem and protocol), beside the weight floor (the
model's weight bytes over the copy bandwidth measured in the same run).

    python3 tools/device/stack_forms.py [--models 'mlp*,swiglu2*'] [--rows 1,16] [--samples 7] [--forms grid,rows]
        [--ctas 66,33]     (also the gemv and mma forms on grids of at most that many CTAs: form@N, a probe)
        [--name NAME | --out PATH]
    python3 tools/device/stack_forms.py --show A.json[,B.json] [--forms gemv,grid]    (anywhere: records as a table)

Writes $OUT/NAME.json (``--name``, default stack_forms) or ``--out PATH`` (provenance, then one entry per model
and row count, after each) and prints a line per entry. A form that cannot be built or fails validation is
recorded with why, and not timed.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import functools
import json
import re
import statistics

from backward_phases import cta_counts  # this folder: --ctas as the backward's phases take it
from records import add_arguments, path_of  # this folder

FORMS = {"grid": {"engine": "persistent-stack", "stack_form": "grid"},
         "gemv": {"engine": "persistent-stack", "stack_form": "gemv"},
         "mma": {"engine": "persistent-stack", "stack_form": "mma"},
         "mma16": {"engine": "persistent-stack", "stack_form": "mma", "stack_tile_rows": 16},
         "grid16": {"engine": "persistent-stack", "stack_form": "grid", "stack_tile_rows": 16},
         "rows": {"engine": "persistent-stack", "stack_form": "rows"},
         "chain": {"engine": "persistent-tc"},
         "chain-pdl": {"engine": "persistent-tc", "pdl": True}}  # its launches overlapping (compile_model(pdl=))
RUN_FORMS = ("grid", "gemv", "mma", "chain")
"""The forms a run times unless ``--forms`` names others (the rows form is the slow one at decode rows)."""
GRID_FORMS = ("gemv", "mma")
"""The forms whose grid ``--ctas`` caps: every CTA an SM, work dealt over ``grid_dim`` at run time, so a smaller
grid runs the same compiled kernel (fewer arrivals at each grid barrier, more items a warp)."""


@contextlib.contextmanager
def grid_capped(ctas: int | None, launcher=None):
    """The fused stack's launches on at most ``ctas`` CTAs while inside (None: as planned, every SM); ``launcher``:
    the class whose ``grid`` is capped (the engine's ``Launcher`` unless given)."""
    if ctas is None:
        yield
        return
    if launcher is None:
        from kernellab.megakernel.engines.persistent_stack import Launcher as launcher
    planned = launcher.grid
    launcher.grid = lambda self, plan, rows: min(planned(self, plan, rows), ctas)
    try:
        yield
    finally:
        launcher.grid = planned


def form_options(name: str) -> dict:
    """A record's description of column ``name``: the form's ``compile_model`` options, and its CTA cap if any."""
    form, _, cap = name.partition("@")
    return {**FORMS[form], "max_ctas": int(cap)} if cap else FORMS[form]


def form_names(forms: list[str], ctas: list[int]) -> list[str]:
    """The record's columns: each form, then each of ``GRID_FORMS`` among them at each cap, as ``form@N``."""
    return forms + [f"{form}@{n}" for form in forms if form in GRID_FORMS for n in ctas]


def show(paths: str, forms: str = "") -> None:
    """Written records as one markdown table: p50 per form, and with several records (revisions of one run, in
    order) each form's column per record that has the form, labelled by the record's commit. A row per model and
    row count of any record, in the order first met; a record without that entry shows "-"."""
    records = []
    for path in paths.split(","):
        with open(path) as f:
            records.append(json.load(f))
    chosen = [f for f in forms.split(",") if f] or list(dict.fromkeys(f for r in records for f in r["forms"]))
    by_key = [{(e["model"], entry_rows(e)): e for e in r["entries"]} for r in records]
    columns = [(form, found, f"{form} us" + (f" @{r['provenance']['git']['commit'][:7]}" if len(records) > 1 else ""))
               for form in chosen for r, found in zip(records, by_key, strict=True) if form in r["forms"]]
    keys = list(dict.fromkeys(key for found in by_key for key in found))
    floors = {}  # none in older records
    for found in by_key:
        for key, e in found.items():
            if e.get("floor", {}).get("weight_floor_us") is not None:
                floors.setdefault(key, e["floor"]["weight_floor_us"])
    shown = bool(floors)
    print("| model | rows | " + " | ".join(label for _, _, label in columns) + (" | weight floor us" if shown else "")
          + " |")
    print("|---|---|" + "---|" * (len(columns) + shown))
    for model, rows in keys:
        cells = []
        for form, found, _ in columns:
            e = found.get((model, rows))
            got = entry_forms(e).get(form, {}) if e else {}
            cells.append(f"{got['p50_us']:.1f}" if "p50_us" in got else "-")
        if shown:
            cells.append(f"{floors[(model, rows)]:.1f}" if (model, rows) in floors else "-")
        print(f"| {model} | {rows} | " + " | ".join(cells) + " |")


def entry_forms(entry: dict) -> dict:
    """An entry's results by form: under ``forms``; records before it kept them beside ``model`` and ``rows``."""
    return entry.get("forms", entry)


def entry_rows(entry: dict) -> int:
    """An entry's row count. In records before ``forms``, a timed rows form overwrote it with its result; the
    plan the form recorded names the rows it was compiled for."""
    if isinstance(entry["rows"], int):
        return entry["rows"]
    return int(re.search(r"planned for (\d+) rows", entry["rows"]["plan"]).group(1))


def time_entry(case, rows: int, samples: int, device, forms=RUN_FORMS) -> dict:
    """Each of ``forms`` (names of ``FORMS``, or ``form@N``: that form on at most N CTAs) at one model and row
    count, each validated first."""
    from kernellab.megakernel import models

    problem = models.StackProblem(case, rows)
    entry = {"model": case.name, "rows": rows, "forms": {}}
    for name in forms:
        form, _, cap = name.partition("@")
        with grid_capped(int(cap) if cap else None):
            entry["forms"][name] = time_form(problem, FORMS[form], samples, device)
    return entry


def time_form(problem, options: dict, samples: int, device, checked: bool = True) -> dict:
    """One compiled form of ``problem``'s model (``compile_model`` options) in a CUDA graph: its p50 and samples,
    after validation against the float64 reference unless ``checked`` is False (a timing probe that computes
    something else); a form that cannot be built or fails validation gives its error instead."""
    from kernellab.harness import timing, validate
    from kernellab.megakernel import compile_model

    inputs = problem.make_inputs(1)
    outputs = problem.make_outputs(inputs)
    try:
        compiled = compile_model(problem.case.spec, rows=problem.shape[0], **options)

        def run(i, o, m=compiled):
            m(i["x"], out=o["y"])
            return o

        if checked:
            result = validate.validate_call(problem, run, seed=3)
            if not result["passed"]:
                return {"error": "failed validation", "validation": result["outputs"]["y"]}
        times = timing.measure("graph_throughput", [functools.partial(run, inputs, outputs)], device,
                               samples=samples, iterations=20)
        return {"p50_us": statistics.median(times), "samples_us": times, "plan": str(compiled.plan())}
    except Exception as e:  # noqa: BLE001 - recorded per form, the run goes on
        return {"error": f"{type(e).__name__}: {e}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--show", metavar="RECORD[,RECORD...]", help="print written records as one markdown table")
    ap.add_argument("--forms", default="", help="comma-separated forms of " + ",".join(FORMS) + ": those to time "
                    "(default " + ",".join(RUN_FORMS) + "), or with --show those to print (default: all recorded)")
    ap.add_argument("--models", default="*")
    ap.add_argument("--rows", default="1,16")
    ap.add_argument("--samples", type=int, default=7)
    ap.add_argument("--ctas", default="", type=cta_counts, help="comma-separated CTA counts: also time the "
                    + ",".join(GRID_FORMS) + " forms on grids of at most that many CTAs (columns form@N)")
    add_arguments(ap, "stack_forms")
    args = ap.parse_args()
    if args.show:
        show(args.show, args.forms)
        return
    forms = [f for f in args.forms.split(",") if f] or list(RUN_FORMS)
    if any(f not in FORMS for f in forms):
        ap.error(f"--forms: names of {','.join(FORMS)} expected, got {args.forms!r}")
    forms = form_names(forms, [int(c) for c in args.ctas.split(",") if c])
    path = path_of(args)
    from kernellab.harness import provenance, timing
    from kernellab.megakernel import models

    device = timing.Device("cuda")
    bandwidth = models.copy_bandwidth_gbs()  # the floor: the weights streamed once at the copy's rate
    record = {"tool": "tools/device/stack_forms.py", "mode": "graph_throughput",
              "forms": {f: form_options(f) for f in forms},
              "provenance": provenance.of_check("cuda", __file__, ["megakernel"]), "entries": []}
    patterns = [p for p in args.models.split(",") if p]
    for case in models.REPORT_MODELS:
        if not any(fnmatch.fnmatch(case.name, p) for p in patterns):
            continue
        for rows in (int(r) for r in args.rows.split(",")):
            entry = time_entry(case, rows, args.samples, device, forms)
            floor = models.floor_entry(case, 0.0, bandwidth)
            entry["floor"] = {k: floor[k] for k in ("weight_bytes", "copy_bandwidth_gbs", "weight_floor_us")}
            record["entries"].append(entry)
            with open(path, "w") as f:
                json.dump(record, f, indent=1)
            print(case.name, rows, {form: round(got["p50_us"], 1) if "p50_us" in got else got.get("error")
                                    for form, got in entry["forms"].items()}, flush=True)


if __name__ == "__main__":
    main()
