"""Warp-level tensor-core pieces shared by conventional-tc and persistent-tc.

MMA: ``mma.sync.m16n8k16`` with fp16 operands and fp32 accumulators (valid on sm_80 and sm_90a), or
on sm_90a ``wgmma.mma_async`` 64 x N x 16 per warpgroup, both operands read from shared memory by
descriptor (``wgmma_*`` below).
Operands live in shared memory K-major (K contiguous) in 8 x 64 (or 8 x 32) swizzled atoms, so that
both the 16-byte ``cp.async`` writes and the ``ldmatrix`` reads are free of bank conflicts. Every
tile load is predicated per 16-byte vector: a vector outside the tensor is written as zeros, so an
MMA never reads stale or uninitialized shared memory and the padding contributes exactly 0. Rows that
are not 16-byte aligned (channels or hidden not a multiple of 8) load element by element instead
(``vector=1``): the same threads and shared-memory layout, 2-byte loads predicated per element.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float16, Float32, Int32
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warp, warpgroup

from ..planning import VECTOR_ELEMENTS
from .common import GELU, RELU, gelu, relu, silu

MMA_SHAPE = (16, 8, 16)


def smem_layout(shape: tuple):
    """An fp16 tile of ``shape`` (rows, K[, stages]) with K contiguous, tiled from swizzled 8-row
    atoms of 64 columns (128 bytes), or 32 columns when K is not a multiple of 64."""
    width = 64 if shape[1] % 64 == 0 else 32
    bits = 3 if width == 64 else 2
    atom = cute.make_composed_layout(cute.make_swizzle(bits, 3, 3), 0,
                                     cute.make_layout((8, width), stride=(width, 1)))
    return cute.tile_to_shape(atom, shape, tuple(range(len(shape))))


def g2s_copy(threads: int, width: int):
    """cp.async of 16 bytes per thread; a row of ``width`` columns is covered by width/8 threads."""
    atom = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), Float16,
                               num_bits_per_copy=16 * 8)
    per_row = width // VECTOR_ELEMENTS
    threads_layout = cute.make_layout((threads // per_row, per_row), stride=(per_row, 1))
    return cute.make_tiled_copy_tv(atom, threads_layout, cute.make_layout((1, VECTOR_ELEMENTS)))


def tiled_mma(warps_m: int, warps_n: int):
    """Warps tiled (warps_m, warps_n); each warp's N extent is 16 so one ldmatrix.x4 feeds two MMAs."""
    op = warp.MmaF16BF16Op(Float16, Float32, MMA_SHAPE)
    return cute.make_tiled_mma(op, cute.make_layout((warps_m, warps_n, 1)),
                               permutation_mnk=(warps_m * MMA_SHAPE[0], warps_n * MMA_SHAPE[1] * 2, MMA_SHAPE[2]))


def s2r_copies(mma):
    """ldmatrix.x4 (no transpose: both operands are K-major) shaped for the A and B fragments."""
    atom = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), Float16)
    return cute.make_tiled_copy_A(atom, mma), cute.make_tiled_copy_B(atom, mma)


@cute.jit
def load_tile(copy: cute.TiledCopy, tid: Int32, g_tile: cute.Tensor, s_tile: cute.Tensor, coords: cute.Tensor,
              row_limit: Int32, col_limit: Int32, vector: cutlass.Constexpr = VECTOR_ELEMENTS):
    """Copy a (rows, cols) tile into shared memory. ``coords`` holds each element's coordinates in the
    global tensor; what lies at or past (row_limit, col_limit) is zero-filled instead. With
    ``vector=8`` each thread's 8 elements go by one 16-byte cp.async (the column limit is a multiple
    of 8, so a vector is entirely inside or outside); with ``vector=1`` element by element, all of a
    thread's loads issued into registers before any is stored, so that they wait out one memory latency
    together instead of one each (a load-store pair per element serializes them)."""
    thr = copy.get_slice(tid)
    src = thr.partition_S(g_tile)
    dst = thr.partition_D(s_tile)
    crd = thr.partition_S(coords)
    steps_m, steps_k = cute.size(dst, mode=[1]), cute.size(dst, mode=[2])
    if cutlass.const_expr(vector == VECTOR_ELEMENTS):
        for m in cutlass.range_constexpr(steps_m):
            for k in cutlass.range_constexpr(steps_k):
                row, col = crd[0, m, k]  # of the vector's first element
                if row < row_limit and col < col_limit:
                    cute.copy(copy, src[None, m, k], dst[None, m, k])
                else:
                    dst[None, m, k].fill(0.0)
    else:
        store_elements(copy, tid, fetch_elements(copy, tid, g_tile, coords, row_limit, col_limit), s_tile)


