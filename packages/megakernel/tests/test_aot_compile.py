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
    # mma.sync persistent-tc: 2 residual dtypes x 2 load widths (16 bytes, one element) x 23 (row tile, channel
    # tile, 1-4 chunk buffers that fit in shared memory) = 92; wgmma: 2 residual dtypes x 21 = 42; hidden split
    # over a 2-CTA cluster: 2 residual dtypes x (21 mma.sync + 10 wgmma tiles that fit with the peer's half) = 62;
    # wgmma with TMA loads: 2 residual dtypes x (split or not) x (the overlapped chunk schedule or not) x the
    # channel tiles and 1-4 chunk buffers that fit = 84 (42 of them the overlapped schedule's); the register form:
    # 2 residual dtypes x 2 load widths x 16 padded (channels, hidden) = 64; the persistent CUDA-core kernels:
    # 2 residual dtypes x 2 hidden placements x 3 weight placements = 12; and the report's empty launch-floor kernel
    assert len(set(names)) == len(names) == 410
    for prefix in ("persistent_", "persistent-global_", "conventional-hidden", "conventional-output",
                   "conventional-tc-hidden", "conventional-tc-output", "persistent-tc_m32_c64_s1",
                   "persistent-tc_m64_c256_s2", "persistent-tc_m32_c64_s4", "persistent-tc_m32_c64_s1_v1",
                   "persistent-tc_m64_c128_s2_wg", "persistent-tc_m128_c256_s1_wg", "persistent-tc_m64_c256_s2_x2",
                   "persistent-tc_m64_c256_s1_wg_x2", "persistent-tc_m64_c512_s1_wg_tma_ov",
                   "persistent-tc_m64_c256_s2_wg_x2_tma_ov", "persistent-tc_regs_c16_h128_res",
                   "persistent-tc_regs_c64_h32_v1", "prologue-rmsnorm", "prologue-cast", "launch-floor"):
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
