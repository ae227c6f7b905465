"""Host cost per call of the eager GPU path, layer by layer, beside torch's: where the microseconds of an
``e2e_throughput`` call go when the kernel itself is shorter than its launch.

    python3 tools/device/host_path.py [--shape 256x3072] [--dtype bf16]

Each layer is timed over back-to-back calls with one synchronize (us per call), then the public call
is profiled. Writes $OUT/host_path.json and prints the table.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import time

import torch

from kernellab.kernels import gpu
from kernellab.kernels.gpu import compiler, ops


def per_call(fn, calls: int = 3000) -> float:
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter_ns() - t0) / 1e3 / calls)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="256x3072")
    ap.add_argument("--dtype", default="bf16")
    args = ap.parse_args()
    m, n = (int(v) for v in args.shape.split("x"))
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    x = torch.randn(m, n, device="cuda", dtype=dt)
    y = torch.empty_like(x)
    w = torch.randn(n, device="cuda", dtype=dt)
    gpu.softmax(x, out=y)
    plans = next(iter(ops._FUNCTIONS.values()))
    fn = compiler.compiled(plans.variant)  # the DSL's kwargs wrapper
    raw = plans.fn  # the tvm_ffi.Function under it, which the ops call
    empty = torch.empty(1, device="cuda")
    layers = {
        "torch.softmax": lambda: torch.softmax(x, -1),
        "torch.softmax(out=y)": lambda: torch.softmax(x, -1, out=y),
        "torch.empty_like(x)": lambda: torch.empty_like(x),
        "ops._empty(x)": lambda: ops._empty(x),
        "torch.compiler.is_compiling()": torch.compiler.is_compiling,
        "ops._fast(softmax, x, y)": lambda: ops._fast("softmax", x, y),
        "torch.rms_norm": lambda: torch.nn.functional.rms_norm(x, (n,), w, 1e-6),
        "tensor.add_ (one torch launch)": lambda: empty.add_(1.0),
        "compiled fn(x, y) (TVM-FFI)": lambda: fn(x, y),
        "raw tvm_ffi.Function(x, y)": lambda: raw(x, y),
        "ops._run": lambda: ops._run("softmax", x, y),
        "ops._launch": lambda: ops._launch("softmax", x, y),
        "gpu.softmax(x, out=y)": lambda: gpu.softmax(x, out=y),
        "gpu.softmax(x)": lambda: gpu.softmax(x),
        "gpu.rmsnorm(x, w, out=y)": lambda: gpu.rmsnorm(x, w, 1e-6, out=y),
    }
    result = {}
    for name, f in layers.items():
        try:
            result[name] = per_call(f)
        except (TypeError, ValueError, RuntimeError) as e:  # a layer that cannot take the call: say why
            result[name] = f"{type(e).__name__}: {e}"
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3000):
        gpu.softmax(x, out=y)
    torch.cuda.synchronize()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(12)
    with open(os.path.join(os.environ.get("OUT", "."), "host_path.json"), "w") as f:
        json.dump({"shape": [m, n], "dtype": args.dtype, "us_per_call": result, "profile": text.getvalue()}, f,
                  indent=1)
    print(text.getvalue()[-3000:])
    for name, us in result.items():
        print(f"{name:34s} {us:7.2f} us" if isinstance(us, float) else f"{name:34s} {us}")


if __name__ == "__main__":
    main()
