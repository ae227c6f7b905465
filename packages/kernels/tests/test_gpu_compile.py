"""CPU tests of the CuTe DSL kernels: the ahead-of-time compile of every variant for sm_90a (no GPU
needed), and a host emulation of each thread's tiling that checks every element of an (M, N) tensor
is loaded and stored by exactly one (CTA, thread, access) and that nothing outside it is touched."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("cutlass")
pytest.importorskip("tvm_ffi")

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass.cute.runtime import from_dlpack  # noqa: E402

from kernellab.kernels import gpu  # noqa: E402
from kernellab.kernels.gpu import compiler  # noqa: E402
from kernellab.kernels.gpu.base import Tuning  # noqa: E402
from kernellab.kernels.gpu.compiler import Variant  # noqa: E402


def test_compile_all_for_sm90a(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELLAB_CUTE_CACHE", str(tmp_path))
    names = gpu.compile_all("sm_90a")
    expected = [v.name for v in compiler.suite_variants() + compiler.representative_variants()]
    assert names == expected
    cubins = list((tmp_path / "sm_90a" / compiler.sources_fingerprint()).glob("*.cubin"))
    assert len(cubins) == len(expected), "each compile keeps its cubin, under the fingerprint of its sources"


def _ownership(variant: Variant, rows: int) -> torch.Tensor:
    """How many times each element of a (rows, N) tensor, padded by a full extra tile on each side,
    is touched by the accesses the kernel's predicates allow (grid, cluster, tiles, threads)."""
    k = variant.kernel()
    blocks = -(-rows // k.rows_per_cta)

    @cute.jit
    def touch(count: cute.Tensor):
        tiled = k.tiled_copy()
        for b in cutlass.range(blocks):
            for c in cutlass.range(k.ctas):
                for t in cutlass.range(k.tiles):
                    for tid in cutlass.range(k.num_threads):
                        thr = tiled.get_slice(tid)
                        tile = c * k.tiles + t
                        row_ok, cols = k.predicates(thr, rows, b, tile)
                        coords = k.part(thr, cute.make_identity_tensor((rows, k.n)), b, tile)
                        if row_ok:
                            for ch in cutlass.range_constexpr(k.chunks):
                                valid = True
                                if cutlass.const_expr(cols is not None):
                                    valid = cols[ch]
                                if valid:
                                    for v in cutlass.range_constexpr(k.vec):
                                        crd = coords[v, 0, ch]
                                        count[crd[0], crd[1]] = count[crd[0], crd[1]] + 1

    count = torch.zeros(rows + k.rows_per_cta, k.ctas * k.tiles * k.tile_cols + k.n, dtype=torch.int32)
    touch(from_dlpack(count))
    return count


@pytest.mark.parametrize("variant,rows", [
    (Variant("softmax", "float32", 1, 1), 300),  # one thread per row, 128 rows per CTA, partial CTA
    (Variant("rmsnorm", "bfloat16", 64, 8), 37),
    (Variant("layernorm", "float32", 20, 2), 70),  # narrow alignment class
    (Variant("softmax", "float32", 1537, 1), 3),  # scalar tail over four warps
    (Variant("rmsnorm", "float16", 1000, 4), 2),
    (Variant("softmax", "bfloat16", 3072, 8), 2),
    (Variant("layernorm", "float32", 8191, 1), 1),
    (Variant("softmax", "float32", 65540, 4), 2),  # a cluster of 5 CTAs, uneven tail
    (Variant("rmsnorm", "bfloat16", 40000, 8), 1),
    (Variant("layernorm", "bfloat16", 300000, 8), 1),  # streamed: 7 CTAs x 3 tiles
    (Variant("softmax", "float32", 140000, 4), 2),
    (Variant("layernorm", "bfloat16", 16384, 8, tuning=Tuning(tile_values=16)), 2),  # streamed on one CTA
    (Variant("rmsnorm", "float32", 4001, 1, tuning=Tuning(tile_values=4)), 3),  # ... with a column tail
    (Variant("layernorm", "bfloat16", 12280, 8), 2),  # LayerNorm's own streaming rule, a column tail
])
def test_every_element_is_owned_once(variant, rows):
    k = variant.kernel()
    count = _ownership(variant, rows)
    assert bool((count[:rows, :k.n] == 1).all()), "an element is missed or touched twice"
    assert int(count.sum()) == rows * k.n, "an access outside the tensor is allowed"


def test_a_row_streamed_on_one_cta_compiles(tmp_path, monkeypatch):
    """Tuning.tile_values streams rows that would fit in registers (sweep plans): one CTA, several tiles."""
    monkeypatch.setenv("KERNELLAB_CUTE_CACHE", str(tmp_path))
    variant = Variant("layernorm", "bfloat16", 16384, 8, weight="bfloat16", bias="bfloat16",
                      tuning=Tuning(tile_values=16))
    plan = variant.kernel().describe()
    assert (plan["cluster"], plan["tiles"], plan["chunks"] * variant.vec) == (1, 2, 16)
    variant.compile("sm_90a")
    assert compiler._RESOURCES[variant].stack_bytes == 0


@pytest.mark.parametrize("op,dtype,n,streamed", [
    ("layernorm", "bfloat16", 16384, True), ("layernorm", "float16", 12288, True),
    ("layernorm", "bfloat16", 8192, False),  # 256 threads a row: four rows per SM in flight
    ("layernorm", "float32", 16384, False), ("softmax", "bfloat16", 16384, False),
    ("layernorm", "bfloat16", 32768, False),  # a cluster's row
])
def test_layernorm_streams_16_bit_rows_that_take_the_largest_cta(op, dtype, n, streamed):
    plan = Variant(op, dtype, n, compiler.widest_vector(n, dtype)).kernel().describe()
    assert (plan["tiles"] > 1) == streamed
    if streamed:
        assert (plan["cluster"], plan["threads_per_row"], plan["chunks"] * plan["vec"]) == (1, 512, 8)
    held = Variant(op, dtype, n, compiler.widest_vector(n, dtype), tuning=Tuning(tile_values=0)).kernel()
    assert held.tiles == 1


def test_resident_ctas_matches_the_occupancy_calculator():
    assert compiler.resident_ctas(256, 47) == 5  # 48 registers a thread after rounding: 12288 a CTA
    assert compiler.resident_ctas(256, 40) == 6
    assert compiler.resident_ctas(128, 64) == 8
    assert compiler.resident_ctas(128, 0) == 16  # no register limit: the thread limit
    assert compiler.resident_ctas(32, 16) == 32  # the CTA limit
    assert compiler.resident_ctas(1024, 255) == 0
    # a ring of row blocks in shared memory (228 KiB an SM, 1 KiB reserved a CTA, WARP_SHARED a warp): 4 warps and
    # 50 KiB: 55 KiB a CTA, 4 an SM where the registers would hold 8
    assert compiler.resident_ctas(128, 64, ring_bytes=50 << 10) == 4
    assert compiler.resident_ctas(128, 64, ring_bytes=8 << 10) == 8  # the registers bind first


@pytest.mark.parametrize("op", ["rmsnorm_backward", "layernorm_backward"])
@pytest.mark.parametrize("dtype,n,stages", [("bfloat16", 1024, 3), ("bfloat16", 1024, 4), ("float16", 1000, 3),
                                            ("bfloat16", 16384, 4), ("float32", 4096, 3), ("bfloat16", 1537, 3)])
def test_ring_of_row_blocks_compiles_without_spills(tmp_path, monkeypatch, op, dtype, n, stages):
    """A held row's ring (``Tuning.ring_stages``): as deep as asked where RING_BYTES holds it, none for 2-byte
    accesses (cp.async moves 4, 8 or 16 bytes); for sm_90a without a stack frame; its shared memory in the
    grid's CTAs an SM (``compiler.wave``)."""
    import dataclasses

    from kernellab.kernels.gpu.base import BACKWARD, RING_BYTES, WIDE_BACKWARD

    monkeypatch.setenv("KERNELLAB_CUTE_CACHE", str(tmp_path))
    wide = dtype != "float32" and n >= 8192
    tuning = dataclasses.replace(WIDE_BACKWARD if wide else BACKWARD, ring_stages=stages)
    vec = compiler.widest_vector(n, dtype)
    variant = Variant(op, dtype, n, vec, weight=dtype, bias=dtype if op == "layernorm_backward" else None,
                      tuning=tuning)
    kernel = variant.kernel()
    plan = kernel.describe()
    if vec * {"float32": 32}.get(dtype, 16) < 32:
        assert plan["ring_stages"] == 0 and plan["ring_bytes"] == 0
        return
    expected = min(stages, RING_BYTES // kernel.ring_stage_bytes())
    assert plan["ring_stages"] == (expected if expected >= 2 else 0) and plan["ring_stages"] >= 2
    assert plan["ring_bytes"] == plan["ring_stages"] * kernel.ring_stage_bytes() <= RING_BYTES
    assert f"-r{stages}" in variant.name
    variant.compile("sm_90a")
    res = compiler._RESOURCES[variant]
    assert res.stack_bytes == 0 and res.registers <= 255
    _, per_wave = compiler.wave(variant, 132)
    by_registers = compiler.resident_ctas(plan["num_threads"], res.registers)
    assert per_wave == 132 * compiler.resident_ctas(plan["num_threads"], res.registers, plan["ring_bytes"]) \
        // plan["cluster"] <= 132 * by_registers // plan["cluster"]


@pytest.mark.parametrize("m,rows_per_cta,per_wave,element_size,grid", [
    (256, 1, 264, 2, 132),  # RMSNorm 256x3072 bf16: the wave's partials are most of the rows' bytes: one CTA an SM
    (1024, 1, 264, 2, 132),  # 1024x4096 bf16: still a third
    (65536, 1, 396, 2, 396),  # 65536x1024 bf16: under 1 %: the wave, its loads in flight
    (65536, 2, 396, 2, 396),
    (37, 1, 264, 4, 37),  # fewer rows than SMs: a CTA a row
    (4096, 2, 132, 4, 132),  # a wave of one CTA an SM stays
    (100000, 4, 528, 4, 264),  # fp32 rows: at most 2 CTAs an SM
    (100000, 4, 528, 2, 528),  # 16-bit rows keep the wave
    (66000, 2, 396, 4, 264),
    (300, 4, 264, 2, 75),  # 75 CTAs hold the rows
])
def test_backward_grid_keeps_the_wave_unless_its_partials_outweigh_the_rows(m, rows_per_cta, per_wave,
                                                                             element_size, grid):
    assert compiler.backward_grid(m, rows_per_cta, per_wave, 132, element_size) == grid


@pytest.mark.parametrize("m, rows_per_cta, per_wave, element_size, spread", [
    (65536, 2, 396, 2, True),  # 65536x1024 bf16: 792 partial rows, a lane of a warp's sum would walk about 25
    (256, 1, 264, 2, False),  # one CTA an SM: 132 rows
    (37, 1, 264, 4, False),
    (100000, 4, 528, 4, True),
])
def test_the_partials_sum_by_ctas_is_chosen_past_a_warps_lanes_at_their_rows(m, rows_per_cta, per_wave,
                                                                              element_size, spread):
    grid = compiler.backward_grid(m, rows_per_cta, per_wave, 132, element_size)
    assert compiler.spread_sum_of(grid * rows_per_cta) is spread
    assert not compiler.spread_sum_of(32 * compiler.PARTIAL_ROWS_PER_LANE)
    assert compiler.spread_sum_of(32 * compiler.PARTIAL_ROWS_PER_LANE + 1)


def test_a_launch_takes_the_spread_variant_on_its_own_wave_only_past_a_warps_lanes():
    """``vector_gradient_launch``: few partial rows keep the warp sum and never ask for the spread variant's wave;
    many take the spread variant on its own wave (LayerNorm fp32 at 1000 columns: 264 CTAs where the warp sum's
    registers hold 396; the grid of the other wave failed the cooperative launch)."""
    def never():
        raise AssertionError("the spread variant's wave was asked for")

    assert compiler.vector_gradient_launch(37, 132, 4, 1, 396, never) == (False, 1, 396, 37)
    asked = []

    def spread_wave():
        asked.append(True)
        return 2, 264

    assert compiler.vector_gradient_launch(66000, 132, 4, 2, 396, spread_wave) == (True, 2, 264, 264)
    assert asked == [True]


def test_the_spread_sum_is_its_own_variant_of_a_norm_backward_only():
    spread = Variant("layernorm_backward", "bfloat16", 1024, 8, weight="bfloat16", bias="bfloat16", spread_sum=True)
    plain = Variant("layernorm_backward", "bfloat16", 1024, 8, weight="bfloat16", bias="bfloat16")
    assert spread.name == plain.name + "_spread"
    assert repr(spread.kernel()) != repr(plain.kernel()), "compiled functions and artifacts of their own"
    assert spread.kernel().spread_sum and not plain.kernel().spread_sum
    assert spread.kernel().describe() == plain.kernel().describe(), "the same plan: only the sum differs"
    with pytest.raises(ValueError, match="spread_sum is a norm backward's choice"):
        Variant("softmax_backward", "float32", 1024, 4, spread_sum=True)


def test_cubin_resources_and_the_launch_bound_of_a_denser_plan(tmp_path, monkeypatch):
    """Registers read from the cubin, and a plan one CTA per SM denser than the heuristic one: the
    launch bound caps the registers so that it is resident, without spilling."""
    monkeypatch.setenv("KERNELLAB_CUTE_CACHE", str(tmp_path))
    for op, extra in (("rmsnorm", {"weight": "bfloat16"}), ("layernorm", {"weight": "bfloat16", "bias": "bfloat16"}),
                      ("softmax", {})):
        variant = Variant(op, "bfloat16", 6144, 8, **extra)
        variant.compile("sm_90a")
        res = compiler._RESOURCES[variant]
        threads = variant.kernel().describe()["num_threads"]
        ctas = compiler.resident_ctas(threads, res.registers)
        assert 16 <= res.registers <= 255 and res.stack_bytes == 0 and 1 <= ctas < 2048 // threads
        denser = Variant(op, "bfloat16", 6144, 8, tuning=Tuning(ctas_per_sm=ctas + 1), **extra)
        assert denser.kernel().describe()["min_ctas_per_sm"] == ctas + 1
        denser.compile("sm_90a")
        dense = compiler._RESOURCES[denser]
        assert compiler.resident_ctas(threads, dense.registers) >= ctas + 1, (res, dense)


def test_plans_bound_the_ctas_per_sm_only_where_it_makes_one_wave(monkeypatch):
    """132 SMs, 256-thread CTAs of one row at 47 registers: 5 resident per SM (660 rows a wave), at most 8
    by threads. A bound of k CTAs per SM caps the registers; in this stand-in, the bound of 8 spills."""
    variant = Variant("rmsnorm", "bfloat16", 6144, 8, weight="bfloat16")
    compiles = []

    def compiled(v):
        compiles.append(v)
        k = v.tuning.ctas_per_sm if v.tuning else 0
        regs = 65536 // (k * 256) // 8 * 8 if k else 47
        compiler._RESOURCES[v] = compiler.Resources(registers=regs, stack_bytes=64 if k == 8 else 0)
        return f"bound {k}" if k else "heuristic"

    monkeypatch.setattr(compiler, "compiled", compiled)
    monkeypatch.setattr(compiler, "_RESOURCES", {})
    plans = compiler.Plans(variant, sms=132)
    assert (plans.ctas, plans.limit) == (5, 8 * 132)
    chosen = {m: plans.for_rows(m) for m in (1, 660, 661, 768, 792, 793, 924, 925, 1000, 1056)}
    assert chosen == {1: "heuristic", 660: "heuristic",  # one wave already
                      661: "bound 6", 768: "bound 6", 792: "bound 6",  # one wave of 6 CTAs per SM, not two of 5
                      793: "bound 7", 924: "bound 7",
                      925: "heuristic", 1000: "heuristic", 1056: "heuristic"}  # one wave needs 8: spills
    assert sorted(v.tuning.ctas_per_sm for v in compiles if v.tuning) == [6, 7, 8], "each bound compiles once"
    assert plans.for_rows(1057) == plans.for_rows(50000) == "heuristic", "past one wave of 8: never bounded"
    single = compiler.Plans(variant)
    assert single.limit == 0 and single.for_rows(768) == "heuristic", "no SM count: the heuristic plan only"


def test_call_of_unwraps_the_kwargs_wrapper_where_there_is_one():
    class Wrapped:
        def __init__(self, inner):
            self.inner = inner

        def __tvm_ffi_object__(self):
            return self.inner

    def raw(*args):
        return args

    assert compiler.call_of(Wrapped(raw)) is raw
    uninitialized = Wrapped(None)  # compiled for another arch: no function under it
    assert compiler.call_of(uninitialized) is uninitialized
    assert compiler.call_of(raw) is raw


SWEEP_TOOL = Path(__file__).resolve().parents[3] / "tools" / "device" / "backward_sweep.py"


@pytest.mark.skipif(not SWEEP_TOOL.exists(), reason="the repository's tools/ (not in an sdist)")
def test_every_backward_sweep_plan_is_a_tuning_under_its_label(monkeypatch):
    """The device sweep's plan table: B0 the kernels' own plan, every other label a distinct Tuning."""
    import importlib.util

    monkeypatch.syspath_prepend(str(SWEEP_TOOL.parent))  # as when it runs: the device tools import each other
    spec = importlib.util.spec_from_file_location("backward_sweep", SWEEP_TOOL)
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    plans = sweep.plans()
    assert tuple(plans) == sweep.PLAN_LABELS
    assert plans["B0"] is None, "B0: the kernels' own plan, by dtype and N"
    forced = [t for label, t in plans.items() if label != "B0"]
    assert all(isinstance(t, Tuning) for t in forced)
    assert len({repr(t) for t in forced}) == len(forced), "no two labels the same plan"
