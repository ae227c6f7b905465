"""Launch-plan sweep of the CuTe backward kernels on the GPU host: a few Tuning plans per case, each checked
against torch and timed in graph throughput (inputs rotated past the L2, as the harness times) beside copy
(the ceiling by the backward's minimum bytes: x or y, dy, dx, the weight once) and torch's own backward.

    python3 tools/device/backward_sweep.py [--cases 'rmsnorm*bf16,*x4096*'] [--plans 'B0,B1'] [--rounds 2]
                                           [--name NAME | --out PATH]
    python3 tools/device/backward_sweep.py --show SWEEP.json...   (anywhere: the written sweeps as tables)

Writes $OUT/NAME.json (``--name``, default backward_sweep) or ``--out PATH`` (after every case: the plans, the run's
provenance and one entry per case) and prints one line per case: each plan as a fraction of the copy ceiling.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import functools
import json
import statistics

from records import add_arguments, path_of  # this folder

SHAPES = [(16384, 8192), (8192, 16384), (65536, 1024), (768, 6144), (1024, 4096), (256, 3072), (37, 1537)]
PLAN_LABELS = ("B0", "B1", "B2", "B3", "B4", "B5", "B6", "B7", "B8", "B9", "B10", "B11", "B12", "B13")
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def plans() -> dict:
    """The sweep's Tuning plans by label (B0: the kernels' own backward plan)."""
    from kernellab.kernels.gpu.base import BACKWARD, WIDE_BACKWARD, Tuning

    return {
        "B0": None,  # the kernels' own plan (BACKWARD, or WIDE_BACKWARD for 16-bit norm rows from WIDE_BACKWARD_N)
        "B1": Tuning(accesses=4, register_values=32, resident_threads=0, tile_values=32),
        "B2": Tuning(accesses=1, register_values=8, resident_threads=0, tile_values=8),
        "B3": Tuning(accesses=2, register_values=16, resident_threads=0, tile_values=16, ctas_per_sm=2),
        "B4": Tuning(accesses=2, register_values=16, resident_threads=0, tile_values=16, min_threads=256),
        "B5": Tuning(accesses=4, register_values=16, resident_threads=0, tile_values=16, ctas_per_sm=3),
        "B6": Tuning(accesses=4, register_values=32, resident_threads=0, tile_values=0),  # 32 values, cluster past
        # B6 and B0 with CTAs of at most 256 threads: more, smaller CTAs per row (a cluster past them)
        "B7": Tuning(accesses=4, register_values=32, resident_threads=0, tile_values=0, max_threads_per_row=256),
        "B8": Tuning(accesses=2, register_values=16, resident_threads=0, tile_values=0, max_threads_per_row=256),
        # B0 under a launch bound of 4 CTAs an SM: at N = 1024 the 16-bit LayerNorm's 168 registers leave 3
        # 128-thread CTAs an SM; bound to 128 (8 B of stack for LayerNorm, none for RMSNorm; sm_90a)
        "B9": Tuning(accesses=2, register_values=16, resident_threads=0, tile_values=0, ctas_per_sm=4),
        # BACKWARD (B10, B11) and WIDE_BACKWARD (B12, B13) reading held rows through a shared-memory ring filled by
        # cp.async 2 or 3 row blocks ahead (Tuning.ring_stages): more bytes in flight an SM than the registers hold
        "B10": dataclasses.replace(BACKWARD, ring_stages=3),
        "B11": dataclasses.replace(BACKWARD, ring_stages=4),
        "B12": dataclasses.replace(WIDE_BACKWARD, ring_stages=3),
        "B13": dataclasses.replace(WIDE_BACKWARD, ring_stages=4),
    }


def show(paths: list[str]) -> None:
    """A written sweep as a markdown table: each case, each plan's and torch's time as a fraction of the copy."""
    for path in paths:
        with open(path) as f:
            cases = json.load(f)["cases"]
        labels = sorted({k for c in cases for k in c["of_copy"] if k != "torch"})
        print("| case | " + " | ".join(f"{k} of copy" for k in labels) + " | torch of copy |")
        print("|---|" + "---|" * (len(labels) + 1))
        for c in cases:
            cells = [c["of_copy"].get(k) for k in (*labels, "torch")]
            print(f"| {c['case']} | " + " | ".join("-" if v is None else f"{v:.2f}" for v in cells) + " |")


def inputs(op, m, n, dt, g):
    import torch

    x = torch.randn(m, n, device="cuda", generator=g).to(dt)
    dy = torch.randn(m, n, device="cuda", generator=g).to(dt)
    if op == "softmax":
        return {"x": torch.softmax(x.float(), -1).to(dt), "dy": dy}
    xf = x.float()
    mean = xf.mean(-1)
    rstd = torch.rsqrt((xf - (mean[:, None] if op == "layernorm" else 0)).pow(2).mean(-1) + 1e-5)
    return {"x": x, "dy": dy, "mean": mean, "rstd": rstd}


def torch_backward(op, w, i):
    import torch

    x, dy = i["x"], i["dy"]
    n = x.shape[-1]
    if op == "softmax":
        return torch.ops.aten._softmax_backward_data(dy, x, -1, x.dtype)
    if op == "rmsnorm":
        return torch.ops.aten._fused_rms_norm_backward(dy, x, [n], i["rstd"][:, None], w, [True, True])
    return torch.ops.aten.native_layer_norm_backward(dy, x, [n], i["mean"][:, None], i["rstd"][:, None], w, w,
                                                     [True, True, True])


def ours(op, variant, w, sms, ctas=None):
    """Our backward called directly, on the grid the GPU ops launch (``compiler.backward_grid``), or on
    ``min(ctas, row blocks, the wave)`` CTAs (a timing probe of any grid the kernel can take: the persistent loop
    gives each CTA more rows, the partials shrink to the grid's rows)."""
    import torch

    from kernellab.kernels.gpu import compiler
    from kernellab.kernels.gpu.ops import _grid_sync as grid_sync

    fn = compiler.call_of(compiler.compiled(variant))
    rows_per_cta, per_wave = compiler.wave(variant, sms)

    def call(i):
        x, dy = i["x"], i["dy"]
        m, n = x.shape
        dx = torch.empty_like(x)
        if op == "softmax":
            fn(x, dy, dx)
            return (dx,)
        if ctas is None:
            grid = compiler.backward_grid(m, rows_per_cta, per_wave, sms, x.element_size())
        else:
            grid = min(compiler.wave_grid(m, rows_per_cta, per_wave), ctas)
        pw, dw, sync = torch.empty(grid * rows_per_cta, n, device="cuda"), torch.empty_like(w), grid_sync(x.device)
        if op == "rmsnorm":
            fn(x, w, dy, i["rstd"], None, dx, pw, dw, sync, grid)
            return dx, dw
        pb, db = (torch.empty_like(pw), torch.empty_like(w)) if variant.bias else (None, None)  # dbias wanted or not
        fn(x, w, dy, i["mean"], i["rstd"], dx, pw, pb, dw, db, sync, grid)
        return dx, dw, db

    return call


def time_case(op, dname, m, n, args, device, sms):
    import torch

    from kernellab.harness import timing
    from kernellab.kernels.gpu import compiler
    from kernellab.kernels.gpu.compiler import Variant, widest_vector

    dt = getattr(torch, DTYPES[dname])
    e = dt.itemsize
    set_bytes = 2 * m * n * e
    sets = timing.rotation_count(set_bytes, device.cache_bytes, limit_bytes=16 << 30)
    g = torch.Generator(device="cuda").manual_seed(m * 7 + n)
    sets_in = [inputs(op, m, n, dt, g) for _ in range(sets)]
    w = torch.randn(n, device="cuda", generator=g).to(dt)
    y = torch.empty(m, n, device="cuda", dtype=dt)
    contenders = {"copy": lambda i: y.copy_(i["x"]), "torch": functools.partial(torch_backward, op, w)}
    want = torch_backward(op, w, sets_in[0])
    want = (want,) if isinstance(want, torch.Tensor) else want
    name = DTYPES[dname]
    vec = widest_vector(n, name)
    case = f"{op}_{m}x{n}_{dname}"
    tunings, plans = args.tunings, {}
    for label in args.plans.split(","):
        variant = Variant(f"{op}_backward", name, n, vec, weight=None if op == "softmax" else name,
                          bias=name if op == "layernorm" else None, tuning=tunings[label])
        try:
            fn = ours(op, variant, w, sms)
            got = fn(sets_in[0])
        except Exception as exc:  # noqa: BLE001 - a plan that does not compile or launch is reported, not fatal
            print(f"{case} {label}: FAILED {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            continue
        tol = 3e-2 if dt == torch.bfloat16 else 1e-3
        bad = [float((a.float() - b.float()).abs().max() / (1 + b.float().abs().max()))
               for a, b in zip(got, want, strict=True)]
        if not max(bad) <= tol:
            print(f"{case} {label}: WRONG {bad}", flush=True)
            continue
        contenders[label] = fn
        plans[label] = variant.kernel().describe() | {"resources": str(compiler._RESOURCES.get(variant))}
    iterations = max(20, int(3000 / (3 * m * n * e / 4e6 + 2)))
    samples = {k: [] for k in contenders}
    names = list(contenders)
    for r in range(args.rounds):
        for label in names if r % 2 == 0 else names[::-1]:
            calls = [functools.partial(contenders[label], s) for s in sets_in]
            samples[label] += timing.measure("graph_throughput", calls, device, samples=args.samples,
                                             iterations=iterations)
    copies = [functools.partial(contenders["copy"], s) for s in sets_in]
    kernel_copy = timing.measure("gpu_throughput", copies, device, samples=args.samples, iterations=iterations)
    p50 = {k: statistics.median(v) for k, v in samples.items()}
    p50["copy"] = min(p50["copy"], statistics.median(kernel_copy))
    # copy moves 2 M N; the backward's minimum is 3 M N (+ the weight and its gradient)
    need = 3 * m * n * e + (0 if op == "softmax" else 2 * n * e * (2 if op == "layernorm" else 1))
    ceiling_bps = 2 * m * n * e / p50["copy"]
    of_copy = {k: need / v / ceiling_bps for k, v in p50.items() if k != "copy"}
    return {"case": case, "sets": sets, "p50_us": p50, "of_copy": of_copy, "plans": plans}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--show", nargs="+", metavar="SWEEP", help="print written sweeps as markdown tables and stop")
    ap.add_argument("--cases", default="*")
    ap.add_argument("--plans", default=",".join(PLAN_LABELS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--shapes", default=None)
    add_arguments(ap, "backward_sweep")
    args = ap.parse_args()
    if args.show:
        show(args.show)
        return
    path = path_of(args)
    import torch

    from kernellab.harness import provenance, timing

    args.tunings = plans()
    device = timing.Device("cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = SHAPES if not args.shapes else [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    record = {"tool": "tools/device/backward_sweep.py", "mode": "graph_throughput",
              "plans": {k: str(v) for k, v in args.tunings.items()},
              "provenance": provenance.of_check("cuda", __file__, ["kernels"]), "cases": []}
    results = record["cases"]
    for m, n in shapes:
        for op in ("softmax", "rmsnorm", "layernorm"):
            for dname in DTYPES:
                case = f"{op}_{m}x{n}_{dname}"
                if not any(fnmatch.fnmatch(case, p) for p in args.cases.split(",")):
                    continue
                r = time_case(op, dname, m, n, args, device, sms)
                results.append(r)
                with open(path, "w") as f:
                    json.dump(record, f, indent=1)
                line = " ".join(f"{k}={v:.2f}" for k, v in sorted(r["of_copy"].items()))
                print(f"{case}: {line}", flush=True)


if __name__ == "__main__":
    main()
