"""Device code shared by the CUDA-core engines (conventional, persistent, persistent-global).

Both GEMMs of a block are the same row-wise product, ``out[r, n] = sum_k a[r, k] w[n, k] + b[n]``,
followed by a different epilogue (activation and fp16 rounding after the first, the residual after
the second). ``linear_rows`` computes it for any sizes: a thread owns ROW_BLOCK rows of one output
column and runs the whole K loop itself (no cross-thread reduction), neighbouring threads take
neighbouring columns. So reads of ``a`` are broadcasts, writes of the output are contiguous, and
the sum runs in one fixed order: every engine built on it is deterministic and a row's result does
not depend on how the rows are tiled.

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


@cute.jit
def linear_rows(a: cute.Tensor, a_row0: Int32, rows_valid: Int32, k_dim: Int32, weight: cute.Tensor,
                bias: cute.Tensor, n_dim: Int32, epilogue: cutlass.Constexpr, tid: Int32):
    """For r < rows_valid and n < n_dim: ``epilogue(r, n, sum_k a[a_row0 + r, k] weight[n, k] + bias[n])``.

    Rows past ``rows_valid`` in a thread's block read the last valid row (always in bounds) and
    are never handed to the epilogue."""
    row_blocks = (rows_valid + ROW_BLOCK - 1) // ROW_BLOCK
    for item in range(tid, row_blocks * n_dim, SCALAR_THREADS):
        block = item // n_dim
        n = item - block * n_dim
        r0 = block * ROW_BLOCK
        rows = [a_row0 + cutlass.min(r0 + rr, rows_valid - 1) for rr in range(ROW_BLOCK)]
        acc = cute.make_rmem_tensor((ROW_BLOCK,), Float32)
        acc.fill(0.0)
        for k in cutlass.range(k_dim, unroll=4):
            w = weight[n, k].to(Float32)
            for rr in cutlass.range_constexpr(ROW_BLOCK):
                acc[rr] = acc[rr] + a[rows[rr], k].to(Float32) * w
        b = bias[n]
        for rr in cutlass.range_constexpr(ROW_BLOCK):
            if r0 + rr < rows_valid:
                epilogue(r0 + rr, n, acc[rr] + b)


@cute.jit
def stage_rows(src: cute.Tensor, row0: Int32, rows_valid: Int32, dst: cute.Tensor, tid: Int32):
    """dst[r, c] = fp32(src[row0 + r, c]) for the tile's valid rows (fp16 -> fp32 is exact)."""
    cols = src.shape[1]
    for i in range(tid, rows_valid * cols, SCALAR_THREADS):
        r = i // cols
        c = i - r * cols
        dst[r, c] = src[row0 + r, c].to(Float32)


@cute.jit
def stage_weight(src: cute.Tensor, dst: cute.Tensor, tid: Int32):
    """A whole (N, K) weight from global memory (read along K, coalesced) into its transposed
    shared-memory view ``dst`` (same logical (N, K) indexing)."""
    k_dim = src.shape[1]
    for i in range(tid, cute.size(src), SCALAR_THREADS):
        n = i // k_dim
        k = i - n * k_dim
        dst[n, k] = src[n, k]


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
