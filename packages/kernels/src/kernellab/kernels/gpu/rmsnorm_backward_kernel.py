"""RMSNorm backward from the forward's rstd: with xhat = x * rstd and g = dy * w,

    dx = rstd * (g - xhat * mean(g * xhat)) (+ dh, the gradient of the residual output h = x + residual)
    dweight = sum over rows of dy * xhat (fp32 partials per CTA row, summed after a grid barrier or, after a
    cluster kernel, by a second launch)

One row reduction (the mean of g * xhat). x is the normalized input (h for the residual form).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from .base import ADD, GradKernel


class RMSNormBackward(GradKernel):
    reductions = 1
    name = "rmsnorm_backward"
    wide_16_bit = True

    def __init__(self, dtype, n: int, vec: int, weight_dtype=None, residual: bool = False, tuning=None,
                 spread_sum: bool = False):
        super().__init__(dtype, n, vec, tuning, spread_sum)
        self.weight_dtype, self.residual = weight_dtype, residual

    def __repr__(self) -> str:
        w = self.weight_dtype.__name__ if self.weight_dtype else "none"
        return f"{super().__repr__()}_w{w}{'_res' if self.residual else ''}"

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor | None, mDY: cute.Tensor, mRstd: cute.Tensor,
                 mDH: cute.Tensor | None, mDX: cute.Tensor, mDW: cute.Tensor | None, mWeightGrad: cute.Tensor | None,
                 mSync: cute.Tensor | None, grid: Int32, stream: cuda.CUstream):
        """mDW: the (grid * rows_per_cta, N) fp32 partials; mWeightGrad: dweight in the weight's dtype; mSync:
        the grid barrier's two int32 words (all three None without a weight)."""
        self.launch_persistent(self.kernel(mX, mW, mDY, mRstd, mDH, mDX, mDW, mWeightGrad, mSync, grid), grid,
                               stream, self.wanted((mDW, mWeightGrad)))

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor | None, mDY: cute.Tensor, mRstd: cute.Tensor,
               mDH: cute.Tensor | None, mDX: cute.Tensor, mDW: cute.Tensor | None, mWeightGrad: cute.Tensor | None,
               mSync: cute.Tensor | None, grid: Int32):
        rows = mX.shape[0]
        thr, bidx, first = self.thread_slice()
        buffer, mbar = self.reduction_storage()
        blocks = cute.ceil_div(rows, self.rows_per_cta)
        gW = self.broadcast_rows(mW)
        _, cols = self.predicates(thr, rows, bidx, first)  # the columns of a held row (the same for every row)
        w = None
        if const_expr(self.tiles == 1 and self.spare_registers):
            w = self.load_vector(thr, gW, first, cols)
        dw = self.accumulator(thr, mDW)
        if const_expr(self.tiles == 1):
            source = self.row_source(thr, (mX, mDY), (mRstd,), rows, bidx, first, cols, grid)
            for block in cutlass.range(bidx, blocks, grid):
                visit = (block - bidx) // grid
                half = visit % 2
                row_ok, _ = self.predicates(thr, rows, block, first)
                x, dy, rstd = self.next_row(thr, source, (mX, mDY), (mRstd,), rows, block, visit, grid, first, cols,
                                            row_ok, lambda v, r: (v[0] * r[0], v[1], r[0]))
                row_w = w if const_expr(self.spare_registers) else self.load_vector(thr, gW, first, cols)
                g = dy if const_expr(row_w is None) else dy * row_w
                dot = self.row_reduce((g * x).reduce(cute.ReductionOp.ADD, 0.0, 0), ADD, 0.0, half, buffer, mbar,
                                      self.phase(visit))
                self.store_dx(thr, mDH, mDX, x, g, rstd, dot / self.n, block, first, row_ok, cols)
                self.partials(thr, mDW, bidx, first, cols, block != bidx, dy * x, dw)
        else:
            for block in cutlass.range(bidx, blocks, grid):
                half = ((block - bidx) // grid) % 2
                rstd = self.load_row_value(thr, mRstd, rows, block, 0, 1.0)
                dot = Float32(0.0)
                for t in cutlass.range(self.tiles):
                    row_ok, tcols = self.predicates(thr, rows, block, t)
                    x, dy, g = self.terms(thr, mX, mDY, self.load_vector(thr, gW, t, tcols), rstd, block, t,
                                          row_ok, tcols)
                    dot = dot + (g * x).reduce(cute.ReductionOp.ADD, 0.0, 0)
                dot = self.row_reduce(dot, ADD, 0.0, half, buffer, None) / self.n
                for t in cutlass.range(self.tiles):
                    row_ok, tcols = self.predicates(thr, rows, block, t)
                    x, dy, g = self.terms(thr, mX, mDY, self.load_vector(thr, gW, t, tcols), rstd, block, t,
                                          row_ok, tcols)
                    self.store_dx(thr, mDH, mDX, x, g, rstd, dot, block, t, row_ok, tcols)
                    self.partials(thr, mDW, bidx, t, tcols, block != bidx, dy * x, None)
        self.store_accumulator(thr, mDW, dw, bidx, first, cols)
        self.finish_rows(self.wanted((mDW, mWeightGrad)), mSync, grid)

    @cute.jit
    def terms(self, thr, mX, mDY, w, rstd, block, tile, row_ok, cols):
        """(xhat, dy, g = dy * w) in fp32 for one tile; 0 past N and past M (dy loads as 0 there)."""
        x = self.load(self.part(thr, mX, block, tile), row_ok, cols, 0.0).load().to(Float32) * rstd
        dy = self.load(self.part(thr, mDY, block, tile), row_ok, cols, 0.0).load().to(Float32)
        g = dy if const_expr(w is None) else dy * w
        return x, dy, g

    @cute.jit
    def store_dx(self, thr, mDH, mDX, xhat, g, rstd, mean_gx, block, tile, row_ok, cols):
        dx = (g - xhat * mean_gx) * rstd
        if const_expr(mDH is not None):
            dx = dx + self.load(self.part(thr, mDH, block, tile), row_ok, cols, 0.0).load().to(Float32)
        self.store(dx, self.part(thr, mDX, block, tile), row_ok, cols)
