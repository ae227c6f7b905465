"""Host cost per call of the eager GPU path, layer by layer, beside torch's: where the microseconds of an
``e2e_throughput`` call go when the kernel itself is shorter than its launch.

    python3 tools/device/host_path.py [--shape 256x3072] [--dtype bf16] [--train rmsnorm|layernorm|softmax]
                                      [--name NAME | --out PATH]
    python3 tools/device/host_path.py --show RECORD.json[,...]   (anywhere: written records as one table)

Each layer is timed over back-to-back calls with one synchronize (us per call), then the public call
is profiled. With ``--train OP``, the layers of one training step (forward and backward through autograd) of
OP instead: torch's step, the two-copy autograd floor, ours, then each piece of our backward alone (the
allocations, the grid rule, the barrier word, the kernel's call), and our step profiled. Writes
$OUT/NAME.json (``--name``, default host_path, host_path_train_OP with ``--train``) or ``--out PATH`` and prints the
table.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time

import torch
from records import add_arguments, path_of  # this folder

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


def ours_forward(op: str, x, w, b):
    if op == "softmax":
        return gpu.softmax(x)
    if op == "rmsnorm":
        return gpu.rmsnorm(x, w, 1e-6)
    return gpu.layernorm(x, w, b, 1e-6)


def train_layers(op: str, m: int, n: int, dt) -> tuple[dict, object]:
    """The layers of one training step of ``op`` and our whole step (for the profile)."""
    from kernellab.harness.suites.problems import _two_copies  # the suites' autograd floor

    x = torch.randn(m, n, device="cuda", dtype=dt, requires_grad=True)
    w = torch.randn(n, device="cuda", dtype=dt, requires_grad=True)
    b = torch.randn(n, device="cuda", dtype=dt, requires_grad=True)
    dy = torch.randn(m, n, device="cuda", dtype=dt)
    F = torch.nn.functional
    torch_fwd = {"softmax": lambda: torch.softmax(x, -1), "rmsnorm": lambda: F.rms_norm(x, (n,), w, 1e-6),
                 "layernorm": lambda: F.layer_norm(x, (n,), w, b, 1e-6)}[op]

    def step(fwd):
        def run():
            fwd().backward(dy)
            x.grad = w.grad = b.grad = None
        return run

    ours = step(lambda: ours_forward(op, x, w, b))
    ours()  # compiles forward and backward
    floor = _two_copies()
    xd, wd, bd = x.detach(), w.detach(), b.detach()
    layers = {
        f"torch {op} step": step(torch_fwd),
        "autograd floor step (two copies)": step(lambda: floor.apply(x)),
        f"ours {op} step": ours,
        f"ours {op} forward, no grad": lambda: ours_forward(op, xd, wd, bd),
        f"torch {op} forward under autograd (no backward)": torch_fwd,
        f"ours {op} forward under autograd (no backward)": lambda: ours_forward(op, x, w, b),
        "torch.empty_like(x) (dx)": lambda: torch.empty_like(xd),
        "x.new_empty partials (fp32)": lambda: xd.new_empty((264, n), dtype=torch.float32),
        "ops._sms(x)": lambda: ops._sms(xd),
        "ops._grid_sync(device)": lambda: ops._grid_sync(xd.device),
    }
    if op != "softmax":
        rstd = torch.rsqrt(xd.float().pow(2).mean(-1) + 1e-6)
        mean = xd.float().mean(-1)
        if op == "rmsnorm":
            layers["ops._grad_launch (backward alone)"] = lambda: ops._grad_launch(
                "rmsnorm_backward", xd, dy, weight=wd, rstd=rstd)
        else:
            layers["ops._grad_launch (backward alone)"] = lambda: ops._grad_launch(
                "layernorm_backward", xd, dy, weight=wd, rstd=rstd, mean=mean, dbias=bd.dtype)
    return layers, ours


def report(layers: dict, profiled, path: str, meta: dict) -> None:
    result = {}
    for label, f in layers.items():
        try:
            result[label] = per_call(f, calls=1000)
        except (TypeError, ValueError, RuntimeError) as e:  # a layer that cannot take the call: say why
            result[label] = f"{type(e).__name__}: {e}"
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(1000):
        profiled()
    torch.cuda.synchronize()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(15)
    from kernellab.harness import provenance

    record = {"provenance": provenance.of_check("cuda", __file__, ["kernels"]), **meta, "us_per_call": result,
              "profile": text.getvalue()}
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
    print(text.getvalue()[-3000:])
    for label, us in result.items():
        print(f"{label:40s} {us:7.2f} us" if isinstance(us, float) else f"{label:40s} {us}")


def show(paths: str) -> None:
    """Written records as one markdown table: us per call of each layer, a column per record."""
    records = []
    for path in paths.split(","):
        with open(path) as f:
            records.append(json.load(f))
    labels = [" ".join(str(v) for v in (r.get("train", "call"), "x".join(map(str, r["shape"])), r["dtype"]))
              + (f" at {r['provenance']['git']['commit'][:7]}" if "provenance" in r else "") for r in records]
    layers = list(dict.fromkeys(layer for r in records for layer in r["us_per_call"]))
    print("| layer | " + " | ".join(f"{label} us" for label in labels) + " |")
    print("|---" * (len(labels) + 1) + "|")
    for layer in layers:
        cells = [r["us_per_call"].get(layer) for r in records]
        print(f"| {layer} | " + " | ".join("-" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v)
                                           for v in cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--show", metavar="RECORD[,RECORD...]", help="print written records as one markdown table")
    ap.add_argument("--shape", default="256x3072")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--train", choices=("softmax", "rmsnorm", "layernorm"))
    add_arguments(ap, "host_path (host_path_train_OP with --train)")
    ap.set_defaults(name=None)  # the default depends on --train
    args = ap.parse_args()
    if args.show:
        show(args.show)
        return
    if args.name is None:
        args.name = f"host_path_train_{args.train}" if args.train else "host_path"
    path = path_of(args)
    m, n = (int(v) for v in args.shape.split("x"))
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    if args.train:
        layers, ours = train_layers(args.train, m, n, dt)
        report(layers, ours, path, {"shape": [m, n], "dtype": args.dtype, "train": args.train})
        return
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
    report(layers, lambda: gpu.softmax(x, out=y), path, {"shape": [m, n], "dtype": args.dtype})


if __name__ == "__main__":
    main()