@cute.jit
def fetch_elements(copy: cute.TiledCopy, tid: Int32, g_tile: cute.Tensor, coords: cute.Tensor, row_limit: Int32,
                   col_limit: Int32) -> cute.Tensor:
    """This thread's elements of a (rows, cols) tile, loaded element by element into registers (0 at or past
    the limits): the first half of ``load_tile(..., vector=1)``, so that a caller can have several tiles'
    loads in flight before it stores any (``store_elements``)."""
    thr = copy.get_slice(tid)
    src = thr.partition_S(g_tile)
    crd = thr.partition_S(coords)
    steps_m, steps_k = cute.size(src, mode=[1]), cute.size(src, mode=[2])
    staged = cute.make_rmem_tensor((VECTOR_ELEMENTS, steps_m, steps_k), Float16)
    for m in cutlass.range_constexpr(steps_m):
        for k in cutlass.range_constexpr(steps_k):
            row, col = crd[0, m, k]
            for e in cutlass.range_constexpr(VECTOR_ELEMENTS):
                staged[e, m, k] = load_element(src[None, m, k], e, row < row_limit and col + e < col_limit)
    return staged


@cute.jit
def store_elements(copy: cute.TiledCopy, tid: Int32, staged: cute.Tensor, s_tile: cute.Tensor):
    """``fetch_elements``' registers into this thread's elements of the shared-memory tile."""
    dst = copy.get_slice(tid).partition_D(s_tile)
    for m in cutlass.range_constexpr(cute.size(dst, mode=[1])):
        for k in cutlass.range_constexpr(cute.size(dst, mode=[2])):
            for e in cutlass.range_constexpr(VECTOR_ELEMENTS):
                dst[None, m, k][e] = staged[e, m, k]


@cute.jit
def load_element(src: cute.Tensor, e: cutlass.Constexpr, inside) -> Float16:
    """src[e] where ``inside``, else 0 (src is not read)."""
    value = Float16(0.0)
    if inside:
        value = src[e]
    return value


@cute.jit
def gemm_from_smem(mma: cute.TiledMma, tid: Int32, acc: cute.Tensor, s_a: cute.Tensor, s_b: cute.Tensor,
                   copy_a: cute.TiledCopy, copy_b: cute.TiledCopy):
    """acc += s_a (M, K) * s_b (N, K)^T with both operands in shared memory, one k-block of 16 at a
    time (fully unrolled: the compiler overlaps the ldmatrix of one k-block with the MMAs of the
    previous one within its register budget)."""
    thr_mma = mma.get_slice(tid)
    frag_a = thr_mma.make_fragment_A(thr_mma.partition_A(s_a))
    frag_b = thr_mma.make_fragment_B(thr_mma.partition_B(s_b))
    thr_a = copy_a.get_slice(tid)
    thr_b = copy_b.get_slice(tid)
    src_a = thr_a.partition_S(s_a)
    src_b = thr_b.partition_S(s_b)
    view_a = thr_a.retile(frag_a)
    view_b = thr_b.retile(frag_b)
    for k in cutlass.range_constexpr(cute.size(frag_a, mode=[2])):
        cute.copy(copy_a, src_a[None, None, k], view_a[None, None, k])
        cute.copy(copy_b, src_b[None, None, k], view_b[None, None, k])
        cute.gemm(mma, acc, frag_a[None, None, k], frag_b[None, None, k], acc)


@cute.jit
def store_inside(t: cute.Tensor, row: Int32, col: Int32, rows: Int32, cols: Int32, value):
    """t[row, col] = value where (row, col) is inside (rows, cols). (A separate function: the DSL
    does not rewrite an ``if`` inside a closure defined in a kernel.)"""
    if row < rows and col < cols:
        t[row, col] = value


