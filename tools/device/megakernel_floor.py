"""Where the time of a tiny engine call goes, on the GPU host: the report's empty launch-floor kernel against
probe kernels that add, one at a time, what an engine's launch has (256 threads; `persistent`'s seven tensor
arguments and its launch options; one round trip to memory reading every input and writing y; a second
round trip behind a CTA barrier), beside the planned engines themselves at one small shape. Each is timed as
the engine report times engines (``report.Run.time_call``: stream and host clocks), directly and replayed in
a CUDA graph, in alternating rounds. The step between two neighbouring rows is what that feature costs; the
last probe is about the least a kernel that reads all its inputs and has one barrier can take.

    python3 tools/device/megakernel_floor.py [--shape 1x7x13] [--engines persistent,persistent-tc,torch-cublas]
                                             [--rounds 3] [--samples 30] [--name NAME | --out PATH]
    python3 tools/device/megakernel_floor.py --show reports/h200/floor/megakernel-floor-1x7x13-40ca6cc.json ...

Writes $OUT/NAME.json (``--name``, default megakernel_floor) or ``--out PATH`` (with the harness's provenance)
and prints a table of stream p50, direct and in a graph; ``--show`` prints that table of written JSON files.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float16, Float32
from records import add_arguments, path_of  # this folder

from kernellab.harness import provenance
from kernellab.megakernel import bench, engines, report
from kernellab.megakernel.engines import floor
from kernellab.megakernel.engines.common import Symbols, compile_variant, compiled
from kernellab.megakernel.engines.graph import GraphCall
from kernellab.megakernel.planning import SCALAR_OCCUPANCY


@dataclasses.dataclass(frozen=True)
class Probe:
    """A one-CTA kernel: ``threads`` threads; ``seven``: the engine's seven tensors (else y alone); ``smem``
    bytes of dynamic shared memory with persistent's launch options; ``trips``: 0 (empty), 1 (every input
    read once, y written) or 2 (a second read behind a CTA barrier)."""

    label: str
    threads: int
    seven: bool
    smem: int = 0
    trips: int = 0

    @property
    def name(self) -> str:
        return f"floor-probe-{self.label}"

    def compile(self, arch: str | None = None):
        s = Symbols()
        y = s.matrix(Float32, s.rows, s.channels)
        if not self.seven:
            return compile_variant(self.name, OneTensor(self), (y,), arch)
        args = (s.matrix(Float16, s.rows, s.channels), s.matrix(Float16, s.rows, s.channels),
                s.matrix(Float16, s.hidden, s.channels), s.vector(Float32, s.hidden),
                s.matrix(Float16, s.channels, s.hidden), s.vector(Float32, s.channels), y)
        return compile_variant(self.name, SevenTensors(self), args, arch)


PROBES = (Probe("256-threads", 256, False), Probe("7-tensors", 256, True),
          Probe("launch-options", 256, True, smem=800), Probe("one-trip", 256, True, smem=800, trips=1),
          Probe("two-trips", 256, True, smem=800, trips=2))


class OneTensor:
    def __init__(self, probe: Probe):
        self.probe = probe

    @cute.jit
    def __call__(self, y: cute.Tensor, stream: cuda.CUstream):
        self.kernel(y).launch(grid=[1, 1, 1], block=[self.probe.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, y: cute.Tensor):
        """Nothing: the launch of a wider CTA."""


class SevenTensors:
    def __init__(self, probe: Probe):
        self.probe = probe

    @cute.jit
    def __call__(self, u: cute.Tensor, res: cute.Tensor, w1: cute.Tensor, b1: cute.Tensor, w2: cute.Tensor,
                 b2: cute.Tensor, y: cute.Tensor, stream: cuda.CUstream):
        if cutlass.const_expr(self.probe.smem):
            self.kernel(u, res, w1, b1, w2, b2, y).launch(
                grid=[1, 1, 1], block=[self.probe.threads, 1, 1], smem=self.probe.smem,
                min_blocks_per_mp=SCALAR_OCCUPANCY, preferred_smem_carveout=100, stream=stream)
        else:
            self.kernel(u, res, w1, b1, w2, b2, y).launch(grid=[1, 1, 1], block=[self.probe.threads, 1, 1],
                                                          stream=stream)

    @cute.kernel
    def kernel(self, u: cute.Tensor, res: cute.Tensor, w1: cute.Tensor, b1: cute.Tensor, w2: cute.Tensor,
               b2: cute.Tensor, y: cute.Tensor):
        """Thread t < channels: y[0, t] from row 0 of every input (one round trip), or from a first read
        through shared memory and a barrier, then a second (two round trips)."""
        tid, _, _ = cute.arch.thread_idx()
        channels = u.shape[1]
        if cutlass.const_expr(self.probe.trips == 1):
            if tid < channels:
                y[0, tid] = (u[0, tid].to(Float32) + res[0, tid].to(Float32) + w1[0, tid].to(Float32) + b1[0]
                             + w2[tid, 0].to(Float32) + b2[tid])
        if cutlass.const_expr(self.probe.trips == 2):
            first = cute.make_tensor(cute.recast_ptr(cute.arch.get_dyn_smem(cutlass.Uint8, alignment=16),
                                                     dtype=Float32), cute.make_layout(channels))
            if tid < channels:
                first[tid] = u[0, tid].to(Float32) + w1[0, tid].to(Float32) + b1[0]
            cute.arch.sync_threads()
            if tid < channels:
                y[0, tid] = first[channels - 1 - tid] + res[0, tid].to(Float32) + w2[tid, 0].to(Float32) + b2[tid]


def probe_call(probe: Probe):
    """The probe as an engine call: ``call(inputs, outputs)`` (x also as the residual, as the engines pass it)."""
    fn = compiled(probe)

    def call(i, o):
        if probe.seven:
            fn(i["x"], i["x"], i["w1"], i["b1"], i["w2"], i["b2"], o["y"])
        else:
            fn(o["y"])
        return o
    return call


def table(record: dict) -> str:
    """The table of a run's stream p50: direct, and replayed in a CUDA graph."""
    lines = [f"stream p50, us, at {'x'.join(map(str, record['shape']))}: direct, in a CUDA graph"]
    for label, r in record["p50_us"].items():
        lines.append(f"{label:24s} {r['direct']['stream']:7.2f} {r['graph']['stream']:7.2f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--show", nargs="+", metavar="JSON", help="print the tables of written runs, then exit")
    ap.add_argument("--shape", default="1x7x13", help="RxCxH of the inputs and of the engines timed beside")
    ap.add_argument("--engines", default="persistent,persistent-tc,torch-cublas")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=30)
    add_arguments(ap, "megakernel_floor")
    args = ap.parse_args()
    if args.show:
        for path in args.show:
            with open(path) as f:
                print(table(json.load(f)))
        return
    path = path_of(args)
    shape = tuple(int(v) for v in args.shape.split("x"))
    run = report.Run(report.parser().parse_args(["--samples", str(args.samples), "--shapes", args.shape]))
    run.device.warm_up(2.0)
    problem = bench.ResidualMLP(shape, activation=bench.DEFAULT_ACTIVATION)
    inputs = problem.make_inputs(1)
    outputs = problem.make_outputs(inputs)
    empty = floor.launcher()
    calls = {"floor (32 threads, y)": lambda i, o: empty(o["y"]) or o}
    for probe in PROBES:
        calls[probe.label] = probe_call(probe)
    for name in args.engines.split(","):
        calls[name] = engines.bind(name, problem.model_shape, bench.DEFAULT_ACTIVATION).call
    timed = {}
    for label, call in calls.items():
        graphed = GraphCall(call)
        timed[label] = {"direct": lambda call=call: call(inputs, outputs),
                        "graph": lambda graphed=graphed: graphed(inputs, outputs)}
    samples = {(label, how): {"stream": [], "host": []} for label in timed for how in ("direct", "graph")}
    order = list(timed)
    for r in range(args.rounds):
        for label in order if r % 2 == 0 else order[::-1]:
            for how, once in timed[label].items():
                run.time_call(once, samples[(label, how)])
    rows = {label: {how: {clock: statistics.median(samples[(label, how)][clock]) for clock in ("stream", "host")}
                    for how in ("direct", "graph")} for label in timed}
    record = {"provenance": provenance.of_check("cuda", __file__, ["megakernel"]), "shape": shape,
              "rounds": args.rounds, "samples_per_round": args.samples,
              "probes": [dataclasses.asdict(p) for p in PROBES], "p50_us": rows}
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
    print(table(record))


if __name__ == "__main__":
    main()
