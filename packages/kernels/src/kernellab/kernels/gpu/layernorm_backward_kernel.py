"""LayerNorm backward from the forward's mean and rstd: with xhat = (x - mean) * rstd and g = dy * w,

    dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
    dweight = sum over rows of dy * xhat,  dbias = sum over rows of dy (fp32 partials per CTA row, summed
    after a grid barrier or, after a cluster kernel, by a second launch)

Two row sums (of g and g * xhat), exchanged between warps together. Columns past N load dy as 0, so g
and both terms are 0 there although xhat is not.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from .base import ADD, GradKernel


class LayerNormBackward(GradKernel):
    reductions = 2
    name = "layernorm_backward"
    wide_16_bit = True

    def __init__(self, dtype, n: int, vec: int, weight_dtype=None, bias: bool = False, tuning=None,
                 spread_sum: bool = False):
        super().__init__(dtype, n, vec, tuning, spread_sum)
        self.weight_dtype, self.bias = weight_dtype, bias

    def __repr__(self) -> str:
        w = self.weight_dtype.__name__ if self.weight_dtype else "none"
        return f"{super().__repr__()}_w{w}{'_db' if self.bias else ''}"

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor | None, mDY: cute.Tensor, mMean: cute.Tensor,
                 mRstd: cute.Tensor, mDX: cute.Tensor, mDW: cute.Tensor | None, mDB: cute.Tensor | None,
                 mWeightGrad: cute.Tensor | None, mBiasGrad: cute.Tensor | None, mSync: cute.Tensor | None,
                 grid: Int32, stream: cuda.CUstream):
        """mDW / mDB: (grid * rows_per_cta, N) fp32 partials; mWeightGrad / mBiasGrad: dweight / dbias in their
        dtypes (None where not wanted); mSync: the grid barrier's two int32 words (None with neither)."""
        self.launch_persistent(self.kernel(mX, mW, mDY, mMean, mRstd, mDX, mDW, mDB, mWeightGrad, mBiasGrad, mSync,
                                           grid), grid, stream, self.wanted((mDW, mWeightGrad), (mDB, mBiasGrad)))

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor | None, mDY: cute.Tensor, mMean: cute.Tensor,
               mRstd: cute.Tensor, mDX: cute.Tensor, mDW: cute.Tensor | None, mDB: cute.Tensor | None,
               mWeightGrad: cute.Tensor | None, mBiasGrad: cute.Tensor | None, mSync: cute.Tensor | None,
               grid: Int32):
        rows = mX.shape[0]
        thr, bidx, first = self.thread_slice()
        buffer, mbar = self.reduction_storage()
        blocks = cute.ceil_div(rows, self.rows_per_cta)
        gW = self.broadcast_rows(mW)
        _, cols = self.predicates(thr, rows, bidx, first)  # the columns of a held row (the same for every row)
        w = None
        if const_expr(self.tiles == 1 and self.spare_registers):
            w = self.load_vector(thr, gW, first, cols)
        dw, db = self.accumulator(thr, mDW), self.accumulator(thr, mDB)
        if const_expr(self.tiles == 1):
            source = self.row_source(thr, (mX, mDY), (mMean, mRstd), rows, bidx, first, cols, grid)
            for block in cutlass.range(bidx, blocks, grid):
                visit = (block - bidx) // grid
                stage = visit % 2 * 2
                row_ok, _ = self.predicates(thr, rows, block, first)
                x, dy, rstd = self.next_row(thr, source, (mX, mDY), (mMean, mRstd), rows, block, visit, grid, first,
                                            cols, row_ok, lambda v, r: ((v[0] - r[0]) * r[1], v[1], r[1]))
                row_w = w if const_expr(self.spare_registers) else self.load_vector(thr, gW, first, cols)
                g = dy if const_expr(row_w is None) else dy * row_w
                sum_g, sum_gx = self.row_reduce((g.reduce(cute.ReductionOp.ADD, 0.0, 0),
                                                 (g * x).reduce(cute.ReductionOp.ADD, 0.0, 0)), ADD, 0.0,
                                                stage, buffer, mbar, self.phase(visit))
                dx = (g - sum_g / self.n - x * (sum_gx / self.n)) * rstd
                self.store(dx, self.part(thr, mDX, block, first), row_ok, cols)
                self.partials(thr, mDW, bidx, first, cols, block != bidx, dy * x, dw)
                self.partials(thr, mDB, bidx, first, cols, block != bidx, dy, db)
        else:
            for block in cutlass.range(bidx, blocks, grid):
                stage = ((block - bidx) // grid) % 2 * 2
                later = block != bidx
                mean = self.load_row_value(thr, mMean, rows, block, 0, 0.0)
                rstd = self.load_row_value(thr, mRstd, rows, block, 0, 1.0)
                sum_g, sum_gx = Float32(0.0), Float32(0.0)
                for t in cutlass.range(self.tiles):
                    row_ok, tcols = self.predicates(thr, rows, block, t)
                    x, dy, g = self.terms(thr, mX, mDY, self.load_vector(thr, gW, t, tcols), mean, rstd, block, t,
                                          row_ok, tcols)
                    sum_g = sum_g + g.reduce(cute.ReductionOp.ADD, 0.0, 0)
                    sum_gx = sum_gx + (g * x).reduce(cute.ReductionOp.ADD, 0.0, 0)
                sum_g, sum_gx = self.row_reduce((sum_g, sum_gx), ADD, 0.0, stage, buffer, None)
                mean_g, mean_gx = sum_g / self.n, sum_gx / self.n
                for t in cutlass.range(self.tiles):
                    row_ok, tcols = self.predicates(thr, rows, block, t)
                    x, dy, g = self.terms(thr, mX, mDY, self.load_vector(thr, gW, t, tcols), mean, rstd, block, t,
                                          row_ok, tcols)
                    self.store((g - mean_g - x * mean_gx) * rstd, self.part(thr, mDX, block, t), row_ok, tcols)
                    self.partials(thr, mDW, bidx, t, tcols, later, dy * x, None)
                    self.partials(thr, mDB, bidx, t, tcols, later, dy, None)
        self.store_accumulator(thr, mDW, dw, bidx, first, cols)
        self.store_accumulator(thr, mDB, db, bidx, first, cols)
        self.finish_rows(self.wanted((mDW, mWeightGrad), (mDB, mBiasGrad)), mSync, grid)

    @cute.jit
    def terms(self, thr, mX, mDY, w, mean, rstd, block, tile, row_ok, cols):
        """(xhat, dy, g = dy * w) in fp32 for one tile; dy (so g) is 0 past N and past M."""
        x = (self.load(self.part(thr, mX, block, tile), row_ok, cols, 0.0).load().to(Float32) - mean) * rstd
        dy = self.load(self.part(thr, mDY, block, tile), row_ok, cols, 0.0).load().to(Float32)
        g = dy if const_expr(w is None) else dy * w
        return x, dy, g
