"""LayerNorm over the last dimension: y = (x - mean) / sqrt(var + eps) * w + b.

Exact two-pass statistics in fp32: the mean first, then the mean of squared deviations from it
(no E[x^2] - E[x]^2 cancellation). Rows held in registers run both passes on the same registers;
streamed rows read x once per pass. Columns past N are zeroed before the deviation sum, so the
padding of a row tail never enters the variance. Given ``mean`` and ``rstd`` ((M,) fp32 tensors), the
kernel also stores each row's mean and 1 / sqrt(var + eps) there, for the backward.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr

from .base import ADD, RowKernel


class LayerNorm(RowKernel):
    stages = 2
    name = "layernorm"
    # bf16 on the H200, graph throughput of the held plan against 8-value tiles (tools/device/norm_sweep.py,
    # 3 rounds): N=12288 0.86 -> 0.92 of copy, N=16384 0.93 -> 0.95. At N=8192 (256 threads, four rows per SM)
    # held stays ahead (0.97 against 0.96), as it does for fp32 rows and for softmax.
    stream_values = 8

    def __init__(self, dtype, n: int, vec: int, weight_dtype=None, bias_dtype=None, tuning=None):
        super().__init__(dtype, n, vec, tuning)
        self.weight_dtype, self.bias_dtype = weight_dtype, bias_dtype

    def __repr__(self) -> str:
        w = self.weight_dtype.__name__ if self.weight_dtype else "none"
        b = self.bias_dtype.__name__ if self.bias_dtype else "none"
        return f"{super().__repr__()}_w{w}_b{b}"

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor | None, mB: cute.Tensor | None, mO: cute.Tensor,
                 mMean: cute.Tensor | None, mRstd: cute.Tensor | None, eps: Float32, stream: cuda.CUstream):
        self.launch(self.kernel(mX, mW, mB, mO, mMean, mRstd, eps), mX.shape[0], stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor | None, mB: cute.Tensor | None, mO: cute.Tensor,
               mMean: cute.Tensor | None, mRstd: cute.Tensor | None, eps: Float32):
        rows = mX.shape[0]
        thr, block, first = self.thread_slice()
        buffer, mbar = self.reduction_storage()
        gW, gB = self.broadcast_rows(mW), self.broadcast_rows(mB)
        if const_expr(self.tiles == 1):
            row_ok, cols = self.predicates(thr, rows, block, first)
            w, b = self.early_vector(thr, gW, first, cols), self.early_vector(thr, gB, first, cols)
            x = self.load(self.part(thr, mX, block, first), row_ok, cols, 0.0).load().to(Float32)
            mean = self.row_reduce(x.reduce(cute.ReductionOp.ADD, 0.0, 0), ADD, 0.0, 0, buffer, mbar) / self.n
            d = self.deviation(x, mean, cols)
            ss = self.row_reduce((d * d).reduce(cute.ReductionOp.ADD, 0.0, 0), ADD, 0.0, 1, buffer, mbar)
            rstd = cute.math.rsqrt(ss / self.n + eps, fastmath=True)
            self.store_row_value(thr, mMean, rows, block, first, mean)
            self.store_row_value(thr, mRstd, rows, block, first, rstd)
            y = d * rstd
            if const_expr(self.vectors == "late"):
                self.store_affine(y, thr, gW, gB, first, self.part(thr, mO, block, first), row_ok, cols)
            else:
                self.store(self.affine(y, w, b), self.part(thr, mO, block, first), row_ok, cols)
        else:
            total = Float32(0.0)
            for t in cutlass.range(self.tiles):
                row_ok, cols = self.predicates(thr, rows, block, first + t)
                x = self.load(self.part(thr, mX, block, first + t), row_ok, cols, 0.0).load().to(Float32)
                total = total + x.reduce(cute.ReductionOp.ADD, 0.0, 0)
            mean = self.row_reduce(total, ADD, 0.0, 0, buffer, mbar) / self.n
            ss = Float32(0.0)
            for t in cutlass.range(self.tiles):
                row_ok, cols = self.predicates(thr, rows, block, first + t)
                x = self.load(self.part(thr, mX, block, first + t), row_ok, cols, 0.0).load().to(Float32)
                d = self.deviation(x, mean, cols)
                ss = ss + (d * d).reduce(cute.ReductionOp.ADD, 0.0, 0)
            rstd = cute.math.rsqrt(self.row_reduce(ss, ADD, 0.0, 1, buffer, mbar) / self.n + eps, fastmath=True)
            self.store_row_value(thr, mMean, rows, block, first, mean)
            self.store_row_value(thr, mRstd, rows, block, first, rstd)
            for t in cutlass.range(self.tiles):
                row_ok, cols = self.predicates(thr, rows, block, first + t)
                x = self.load(self.part(thr, mX, block, first + t), row_ok, cols, 0.0).load().to(Float32)
                w, b = self.load_vector(thr, gW, first + t, cols), self.load_vector(thr, gB, first + t, cols)
                self.store(self.affine((x - mean) * rstd, w, b), self.part(thr, mO, block, first + t), row_ok, cols)

    @cute.jit
    def deviation(self, x, mean, cols):
        """x - mean with the columns past N set to 0 (they are 0 in x, which is not 0 - mean)."""
        d = cute.make_rmem_tensor(x.shape, Float32)
        d.store(x - mean)
        self.zero_out_of_range(d, cols)
        return d.load()

    @cute.jit
    def affine(self, y, w, b):
        if const_expr(w is not None):
            y = y * w
        if const_expr(b is not None):
            y = y + b
        return y
