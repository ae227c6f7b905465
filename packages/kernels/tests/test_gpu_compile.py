"""CPU tests of the CuTe DSL kernels: the ahead-of-time compile of every variant for sm_90a (no GPU
needed), and a host emulation of each thread's tiling that checks every element of an (M, N) tensor
is loaded and stored by exactly one (CTA, thread, access) and that nothing outside it is touched."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("cutlass")
pytest.importorskip("tvm_ffi")

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass.cute.runtime import from_dlpack  # noqa: E402

from kernellab.kernels import gpu  # noqa: E402
from kernellab.kernels.gpu import compiler  # noqa: E402
from kernellab.kernels.gpu.compiler import Variant  # noqa: E402


def test_compile_all_for_sm90a(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELLAB_CUTE_CACHE", str(tmp_path))
    names = gpu.compile_all("sm_90a")
    expected = [v.name for v in compiler.suite_variants() + compiler.representative_variants()]
    assert names == expected
    cubins = list((tmp_path / "sm_90a").glob("*.cubin"))
    assert len(cubins) == len(expected), "each compile keeps its cubin"


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
])
def test_every_element_is_owned_once(variant, rows):
    k = variant.kernel()
    count = _ownership(variant, rows)
    assert bool((count[:rows, :k.n] == 1).all()), "an element is missed or touched twice"
    assert int(count.sum()) == rows * k.n, "an access outside the tensor is allowed"
