"""Which device copy is a bandwidth ceiling, on the GPU host: the harness's copy control (``y.copy_(x)``, a
cudaMemcpy that a CUDA graph records as a memcpy node) against elementwise copy kernels that no graph turns
into a memcpy (``torch.mul(x, 1, out=y)``, ``torch.add(x, 0, out=y)``), each timed directly on the stream and
replayed in a CUDA graph, over buffers rotated past the L2, in alternating rounds. The question: is the copy in a
graph a stable ceiling, or one that a kernel reading and writing the same bytes passes?

    python3 tools/device/copy_ceiling.py [--shapes 16384x8192,8192x16384,65536x1024] [--dtypes float32,bfloat16]
                                         [--rounds 3] [--calls 20] [--name NAME | --out PATH]
    python3 tools/device/copy_ceiling.py --show reports/h200/norm-backward/copy-ceiling.json
    python3 tools/device/copy_ceiling.py --show COPY.json --against RUN.json [--mode graph_throughput]
        (each contender of a harness run report against the fastest copy of its shape and dtype in COPY.json)

Writes $OUT/NAME.json (``--name``, default copy-ceiling) or ``--out PATH`` (the harness's provenance, then a record
per shape, dtype, copy and clock: the median over rounds of GB/s by bytes read plus written) and prints a table of
it last.
"""

from __future__ import annotations

import argparse
import json
import statistics

from records import add_arguments, path_of  # this folder

COPIES = {"memcpy": lambda torch, x, y: y.copy_(x),
          "mul-kernel": lambda torch, x, y: torch.mul(x, 1, out=y),
          "add-kernel": lambda torch, x, y: torch.add(x, 0, out=y)}
CLOCKS = ("stream", "graph")


def time_copy(torch, copy, pairs, calls: int, clock: str) -> float:
    """Microseconds per copy: ``calls`` copies, each on the next rotated (x, y) pair, timed with CUDA events;
    ``clock`` graph replays them captured in one CUDA graph (after a warm replay), stream issues them directly."""
    def issue():
        for i in range(calls):
            x, y = pairs[i % len(pairs)]
            copy(torch, x, y)
    issue()
    torch.cuda.synchronize()
    if clock == "graph":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            issue()
        graph.replay()
        torch.cuda.synchronize()
        run = graph.replay
    else:
        run = issue
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def table(records: list[dict]) -> str:
    rows = sorted({(r["shape"], r["dtype"]) for r in records})
    head = [f"{c} {k} GB/s" for c in COPIES for k in CLOCKS]
    lines = ["| shape | dtype | " + " | ".join(head) + " |", "|" + "---|" * (len(head) + 2)]
    by = {(r["shape"], r["dtype"], r["copy"], r["clock"]): r["gbps"] for r in records}
    for shape, dtype in rows:
        cells = [f"{by[(shape, dtype, c, k)]:.0f}" if (shape, dtype, c, k) in by else "-" for c in COPIES
                 for k in CLOCKS]
        lines.append(f"| {shape} | {dtype} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def against(records: list[dict], run: dict, mode: str) -> str:
    """A harness run report's contenders at the shapes ``records`` timed: GB/s by the problem's minimum bytes (the
    report's own ``gbps``) over the fastest copy of the same shape and dtype among ``records``, beside the report's
    own ``ceiling_fraction`` (its copy)."""
    from kernellab.harness.case import torch_dtype  # the harness's dtype names ("bf16"), the records' torch ones

    best: dict[tuple, float] = {}
    for r in records:
        key = (r["shape"], r["dtype"])
        best[key] = max(best.get(key, 0.0), r["gbps"])
    lines = [f"| case | impl | {mode} GB/s | of the report's copy | of the fastest copy here |",
             "|---|---|---|---|---|"]
    for c in run["cases"]:
        p, m = c["problem"], c["modes"].get(mode, {})
        key = ("x".join(map(str, p["shape"])), str(torch_dtype(p["dtype"])).removeprefix("torch."))
        if p["op"] == run.get("ceiling_op", "copy") or key not in best or "gbps" not in m:
            continue
        own = m.get("ceiling_fraction")
        lines.append(f"| {c['name']} | {c['impl']} | {m['gbps']:.0f} | {'-' if own is None else f'{own:.2f}'} | "
                     f"{m['gbps'] / best[key]:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="16384x8192,8192x16384,65536x1024")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=20, help="copies a timing, each on the next rotated pair")
    ap.add_argument("--show", metavar="JSON", help="print a written record's table, then exit")
    ap.add_argument("--against", metavar="RUN", help="with --show: a harness run report read against the record")
    ap.add_argument("--mode", default="graph_throughput", help="with --against: the report's mode")
    add_arguments(ap, "copy-ceiling")
    args = ap.parse_args()
    if args.show:
        records = json.load(open(args.show))["records"]
        if args.against:
            print(against(records, json.load(open(args.against)), args.mode))
        else:
            print(table(records))
        return
    path = path_of(args)
    import torch

    from kernellab.harness import provenance
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    out = {"provenance": provenance.of_check("cuda", __file__, ["harness"]), "rounds": args.rounds,
           "calls": args.calls, "records": []}
    for shape in shapes:
        for dtype in dtypes:
            x0 = torch.randn(shape, device="cuda", dtype=dtype)
            nbytes = x0.numel() * x0.element_size()
            sets = max(2, -(-4 * l2 // (2 * nbytes)))  # pairs rotated past 4 L2s
            pairs = [(x0 if i == 0 else torch.randn_like(x0), torch.empty_like(x0)) for i in range(sets)]
            times: dict[tuple, list[float]] = {}
            for r in range(args.rounds):
                order = list(COPIES) if r % 2 == 0 else list(reversed(COPIES))
                for name in order:
                    for clock in CLOCKS:
                        times.setdefault((name, clock), []).append(
                            time_copy(torch, COPIES[name], pairs, args.calls, clock))
            for x, y in pairs:
                assert torch.equal(x, y), "a copy did not copy"
            for (name, clock), us in times.items():
                p50 = statistics.median(us)
                out["records"].append({"shape": "x".join(map(str, shape)), "dtype": str(dtype).split(".")[1],
                                       "copy": name, "clock": clock, "us": us, "p50_us": p50,
                                       "gbps": 2 * nbytes / (p50 * 1e3)})
            del pairs, x0
            torch.cuda.empty_cache()
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(table(out["records"]))


if __name__ == "__main__":
    main()
