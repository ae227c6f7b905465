"""Ahead-of-time sm_90a compile without a GPU (``CUTE_DSL_ARCH=sm_90a``): one variant of every kernel
class and code path (the report's empty launch-floor kernel too), so a CuTe DSL error fails CI.
``nox -s build`` compiles all of them."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi is not installed")

from kernellab.megakernel import aot, compile_all  # noqa: E402


def test_representative_variants_compile_for_sm90a():
    names = compile_all(arch="sm_90a", representative=True)
    assert names == [v.name for v in aot.variants(representative=True)]
    assert len(set(names)) == len(names)


def test_the_full_list_covers_every_engine_and_is_unique():
    names = [v.name for v in aot.variants()]
    # persistent-tc, both forms (every row tile, channel tile, chunk buffers, load width, split, multicast, chunk
    # schedule and padded register-form size, for 2 residual dtypes) = 582; conventional-tc's two stages (the output
    # stage for 2 residual dtypes) = 3; the prologue = 3; the report's empty launch-floor kernel = 1; and the
    # CUDA-core kernels compiled for the report's shapes; and the persistent-stack kernels of the report's models
    assert len(set(names)) == len(names) == 582 + 3 + 3 + 1 + len(aot.cuda_core_variants()) + len(aot.stack_variants())
    for prefix in ("persistent_", "persistent-global_", "conventional-hidden", "conventional-output",
                   "conventional-tc-hidden", "conventional-tc-output", "persistent-tc_m32_c64_s1",
                   "persistent-tc_m64_c256_s2", "persistent-tc_m32_c64_s4", "persistent-tc_m32_c64_s1_v1",
                   "persistent-tc_m64_c128_s2_wg", "persistent-tc_m128_c256_s1_wg", "persistent-tc_m64_c256_s2_x2",
                   "persistent-tc_m32_c512_s1_x8", "persistent-tc_m64_c256_s1_wg_x2",
                   "persistent-tc_m64_c512_s1_wg_tma_ov",
                   "persistent-tc_m64_c256_s2_wg_x2_tma_ov", "persistent-tc_regs_c16_h128_res",
                   "persistent-tc_regs_c64_h32_v1", "prologue-rmsnorm", "prologue-cast", "launch-floor",
                   "persistent-stack_mma_m16_c2048_s4_gated", "persistent-stack_grid_m64_c256",
                   "persistent-stack_rows_m32_c512"):
        assert any(n.startswith(prefix) for n in names), prefix


AOT_NAMES = {v.name for v in aot.variants()}


@settings(max_examples=300, deadline=None)
@given(rows=st.integers(1, 40_000), channels=st.integers(1, 512), hidden=st.integers(1, 4096),
       aligned=st.booleans(), residual=st.sampled_from(["float16", "float32"]))
def test_every_planned_persistent_tc_variant_is_in_the_ahead_of_time_list(rows, channels, hidden, aligned,
                                                                            residual):
    """What the planner picks for persistent-tc (either form, any shape it serves) is among the variants that
    ``compile_all`` compiles, so the sm_90a build covers every kernel a plan can run."""
    from kernellab.megakernel import planning
    from kernellab.megakernel.engines import persistent_tc

    if aligned:
        channels, hidden = (planning.round_up(n, planning.VECTOR_ELEMENTS) for n in (channels, hidden))
    plan = planning.choose("persistent-tc", rows, channels, hidden, planning.H200).plan
    assert plan.engine == "persistent-tc"
    assert persistent_tc.variant(plan, residual).name in AOT_NAMES


def test_the_cuda_core_kernels_of_every_report_shape_are_in_the_ahead_of_time_list():
    """The CUDA-core kernels are compiled for their sizes: the list holds, for every shape of the engine report,
    the kernels its conventional, persistent and persistent-global plans run (both residual dtypes)."""
    from kernellab.megakernel import bench, planning
    from kernellab.megakernel.engines import conventional, persistent

    for rows, channels, hidden in bench.DEVELOPMENT_SHAPES + bench.ASSESSMENT_SHAPES:
        for residual in ("float16", "float32"):
            for engine in ("persistent", "persistent-global"):
                plan = planning.choose(engine, rows, channels, hidden, planning.H200).plan
                assert plan.engine == engine
                assert persistent.Variant.of(plan, residual).name in AOT_NAMES
            plan = planning.choose("conventional", rows, channels, hidden, planning.H200).plan
            assert conventional.Variant("hidden", channels, hidden, plan.tile.rows).name in AOT_NAMES
            assert conventional.Variant("output", hidden, channels, plan.tile.rows, residual).name in AOT_NAMES


@settings(max_examples=8, deadline=None)
@given(rows=st.integers(1, 3000), channels=st.integers(1, 300), hidden=st.integers(1, 600),
       tile_rows=st.sampled_from([None, 4, 8, 12, 32]), engine=st.sampled_from(["persistent", "persistent-global"]),
       weights=st.sampled_from([None, "smem", "global", "registers"]),
       residual=st.sampled_from(["float16", "float32"]))
def test_cuda_core_kernels_compile_for_any_size(rows, channels, hidden, tile_rows, engine, weights, residual):
    """The CUDA-core kernels are compiled per size, so a size no list names must compile too: odd K below one K
    step, N of one, tiles of several row blocks, every weight placement a plan allows (the GPU tests run such
    shapes; this catches a CuTe DSL error in CI, without a GPU)."""
    from hypothesis import assume

    from kernellab.megakernel import planning
    from kernellab.megakernel.engines import conventional, persistent

    try:
        plan = planning.forced(engine, rows, channels, hidden, planning.H200, tile_rows=tile_rows, weights=weights)
    except ValueError:  # a tile or placement this size does not allow
        assume(False)
    persistent.Variant.of(plan, residual).compile("sm_90a")
    conventional.Variant("output", hidden, channels, plan.tile.rows, residual).compile("sm_90a")


def test_cuda_core_kernels_compile_at_the_smallest_sizes():
    """One channel and one hidden unit: no whole K step, one output column, every lane group idle but one."""
    from kernellab.megakernel import planning
    from kernellab.megakernel.engines import conventional, persistent

    for engine in ("persistent", "persistent-global"):
        plan = planning.forced(engine, 5, 1, 1, planning.H200)
        assert persistent.Variant.of(plan).compile("sm_90a") is not None
    assert conventional.Variant("hidden", 1, 1, 4).compile("sm_90a") is not None


def test_every_report_model_plan_runs_an_ahead_of_time_stack_variant():
    """Each model of the report's models section, at each of its row counts, runs a persistent-stack kernel that
    ``compile_all`` compiles where planning fuses it (else the per-block chain serves), and so does the rows form
    forced there."""
    from kernellab.megakernel import models, planning
    from kernellab.megakernel.compiler import frontend
    from kernellab.megakernel.engines import persistent_stack
    from kernellab.megakernel.planning.stack import StackPlan, plan_stack

    forms = set()
    for case in models.REPORT_MODELS:
        blocks, _ = frontend.read_spec(case.spec)
        for rows in models.REPORT_ROWS:
            forced = plan_stack(blocks, rows, planning.H200, form="rows")
            assert not case.fits_l2 or persistent_stack.variant(forced).name in AOT_NAMES, (case.name, rows)
            plan = plan_stack(blocks, rows, planning.H200)
            if not isinstance(plan, StackPlan):  # past the fused forms' rows: the chain serves it
                assert "per-block chain was faster" in plan.reason, (case.name, rows, plan)
                continue
            assert persistent_stack.variant(plan).name in AOT_NAMES
            forms.add(plan.form)
    assert forms == {"gemv", "mma"}  # past the mma form's rows the per-block chain serves every report model


def test_prologue_spreads_few_rows_over_more_warps_each():
    """A row gets 8 warps (a CTA) while rows x 8 warps fit about a CTA an SM, halving down to a warp a row past 4 x
    SMs rows; always a power of two dividing the CTA's warps."""
    from kernellab.megakernel.engines import prologue

    sms = 132
    assert [prologue.row_split(r, sms) for r in (1, 16, 132)] == [prologue.WARPS] * 3
    assert [prologue.row_split(r, sms) for r in (133, 264, 265, 528, 529, 1056, 1057, 10**6)] == [4, 4, 2, 2, 1, 1,
                                                                                                      1, 1]
    for rows in range(1, 3000, 7):
        split = prologue.row_split(rows, sms)
        assert prologue.WARPS % split == 0 and split & (split - 1) == 0
        assert split == 1 or rows * split <= prologue.WARPS * sms


