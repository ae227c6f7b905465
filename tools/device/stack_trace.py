"""A timeline of the fused stack's matrix-vector forms inside one call, on the GPU host: per block, how long each
CTA spends on its operand, phase A, the wait at the first grid barrier, phase B and the wait at the second; then
the final norm (or the copy into y) after the last block.

    python3 tools/device/stack_trace.py [--models 'swiglu4*'] [--rows 1,16] [--forms gemv,mma]
                                        [--name NAME | --out PATH]
    python3 tools/device/stack_trace.py --show RECORD.json    (anywhere: a written record as tables)
    python3 tools/device/stack_trace.py --compare RECORD.json...  (anywhere: records side by side, one line an entry)

Builds a traced copy of ``engines/persistent_stack_gemv.py`` beside it (``_traced_persistent_stack_gemv.py``,
removed at the end) whose kernel has thread 0 of every CTA write ``clock64`` and ``%globaltimer`` at the steps of
``STEPS`` of each block and at the kernel's end (anchored on lines of the kernel's source; a change that moves one
stops this tool with the anchor's text), and uses its kernel in both forms (the mma form inherits the gemv form's).
The stamps go to a buffer whose address is compiled into the kernel. Each model runs as ``stack_forms.time_form``
runs it (validated against the float64 reference, then timed in a CUDA graph), and the buffer holds the last
replay's stamps. The clocks are converted to microseconds by each CTA's own clock rate over the call
(``%globaltimer`` may tick coarsely, so it only sets the rate and the common start). Writes $OUT/NAME.json
(``--name``, default stack_trace) or ``--out PATH`` with the harness's provenance, and prints per block the median
and the slowest CTA of each step. A block of several row tiles (past the planned rows) stamps its operand and phase A
once a tile: the last tile's stand.

What to read: where ``phase A`` (or ``B``) of the slowest CTA is far above the median, the barrier's wait is the
skew of the work, not the barrier, and the slowest CTAs' indices (``--show``) say whose work; where every step is
short and the block still long, the time is between them.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import statistics
from pathlib import Path

from records import add_arguments, path_of  # this folder
from source_patch import line_after, line_before, replace_once, traced_module  # this folder

TOOL = "stack_trace"
STEPS = (  # (the step that ends at the stamp, a line of StackGemv.kernel, whether the stamp goes after it or before)
    ("zero + operand",
     "self.stream_operand(x, ws, i, row0, rows, s_u, meta, eps, norm_w, norm_b, channels, s_stats, tid)", True),
    ("phase A", "            slices = (units + self.slice - 1) // self.slice", False),
    ("barrier 1", "            for m in range(slice_items):", False),
    ("phase B", "            if i + 1 < blocks:", False),
    ("barrier 2", "self.first_unit_batches(w1, w3, ring, meta, i + 1, first_warp, all_warps, lane)\n"
                  "            self.grid_barrier(sync, grid, tid)", True),
)
"""A block's steps in order; the block starts at the top of its loop body (``BLOCK_TOP``)."""
BLOCK_TOP = "            units = meta[i, 1] * STACK_TILE"
SLOTS_A_BLOCK = len(STEPS) + 1  # the block's top, then one stamp a step
MAX_BLOCKS = 32
TRACE_SLOTS = MAX_BLOCKS * SLOTS_A_BLOCK + 1  # and one after the final norm
STAMP = "self.trace_stamp(tid, cta, i * {per_block} + {k})"
MMA_SECTION = "\n    # ---- what the mma form"  # the comment after StackGemv.kernel's last line (the final norm's loop)
FINAL_STAMP = "\n        self.trace_stamp(tid, cta, blocks * {per_block})"
STAMP_METHOD = '''
    @cute.jit
    def trace_stamp(self, tid: Int32, cta: Int32, slot: Int32):
        """stack_trace.py: thread 0 writes clock64 and %globaltimer into the trace buffer's (cta, slot)."""
        if tid == 0:
            trace = cute.make_tensor(cute.make_ptr(Int64, TRACE_ADDRESS, cute.AddressSpace.gmem, assumed_align=16),
                                     cute.make_layout((TRACE_CTAS, TRACE_SLOTS, 2),
                                                      stride=(TRACE_SLOTS * 2, 2, 1)))
            trace[cta, slot, 0] = cute.arch.clock64()
            trace[cta, slot, 1] = cute.arch.globaltimer()
'''


