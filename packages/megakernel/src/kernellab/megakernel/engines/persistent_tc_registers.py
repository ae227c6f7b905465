"""``persistent-tc``'s register form: one warp per CTA, the weights and the hidden never in shared memory.

For blocks whose weights fit a warp's registers as MMA operand fragments (``planning.REGISTER_FORM_MAX``), a
CTA is one warp that loads W1 and W2 straight from global memory into its ``mma.sync`` B fragments once,
then owns row tiles of 16 rows (tile b, b + grid, ...). Per tile, its x and residual loads issued together:

    acc_h = x_tile W1^T                     (GEMM1: A fragments of x loaded from global memory)
    h     = fp16(act(acc_h + b1))           (the accumulators *are* GEMM2's A fragments, see below)
    y     = h W2^T + b2 + residual          (GEMM2, written from the accumulators)

The m16n8k16 accumulator of columns [8n, 8n + 8) holds, per thread, the same (row, column) pairs that the A
fragment of k-block n // 2 holds in its values 4 (n % 2) .. 4 (n % 2) + 3, so element i of the GEMM1
accumulators (values fastest, then n) is element i of GEMM2's A fragments (values fastest, then k-block): the
hidden goes from one GEMM to the next by an fp16 conversion in place, with no shared memory and no barrier.

Memory order: a product's K order (and GEMM1's N order, which is GEMM2's K order, and GEMM2's N order) is free
so long as both operands and the biases follow it. Each dimension is taken in groups of 32 (two blocks of 16; a
last block of 16 alone), and the slot order within a group is chosen so that the 8 (4) slots one thread holds
of it are 8 (4) neighbouring memory indices (``planning.register_run_start``, ``planning.register_slot``):
x, W1, W2, the residual and y move in runs of 8 neighbouring columns per row, 16 bytes of fp16, where the
MMA's own order would take 4-byte pairs.

Padding: channels and hidden are padded to multiples of 16 (the MMA's K); what lies outside the tensors reads
as 0, so padded hidden units have zero W1 rows, zero bias and zero W2 columns and add exactly 0 to y. Rows of
16-byte alignment (channels and hidden multiples of 8) move each run as one vector access (``vector=8``),
others element by element (``load_run``).
"""

from __future__ import annotations

import dataclasses

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float16, Float32, Int32
from cutlass.cute.nvgpu import warp

from ..planning import (
    REGISTER_FORM_ROWS,
    REGISTER_FORM_THREADS,
    VECTOR_ELEMENTS,
    register_groups,
    register_run_start,
    register_slot,
)
from . import tensorcore
from .common import block_signature, compile_variant


@dataclasses.dataclass(frozen=True)
class Variant:
    channels_tile: int  # channels padded to a multiple of 16
    hidden_tile: int  # hidden padded to a multiple of 16
    residual: str = "float16"
    vector: int = VECTOR_ELEMENTS  # 8: 16-byte rows, one access per run of columns; 1: element by element

    @property
    def name(self) -> str:
        narrow = "" if self.vector == VECTOR_ELEMENTS else f"_v{self.vector}"
        return f"persistent-tc_regs_c{self.channels_tile}_h{self.hidden_tile}{narrow}_res-{self.residual}"

    def compile(self, arch: str | None = None):
        kernel = PersistentTensorCoreRegisters(self)
        return compile_variant(self.name, kernel, block_signature(self.vector, self.residual), arch)


@cute.jit
def zero_outside(value, inside):
    """value where ``inside``, else 0 of its type: a select (the value was loaded unconditionally)."""
    out = value.dtype(0.0)
    if inside:
        out = value
    return out


