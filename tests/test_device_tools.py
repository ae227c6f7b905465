"""The GPU-host tools that rewrite or read kernel source stay in step with it (checked on the CPU)."""

import ast
import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNEL = ROOT / "packages/megakernel/src/kernellab/megakernel/engines/persistent_tc.py"


def load_tool(name):
    """A tools/device script as a module, its folder on sys.path as when it runs (the tools import each other)."""
    if str(ROOT / "tools/device") not in sys.path:
        sys.path.insert(0, str(ROOT / "tools/device"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools/device" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_trace_anchors_hold_in_the_kernel_source():
    trace = load_tool("megakernel_trace")
    traced = trace.traced_source(KERNEL.read_text())
    ast.parse(traced)
    steps = len(trace.OVERLAPPED) + len(trace.SERIAL) + 2  # and each loop's top
    assert traced.count("self.stamp(trace, tid, cta, ") == steps + 4  # and the tile's start, first GEMM, chunks, end
    assert "trace: cute.Tensor" in traced and 'f"traced-persistent-tc_m' in traced


def test_trace_names_an_anchor_the_kernel_lost():
    trace = load_tool("megakernel_trace")
    source = KERNEL.read_text().replace("warpgroup.wait_group(1)  # GEMM1(j + 1) is done", "warpgroup.wait_group(1)")
    with pytest.raises(SystemExit, match="GEMM1"):
        trace.traced_source(source)


SOURCE_PAGE = '''"Kernel Name","kernel_a",
"Address","Source","Warp Stall Sampling (All Samples)","# Samples","Instructions Executed"
"0x10","      LDC R1, c[0x0][0x28]","3","3","16"
"0x20","@!P0  BRA 0x40","0","0","16"
"0x30","      FFMA R2, R3, R4, R2","12","12","1,024"
"0x40","      EXIT","0","0",""
"Kernel Name","kernel_b",
"Address","Source","Instructions Executed","Warp Stall Sampling (All Samples)"
"0x10","      FFMA.FTZ R0, R1, R2, R0","64","2"
'''


def test_source_profile_counts_instructions_by_opcode_and_per_warp():
    """``megakernel_profile.py --source`` reads ncu's source page: each launch's lines (columns found by name, as
    ncu orders them per kernel), warp instructions per warp from the plan's grid and threads, opcodes without
    predicates or modifiers."""
    profile = load_tool("megakernel_profile")
    kernels = profile.parse_source(SOURCE_PAGE)
    assert [k["kernel"] for k in kernels] == ["kernel_a", "kernel_b"]
    assert [line["executed"] for line in kernels[0]["lines"]] == [16, 16, 1024, 0]
    assert kernels[1]["lines"][0] == {"address": "0x10", "sass": "FFMA.FTZ R0, R1, R2, R0", "executed": 64,
                                      "samples": 2}
    warps = profile.plan_warps({"grid": 2, "tile_threads": 256})
    assert warps == 16
    summary = profile.source_summary(kernels[0], warps, top=2)
    assert summary["executed"] == 1056 and summary["executed_per_warp"] == 66 and summary["samples"] == 15
    assert summary["by_opcode"] == {"FFMA": 1024, "LDC": 16, "BRA": 16}
    assert [line["address"] for line in summary["most_sampled"]] == ["0x30", "0x10"]
    assert profile.source_line(summary).startswith("66 instructions a warp: FFMA=64 LDC=1 BRA=1")
    torch_summary = profile.source_summary(kernels[1], profile.plan_warps(None))
    assert torch_summary["executed_per_warp"] is None
    assert profile.source_line(torch_summary) == "64 instructions in all: FFMA=64"


def test_phases_table_adds_the_smaller_grids_only_where_they_were_timed(tmp_path, capsys):
    """``backward_phases.py --show``: the phases at the grid the ops launch, then (records made with ``--ctas``)
    the same phases on each smaller grid, largest first; an older record without grids prints the first table."""
    import json

    phases = load_tool("backward_phases")
    times = {"256": {"full": 10.0, "barrier": 7.0, "rows": 4.0}, "66": {"full": 8.0, "barrier": 6.5, "rows": 4.5}}
    record = {p: {"rmsnorm_backward_256x3072_bfloat16": {
        "p50_us": times["256"][p], "grid": 256, "rows_per_cta": 1,
        "p50_us_by_grid": {g: t[p] for g, t in times.items()}}} for p in phases.PHASES}
    path = tmp_path / "phases.json"
    path.write_text(json.dumps({"cases": record}))
    phases.show(str(path))
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "| rmsnorm_backward_256x3072_bfloat16 | 4.00 | 3.00 | 3.00 | 10.00 | 256 |"
    assert lines[-2:] == ["| rmsnorm_backward_256x3072_bfloat16 | 256 | 4.00 | 3.00 | 3.00 | 10.00 |",
                          "| rmsnorm_backward_256x3072_bfloat16 | 66 | 4.50 | 2.00 | 1.50 | 8.00 |"]
    for case in record.values():  # a record from before --ctas
        for entry in case.values():
            del entry["p50_us_by_grid"]
    path.write_text(json.dumps({"cases": record}))
    phases.show(str(path))
    assert len(capsys.readouterr().out.splitlines()) == 3


def test_phases_table_of_several_records_puts_the_sum_and_kernel_of_each_revision_side_by_side(tmp_path, capsys):
    """``backward_phases.py --show A,B``: the sum's and the kernel's column per record, labelled by its commit, the
    first record's cases, '-' where a later record lacks one."""
    import json

    phases = load_tool("backward_phases")

    def record(commit, cases):
        found = {p: {case: {"p50_us": t[p], "grid": 132} for case, t in cases.items()} for p in phases.PHASES}
        return {"cases": found, "provenance": {"git": {"commit": commit * 40}}}

    one, two = tmp_path / "one.json", tmp_path / "two.json"
    one.write_text(json.dumps(record("a", {"x": {"full": 10.0, "barrier": 7.0, "rows": 4.0},
                                           "y": {"full": 5.0, "barrier": 4.5, "rows": 4.0}})))
    two.write_text(json.dumps(record("b", {"x": {"full": 8.5, "barrier": 7.0, "rows": 4.0}})))
    phases.show(f"{one},{two}")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| case | + sum @aaaaaaa | + sum @bbbbbbb | kernel @aaaaaaa | kernel @bbbbbbb |"
    assert lines[2:] == ["| x | 3.00 | 1.50 | 10.00 | 8.50 |", "| y | 0.50 | - | 5.00 | - |"]


def test_phases_ops_take_known_kernels_only():
    """``backward_phases.py --ops``: LayerNorm without dbias is a kernel of its own; an unknown name or an empty list
    is refused before any GPU work."""
    import argparse

    phases = load_tool("backward_phases")
    assert phases.kernel_names("rmsnorm,layernorm-nobias") == "rmsnorm,layernorm-nobias"
    for bad in ("", "rmsnorm,softmax", "layernorm,"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected"):
            phases.kernel_names(bad)


def test_stack_trace_stamps_every_step_of_each_block_in_the_gemv_kernel():
    """``stack_trace.py``: the traced gemv module is valid Python with a stamp at the block's top and after each step,
    inside the block loop (indexed by the block), and the stamp method beside the kernel."""
    trace = load_tool("stack_trace")
    source = (ROOT / "packages/megakernel/src/kernellab/megakernel/engines/persistent_stack_gemv.py").read_text()
    traced = trace.traced_source(source)
    ast.parse(traced)
    stamps = [line for line in traced.splitlines() if "self.trace_stamp(tid, cta, i * " in line]
    assert len(stamps) == trace.SLOTS_A_BLOCK
    assert [int(line.rsplit("+ ", 1)[1].rstrip(")")) for line in stamps] == list(range(trace.SLOTS_A_BLOCK))
    assert all(line.startswith(" " * 12) for line in stamps)  # in the loop over blocks (its body's indentation)
    final = [line for line in traced.splitlines() if "self.trace_stamp(tid, cta, blocks * " in line]
    assert final == [f"        self.trace_stamp(tid, cta, blocks * {trace.SLOTS_A_BLOCK})"]  # after the block loop
    kernel = traced[traced.index("    def kernel("):traced.index("    @cute.jit\n    def trace_stamp(")]
    assert kernel.rstrip().endswith(final[0].strip())  # the kernel's last statement
    assert trace.TRACE_SLOTS > trace.MAX_BLOCKS * trace.SLOTS_A_BLOCK
    assert "def trace_stamp(" in traced and "cute.arch.globaltimer()" in traced


def test_traced_module_imports_the_rewrite_beside_the_original_and_removes_it(tmp_path, monkeypatch):
    """``source_patch.traced_module``: the rewritten copy is a module of the original's package while the block
    runs (CuTe DSL reads a kernel's source from its file), and its file is gone afterwards, also on an error."""
    patch = load_tool("source_patch")
    (tmp_path / "kernelpkg").mkdir()
    (tmp_path / "kernelpkg" / "__init__.py").write_text("")
    (tmp_path / "kernelpkg" / "kern.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    kern = importlib.import_module("kernelpkg.kern")
    with patch.traced_module(kern, lambda s: patch.line_after("t", s, "VALUE = 1", "TRACED = True")) as traced:
        assert traced.__name__ == "kernelpkg._traced_kern" and traced.VALUE == 1 and traced.TRACED
    assert not (tmp_path / "kernelpkg" / "_traced_kern.py").exists()
    with pytest.raises(RuntimeError), patch.traced_module(kern, lambda s: s.replace("1", "2")):
        raise RuntimeError("the run failed")
    assert not (tmp_path / "kernelpkg" / "_traced_kern.py").exists()
    assert patch.line_before("t", "a\n    b\n", "b", "x") == "a\n    x\n    b\n"
    with pytest.raises(SystemExit, match="t: the kernel's source has 0 of 'c'"):
        patch.replace_once("t", "a\nb\n", "c", "d")


def test_stack_trace_rates_are_each_phases_weight_bytes_over_its_slowest_cta():
    """``stack_trace.phase_rates``: phase A streams W1 and W3 (gated) or W1, phase B W2, per block of the named
    model, over the slowest CTA's time; a model the suite does not name has none."""
    trace = load_tool("stack_trace")
    steps = {"phase A": [{"median_us": 1.0, "max_us": 2.0}] * 4, "phase B": [{"median_us": 0.1, "max_us": 1.0}] * 4}
    rates = trace.phase_rates("swiglu4-c2048-h8192-1b-ffn", steps)
    weight = 2 * 2048 * 8192  # bytes of one fp16 matrix of the 1B-sized stack's block
    assert rates == [(2 * weight / 2.0 / 1e3, weight / 1.0 / 1e3)] * 4
    assert trace.phase_rates("not-a-model", steps) is None


def test_stack_trace_stops_on_an_anchor_the_kernel_lost():
    trace = load_tool("stack_trace")
    source = (ROOT / "packages/megakernel/src/kernellab/megakernel/engines/persistent_stack_gemv.py").read_text()
    with pytest.raises(SystemExit, match="update the anchors"):
        trace.traced_source(source.replace("            if i + 1 < blocks:", "            if blocks > i + 1:"))


def test_stack_trace_timeline_converts_each_ctas_clocks_at_its_own_rate():
    """Two CTAs, two blocks: one CTA at 1 clock a ns, the other at 2; per step the median and the slowest CTA."""
    trace = load_tool("stack_trace")
    per_block = trace.SLOTS_A_BLOCK

    def cta(rate, durations_ns):
        clocks, ns, out = 0, 1000, []
        for d in durations_ns:
            out.append([clocks, ns])
            clocks, ns = clocks + d * rate, ns + d
        out.append([clocks, ns])
        return out + [[0, 0]] * (trace.TRACE_SLOTS - len(out))

    # block 0's top to block 1's last step, then block 1's end to the final stamp (slot blocks * per_block)
    fast = [100, 2000, 500, 1000, 300, 0] + [100, 2000, 500, 1000, 300] + [700]
    slow = [100, 4000, 100, 3000, 100, 0] + [100, 2000, 500, 1000, 300] + [1500]
    assert len(fast) == 2 * per_block
    got, final = trace.timeline([cta(1, fast), cta(2, slow)], blocks=2)
    assert list(got) == [name for name, *_ in trace.STEPS]
    assert got["phase A"][0] == {"median_us": 3.0, "max_us": 4.0, "slowest_ctas": [1, 0]}
    assert got["barrier 1"][0] == {"median_us": 0.3, "max_us": 0.5, "slowest_ctas": [0, 1]}
    assert got["phase B"][1] == {"median_us": 1.0, "max_us": 1.0, "slowest_ctas": [0, 1]}  # a tie: the lower index
    assert final == {"median_us": 1.1, "max_us": 1.5}


def test_stack_phases_table_subtracts_each_probe_from_the_next_and_marks_what_is_missing(tmp_path, capsys):
    """``stack_phases.py``: the per-phase entries merged per (model, rows, form) with the model's weight floor,
    then the skeleton, what phase A and phase B add, and the full call; '-' where a phase failed."""
    import json

    phases = load_tool("stack_phases")
    by_phase = {
        "full": [{"model": "m", "rows": 1, "form": "gemv", "phase": "full", "p50_us": 20.0},
                 {"model": "m", "rows": 1, "form": "mma", "phase": "full", "error": "failed validation"}],
        "phase_a": [{"model": "m", "rows": 1, "form": "gemv", "phase": "phase_a", "p50_us": 14.0},
                    {"model": "m", "rows": 1, "form": "mma", "phase": "phase_a", "p50_us": 16.0}],
        "skeleton": [{"model": "m", "rows": 1, "form": "gemv", "phase": "skeleton", "p50_us": 9.5}],
    }
    entries = phases.merged(by_phase, {"m": 1.4})
    assert [(e["form"], e["weight_floor_us"]) for e in entries] == [("gemv", 1.4), ("mma", 1.4)]
    assert entries[1]["full"] == {"error": "failed validation"} and "skeleton" not in entries[1]
    path = tmp_path / "phases.json"
    path.write_text(json.dumps({"entries": entries}))
    phases.show(str(path))
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:] == ["| m | 1 | gemv | 9.5 | 4.5 | 6.0 | 20.0 | 1.4 |", "| m | 1 | mma | - | - | - | - | 1.4 |"]


def test_a_stack_form_that_cannot_be_built_is_recorded_with_why_not_timed():
    """``stack_forms.time_form`` (shared with ``stack_phases``): a form whose compile fails (here: no CUDA device)
    gives its error and no time."""
    import torch

    from kernellab.megakernel import models

    if torch.cuda.is_available():
        pytest.skip("checks the no-GPU refusal")
    forms = load_tool("stack_forms")
    got = forms.time_form(models.StackProblem(models.REPORT_MODELS[0], 1, device="cpu"), forms.FORMS["gemv"], 3, None)
    assert set(got) == {"error"} and "NeedsGPUError" in got["error"]


def test_stack_forms_caps_the_grid_of_the_gemv_and_mma_forms_only_inside_the_probe():
    """``stack_forms.py --ctas``: a column ``form@N`` for the gemv and mma forms alone, recorded with its cap; inside
    ``grid_capped(N)`` a launcher's grid is at most N (the planned grid where it is smaller), and the planned grid is
    back after, also when the timed call raised. A stand-in launcher: the engine's module needs the CuTe DSL."""
    forms = load_tool("stack_forms")
    assert forms.form_names(["gemv", "chain", "mma"], [66, 33]) == [
        "gemv", "chain", "mma", "gemv@66", "gemv@33", "mma@66", "mma@33"]
    assert forms.form_options("mma@33") == {**forms.FORMS["mma"], "max_ctas": 33}
    assert forms.form_options("chain") == forms.FORMS["chain"]
    assert forms.form_options("chain-pdl") == {**forms.FORMS["chain"], "pdl": True}

    class Launcher:
        def grid(self, plan, rows):
            return 132

    stack = Launcher()
    with forms.grid_capped(200, Launcher):
        assert stack.grid(None, 1) == 132
    with pytest.raises(RuntimeError), forms.grid_capped(33, Launcher):
        assert stack.grid(None, 1) == 33
        raise RuntimeError("the timed call failed")
    assert stack.grid(None, 1) == 132


def test_stack_phase_probes_compile_out_their_methods_in_both_forms(monkeypatch):
    """Each probe's methods exist on both forms' kernel classes (a rename would time the whole kernel under a
    probe's name) and compile out: the skeleton's gemv cubin for sm_90a differs from the full one."""
    pytest.importorskip("cutlass")
    import hashlib

    from kernellab.megakernel.engines import persistent_stack

    phases = load_tool("stack_phases")
    variant = persistent_stack.Variant("gemv", 1, 256, 4, False)
    full = hashlib.sha256(variant.compile("sm_90a").__cubin__).hexdigest()
    phases.compile_out("skeleton", patch=monkeypatch.setattr)
    assert hashlib.sha256(variant.compile("sm_90a").__cubin__).hexdigest() != full
    with pytest.raises(AttributeError, match="defines no"):
        monkeypatch.setattr(phases, "PHASE_A", ("no_such_method",))
        phases.compile_out("skeleton", patch=monkeypatch.setattr)


def test_forms_table_puts_revisions_side_by_side_and_the_floor_where_recorded(tmp_path, capsys):
    """``stack_forms.py --show A,B``: each chosen form's column per record (labelled by its commit) where that record
    has the form, a failed form as '-', and the weight floor column only when a record measured it."""
    import json

    forms = load_tool("stack_forms")

    def record(commit, kinds, gemv_us, floor=None):
        entry = {"model": "mlp4", "rows": 1, "grid": {"p50_us": 40.0}, "gemv": gemv_us}
        if floor is not None:
            entry["floor"] = {"weight_floor_us": floor}
        return {"forms": {k: {} for k in kinds}, "provenance": {"git": {"commit": commit * 40}}, "entries": [entry]}

    old = tmp_path / "old.json"
    old.write_text(json.dumps(record("a", ("grid", "gemv"), {"p50_us": 31.4})))
    new = tmp_path / "new.json"
    new.write_text(json.dumps(record("b", ("grid", "gemv", "cluster"), {"error": "failed validation"}, 1.5)))
    forms.show(f"{old},{new}", "gemv,cluster")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| model | rows | gemv us @aaaaaaa | gemv us @bbbbbbb | cluster us @bbbbbbb | weight floor us |"
    assert lines[2] == "| mlp4 | 1 | 31.4 | - | - | 1.5 |"
    forms.show(f"{old}", "gemv")
    assert capsys.readouterr().out.splitlines()[0] == "| model | rows | gemv us |"
    forms.show(f"{new}")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| model | rows | grid us | gemv us | cluster us | weight floor us |"
    assert lines[2] == "| mlp4 | 1 | 40.0 | - | - | 1.5 |"


def test_forms_table_matches_records_by_model_and_rows(tmp_path, capsys):
    """Records of different models or row counts side by side: each cell from the record's own entry of that model
    and row count (not its entry at the same position), "-" where the record has none, rows in the order first met."""
    import json

    forms = load_tool("stack_forms")

    def record(commit, entries):
        return {"forms": {"mma": {}}, "provenance": {"git": {"commit": commit * 40}},
                "entries": [{"model": m, "rows": r, "forms": {"mma": {"p50_us": us}}} for m, r, us in entries]}

    paths = []
    for commit, entries in (("a", [("mlp4", 16, 36.0), ("mlp8", 16, 84.5)]), ("b", [("mlp8", 16, 74.4),
                                                                                      ("mlp8", 32, 106.2)])):
        paths.append(tmp_path / f"{commit}.json")
        paths[-1].write_text(json.dumps(record(commit, entries)))
    forms.show(",".join(map(str, paths)))
    assert capsys.readouterr().out.splitlines()[2:] == ["| mlp4 | 16 | 36.0 | - |", "| mlp8 | 16 | 84.5 | 74.4 |",
                                                         "| mlp8 | 32 | - | 106.2 |"]


def test_forms_table_reads_the_rows_form_beside_the_row_count(tmp_path, capsys):
    """A record keeps its forms under ``forms``, so the rows form's result and the entry's row count are two
    fields; in a record from before, where the rows form had overwritten the row count, the count comes from the
    plan that form recorded."""
    import json

    forms = load_tool("stack_forms")
    plan = "4-block stack, planned for 1024 rows on cuda\nform: persistent-stack"
    new = {"model": "mlp4", "rows": 1024, "forms": {"rows": {"p50_us": 327.6, "plan": plan}, "chain": {"p50_us": 7.5}}}
    old = {"model": "mlp4", "rows": {"p50_us": 300.0, "plan": plan}, "chain": {"p50_us": 8.5}}
    for name, entry, row in (("new", new, "| mlp4 | 1024 | 327.6 | 7.5 |"),
                             ("old", old, "| mlp4 | 1024 | 300.0 | 8.5 |")):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"forms": {"rows": {}, "chain": {}}, "provenance": {"git": {"commit": "c" * 40}},
                                    "entries": [entry]}))
        forms.show(str(path), "rows,chain")
        assert capsys.readouterr().out.splitlines()[2] == row


