"""How many clusters of a persistent-tc plan the GPU holds at once, beside how many the plan launches, on the GPU
host: where a split's clusters outnumber what the GPU holds, the last ones wait for a second wave, whatever share
of the SMs they fill (clusters are placed within a GPC, and not every GPC has room for a whole number of them).

    python3 tools/device/cluster_occupancy.py [--shapes 1024x128x1024,896x128x1024] [--plans 'split*']
                                              [--name NAME | --out PATH]
    python3 tools/device/cluster_occupancy.py --show RECORD.json   (anywhere: a written record as a table)

Each plan (``megakernel_sweep.PLANS``' labels, the planner's own as ``planned``) is compiled, its cubin loaded
through the driver, and ``cuOccupancyMaxActiveClusters`` asked with the plan's grid, threads, cluster and shared
memory (planning's count, ``Plan.smem.bytes``), beside the count planning itself takes for the cluster size
(``DeviceSpec.clusters_at_once``, the driver's answer for an empty kernel): the two should agree. Nothing is
launched or timed. Writes $OUT/NAME.json (``--name``,
default cluster_occupancy) or ``--out PATH`` with the harness's provenance, and prints a table last.
"""

from __future__ import annotations

import argparse
import fnmatch
import json

from megakernel_sweep import PLANS  # this folder
from records import add_arguments, path_of  # this folder

from kernellab.harness import provenance
from kernellab.megakernel import planning

SHAPES = [(1024, 128, 1024), (896, 128, 1024), (1024, 64, 1024), (1024, 256, 1024), (768, 256, 1024),
          (1536, 256, 1024), (2048, 256, 1024), (16, 512, 2048), (256, 256, 1024)]
"""The shapes of the H100's split sweeps where a wide split won or lost at 96 to 128 CTAs, and two decode ones."""


def compiled_cubin(plan) -> bytes | str:
    """The cubin of a persistent-tc plan's kernel, compiled in this process (the DSL keeps its bytes, or its file,
    on the compiled function)."""
    from kernellab.megakernel.engines import common, persistent_tc

    return common.compiled(persistent_tc.variant(plan)).__cubin__


def row(shape, label: str, device) -> dict:
    """One plan's record: its tile, grid, clusters launched and the most the GPU holds at once."""
    engine, choices = PLANS[label]
    if engine != "persistent-tc":
        raise ValueError(f"{label}: not a persistent-tc plan")
    plan = planning.forced(engine, *shape, device, **choices)
    cubin = compiled_cubin(plan)
    cluster = plan.tile.split * plan.tile.multicast
    grid = plan.owners.grid
    most = planning.max_active_clusters(cubin, grid, plan.tile.threads, cluster, plan.smem.bytes)
    return {"shape": list(shape), "plan": label, "tile_rows": plan.tile.rows, "split": plan.tile.split,
            "cluster": cluster, "grid": grid, "clusters": grid // cluster, "max_active_clusters": most,
            "smem_bytes": plan.smem.bytes, "waves": -(-(grid // cluster) // most) if most else None,
            "planning_held": device.clusters_held(cluster)}


def show(path: str) -> None:
    with open(path) as f:
        rows = json.load(f)["plans"]
    print("| shape | plan | tile | grid | clusters | most at once | waves | planning's count |")
    print("|---|---|---|---|---|---|---|---|")
    seen = set()
    for r in rows:
        if (key := (tuple(r["shape"]), r["plan"])) in seen:  # 0.29.0's tool listed the planner's plan twice
            continue
        seen.add(key)
        print(f"| {'x'.join(map(str, r['shape']))} | {r['plan']} | {r['tile_rows']}/{r['split']} | {r['grid']} | "
              f"{r['clusters']} | {r['max_active_clusters']} | {r['waves']} | {r.get('planning_held', '-')} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--show", metavar="RECORD", help="print a written record as a table and stop")
    ap.add_argument("--shapes", help="comma-separated RxCxH (default: the split sweeps' 96-128 CTA shapes)")
    ap.add_argument("--plans", default="planned,split*", help="comma-separated shell patterns over the labels")
    add_arguments(ap, "cluster_occupancy")
    args = ap.parse_args()
    if args.show:
        show(args.show)
        return
    path = path_of(args)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    patterns = [p for p in args.plans.split(",") if p]
    labels = [label for label in PLANS if any(fnmatch.fnmatch(label, p) for p in patterns)]
    import torch

    torch.zeros(1, device="cuda")  # the primary context, current for the driver calls
    device = planning.current_device()
    rows, skipped = [], {}
    for shape in shapes:
        for label in labels:
            try:
                rows.append(row(shape, label, device))
                print(f"{'x'.join(map(str, shape))} {label}: {rows[-1]['clusters']} clusters, "
                      f"{rows[-1]['max_active_clusters']} at once", flush=True)  # compiles take seconds a plan
            except ValueError as e:
                skipped[f"{'x'.join(map(str, shape))} {label}"] = str(e)
    record = {"provenance": provenance.of_check("cuda", __file__, ["megakernel"]), "plans": rows, "skipped": skipped}
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
    show(path)


if __name__ == "__main__":
    main()
