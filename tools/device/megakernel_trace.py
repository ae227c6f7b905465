"""Phase trace of persistent-tc on the GPU host: where a tile's clocks go, step by step.

    python3 tools/device/megakernel_trace.py 16384x512x2048 4096x256x1024 16384x512x2048:grid=16 ...
                                             [--name NAME | --out PATH]

Builds a traced copy of ``engines/persistent_tc.py`` beside it (``_traced_persistent_tc.py``, removed at the end):
the kernel takes one more tensor, and thread 0 of every CTA writes ``clock()`` into it after each step of its first
tile (``OVERLAPPED`` and ``SERIAL``, one per chunk schedule: after a wait, a barrier, a GEMM, the activation) and at
the tile's start and end. Each ``SHAPE[:choice=value...]`` runs the planned kernel of the shared-memory form
(``planning.forced`` choices, ``registers=False``: the register form is another module) on the benchmark's inputs
and default activation, three times to warm up and ten times timed, then takes the last run's stamps. Printed and
written to ``$OUT/NAME.json`` (``--name``, default megakernel-trace) or ``--out PATH`` with the harness's
provenance: per step the median clocks over CTAs and chunks, per tile the median clocks from its start to its first
GEMM, through its chunks, and through the output epilogue. A stamp costs a few instructions; the clocks are the
SM's, so a step's share of a chunk is what to read, not its microseconds.

Anchors are lines of the kernel's source: a change there that moves one makes this tool stop with the anchor's
text, to be updated with the kernel.
"""

from __future__ import annotations

import argparse
import json
import statistics

from records import add_arguments, path_of  # this folder
from source_patch import line_after, replace_once, traced_module  # this folder

TOOL = "megakernel_trace"
TRACE_SLOTS = 512  # per CTA: 8 per chunk, tile-level stamps from TILE_SLOT
TILE_SLOT = 500
OVERLAPPED = [  # (a line of the overlapped chunk loop, the step that ends after it)
    ("pipe_w1.consumer_wait(use_w1)  # W1(j + 1) landed", "b1 + W1 wait"),
    ("cute.arch.sync_threads()  # hidden chunk j is complete", "barrier"),
    ("                    pipe_w2.consumer_wait(use_w2)\n", "GEMM1 issue + W2 wait"),
    ("warpgroup.wait_group(1)  # GEMM1(j + 1) is done", "GEMM1"),
    ("self.hidden_epilogue(acc_h, bias_h, act, thr_h.partition_C(s_h[None, None, (jj + 1) % 2]))", "activation"),
    ("warpgroup.wait_group(0)  # GEMM2(j) is done", "GEMM2 rest"),
]
SERIAL = [  # the serial chunk loop (TMA loads)
    ("pipe_w1.consumer_wait(use_w1)  # W1(j) landed", "b1 + W1 wait"),
    ("self.gemm(mma_h, tid, acc_h, s_x, s_w1[None, None, slot], copy_a, copy_b, False)", "barrier + GEMM1"),
    ("                    self.hidden_epilogue(acc_h, bias_h, act, h_dst)\n", "activation"),
    ("pipe_w2.consumer_wait(use_w2)  # W2(j) landed", "W2 wait"),
    ("self.gemm(mma_y, tid, acc_y, s_h[None, None, 0], s_w2[None, None, slot], copy_a, copy_b, True)",
     "barrier + GEMM2"),
]
LOOP_TOPS = {"overlapped": "                    j = rank + split * jj\n",
             "serial": "                    j, slot = rank + split * jj, jj % stages\n"}
STAMP = "self.stamp(trace, tid, cta, {slot}, first)"


def traced_source(source: str) -> str:
    """persistent_tc.py with the trace tensor and the stamps."""
    s = replace_once(TOOL, source, "block_signature(self.vector, self.residual), arch)",
                     "block_signature(self.vector, self.residual) + (cute.runtime.make_fake_tensor("
                     f"Int32, (cute.sym_int(), {TRACE_SLOTS}), stride=({TRACE_SLOTS}, 1)),), arch)")
    s = replace_once(TOOL, s, "act: Int32, grid: Int32, stream: cuda.CUstream):",
                     "act: Int32, grid: Int32, trace: cute.Tensor, stream: cuda.CUstream):")
    s = replace_once(TOOL, s, "self.kernel(u, residual, w1, b1, w2, b2, y, act, *layouts,",
                     "self.kernel(u, residual, w1, b1, w2, b2, y, act, trace, *layouts,")
    s = replace_once(TOOL, s, "y: cute.Tensor, act: Int32, x_layout: cute.ComposedLayout,",
                     "y: cute.Tensor, act: Int32, trace: cute.Tensor, x_layout: cute.ComposedLayout,")
    s = replace_once(TOOL, s, "    @cute.jit\n    def weight_pipelines(", (
        "    @cute.jit\n    def stamp(self, trace: cute.Tensor, tid: Int32, cta: Int32, slot: Int32, first: Int32):\n"
        "        if tid == 0 and first == 0:\n            trace[cta, slot] = cute.arch.clock()\n\n"
        "    @cute.jit\n    def weight_pipelines("))
    s = replace_once(TOOL, s, "            row0 = tile * tile_rows\n", "            first = (tile - group) // groups\n"
                     f"            {STAMP.format(slot=TILE_SLOT)}\n            row0 = tile * tile_rows\n")
    s = line_after(TOOL, s, "tensorcore.wgmma_from_smem(mma_h, tid, acc_h, s_x, s_w1[None, None, use_w1.index], False)",
                   STAMP.format(slot=TILE_SLOT + 1))  # the overlapped schedule's first GEMM1
    after_chunks = "            if cutlass.const_expr(split > 1):\n                cute.arch.cp_async_wait_group(0)"
    s = replace_once(TOOL, s, after_chunks, f"            {STAMP.format(slot=TILE_SLOT + 2)}\n" + after_chunks)
    s = replace_once(TOOL, s, "        if cutlass.const_expr(split * multicast > 1):  # no CTA leaves",
                     f"            {STAMP.format(slot=TILE_SLOT + 3)}\n"
                      "        if cutlass.const_expr(split * multicast > 1):  # no CTA leaves")
    for schedule, steps in (("overlapped", OVERLAPPED), ("serial", SERIAL)):
        s = line_after(TOOL, s, LOOP_TOPS[schedule], STAMP.format(slot="8 * jj"))
        for k, (anchor, _) in enumerate(steps, start=1):
            s = line_after(TOOL, s, anchor, STAMP.format(slot=f"8 * jj + {k}"))
    return replace_once(TOOL, s, 'return (f"persistent-tc_m{', 'return (f"traced-persistent-tc_m{')