def traced_source(source: str) -> str:
    """persistent_stack_gemv.py with the trace buffer's stamps in ``StackGemv.kernel``."""
    s = replace_once(TOOL, source, "from cutlass import Float16, Float32, Int32\n",
                     "from cutlass import Float16, Float32, Int32, Int64\n"
                     "TRACE_ADDRESS, TRACE_CTAS, TRACE_SLOTS = 0, 1, 1  # set by stack_trace.py\n")
    s = line_after(TOOL, s, BLOCK_TOP, STAMP.format(per_block=SLOTS_A_BLOCK, k=0))
    for k, (_, anchor, after) in enumerate(STEPS, start=1):
        s = (line_after if after else line_before)(TOOL, s, anchor, STAMP.format(per_block=SLOTS_A_BLOCK, k=k))
    return replace_once(TOOL, s, "\n" + MMA_SECTION,  # the final stamp ends the kernel, the method follows it
                        FINAL_STAMP.format(per_block=SLOTS_A_BLOCK) + "\n" + STAMP_METHOD + MMA_SECTION)


SLOWEST_CTAS = 4
"""CTAs named per step and block, the slowest first: which CTAs hold a barrier back (phase B's items are dealt to
the warps in runs, CTA by CTA, so a CTA's index says which items it had)."""


def timeline(stamps: list, blocks: int) -> tuple[dict, dict]:
    """Per block and step, the median and the slowest CTA's microseconds and the ``SLOWEST_CTAS`` slowest CTAs
    (stamps: per CTA, per slot, (clock64, globaltimer ns)), and the median and slowest of the final norm (or the copy
    into y) after the last block; each CTA's clocks converted at its own rate between its first stamp and the end of
    its last block."""
    per_step = {name: [[] for _ in range(blocks)] for name, *_ in STEPS}
    final = []
    for cta in stamps:
        first, last = cta[0], cta[(blocks - 1) * SLOTS_A_BLOCK + len(STEPS)]
        ns, clocks = last[1] - first[1], last[0] - first[0]
        if ns <= 0 or clocks <= 0:
            raise ValueError("a CTA's stamps do not advance: was the traced kernel run?")
        us_per_clock = ns / clocks / 1000
        for i in range(blocks):
            base = i * SLOTS_A_BLOCK
            for k, (name, *_) in enumerate(STEPS):
                per_step[name][i].append((cta[base + k + 1][0] - cta[base + k][0]) * us_per_clock)
        final.append((cta[blocks * SLOTS_A_BLOCK][0] - last[0]) * us_per_clock)
    steps = {name: [{"median_us": statistics.median(v), "max_us": max(v),
                     "slowest_ctas": sorted(range(len(v)), key=lambda c: -v[c])[:SLOWEST_CTAS]} for v in by_block]
             for name, by_block in per_step.items()}
    return steps, {"median_us": statistics.median(final), "max_us": max(final)}


def phase_rates(model: str, steps: dict) -> list[tuple[float, float]] | None:
    """Per block, the rate (GB/s) at which phase A streams the block's W1 [and W3] and phase B its W2, each over
    the slowest CTA's time of that phase: every CTA streams its share side by side, so this is a lower bound of the
    grid's rate (the median CTA's time would overstate it where CTAs have no items); None for a model the models
    suite does not name."""
    from kernellab.megakernel import models
    from kernellab.megakernel.compiler import frontend

    case = next((c for c in models.REPORT_MODELS if c.name == model), None)
    if case is None or "phase A" not in steps or "phase B" not in steps:
        return None
    blocks, _ = frontend.read_spec(case.spec)
    return [((2 if b.gated else 1) * 2 * b.channels * b.hidden / a["max_us"] / 1e3,
             2 * b.channels * b.hidden / p["max_us"] / 1e3)
            for b, a, p in zip(blocks, steps["phase A"], steps["phase B"], strict=True)]


def show(path: str) -> None:
    """A written record: per entry, a table of its blocks' steps (median / slowest CTA, us), then the rates at
    which its phases stream their weights (``phase_rates``) and each step's slowest CTAs."""
    with open(path) as f:
        record = json.load(f)
    for e in record["entries"]:
        print(f"\n{e['model']}, {e['rows']} rows, {e['form']} form: "
              + (e["error"] if "error" in e else f"{e['p50_us']:.1f} us a call (traced)"))
        if "steps" not in e:
            continue
        names = list(e["steps"])
        print("| block | " + " | ".join(names) + " |")
        print("|---|" + "---|" * len(names))
        for i in range(len(e["steps"][names[0]])):
            cells = [f"{e['steps'][n][i]['median_us']:.2f} / {e['steps'][n][i]['max_us']:.2f}" for n in names]
            print(f"| {i} | " + " | ".join(cells) + " |")
        rates = phase_rates(e["model"], e["steps"])
        if rates:
            print("\nweights streamed, at least (GB/s over the slowest CTA's phase): phase A "
                  + ", ".join(f"{a:.0f}" for a, _ in rates) + "; phase B " + ", ".join(f"{b:.0f}" for _, b in rates)
                  + " (block 0, 1, ...)")
        if "slowest_ctas" in e["steps"][names[0]][0]:  # records before it have none
            for n in names:
                print(f"slowest CTAs of {n}: " + "; ".join(", ".join(map(str, b["slowest_ctas"]))
                                                         for b in e["steps"][n]) + " (block 0; 1; ...)")
        if "final_us" in e:  # records before it have none
            print(f"\nafter the last block, the final norm (or the copy into y): {e['final_us']['median_us']:.2f} / "
                  f"{e['final_us']['max_us']:.2f} us")