OUTPUT_BATCH = 16
"""Output elements per thread whose b2 and residual loads are all issued before any of their y stores. A y store
between two loads keeps the later load behind it (y may alias them, for all the compiler knows), so an element at a
time the output epilogue waited one memory latency per element: a phase trace of persistent-tc on the H200 put
it at 56,000 clocks of a 230,000-clock 64 x 512 tile (16384 x 512 x 2048)."""


@cute.jit
def read_output_terms(bias: cute.Tensor, res: cute.Tensor, k: cutlass.Constexpr, inside, col: Int32, row: Int32,
                      b2: cute.Tensor, residual: cute.Tensor, width: cutlass.Constexpr):
    """bias[k + e] = b2[col + e] and res[k + e] = residual[row, col + e] as fp32 for e < ``width`` where ``inside``,
    else 0 (nothing is read); with width 2 the residual pair is one load (``pair``)."""
    for e in cutlass.range_constexpr(width):
        bias[k + e] = Float32(0.0)
        res[k + e] = Float32(0.0)
    if inside:
        if cutlass.const_expr(width == 1):
            bias[k] = b2[col]
            res[k] = residual[row, col].to(Float32)
        else:
            got = cute.make_rmem_tensor((2,), residual.element_type)
            cute.autovec_copy(pair(residual, row, col), got)
            for e in cutlass.range_constexpr(2):
                bias[k + e] = b2[col + e]
                res[k + e] = got[e].to(Float32)