def test_programmatic_launch_variants_carry_both_instructions(monkeypatch):
    """A ``pdl`` variant lets the next launch start (``griddepcontrol.launch_dependents``) and waits for the one
    before (``griddepcontrol.wait``); a plain one has neither (read from the sm_90a PTX the compile keeps)."""
    from kernellab.megakernel.engines import cache, persistent_tc, prologue
    from kernellab.megakernel.planning import TC_CHANNEL_TILES, TC_ROW_TILES

    monkeypatch.setenv("KERNELLAB_MEGAKERNEL_KEEP_PTX", "1")
    for variant, launched_early in ((prologue.Variant(norm=True, pdl=True), True),
                                    (prologue.Variant(norm=False, pdl=True), True),
                                    (prologue.Variant(norm=True), False),
                                    (persistent_tc.Variant(TC_ROW_TILES[0], TC_CHANNEL_TILES[0], pdl=True), True)):
        variant.compile("sm_90a")
        ptx = "".join(p.read_text() for p in (cache.artifact_dir("sm_90a") / variant.name).rglob("*.ptx"))
        assert ptx, variant.name
        found = {op for op in ("griddepcontrol.launch_dependents", "griddepcontrol.wait") if op in ptx}
        assert found == ({"griddepcontrol.launch_dependents", "griddepcontrol.wait"} if launched_early else set()), \
            variant.name
