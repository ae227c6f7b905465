"""Launch-plan sweep of the CuTe norm kernels on the GPU host: every distinct plan the Tuning knobs give,
timed in graph throughput with inputs rotated past the L2 and one output buffer (as the harness times
them) beside torch's copy (the ceiling), torch eager and QuACK (bound as the gpu-norm suite binds it),
in alternating rounds. It is how the heuristic defaults in gpu/base.py are chosen.

    python3 tools/device/norm_sweep.py [--cases 'rmsnorm*bf16,*x4096_fp32'] [--plans '8-48-*'] [--rounds 2]
                                       [--shapes 512x6144,768x6144,1536x6144]   (M against a plan's waves)
                                       [--by-rows]   (only cases where M picks a bounded plan: it against the default)

Writes $OUT/NAME.json (``--name``, default norm_sweep) or ``--out PATH`` (after every case) and prints one line per
case: the default plan, the best plan, both as a fraction of the copy ceiling. Every plan's output is checked
against torch before it is timed.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import functools
import itertools
import json
import statistics
import types

import torch
import torch.nn.functional as F
from records import add_arguments, path_of  # this folder

from kernellab.harness import timing
from kernellab.kernels.gpu import compiler
from kernellab.kernels.gpu.base import Tuning
from kernellab.kernels.gpu.compiler import Variant, widest_vector

SHAPES = [(16384, 8192), (8192, 16384), (65536, 1024), (768, 6144), (1024, 4096), (256, 3072), (37, 1537)]
KNOBS = [Tuning(a, rv, 128, rt, vs) for a in (2, 4, 8) for rv, rt in ((32, 0), (32, 1024), (64, 512))
         for vs in ("early", "late")] + [  # fewer threads per row, more values each (QuACK's kind of plan)
    Tuning(8, 48, 128, 768, "late"), Tuning(12, 96, 128, 512, "late"), Tuning(16, 128, 128, 512, "late"),
    # launch bounds from 16 values of x per thread up: more resident rows per SM
    Tuning(4, 16, 128, 1280, "late"), Tuning(4, 16, 128, 1536, "late"), Tuning(8, 16, 128, 896, "late"),
    # rows streamed on one CTA (the passes after the first re-read x from L2): fewer registers, more rows in flight;
    # tile_values=0 holds every row that fits (against a kernel's own streaming rule)
    Tuning(tile_values=0), Tuning(tile_values=16), Tuning(tile_values=16, ctas_per_sm=3), Tuning(tile_values=8),
    Tuning(tile_values=8, ctas_per_sm=4),
    # 16-bit rows of 16384 split over a cluster of two CTAs, 16 values per thread: 3 or 4 CTAs per SM
    Tuning(2, 16, 128, 1536, "late"), Tuning(2, 16, 128, 2048, "late")]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
EPS = {"rmsnorm": 1e-6, "layernorm": 1e-5}


def torch_op(op, x, w, b):
    if op == "softmax":
        return torch.softmax(x, -1)
    if op == "rmsnorm":
        return F.rms_norm(x, (x.shape[-1],), w, EPS[op])
    return F.layer_norm(x, (x.shape[-1],), w, b, EPS[op])


def ours(op, fn):
    if op == "softmax":
        return lambda x, w, b, y: fn(x, y)
    if op == "rmsnorm":
        return lambda x, w, b, y: fn(x, w, None, y, None, None, EPS[op])
    return lambda x, w, b, y: fn(x, w, b, y, None, None, EPS[op])


def quack_op(op, dname, m, n):
    """QuACK bound as the gpu-norm suite binds it (kernellab.kernels.bench), or None where it cannot run."""
    from kernellab.harness.case import Unsupported
    from kernellab.kernels import bench

    if bench._quack_available():
        return None
    dt = DTYPES[dname]
    problem = types.SimpleNamespace(op=op, device="cuda", dtype=dname, name=f"{op}_{m}x{n}_{dname}", shape=(m, n),
                                    params={"eps": EPS.get(op)}, element_size=lambda: dt.itemsize)
    try:
        call = bench._quack_call(problem)
    except Unsupported:
        return None
    return lambda x, w, b, y: call({"x": x, "weight": w, "bias": b}, {"y": y})


def plans(op, dt, n, patterns=("*",)):
    """{plan description: (label, Variant)} over the knobs whose label matches a pattern, the default first."""
    name = {torch.float32: "float32", torch.bfloat16: "bfloat16"}[dt]
    base = dict(weight=None if op == "softmax" else name, bias=name if op == "layernorm" else None)
    vec = widest_vector(n, name)
    out = {}
    for tuning in [None, *KNOBS]:
        v = Variant(op, name, n, vec, tuning=tuning, **base)
        label = "default" if tuning is None else v.name.rsplit("_t", 1)[1]
        if tuning is not None and not any(fnmatch.fnmatch(label, p) for p in patterns):
            continue
        key = json.dumps(v.kernel().describe(), sort_keys=True)
        out.setdefault(key, (label, v))
    return out


def by_rows(variants, m):
    """The function the ops choose for M rows where it is not the heuristic plan's (then it joins
    ``variants`` as "by-rows", labelled with its bound), else None."""
    label, default = next(iter(variants.values()))
    chosen = compiler.Plans(default, torch.cuda.get_device_properties(0).multi_processor_count)
    fn = chosen.for_rows(m)
    if fn is chosen.fn:
        return None
    k = next(k for k, f in chosen.bounded.items() if f is fn)
    variants["by-rows"] = ("by-rows", dataclasses.replace(default, tuning=Tuning(ctas_per_sm=k)))
    return fn


def time_case(op, dname, m, n, args, device) -> dict | None:
    """Every plan of one case beside copy, torch and QuACK; p50 of graph throughput per contender."""
    dt = DTYPES[dname]
    variants = plans(op, dt, n, args.plans.split(","))
    chosen = by_rows(variants, m)
    if args.by_rows and chosen is None:
        return None
    set_bytes = m * n * dt.itemsize  # inputs rotate; every call writes one output, as in the harness
    sets = timing.rotation_count(set_bytes, device.cache_bytes, limit_bytes=16 << 30)
    g = torch.Generator(device="cuda").manual_seed(m * 7 + n)
    xs = [torch.randn(m, n, device="cuda", dtype=dt, generator=g) for _ in range(sets)]
    y = torch.empty_like(xs[0])
    w = torch.randn(n, device="cuda", dtype=dt, generator=g)
    b = torch.randn(n, device="cuda", dtype=dt, generator=g)
    contenders = {"copy": lambda x, w, b, y: y.copy_(x), "torch": functools.partial(torch_eager, op)}
    q = quack_op(op, dname, m, n)
    if q is not None:
        contenders["quack"] = q
    want = torch_op(op, xs[0].double(), w.double(), b.double()).float()
    tol = 2e-2 if dt == torch.bfloat16 else 1e-4
    case = f"{op}_{m}x{n}_{dname}"
    for label, v in variants.values():
        fn = ours(op, v.compile() if label != "by-rows" else chosen)
        y.fill_(float("nan"))
        fn(xs[0], w, b, y)
        err = (y.float() - want).abs().max().item()
        if not err <= tol * (1 + want.abs().max().item()):
            print(f"{case} {label}: WRONG (max error {err})", flush=True)
            continue
        contenders[label] = fn
    est = 2 * set_bytes / 4e6 + 2  # us per call at ~4 TB/s, read plus write
    iterations = max(20, int(3000 / est))
    samples = {k: [] for k in contenders}
    names = list(contenders)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            calls = [functools.partial(contenders[name], xs[i], w, b, y) for i in range(sets)]
            samples[name] += timing.measure("graph_throughput", calls, device, samples=args.samples,
                                            iterations=iterations)
    # the ceiling as the harness takes it: the faster throughput mode of copy (in a graph alone, the sweep's
    # fp32 copies ran far under the harness's ceiling, which made plans look faster than copy)
    copies = [functools.partial(contenders["copy"], xs[i], w, b, y) for i in range(sets)]
    kernel_copy = timing.measure("gpu_throughput", copies, device, samples=args.samples, iterations=iterations)
    p50 = {k: statistics.median(v) for k, v in samples.items()}
    p50["copy"] = min(p50["copy"], statistics.median(kernel_copy))
    plan_us = {k: v for k, v in p50.items() if k not in ("copy", "torch", "quack")}
    best = min(plan_us, key=plan_us.get)
    return {"case": case, "sets": sets, "p50_us": p50, "best": best,
            "default_of_copy": p50["copy"] / p50["default"], "best_of_copy": p50["copy"] / p50[best],
            "plans": {label: v.kernel().describe() for label, v in variants.values()}}


def torch_eager(op, x, w, b, y):
    return torch_op(op, x, w, b)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="*", help="comma-separated shell patterns over case names")
    ap.add_argument("--shapes", help="comma-separated MxN in place of the suite's shapes")
    ap.add_argument("--plans", default="*",
                    help="comma-separated shell patterns over plan labels (a-rv-mt-rt-vectors[-cK][-sV])")
    ap.add_argument("--by-rows", action="store_true",
                    help="only cases where the ops run a bounded plan for M (compiler.Plans), timed as 'by-rows'")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--samples", type=int, default=10)
    add_arguments(ap, "norm_sweep")
    args = ap.parse_args()
    path = path_of(args)
    device = timing.Device("cuda")
    device.warm_up(2.0)
    results = []
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    for (m, n), dname, op in itertools.product(shapes, DTYPES, ("softmax", "rmsnorm", "layernorm")):
        if not any(fnmatch.fnmatch(f"{op}_{m}x{n}_{dname}", p) for p in args.cases.split(",")):
            continue
        row = time_case(op, dname, m, n, args, device)
        if row is None:
            continue
        results.append(row)
        p50 = row["p50_us"]
        qs = f"{p50['copy'] / p50['quack']:.3f}" if "quack" in p50 else "  -  "
        print(f"{row['case']:28s} copy {p50['copy']:8.2f}us torch {p50['copy'] / p50['torch']:.3f} quack {qs} "
              f"default {row['default_of_copy']:.3f} best {row['best_of_copy']:.3f} ({row['best']})", flush=True)
        torch.cuda.empty_cache()
        with open(path, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