def pair(t: cute.Tensor, row: Int32, col: Int32) -> cute.Tensor:
    """t[row, col : col + 2] for an even ``col`` as a tensor whose offset the compiler sees is a multiple of 2
    (row strides of 16-byte rows are multiples of 8), so that a copy of it is one vector access."""
    return cute.local_tile(t, (1, 2), (row, col // 2))[0, None]


@cute.jit
def store_output(acc: cute.Tensor, coords: cute.Tensor, row0: Int32, col0: Int32, rows: Int32, cols: Int32,
                 b2: cute.Tensor, residual: cute.Tensor, y: cute.Tensor, width: cutlass.Constexpr = 1,
                 split: cutlass.Constexpr = 1, rank: Int32 = 0):
    """y[row0 + r, col0 + c] = acc[i] + b2[col0 + c] + residual[row0 + r, col0 + c] for this thread's elements i
    ((r, c) = coords[i]) inside (rows, cols), ``OUTPUT_BATCH`` at a time: a batch's loads first, then its stores.
    ``width`` 2 (16-byte rows: cols a multiple of 8) takes elements 2p and 2p + 1, neighbouring columns in every
    MMA fragment, together: one residual load and one 8-byte y store. With ``split`` S > 1 only the pairs p with
    p % S == ``rank`` (a hidden split's CTA finishes every S-th pair: ``split_owner``)."""
    count = cute.size(acc)
    batch = min(OUTPUT_BATCH, count)
    bias = cute.make_rmem_tensor((batch,), Float32)
    res = cute.make_rmem_tensor((batch,), Float32)
    for b0 in cutlass.range_constexpr(0, count, batch):
        for k in cutlass.range_constexpr(0, min(batch, count - b0), width):
            r, c = coords[b0 + k]
            read_output_terms(bias, res, k, row0 + r < rows and col0 + c < cols and split_owner(b0 + k, split) == rank,
                              col0 + c, row0 + r, b2, residual, width)
        for k in cutlass.range_constexpr(0, min(batch, count - b0), width):
            r, c = coords[b0 + k]
            if row0 + r < rows and col0 + c < cols and split_owner(b0 + k, split) == rank:
                if cutlass.const_expr(width == 1):
                    y[row0 + r, col0 + c] = acc[b0 + k] + bias[k] + res[k]
                else:
                    out = cute.make_rmem_tensor((2,), Float32)
                    for e in cutlass.range_constexpr(2):
                        out[e] = acc[b0 + k + e] + bias[k + e] + res[k + e]
                    cute.autovec_copy(out, pair(y, row0 + r, col0 + c))


def split_owner(i: int, split: int) -> int:
    """The CTA of a hidden split that finishes output element i of a fragment: pairs of neighbouring columns
    (elements 2p, 2p + 1) go round the ``split`` CTAs, so that each CTA's stores stay 8-byte vectors."""
    return i // 2 % split


def split_slot(i: int, split: int) -> int:
    """Where output element i of a fragment lies among the elements its finishing CTA (``split_owner``) holds."""
    return i // (2 * split) * 2 + i % 2


def split_recv_slot(i: int, count: int, split: int, sender):
    """Where hidden-split CTA ``sender`` puts output element i (of ``count`` a fragment) in the receive buffer of
    the CTA that finishes it: one run of count / split slots per peer, the peers in the order (sender - owner - 1)
    mod split, so that each of the split - 1 senders has its own run."""
    return (sender - split_owner(i, split) - 1 + split) % split * (count // split) + split_slot(i, split)


@cute.jit
def activate_in_place(acc: cute.Tensor, bias: cute.Tensor, act: Int32):
    """acc[i] = act(acc[i] + bias[i]): the fp32 part of a GEMM1 epilogue, kept in the accumulators."""
    for i in cutlass.range_constexpr(cute.size(acc)):
        acc[i] = acc[i] + bias[i]

    def keep(i, v):
        acc[i] = v

    apply_activation(acc, act, keep)


@cute.jit
def apply_activation(values: cute.Tensor, act: Int32, store: cutlass.Constexpr):
    """``store(i, act(values[i]))`` for every element, with the activation chosen once outside the
    (unrolled) element loop rather than per element."""
    count = cute.size(values)
    if act == RELU:
        for i in cutlass.range_constexpr(count):
            store(i, relu(values[i]))
    elif act == GELU:
        for i in cutlass.range_constexpr(count):
            store(i, gelu(values[i]))
    else:
        for i in cutlass.range_constexpr(count):
            store(i, silu(values[i]))


# ---- wgmma (sm_90a) ---------------------------------------------------------------------------------

WGMMA_M = 64  # rows of one warpgroup's instruction


def wgmma_smem_layout(shape: tuple):
    """An fp16 tile of ``shape`` (rows, K[, stages]) K-major, tiled from the 128-byte-swizzled atom that
    wgmma descriptors address (K a multiple of 64)."""
    atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, Float16)
    return cute.tile_to_shape(atom, shape, tuple(range(len(shape))))


def wgmma_tiled(rows: int, n: int, warpgroups: int):
    """wgmma over a (rows, n) product: warpgroups split the rows where there are 64 per warpgroup, else
    the columns (rows == 64)."""
    split_m = rows == WGMMA_M * warpgroups
    if not split_m and rows != WGMMA_M:
        raise ValueError(f"wgmma tiles have 64 rows per warpgroup or 64 rows in all, got {rows}")
    op = warpgroup.MmaF16BF16Op(Float16, Float32, (WGMMA_M, n if split_m else n // warpgroups, 16),
                                warpgroup.OperandSource.SMEM, OperandMajorMode.K, OperandMajorMode.K)
    return cute.make_tiled_mma(cute.make_mma_atom(op), (warpgroups, 1, 1) if split_m else (1, warpgroups, 1))


@cute.jit
def wgmma_from_smem(mma: cute.TiledMma, tid: Int32, acc: cute.Tensor, s_a: cute.Tensor, s_b: cute.Tensor,
                    accumulate: cutlass.Constexpr):
    """acc (+)= s_a (M, K) * s_b (N, K)^T by wgmma, waited for before returning. ``accumulate=False``
    overwrites acc (the first k-block does not add). The caller fences shared memory written by the
    generic proxy (``cute.arch.fence_view_async_shared``) and synchronizes before calling."""
    wgmma_issue(mma, tid, acc, s_a, s_b, accumulate)
    warpgroup.wait_group(0)


@cute.jit
def wgmma_issue(mma: cute.TiledMma, tid: Int32, acc: cute.Tensor, s_a: cute.Tensor, s_b: cute.Tensor,
                accumulate: cutlass.Constexpr):
    """``wgmma_from_smem`` issued and committed as one wgmma group, not waited for: the caller waits
    (``warpgroup.wait_group``), so that two products can run at once, or other work under one."""
    thr = mma.get_slice(tid)
    frag_a = mma.make_fragment_A(thr.partition_A(s_a))
    frag_b = mma.make_fragment_B(thr.partition_B(s_b))
    warpgroup.fence()
    for k in cutlass.range_constexpr(cute.size(frag_a, mode=[2])):
        mma.set(warpgroup.Field.ACCUMULATE, accumulate or k > 0)
        cute.gemm(mma, acc, frag_a[None, None, k], frag_b[None, None, k], acc)
    warpgroup.commit_group()