def test_copy_ceiling_reads_a_run_against_the_fastest_copy_of_each_shape():
    """``copy_ceiling.py --show COPY --against RUN``: each contender's GB/s (the report's own, by minimum bytes) over
    the fastest copy the record timed at the same shape and dtype (any copy, any clock), beside the report's own
    fraction; the run's ceiling cases and shapes the record did not time are left out."""
    tool = load_tool("copy_ceiling")
    records = [{"shape": "64x32", "dtype": "float32", "copy": "memcpy", "clock": "graph", "gbps": 2000.0},
               {"shape": "64x32", "dtype": "float32", "copy": "mul-kernel", "clock": "stream", "gbps": 4000.0},
               {"shape": "64x32", "dtype": "bfloat16", "copy": "memcpy", "clock": "graph", "gbps": 3000.0}]

    def case(op, shape, dtype, gbps, own):
        return {"name": f"{op}_{shape}_{dtype}", "impl": "cute", "modes": {"graph_throughput": {
                "gbps": gbps, "ceiling_fraction": own}},
                "problem": {"op": op, "shape": [int(v) for v in shape.split("x")], "dtype": dtype}}

    run = {"ceiling_op": "copy", "cases": [case("copy", "64x32", "fp32", 2000.0, 1.0),
                                           case("rmsnorm", "64x32", "fp32", 3000.0, 1.5),
                                           case("rmsnorm", "64x32", "bf16", 2700.0, 0.9),
                                           case("rmsnorm", "128x32", "fp32", 100.0, 0.5)]}
    rows = tool.against(records, run, "graph_throughput").splitlines()[2:]
    assert rows == ["| rmsnorm_64x32_fp32 | cute | 3000 | 1.50 | 0.75 |",
                    "| rmsnorm_64x32_bf16 | cute | 2700 | 0.90 | 0.90 |"]


