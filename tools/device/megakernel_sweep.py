"""Plan sweep of the persistent engines on the GPU host: persistent-tc's plan against forced alternatives
(the wgmma form with 64- and 128-row tiles, other chunk-buffer counts, other row tiles), and the CUDA-core
`persistent` engine's plan against its weights staged in shared memory, read from global memory or held in
registers, beside
torch-cublas, in alternating rounds. It is how planning's rules for these engines are chosen.

    python3 tools/device/megakernel_sweep.py [--shapes 4096x256x1024,16384x512x2048] [--plans 'wgmma*']
                                             [--rounds 2] [--samples 10] [--name NAME | --out PATH]
    python3 tools/device/megakernel_sweep.py --show A.json[,B.json] [--plans 'split*']   (anywhere: a table)

Every plan is validated (fresh inputs, poisoned output, float reference) before it is timed; a plan that
fails is reported and not timed. Timing: graph throughput of one call per replay (harness timing).
Writes $OUT/NAME.json (``--name``, default megakernel_sweep) or ``--out PATH`` (with the harness's provenance)
after every shape and prints one line per shape, the fastest first.
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import json
import statistics

from records import add_arguments, path_of  # this folder

from kernellab.harness import provenance, timing, validate
from kernellab.megakernel import bench, engines, planning

SHAPES = [(1024, 128, 256), (4096, 256, 1024), (16384, 512, 2048), (257, 64, 128), (1, 7, 13), (129, 31, 47),
          (8448, 512, 512), (16384, 384, 1536), (2048, 512, 1024), (385, 72, 200), (201, 61, 109)]
"""The development shapes and others of their kinds; never the report's assessment shapes."""
PLANS = {  # label -> (engine, planning.forced choices); {}: the planner's own plan
    "planned": ("persistent-tc", {}),
    "wgmma-64": ("persistent-tc", {"mma": "wgmma"}),
    "wgmma-128": ("persistent-tc", {"mma": "wgmma", "tile_rows": 128}),
    "wgmma-64-s1": ("persistent-tc", {"mma": "wgmma", "stages": 1}),
    "wgmma-128-s1": ("persistent-tc", {"mma": "wgmma", "tile_rows": 128, "stages": 1}),
    "sync-32": ("persistent-tc", {"mma": "mma.sync", "tile_rows": 32}),
    "sync-64": ("persistent-tc", {"mma": "mma.sync", "tile_rows": 64}),
    "sync-s1": ("persistent-tc", {"mma": "mma.sync", "stages": 1}),
    "sync-s2": ("persistent-tc", {"mma": "mma.sync", "stages": 2}),
    "split1": ("persistent-tc", {"split": 1}),
    "split2": ("persistent-tc", {"split": 2}),
    "split4": ("persistent-tc", {"split": 4}),
    "split8": ("persistent-tc", {"split": 8}),
    "split2-32": ("persistent-tc", {"split": 2, "mma": "mma.sync", "tile_rows": 32}),
    "split4-32": ("persistent-tc", {"split": 4, "mma": "mma.sync", "tile_rows": 32}),
    "split8-32": ("persistent-tc", {"split": 8, "mma": "mma.sync", "tile_rows": 32}),
    "split4-wgmma": ("persistent-tc", {"split": 4, "mma": "wgmma"}),
    "split8-wgmma": ("persistent-tc", {"split": 8, "mma": "wgmma"}),
    "split2-64": ("persistent-tc", {"split": 2, "mma": "mma.sync", "tile_rows": 64}),
    "split2-wgmma": ("persistent-tc", {"split": 2, "mma": "wgmma"}),
    "wgmma-64-cp": ("persistent-tc", {"mma": "wgmma", "loads": "cp.async"}),  # the planner's loads are TMA
    "split2-wgmma-cp": ("persistent-tc", {"mma": "wgmma", "split": 2, "loads": "cp.async"}),
    "overlap": ("persistent-tc", {"mma": "wgmma", "overlap": True}),
    "serial": ("persistent-tc", {"mma": "wgmma", "overlap": False}),  # the chunk schedule before the overlap
    "split2-overlap": ("persistent-tc", {"mma": "wgmma", "split": 2, "overlap": True}),
    "pdl": ("persistent-tc", {"pdl": True}),  # the planned tile, consecutive calls overlapping (graph: one after
    # another in a capture): does launching each call during the one before pay, most where its grid is small?
    "registers": ("persistent-tc", {"registers": True}),  # one-warp CTAs, weights and hidden in registers
    "shared": ("persistent-tc", {"registers": False}),  # the shared-memory form's plan
    "mc2": ("persistent-tc", {"mma": "wgmma", "multicast": 2}),
    "mc2-s1": ("persistent-tc", {"mma": "wgmma", "multicast": 2, "stages": 1}),
    "mc4": ("persistent-tc", {"mma": "wgmma", "multicast": 4}),
    # the planned tile on fewer CTAs: if a CTA's chunk period (p50 / (tiles per CTA x chunks)) shortens, the
    # CTAs were sharing a bound (L2); if it stays, each CTA's own chain of loads and products sets it
    "grid66": ("persistent-tc", {"grid": 66}),
    "grid32": ("persistent-tc", {"grid": 32}),
    "grid16": ("persistent-tc", {"grid": 16}),
    "mc2-grid66": ("persistent-tc", {"mma": "wgmma", "multicast": 2, "grid": 66}),
    "persistent": ("persistent", {}),  # the planner's weights placement, against both forced:
    "persistent-smem-weights": ("persistent", {"weights": "smem"}),  # staged in shared memory, or
    "persistent-global-weights": ("persistent", {"weights": "global"}),  # read from global memory, or
    "persistent-register-weights": ("persistent", {"weights": "registers"}),  # each lane's share in registers
    "persistent-rows4": ("persistent", {"tile_rows": 4}),  # the planner's placement with other row tiles: more
    "persistent-rows16": ("persistent", {"tile_rows": 16}),  # CTAs reading the weights, or fewer with more rows
}
ALWAYS = ("planned", "persistent")
"""Labels swept whatever ``--plans`` says: the plans that serve the shape today."""