class PersistentTensorCoreRegisters:
    def __init__(self, variant: Variant):
        self.channels_tile = variant.channels_tile
        self.hidden_tile = variant.hidden_tile
        self.aligned = variant.vector == VECTOR_ELEMENTS  # runs load and store as vectors

    @cute.jit
    def __call__(self, u: cute.Tensor, residual: cute.Tensor, w1: cute.Tensor, b1: cute.Tensor, w2: cute.Tensor,
                 b2: cute.Tensor, y: cute.Tensor, act: Int32, grid: Int32, stream: cuda.CUstream):
        op = warp.MmaF16BF16Op(Float16, Float32, tensorcore.MMA_SHAPE)
        mma = cute.make_tiled_mma(op, cute.make_layout((1, 1, 1)))  # one warp
        self.kernel(u, residual, w1, b1, w2, b2, y, act, mma).launch(
            grid=[grid, 1, 1], block=[REGISTER_FORM_THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, u: cute.Tensor, residual: cute.Tensor, w1: cute.Tensor, b1: cute.Tensor, w2: cute.Tensor,
               b2: cute.Tensor, y: cute.Tensor, act: Int32, mma: cute.TiledMma):
        tile_rows, cols, hid = REGISTER_FORM_ROWS, self.channels_tile, self.hidden_tile
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        rows, channels = u.shape
        hidden = w1.shape[0]
        thr = mma.get_slice(tid)
        g, t = tid // 4, tid % 4  # the MMA's row group and thread in group

        # once per CTA: both weights as B fragments (W1 is (hidden, channels) and W2 (channels, hidden), each
        # K-major as the MMA takes B), b1 at the GEMM1 accumulators' columns, b2 at GEMM2's
        f_w1 = cute.make_rmem_tensor(thr.partition_shape_B((hid, cols)), Float16)
        f_w2 = cute.make_rmem_tensor(thr.partition_shape_B((cols, hid)), Float16)
        self.load_b_fragment(f_w1, w1, g, t, hid, cols, hidden, channels)
        self.load_b_fragment(f_w2, w2, g, t, cols, hid, channels, hidden)
        bias_h = cute.make_rmem_tensor(thr.partition_shape_C((tile_rows, hid)), Float32)
        bias_y = cute.make_rmem_tensor(thr.partition_shape_C((tile_rows, cols)), Float32)
        self.load_bias(bias_h, b1, t, hid, hidden)
        self.load_bias(bias_y, b2, t, cols, channels)

        for tile in range(cta, cute.ceil_div(rows, tile_rows), grid):
            row0 = tile * tile_rows
            f_x = cute.make_rmem_tensor(thr.partition_shape_A((tile_rows, cols)), Float16)
            self.load_a_fragment(f_x, u, row0 + g, t, rows, channels)
            res = cute.make_rmem_tensor(bias_y.shape, Float32)
            self.load_residual(res, residual, row0 + g, t, rows, channels)

            acc_h = cute.make_rmem_tensor(bias_h.shape, Float32)
            acc_h.fill(0.0)
            for k in cutlass.range_constexpr(cols // 16):
                cute.gemm(mma, acc_h, f_x[None, None, k], f_w1[None, None, k], acc_h)
            f_h = cute.make_rmem_tensor(thr.partition_shape_A((tile_rows, hid)), Float16)
            self.hidden_epilogue(acc_h, bias_h, act, f_h)

            acc_y = cute.make_rmem_tensor(bias_y.shape, Float32)
            acc_y.fill(0.0)
            for k in cutlass.range_constexpr(hid // 16):
                cute.gemm(mma, acc_y, f_h[None, None, k], f_w2[None, None, k], acc_y)
            self.store_y(acc_y, bias_y, res, y, row0 + g, t, rows, channels)

    @cute.jit
    def hidden_epilogue(self, acc_h: cute.Tensor, bias_h: cute.Tensor, act: Int32, f_h: cute.Tensor):
        """f_h = fp16(act(acc_h + b1)): GEMM1's accumulators become GEMM2's A fragments, element for element."""
        tensorcore.activate_in_place(acc_h, bias_h, act)
        for i in cutlass.range_constexpr(cute.size(acc_h)):
            f_h[i] = acc_h[i].to(Float16)

    @cute.jit
    def load_run(self, src: cute.Tensor, row: Int32, col: Int32, n: cutlass.Constexpr, rows: Int32, limit: Int32):
        """src[row, col : col + n] in registers, 0 where (row, column) lies outside (rows, limit).

        16-byte rows: one vector access (col is a multiple of n, so the run is wholly inside or outside), under a
        branch that is the same for every lane but at the tensor's last rows and columns. Other rows: n element
        loads that read inside the tensor whatever the lane (an outside one reads row 0 or column 0 instead, and
        its value is replaced by 0): element loads under a branch that differs between lanes made the warp wait
        for them where it rejoined (a first form, measured slower than this one at 32 x 48 padded weights)."""
        run = cute.make_rmem_tensor((n,), src.element_type)
        if cutlass.const_expr(self.aligned):
            run.fill(0.0)
            if row < rows and col < limit:
                cute.autovec_copy(cute.local_tile(src, (1, n), (row, col // n))[0, None], run)
        else:
            safe_row = row if row < rows else 0
            for e in cutlass.range_constexpr(n):
                inside = row < rows and col + e < limit
                run[e] = zero_outside(src[safe_row, col + e if col + e < limit else 0], inside)
        return run

    @cute.jit
    def load_a_fragment(self, frag: cute.Tensor, src: cute.Tensor, row: Int32, t: Int32, rows: Int32, limit: Int32):
        """x's A fragments ((e0, row half, e1), 1, k-block) of rows ``row`` and ``row + 8``, in the run order."""
        for half in cutlass.range_constexpr(2):
            r = row + 8 * half
            for first, blocks in register_groups(self.channels_tile):
                run = self.load_run(src, r, register_run_start(first, blocks, t), 4 * blocks, rows, limit)
                for i in cutlass.range_constexpr(4 * blocks):
                    frag[i % 2 + 2 * half + 4 * (i // 2 % 2), 0, first + i // 4] = run[i]

    @cute.jit
    def load_b_fragment(self, frag: cute.Tensor, src: cute.Tensor, g: Int32, t: Int32, n_padded: cutlass.Constexpr,
                        k_padded: cutlass.Constexpr, n_limit: Int32, k_limit: Int32):
        """A weight's B fragments ((e0, e1), n-tile, k-block): slot g of n-tile j is row register_slot(j, g) of ``src``,
        its K slots in the run order."""
        for j in cutlass.range_constexpr(n_padded // 8):
            row = register_slot(j, g, n_padded)
            for first, blocks in register_groups(k_padded):
                run = self.load_run(src, row, register_run_start(first, blocks, t), 4 * blocks, n_limit, k_limit)
                for i in cutlass.range_constexpr(4 * blocks):
                    frag[i % 4, j, first + i // 4] = run[i]

    @cute.jit
    def load_bias(self, frag: cute.Tensor, bias: cute.Tensor, t: Int32, padded: cutlass.Constexpr, limit: Int32):
        """A bias at the accumulators ((e0, row half), 1, n-tile) of a product whose N order is the run order."""
        as_row = cute.make_tensor(bias.iterator, cute.make_layout((1, limit)))
        for first, blocks in register_groups(padded):
            run = self.load_run(as_row, 0, register_run_start(first, blocks, t), 4 * blocks, 1, limit)
            for i in cutlass.range_constexpr(4 * blocks):
                for half in cutlass.range_constexpr(2):
                    frag[i % 2 + 2 * half, 0, 2 * first + i // 2] = run[i]

    @cute.jit
    def load_residual(self, res: cute.Tensor, residual: cute.Tensor, row: Int32, t: Int32, rows: Int32,
                      limit: Int32):
        """The residual at GEMM2's accumulators, in fp32."""
        for half in cutlass.range_constexpr(2):
            r = row + 8 * half
            for first, blocks in register_groups(self.channels_tile):
                run = self.load_run(residual, r, register_run_start(first, blocks, t), 4 * blocks, rows, limit)
                for i in cutlass.range_constexpr(4 * blocks):
                    res[i % 2 + 2 * half, 0, 2 * first + i // 2] = run[i].to(Float32)

    @cute.jit
    def store_y(self, acc: cute.Tensor, bias: cute.Tensor, res: cute.Tensor, y: cute.Tensor, row: Int32, t: Int32,
                rows: Int32, limit: Int32):
        """y = acc + b2 + residual from GEMM2's accumulators, a run per row and group."""
        for half in cutlass.range_constexpr(2):
            r = row + 8 * half
            for first, blocks in register_groups(self.channels_tile):
                start, n = register_run_start(first, blocks, t), 4 * blocks
                out = cute.make_rmem_tensor((n,), Float32)
                for i in cutlass.range_constexpr(n):
                    k = (i % 2 + 2 * half, 0, 2 * first + i // 2)
                    out[i] = acc[k] + bias[k] + res[k]
                if cutlass.const_expr(self.aligned):
                    if r < rows and start < limit:
                        cute.autovec_copy(out, cute.local_tile(y, (1, n), (r, start // n))[0, None])
                else:
                    for i in cutlass.range_constexpr(n):
                        if r < rows and start + i < limit:
                            y[r, start + i] = out[i]