def phases(stamps, grid: int, chunks: int, steps: list) -> dict:
    """Median clocks of each step over CTAs and chunks (the last step runs to the next chunk's top)."""
    names = [name for _, name in steps] + ["release + loads"]
    out = {name: [] for name in names}
    for c in range(grid):
        for jj in range(chunks):
            for k, name in enumerate(names):
                end = 8 * jj + k + 1 if k + 1 < len(names) else 8 * (jj + 1)
                if k + 1 == len(names) and jj + 1 == chunks:
                    continue
                out[name].append((int(stamps[c][end]) - int(stamps[c][8 * jj + k])) & 0xFFFFFFFF)
    return {name: statistics.median(v) for name, v in out.items() if v}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", nargs="+", help="RxCxH[:choice=value...] (planning.forced choices, e.g. grid=16)")
    add_arguments(ap, "megakernel-trace")
    args = ap.parse_args()
    path = path_of(args)
    import torch

    from kernellab.harness import provenance
    from kernellab.megakernel import bench, planning
    from kernellab.megakernel.engines import persistent_tc
    from kernellab.megakernel.model import ACTIVATION_CODES

    with traced_module(persistent_tc, traced_source) as traced:
        record = {"provenance": provenance.of_check("cuda", __file__, ["megakernel"]), "cases": {}}
        for case in args.cases:
            shape, *choices = case.split(":")
            rows, channels, hidden = (int(v) for v in shape.split("x"))
            forced = {k: int(v) if v.isdigit() else {"True": True, "False": False}.get(v, v)
                      for k, v in (c.split("=") for c in choices)}
            forced["registers"] = False  # the shared-memory form's kernel is the one rewritten with stamps
            plan = planning.forced("persistent-tc", rows, channels, hidden, planning.current_device(), **forced)
            t = plan.tile
            fn = traced.Variant(t.rows, t.channels_tile, "float16", t.stages, t.vector, t.mma, t.split, t.multicast,
                                t.loads, t.overlap).compile()
            problem = bench.ResidualMLP((rows, channels, hidden), activation=bench.DEFAULT_ACTIVATION)
            x = problem.make_inputs(1)
            # as engines.plan_call calls a plan: x is both the GEMM operand and the residual
            tensors = (x["x"], x["x"], x["w1"], x["b1"], x["w2"], x["b2"], problem.make_outputs(x)["y"])
            act = ACTIVATION_CODES[bench.DEFAULT_ACTIVATION]
            grid = plan.owners.grid
            stamps = torch.zeros(grid, TRACE_SLOTS, dtype=torch.int32, device="cuda")
            for _ in range(3):
                fn(*tensors, act, grid, stamps)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(10):
                fn(*tensors, act, grid, stamps)
            end.record()
            end.synchronize()
            rows_of = stamps.cpu().tolist()
            chunks = planning.tc_chunks_per_cta(hidden, t.split) - int(t.overlap)
            steps = OVERLAPPED if t.overlap else SERIAL
            spans = [("to the first GEMM", 0, 1), ("chunks", 1, 2)] if t.overlap else [("chunks", 0, 2)]
            spans += [("output epilogue", 2, 3), ("tile", 0, 3)]
            tile = {what: statistics.median((r[TILE_SLOT + b] - r[TILE_SLOT + a]) & 0xFFFFFFFF for r in rows_of)
                    for what, a, b in spans}
            per_chunk = phases(rows_of, grid, chunks, steps)
            record["cases"][case] = {"plan": plan.describe(), "kernel_us": start.elapsed_time(end) * 100,
                                     "chunk_clocks_median": per_chunk, "tile_clocks_median": tile}
            print(f"{case}: {record['cases'][case]['kernel_us']:.1f} us, grid {grid}")
            print("  per chunk: " + "  ".join(f"{k} {v:.0f}" for k, v in per_chunk.items())
                  + f"  (sum {sum(per_chunk.values()):.0f} clocks)")
            print("  per tile: " + "  ".join(f"{k} {v:.0f}" for k, v in tile.items()))
        with open(path, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
