"""Where the one-launch norm backward's time goes, on the GPU host: each RMSNorm / LayerNorm backward case
timed (CUDA-graph throughput) three ways, each compiled in a process of its own:

    full     the kernel as shipped: rows, grid barrier, the partials' sum into dweight / dbias
    barrier  rows and the grid barrier, no partials' sum (dweight / dbias left unwritten)
    rows     rows alone (dweight / dbias left unwritten): what the per-row work costs

    python3 tools/device/backward_phases.py [--shapes 37x1537:float32,256x3072:bfloat16] [--ops rmsnorm,layernorm]
                                            [--name NAME | --out PATH]
    python3 tools/device/backward_phases.py --show RECORD.json[,...]   (anywhere: written records as tables)

The differences are the barrier's and the sum's costs. Only "full" gives correct vector gradients; the
others are timing probes. With ``--ctas 33,66``, each phase is also timed on grids of at most that many CTAs
(fewer, fatter CTAs: each runs more rows, and fewer partial rows are summed). ``--ops`` picks the kernels:
rmsnorm, layernorm, and layernorm-nobias (LayerNorm without dbias: one pair of partials to sum, not two). Writes
$OUT/NAME.json (``--name``, default backward_phases) or ``--out PATH`` and prints one line per case and grid. A
case whose row is held by a cluster is refused before any timing: its partials are summed by a launch of their own,
so it has no grid barrier phase.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import subprocess
import sys

from records import add_arguments, path_of  # this folder

SHAPES = "37x1537:float32,256x3072:bfloat16,1024x4096:bfloat16,768x6144:bfloat16,65536x1024:bfloat16"
PHASES = ("full", "barrier", "rows")
OPS = ("rmsnorm", "layernorm", "layernorm-nobias")


def probe(phase: str, shapes: str, caps: list[int], grids: dict, ops: list[str]) -> dict:
    """One phase's timings, in this process (the kernels compile after the patch). ``grids``: the full phase's grid
    of each case, which the others time too (a patched kernel's registers may hold another wave)."""
    import torch
    from backward_sweep import ours  # the kernel called directly, as the plan sweep calls it (this folder)

    from kernellab.harness import timing
    from kernellab.kernels.gpu import base, compiler
    from kernellab.kernels.gpu.compiler import Variant, widest_vector

    if phase == "barrier":
        base.GradKernel.reduce_partials = lambda self, pairs, m_sync, grid: self.grid_barrier(m_sync, grid)
    elif phase == "rows":
        base.GradKernel.reduce_partials = lambda self, pairs, m_sync, grid: None
    device = timing.Device("cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = {}
    for item in shapes.split(","):
        shape, name = item.split(":")
        m, n = map(int, shape.split("x"))
        dt = getattr(torch, name)
        x = torch.randn(m, n, device="cuda").to(dt)
        dy, w = torch.randn_like(x), torch.randn(n, device="cuda").to(dt)
        xf = x.float()
        mean, rstd = xf.mean(-1), torch.rsqrt(xf.var(-1, unbiased=False) + 1e-5)
        for kind in ops:
            op = kind.removesuffix("-nobias")
            case = f"{op}_backward_{m}x{n}_{name}{'_nobias' if kind != op else ''}"
            v = Variant(f"{op}_backward", name, n, widest_vector(n, name), weight=name,
                        bias=name if kind == "layernorm" else None)
            inputs = {"x": x, "dy": dy, "mean": mean, "rstd": rstd}
            spread_v = dataclasses.replace(v, spread_sum=True)

            def spread_wave(op=op, spread_v=spread_v, w=w):  # called at once, in this iteration
                ours(op, spread_v, w, sms)  # compiles: wave() reads the cubin's registers
                return compiler.wave(spread_v, sms)

            ours(op, v, w, sms)
            spread, rows_per_cta, per_wave, default = compiler.vector_gradient_launch(  # the ops' variant and grid
                m, sms, x.element_size(), *compiler.wave(v, sms), spread_wave)
            v = spread_v if spread else v
            default = grids.get(case, default)
            wave = compiler.wave_grid(m, rows_per_cta, per_wave)  # timed too, so the rule can be rechecked
            iterations = max(20, int(3000 / (3 * m * n * x.element_size() / 4e6 + 2)))
            timed = {}
            for grid in sorted({default, *((wave, *(min(c, wave) for c in caps)) if caps else ())}, reverse=True):
                call = functools.partial(ours(op, v, w, sms, ctas=grid), inputs)
                samples = timing.measure("graph_throughput", [call], device, samples=7, iterations=iterations)
                timed[grid] = statistics.median(samples)
            out[case] = {"p50_us": timed[default], "grid": default, "rows_per_cta": rows_per_cta,
                         "spread_sum": v.spread_sum, "p50_us_by_grid": {str(g): t for g, t in timed.items()}}
    return out


def show(paths: str) -> None:
    """Written records as markdown tables. One record: per case, the rows alone, what the barrier and the sum add,
    the whole kernel (CUDA-graph throughput p50, us), and its grid. Several (comma-separated: revisions of one run):
    the sum's and the kernel's columns per record side by side, labelled by each record's commit."""
    if "," in paths:
        compare(paths.split(","))
        return
    with open(paths) as f:
        found = json.load(f)["cases"]
    print("| case | rows | + barrier | + sum | kernel | CTAs |")
    print("|---|---|---|---|---|---|")
    for case, full in found["full"].items():
        t = {p: found[p][case]["p50_us"] for p in PHASES}
        print(f"| {case} | {t['rows']:.2f} | {t['barrier'] - t['rows']:.2f} | {t['full'] - t['barrier']:.2f} | "
              f"{t['full']:.2f} | {full['grid']} |")
    grids = [(case, full["p50_us_by_grid"]) for case, full in found["full"].items()
             if len(full.get("p50_us_by_grid", {})) > 1]
    if grids:  # the same phases on smaller grids
        print()
        print("| case | CTAs | rows | + barrier | + sum | kernel |")
        print("|---|---|---|---|---|---|")
        for case, by_grid in grids:
            for g in sorted(by_grid, key=int, reverse=True):
                t = {p: found[p][case]["p50_us_by_grid"][g] for p in PHASES}
                print(f"| {case} | {g} | {t['rows']:.2f} | {t['barrier'] - t['rows']:.2f} | "
                      f"{t['full'] - t['barrier']:.2f} | {t['full']:.2f} |")


def compare(paths: list[str]) -> None:
    """What the sum adds and the whole kernel per case, a column each per record (the cases of the first)."""
    records = []
    for path in paths:
        with open(path) as f:
            record = json.load(f)
        records.append((record["cases"], record["provenance"]["git"]["commit"][:7]))
    print("| case | " + " | ".join(f"+ sum @{c}" for _, c in records) + " | "
          + " | ".join(f"kernel @{c}" for _, c in records) + " |")
    print("|---|" + "---|" * 2 * len(records))
    for case in records[0][0]["full"]:
        sums, kernels = [], []
        for found, _ in records:
            if case not in found["full"]:
                sums.append("-")
                kernels.append("-")
                continue
            full, barrier = found["full"][case]["p50_us"], found["barrier"][case]["p50_us"]
            sums.append(f"{full - barrier:.2f}")
            kernels.append(f"{full:.2f}")
        print(f"| {case} | " + " | ".join(sums) + " | " + " | ".join(kernels) + " |")


def plan_ctas(op: str, n: int, dtype: str) -> int:
    """CTAs that hold one row in the kernels' backward plan for N and dtype (more than 1: a cluster)."""
    from kernellab.kernels.gpu.compiler import Variant, widest_vector

    return Variant(f"{op}_backward", dtype, n, widest_vector(n, dtype), weight=dtype).kernel().ctas


def clustered_cases(shapes: str, ops: list[str], ctas_of=plan_ctas) -> list[str]:
    """The cases of ``shapes`` x ``ops`` whose row a cluster holds (``ctas_of(op, n, dtype)`` above 1)."""
    found = []
    for item in shapes.split(","):
        shape, dtype = item.split(":")
        n = int(shape.split("x")[1])
        found += [f"{shape}:{dtype} ({op}: {ctas} CTAs a row)" for op in dict.fromkeys(k.removesuffix("-nobias")
                  for k in ops) if (ctas := ctas_of(op, n, dtype)) > 1]
    return found


def kernel_names(text: str) -> str:
    """--ops: comma-separated names of OPS (kept as text: it is passed on to each phase's process)."""
    unknown = [k for k in text.split(",") if k not in OPS]
    if unknown or not text:
        raise argparse.ArgumentTypeError(f"comma-separated kernels of {','.join(OPS)} expected, got {text!r}")
    return text


def cta_counts(text: str) -> str:
    """--ctas: comma-separated positive integers (kept as text: it is passed on to each phase's process)."""
    if not all(c.isdigit() and int(c) > 0 for c in text.split(",") if c):
        raise argparse.ArgumentTypeError(f"comma-separated positive integers expected, got {text!r}")
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=SHAPES, help="comma-separated MxN:dtype")
    ap.add_argument("--show", metavar="RECORD[,RECORD...]",
                    help="print written records (several: revisions side by side) as markdown tables and stop")
    ap.add_argument("--ctas", default="", type=cta_counts, help="comma-separated CTA counts: also time each case on "
                    "grids of at most that many CTAs")
    ap.add_argument("--ops", default="rmsnorm,layernorm", type=kernel_names,
                    help="comma-separated kernels of " + ",".join(OPS))
    ap.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)  # the per-phase subprocess
    ap.add_argument("--grids", default="{}", type=json.loads, help=argparse.SUPPRESS)  # the full phase's grids
    add_arguments(ap, "backward_phases")
    args = ap.parse_args()
    caps = [int(c) for c in args.ctas.split(",") if c]
    if args.show:
        show(args.show)
        return 0
    if args.phase:
        print(json.dumps(probe(args.phase, args.shapes, caps, args.grids, args.ops.split(","))))
        return 0
    clustered = clustered_cases(args.shapes, args.ops.split(","))
    if clustered:
        ap.error("--shapes: a cluster holds the row of " + ", ".join(clustered) + "; its partials are summed by a "
                 "launch of their own, so there is no grid barrier phase to time (time it with backward_sweep.py)")
    path = path_of(args)  # the per-phase subprocesses print their results; this process writes the record
    from kernellab.harness import provenance

    found = {}
    for phase in PHASES:
        grids = {case: r["grid"] for case, r in found.get("full", {}).items()}  # PHASES starts with full
        run = subprocess.run([sys.executable, __file__, "--phase", phase, "--shapes", args.shapes, "--ctas",
                              args.ctas, "--grids", json.dumps(grids), "--ops", args.ops],
                             stdout=subprocess.PIPE, text=True, check=True)  # its errors to our stderr
        found[phase] = json.loads(run.stdout.strip().splitlines()[-1])
    record = {"tool": "tools/device/backward_phases.py", "phases": PHASES, "mode": "graph_throughput",
              "provenance": provenance.of_check("cuda", __file__, ["kernels"]), "cases": found}
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
    for case, full in found["full"].items():
        for g in full["p50_us_by_grid"]:
            t = {p: found[p][case]["p50_us_by_grid"][g] for p in PHASES}
            print(f"{case} on {g} CTAs: rows {t['rows']:.2f} us, + barrier {t['barrier'] - t['rows']:.2f}, "
                  f"+ sum {t['full'] - t['barrier']:.2f} = {t['full']:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