def compare(paths: list[str]) -> None:
    """Several records of the same entries (a before and its afters, from one device session): per model, rows and
    form, each record's time a call and the mean over blocks of phase B's median and slowest CTA."""
    records = {Path(p).stem: json.loads(Path(p).read_text()) for p in paths}
    keys = list(dict.fromkeys((e["model"], e["rows"], e["form"]) for r in records.values() for e in r["entries"]))
    print("| model | rows | form | " + " | ".join(f"{n}: us a call (phase B median / slowest)" for n in records)
          + " |")
    print("|---|---|---|" + "---|" * len(records))
    for key in keys:
        cells = []
        for record in records.values():
            e = next((e for e in record["entries"] if (e["model"], e["rows"], e["form"]) == key), None)
            if e is None or "steps" not in e:
                cells.append("-" if e is None else e["error"][:40])
                continue
            b = e["steps"]["phase B"]
            cells.append(f"{e['p50_us']:.1f} ({statistics.mean(s['median_us'] for s in b):.2f} / "
                         f"{statistics.mean(s['max_us'] for s in b):.2f})")
        print(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--show", metavar="RECORD", help="print a written record as tables and stop")
    ap.add_argument("--compare", nargs="+", metavar="RECORD", help="print written records side by side and stop")
    ap.add_argument("--models", default="*")
    ap.add_argument("--rows", default="1,16")
    ap.add_argument("--forms", default="gemv,mma")
    ap.add_argument("--samples", type=int, default=5)
    add_arguments(ap, "stack_trace")
    args = ap.parse_args()
    if args.show:
        show(args.show)
        return
    if args.compare:
        compare(args.compare)
        return
    forms = args.forms.split(",")
    if not forms or any(f not in ("gemv", "mma") for f in forms):
        ap.error(f"--forms: gemv and/or mma, got {args.forms!r}")
    path = path_of(args)
    import torch
    from stack_forms import FORMS, time_form

    from kernellab.harness import provenance, timing
    from kernellab.megakernel import models as report_models
    from kernellab.megakernel.engines import persistent_stack_gemv

    with traced_module(persistent_stack_gemv, traced_source) as traced:
        ctas = torch.cuda.get_device_properties(0).multi_processor_count  # the forms' grid
        trace = torch.zeros((ctas, TRACE_SLOTS, 2), dtype=torch.int64, device="cuda")
        traced.TRACE_ADDRESS, traced.TRACE_CTAS, traced.TRACE_SLOTS = trace.data_ptr(), ctas, TRACE_SLOTS
        # both forms run the traced kernel: the mma form's class inherits it from the gemv form's
        persistent_stack_gemv.StackGemv.kernel = traced.StackGemv.__dict__["kernel"]
        persistent_stack_gemv.StackGemv.trace_stamp = traced.StackGemv.__dict__["trace_stamp"]
        device = timing.Device("cuda")
        record = {"tool": "tools/device/stack_trace.py", "steps": [name for name, *_ in STEPS],
                  "provenance": provenance.of_check("cuda", __file__, ["megakernel"]), "entries": []}
        for case in report_models.REPORT_MODELS:
            if not any(fnmatch.fnmatch(case.name, p) for p in args.models.split(",") if p):
                continue
            blocks = len(case.spec["blocks"])
            if blocks > MAX_BLOCKS:
                raise SystemExit(f"stack_trace: {case.name} has {blocks} blocks, the trace holds {MAX_BLOCKS}")
            for r in (int(v) for v in args.rows.split(",")):
                for form in forms:
                    trace.zero_()
                    got = time_form(report_models.StackProblem(case, r), FORMS[form], args.samples, device)
                    entry = {"model": case.name, "rows": r, "form": form,
                             **{k: v for k, v in got.items() if k != "samples_us"}}
                    if "error" not in got:
                        torch.cuda.synchronize()
                        entry["steps"], entry["final_us"] = timeline(trace.cpu().tolist(), blocks)
                    record["entries"].append(entry)
                    print(f"{case.name} rows={r} {form}: "
                          + (entry.get("error") or f"{entry['p50_us']:.1f} us; per block (median/max us) "
                             + "; ".join(f"{n} {statistics.mean(s['median_us'] for s in v):.2f}/"
                                         f"{statistics.mean(s['max_us'] for s in v):.2f}"
                                         for n, v in entry["steps"].items())), flush=True)
        with open(path, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
