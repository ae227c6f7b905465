"""RMSNorm over the last dimension: y = h / sqrt(mean(h^2) + eps) * w, with h = x (+ residual).

One row reduction (the sum of squares, fp32). With a residual, h is written to ``residual_out`` in
x's dtype as soon as it is formed, and y is computed from the fp32 h. Streamed rows re-read h in
the output pass from ``residual_out`` (which this thread wrote) or from x, so an in-place residual
update (residual_out aliasing x or residual) stays correct. Given ``rstd`` (an (M,) fp32 tensor), the
kernel also stores each row's 1 / sqrt(mean(h^2) + eps) there, for the backward.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr

from .base import ADD, RowKernel


class RMSNorm(RowKernel):
    stages = 1
    name = "rmsnorm"

    def __init__(self, dtype, n: int, vec: int, weight_dtype=None, residual: bool = False, tuning=None):
        super().__init__(dtype, n, vec, tuning)
        self.weight_dtype, self.residual = weight_dtype, residual
        if residual:  # x and the residual both in registers: 64 would spill, keep the natural count
            self.min_ctas_per_sm = 1

    def __repr__(self) -> str:
        w = self.weight_dtype.__name__ if self.weight_dtype else "none"
        return f"{super().__repr__()}_w{w}{'_res' if self.residual else ''}"

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor | None, mR: cute.Tensor | None, mO: cute.Tensor,
                 mRO: cute.Tensor | None, mRstd: cute.Tensor | None, eps: Float32, stream: cuda.CUstream):
        self.launch(self.kernel(mX, mW, mR, mO, mRO, mRstd, eps), mX.shape[0], stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor | None, mR: cute.Tensor | None, mO: cute.Tensor,
               mRO: cute.Tensor | None, mRstd: cute.Tensor | None, eps: Float32):
        rows = mX.shape[0]
        thr, block, first = self.thread_slice()
        buffer, mbar = self.reduction_storage()
        gW = self.broadcast_rows(mW)
        if const_expr(self.tiles == 1):
            row_ok, cols = self.predicates(thr, rows, block, first)
            w = self.early_vector(thr, gW, first, cols)
            h = self.combine(thr, mX, mR, mRO, block, first, row_ok, cols)
            ss = self.row_reduce((h * h).reduce(cute.ReductionOp.ADD, 0.0, 0), ADD, 0.0, 0, buffer, mbar)
            rstd = cute.math.rsqrt(ss / self.n + eps, fastmath=True)
            self.store_row_value(thr, mRstd, rows, block, first, rstd)
            y = h * rstd
            if const_expr(self.vectors == "late"):
                self.store_affine(y, thr, gW, None, first, self.part(thr, mO, block, first), row_ok, cols)
            else:
                self.store(self.scale(y, w), self.part(thr, mO, block, first), row_ok, cols)
        else:
            ss = Float32(0.0)
            for t in cutlass.range(self.tiles):
                row_ok, cols = self.predicates(thr, rows, block, first + t)
                h = self.combine(thr, mX, mR, mRO, block, first + t, row_ok, cols)
                ss = ss + (h * h).reduce(cute.ReductionOp.ADD, 0.0, 0)
            rstd = cute.math.rsqrt(self.row_reduce(ss, ADD, 0.0, 0, buffer, mbar) / self.n + eps, fastmath=True)
            self.store_row_value(thr, mRstd, rows, block, first, rstd)
            mH = mRO if const_expr(mRO is not None) else mX
            for t in cutlass.range(self.tiles):
                row_ok, cols = self.predicates(thr, rows, block, first + t)
                h = self.load(self.part(thr, mH, block, first + t), row_ok, cols, 0.0).load().to(Float32)
                y = self.scale(h * rstd, self.load_vector(thr, gW, first + t, cols))
                self.store(y, self.part(thr, mO, block, first + t), row_ok, cols)

    @cute.jit
    def combine(self, thr, mX, mR, mRO, block, tile, row_ok, cols):
        """h = x (+ residual) in fp32 for one tile; with a residual, also writes h to residual_out."""
        h = self.load(self.part(thr, mX, block, tile), row_ok, cols, 0.0).load().to(Float32)
        if const_expr(mR is not None):
            h = h + self.load(self.part(thr, mR, block, tile), row_ok, cols, 0.0).load().to(Float32)
            self.store(h, self.part(thr, mRO, block, tile), row_ok, cols)
        return h

    @cute.jit
    def scale(self, y, w):
        return y if const_expr(w is None) else y * w