def labelled_call(problem, label, activation, device):
    """(description, call) of one label (a ``PLANS`` label or torch-cublas) at the problem's shape, its plan
    validated first; ValueError where the plan does not exist at this shape or fails validation."""
    if label == "torch-cublas":
        bound = engines.bind(label, problem.model_shape, activation)
        return {"served_by": bound.served_by}, bound.call
    engine, choices = PLANS[label]
    shape = problem.model_shape
    plan = planning.forced(engine, shape.rows, shape.channels, shape.hidden, device, **choices)
    call = engines.plan_call(plan, activation)
    check = validate.validate_call(problem, call, 7)
    if not check["passed"]:
        raise ValueError(f"WRONG: {check}")
    return plan.describe(), call


def plan_calls(shape, patterns, activation, device):
    """{label: (plan description, call)} of the plans that exist at this shape and pass validation, and
    torch-cublas."""
    problem = bench.ResidualMLP(shape, activation=activation)
    out, skipped = {}, {}
    for label in [*PLANS, "torch-cublas"]:
        if label not in (*ALWAYS, "torch-cublas") and not any(fnmatch.fnmatch(label, p) for p in patterns):
            continue
        try:
            out[label] = labelled_call(problem, label, activation, device)
        except ValueError as e:
            skipped[label] = str(e)
            if str(e).startswith("WRONG"):
                print(f"{shape} {label}: WRONG", flush=True)
    return problem, out, skipped


def chunk_periods(shape, p50, calls):
    """{label: us per hidden chunk of one CTA's tiles} for the persistent-tc plans of the shared-memory form (the
    register form has no chunks): p50 over the chunks its busiest CTA runs one after another (tiles per CTA x its
    share of the hidden chunks)."""
    out = {}
    for label, (plan, _) in calls.items():
        if plan.get("engine") == "persistent-tc" and not plan.get("tile_registers"):
            chunks = planning.tc_chunks_per_cta(shape[2], plan["tile_split"])
            out[label] = p50[label] / (plan["tiles_per_cta"] * chunks)
    return out


