"""Device code shared by the CUDA-core engines (conventional, persistent, persistent-global).

Both GEMMs of a block are the same row-wise product, ``out[r, n] = sum_k a[r, k] w[n, k] + b[n]``,
followed by a different epilogue (activation and fp16 rounding after the first, the residual after
the second). ``linear_rows`` computes it for any sizes: a group of ``k_lanes`` neighbouring threads
owns ROW_BLOCK rows of one output column, each lane summing every lanes-th k, and a butterfly of
shuffles adds the lanes' sums (one lane when the columns fill the CTA: the whole K loop in one
thread); neighbouring groups take neighbouring columns. So reads of ``a`` are broadcasts within a
group, and the sum runs in one fixed order that depends on the sizes alone: every engine built on it
is deterministic and a row's result does not depend on how the rows are tiled.

Weights staged in shared memory are stored transposed (K-major rows of N, padded to a stride S with
S = 2 mod 4 halves) so that the threads of a warp read consecutive halves at each k, and the staging
copy (coalesced global reads along K) writes with an odd word stride: both free of bank conflicts.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float16, Float32, Int32, Uint8

from ..planning import ROW_BLOCK, SCALAR_THREADS, padded_stride
from .common import activate, round_to_fp16

LANE_MIN_K = 8
"""The fewest k a lane of a shared K loop sums: below it the shuffles cost more than the shorter loop saves."""


@cute.jit
def k_lanes(n_dim: Int32, k_dim: Int32) -> Int32:
    """Threads that share one output's K loop: the largest power of two up to 32 with that many threads per
    output of every column still within the CTA, each lane summing at least LANE_MIN_K k. It depends on the
    sizes alone, not on the rows of a tile, so the order of every sum does not depend on the tiling."""
    lanes = Int32(1)
    for candidate in cutlass.range_constexpr(1, 6):
        if (1 << candidate) * n_dim <= SCALAR_THREADS and (1 << candidate) * LANE_MIN_K <= k_dim:
            lanes = Int32(1 << candidate)
    return lanes


@cute.jit
def linear_rows(a: cute.Tensor, a_row0: Int32, rows_valid: Int32, k_dim: Int32, weight: cute.Tensor,
                bias: cute.Tensor, n_dim: Int32, epilogue: cutlass.Constexpr, tid: Int32):
    """For r < rows_valid and n < n_dim: ``epilogue(r, n, sum_k a[a_row0 + r, k] weight[n, k] + bias[n])``.

    ``k_lanes`` neighbouring threads of a warp share an output: lane l of the group sums k = l, l + lanes,
    ..., and a butterfly of shuffles adds the lanes' sums. Every thread runs the same number of passes (a
    pass past the last output repeats it and stores nothing), so whole warps reach the shuffles. Rows past
    ``rows_valid`` in a block read the last valid row (always in bounds) and are never handed to the
    epilogue."""
    lanes = k_lanes(n_dim, k_dim)
    group, lane = tid // lanes, tid % lanes
    groups = SCALAR_THREADS // lanes
    total = (rows_valid + ROW_BLOCK - 1) // ROW_BLOCK * n_dim
    for first in range(0, total, groups):
        item = cutlass.min(first + group, total - 1)
        block = item // n_dim
        n = item - block * n_dim
        r0 = block * ROW_BLOCK
        rows = [a_row0 + cutlass.min(r0 + rr, rows_valid - 1) for rr in range(ROW_BLOCK)]
        acc = cute.make_rmem_tensor((ROW_BLOCK,), Float32)
        acc.fill(0.0)
        for k in cutlass.range(lane, k_dim, lanes, unroll=4):
            w = weight[n, k].to(Float32)
            for rr in cutlass.range_constexpr(ROW_BLOCK):
                acc[rr] = acc[rr] + a[rows[rr], k].to(Float32) * w
        for step in cutlass.range_constexpr(4, -1, -1):  # offsets 16, 8, 4, 2, 1 below the group size
            if (1 << step) < lanes:
                for rr in cutlass.range_constexpr(ROW_BLOCK):
                    acc[rr] = acc[rr] + cute.arch.shuffle_sync_bfly(acc[rr], offset=1 << step)
        if lane == 0 and first + group < total:
            b = bias[n]
            for rr in cutlass.range_constexpr(ROW_BLOCK):
                if r0 + rr < rows_valid:
                    epilogue(r0 + rr, n, acc[rr] + b)


STAGE_UNROLL = 4
"""Rows a warp loads into registers before storing any when staging into shared memory, so that their
memory latencies overlap."""


@cute.jit
def stage_rows(src: cute.Tensor, row0: Int32, rows_valid: Int32, dst: cute.Tensor, tid: Int32):
    """dst[r, c] = src[row0 + r, c], converted to dst's type, for r < rows_valid and every column: a tile's
    input rows (fp16 -> fp32 is exact), or a whole (N, K) weight (row0 0) into its transposed view. Warp w
    takes rows w, w + warps, ..., STAGE_UNROLL of them at a time, lanes the columns (coalesced), with no
    division per element."""
    cols = src.shape[1]
    warp, lane = tid // 32, tid % 32
    warps = SCALAR_THREADS // 32
    for r in range(warp, rows_valid, warps * STAGE_UNROLL):
        for c in range(lane, cols, 32):
            staged = cute.make_rmem_tensor((STAGE_UNROLL,), src.element_type)
            for u in cutlass.range_constexpr(STAGE_UNROLL):
                staged[u] = src[row0 + cutlass.min(r + u * warps, rows_valid - 1), c]
            for u in cutlass.range_constexpr(STAGE_UNROLL):
                if r + u * warps < rows_valid:
                    dst[r + u * warps, c] = staged[u].to(dst.element_type)


def dynamic_smem():
    return cute.arch.get_dyn_smem(Uint8, alignment=16)


def smem_rows(base, byte_offset, dtype, rows, cols) -> cute.Tensor:
    """A row-major (rows, cols) tensor at ``byte_offset`` of the dynamic shared memory."""
    return cute.make_tensor(cute.recast_ptr(base + byte_offset, dtype=dtype),
                            cute.make_layout((rows, cols), stride=(cols, 1)))


def smem_weight(base, byte_offset, n, k) -> cute.Tensor:
    """An fp16 (N, K) weight view stored transposed: element (n, k) at k * S + n."""
    return cute.make_tensor(cute.recast_ptr(base + byte_offset, dtype=Float16),
                            cute.make_layout((n, k), stride=(1, padded_stride(n))))


def hidden_to_smem(h_s: cute.Tensor, act: Int32):
    """First-GEMM epilogue with the hidden on chip: fp32 holding the fp16-rounded value."""

    def store(r, n, v):
        h_s[r, n] = round_to_fp16(activate(v, act))

    return store


def hidden_to_global(hidden: cute.Tensor, row0: Int32, act: Int32):
    """First-GEMM epilogue with the hidden in global memory (fp16)."""

    def store(r, n, v):
        hidden[row0 + r, n] = activate(v, act).to(Float16)

    return store


def output_with_residual(y: cute.Tensor, residual: cute.Tensor, row0: Int32):
    """Second-GEMM epilogue: y = (h W2^T + b2) + residual, in fp32."""

    def store(r, n, v):
        y[row0 + r, n] = v + residual[row0 + r, n].to(Float32)

    return store