def test_a_record_never_overwrites_an_earlier_one_of_the_same_call(tmp_path, monkeypatch):
    """Two commands of one device call that write the same record name keep both (a later one had overwritten the
    first, and its data was lost)."""
    records = load_tool("records")
    monkeypatch.setenv("OUT", str(tmp_path))
    first = records.record_path("stack_forms.json")
    assert first == str(tmp_path / "stack_forms.json")
    open(first, "w").close()
    second = records.record_path("stack_forms.json")
    assert second == str(tmp_path / "stack_forms-2.json")
    open(second, "w").close()
    assert records.record_path("stack_forms.json") == str(tmp_path / "stack_forms-3.json")
    assert records.record_path("backward_sweep.json") == str(tmp_path / "backward_sweep.json")


def test_trees_runs_a_command_in_each_packed_revision_with_its_commit(tmp_path):
    """`trees.sh pack` archives a revision; `run` unpacks it and runs the command with that tree's packages
    first on the path and the revision's commit as the provenance's."""
    import os
    import shutil
    import subprocess
    import sys

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the repository's git history")
    env = {**os.environ, "KERNELLAB_TREES": str(tmp_path / "trees"), "OUT": str(tmp_path / "out"),
           "TMPDIR": str(tmp_path)}
    script = str(ROOT / "tools/device/trees.sh")
    subprocess.run(["bash", script, "pack", "HEAD", "HEAD~0"], cwd=ROOT, env=env, check=True, capture_output=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert (tmp_path / "trees" / "HEAD.commit").read_text().strip() == head
    assert (tmp_path / "trees" / "HEAD-0.commit").read_text().strip() == head  # a plain name for HEAD~0
    probe = (f"{sys.executable} -c 'import os, kernellab.kernels as k; "
             "print(k.__file__, os.environ[\"KERNELLAB_GIT_COMMIT\"])' > $OUT/probe.txt")
    run = subprocess.run(["bash", script, "run", probe, "HEAD"], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True)
    assert f"== HEAD ({head})" in run.stdout
    module, commit = (tmp_path / "out" / "HEAD" / "probe.txt").read_text().split()
    assert "kernellab-trees/HEAD/packages/kernels/src/" in module and commit == head


def test_trees_packs_a_patch_on_its_base_as_a_commit_of_its_own(tmp_path):
    """`trees.sh patch P` packs a tree of main with P applied, under P's name, its commit one made on main for it
    (the tree's provenance then names what was measured); a patch that does not apply packs nothing."""
    import os
    import shutil
    import subprocess

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the repository's git history")
    env = {**os.environ, "KERNELLAB_TREES": str(tmp_path / "trees")}
    script = str(ROOT / "tools/device/trees.sh")
    first = subprocess.run(["git", "show", "HEAD:tools/device/trees.sh"], cwd=ROOT, capture_output=True,
                           text=True).stdout.splitlines()[:3]
    patch = tmp_path / "probe.patch"
    patch.write_text("--- a/tools/device/trees.sh\n+++ b/tools/device/trees.sh\n@@ -1,3 +1,4 @@\n"
                     f" {first[0]}\n+# probe\n {first[1]}\n {first[2]}\n")
    subprocess.run(["bash", script, "patch", str(patch), "HEAD"], cwd=ROOT, env=env, check=True, capture_output=True)
    rev = (tmp_path / "trees" / "probe.commit").read_text().strip()
    parent = subprocess.run(["git", "rev-parse", f"{rev}^"], cwd=ROOT, capture_output=True, text=True).stdout
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    assert parent == head
    shown = subprocess.run(["git", "show", f"{rev}:tools/device/trees.sh"], cwd=ROOT, capture_output=True, text=True)
    assert shown.stdout.splitlines()[1] == "# probe"
    bad = tmp_path / "bad.patch"
    bad.write_text(patch.read_text().replace(f" {first[0]}", " no such line"))
    got = subprocess.run(["bash", script, "patch", str(bad), "HEAD"], cwd=ROOT, env=env, capture_output=True,
                         text=True)
    assert got.returncode == 1 and "does not apply" in got.stderr and not (tmp_path / "trees" / "bad.zip").exists()


def test_phases_refuse_a_row_held_by_a_cluster():
    """``backward_phases.py``: a case whose row a cluster holds has no grid barrier phase (a launch of its own sums
    its partials), so it is named before any timing; the plan is asked once per op, LayerNorm without dbias too."""
    phases = load_tool("backward_phases")
    asked = []

    def ctas_of(op, n, dtype):
        asked.append((op, n, dtype))
        return 2 if n > 8192 else 1

    found = phases.clustered_cases("37x1537:float32,1000x12289:float32", ["layernorm", "layernorm-nobias"], ctas_of)
    assert found == ["1000x12289:float32 (layernorm: 2 CTAs a row)"]
    assert asked == [("layernorm", 1537, "float32"), ("layernorm", 12289, "float32")]
    assert phases.clustered_cases("256x3072:bfloat16", ["rmsnorm"], ctas_of) == []


def test_cluster_occupancy_counts_a_plans_clusters_and_waves(monkeypatch):
    """``cluster_occupancy.py``'s record of a plan (compile and driver query stood in for): the clusters it launches
    are its grid over its split, and the waves they take are those over the most the GPU holds at once."""
    from kernellab.megakernel import planning

    occupancy = load_tool("cluster_occupancy")
    asked = []
    monkeypatch.setattr(occupancy, "compiled_cubin", lambda plan: b"cubin")
    monkeypatch.setattr(occupancy.planning, "max_active_clusters",
                        lambda cubin, grid, threads, cluster, smem: (asked.append((grid, cluster, smem)), 14)[1])
    wide = occupancy.row((1024, 128, 1024), "split8-wgmma", planning.H200)
    assert (wide["tile_rows"], wide["split"], wide["grid"], wide["clusters"]) == (64, 8, 128, 16)
    assert wide["max_active_clusters"] == 14 and wide["waves"] == 2, "16 clusters where 14 fit: a second wave"
    assert wide["planning_held"] is None, "the CPU's stand-in device has no count of its own"
    counted = dataclasses.replace(planning.H200, clusters_at_once=((4, 30), (8, 15)))
    assert occupancy.row((1024, 128, 1024), "split8-wgmma", counted)["planning_held"] == 15
    planned = occupancy.row((1024, 128, 1024), "planned", planning.H200)
    assert planned["clusters"] == planned["grid"] // planned["split"] and planned["waves"] == 2
    assert asked[0] == (128, 8, wide["smem_bytes"])
    with pytest.raises(ValueError, match="not a persistent-tc plan"):
        occupancy.row((1024, 128, 1024), "persistent", planning.H200)


def test_every_waiting_patch_still_applies_to_this_tree():
    """``tools/device/patches/*.patch``: GPU changes written and compiled but not yet measured, each waiting for a
    device session (``trees.sh patch``) with its plan in its header. A change to the files under one makes it stale:
    rebase it with the change, or drop it with its plan, rather than find out on the device."""
    import shutil
    import subprocess

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the repository's git history")
    patches = sorted((ROOT / "tools/device/patches").glob("*.patch"))
    if not patches:
        pytest.skip("no patch waits for the device")
    for patch in patches:
        got = subprocess.run(["git", "apply", "--check", str(patch)], cwd=ROOT, capture_output=True, text=True)
        assert got.returncode == 0, f"{patch.name} no longer applies: {got.stderr}"
        assert not patch.read_text().startswith("diff --git"), f"{patch.name}: its header should say what it is for"


def test_ab_reports_writes_three_reports_that_verify_with_the_rounds_each_side_ran(tmp_path):
    """An A/B of 3 rounds runs 4 (each side first in half of them): the comparison and both sides' run reports
    must state the rounds their cases ran, or the audit refuses them as inconsistent."""
    import os
    import subprocess

    from kernellab.harness import cli
    from kernellab.harness import report as report_io

    planted = ROOT / "packages/harness/tests/ray_planted"  # the planted suites, found through their entry points
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(planted), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, str(ROOT / "tools/device/ab_reports.py"), "--suite", "ray-quick",
                          "--baseline", "HEAD", "--rounds", "3", "--samples", "2", "--warmup", "0", "--iterations", "1",
                          "--modes", "e2e_throughput", "--out", str(tmp_path)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    for name in ("ab", "reference", "candidate"):
        path = tmp_path / f"ray-quick-{name}.json"
        report = report_io.load(path)
        assert report["config"]["rounds"] == 4
        assert cli.main(["--show", str(path)]) == 0  # consistent: its cases ran the rounds its config states