def l2_copy_bandwidth(device, megabytes=(4, 8, 16)):
    """{MB: TB/s} of torch's device copy between two buffers of that size that stay in the L2 (bytes read plus
    written), graph throughput: the ceiling that weight chunks streamed from the L2 by every SM share."""
    torch = device.torch
    out = {}
    for mb in megabytes:
        a = torch.randn(mb * 2**18, device="cuda")
        b = torch.empty_like(a)
        us = statistics.median(timing.measure("graph_throughput", [functools.partial(b.copy_, a)], device, samples=10,
                                              iterations=50))
        out[mb] = 2 * a.numel() * 4 / us / 1e6
    return out


def show(paths: str, plans: str = "*") -> None:
    """Written records as one markdown table: a row per shape, a column per plan (in the order first met), each
    cell its p50 in us and, for persistent-tc, its tile as rows/split ('-': not built or not valid there)."""
    patterns = [p for p in plans.split(",") if p] or ["*"]
    rows, labels = [], []
    for path in paths.split(","):
        with open(path) as f:
            for entry in json.load(f)["shapes"]:
                rows.append(entry)
                labels += [k for k in entry["p50_us"] if k not in labels
                           and any(fnmatch.fnmatch(k, p) for p in patterns)]
    print("| shape | " + " | ".join(labels) + " |")
    print("|---" * (len(labels) + 1) + "|")
    for entry in rows:
        cells = []
        for label in labels:
            p50, plan = entry["p50_us"].get(label), entry["plans"].get(label, {})
            tile = f" ({plan['tile_rows']}/{plan['tile_split']})" if plan.get("engine") == "persistent-tc" else ""
            cells.append("-" if p50 is None else f"{p50:.1f}{tile}")
        print(f"| {'x'.join(map(str, entry['shape']))} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--show", metavar="RECORD[,RECORD...]", help="print written records as one markdown table")
    ap.add_argument("--shapes", help="comma-separated RxCxH (default: the report's larger development shapes)")
    ap.add_argument("--plans", default="*", help=f"comma-separated shell patterns over {list(PLANS)}")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--samples", type=int, default=10)
    add_arguments(ap, "megakernel_sweep")
    ap.add_argument("--l2", action="store_true", help="also record torch's copy bandwidth within the L2")
    args = ap.parse_args()
    if args.show:
        show(args.show, args.plans)
        return
    path = path_of(args)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    device = timing.Device("cuda")
    device.warm_up(2.0)
    spec = planning.current_device()
    record = {"provenance": provenance.of_check("cuda", __file__, ["megakernel"]),
              "rounds": args.rounds, "samples_per_round": args.samples, "timing": "graph_throughput", "shapes": []}
    if args.l2:
        record["l2_copy_tb_per_s"] = l2_copy_bandwidth(device)
        print("L2 copy TB/s " + "  ".join(f"{mb} MB {v:.2f}" for mb, v in record["l2_copy_tb_per_s"].items()))
    for shape in shapes:
        problem, calls, skipped = plan_calls(shape, args.plans.split(","), bench.DEFAULT_ACTIVATION, spec)
        inputs = problem.make_inputs(1)
        outputs = problem.make_outputs(inputs)
        samples = {label: [] for label in calls}
        names = list(calls)
        for r in range(args.rounds):
            for label in names if r % 2 == 0 else names[::-1]:
                call = functools.partial(calls[label][1], inputs, outputs)
                samples[label] += timing.measure("graph_throughput", [call], device, samples=args.samples,
                                                 iterations=20)
        p50 = {label: statistics.median(v) for label, v in samples.items()}
        record["shapes"].append({"shape": shape, "p50_us": p50, "skipped": skipped,
                                 "plans": {label: calls[label][0] for label in calls},
                                 "chunk_period_us": chunk_periods(shape, p50, calls)})
        ranked = sorted(p50, key=p50.get)
        print(f"{'x'.join(map(str, shape)):16s} " + "  ".join(f"{k} {p50[k]:.1f}" for k in ranked), flush=True)
        print(" " * 17 + "us per chunk: " + "  ".join(f"{k} {v:.2f}" for k, v in
                                                     record["shapes"][-1]["chunk_period_us"].items()), flush=True)
        with open(path, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
