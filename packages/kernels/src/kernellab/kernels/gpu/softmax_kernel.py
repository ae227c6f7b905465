"""Softmax over the last dimension: y = exp(x - max) / sum(exp(x - max)), fp32 inside.

Two row reductions (max, then the sum of exponentials). Rows held in registers compute both from
the same registers; streamed rows keep a per-thread running (max, sum) over the tiles (the sum is
rescaled when the max grows) and reduce the pairs, then a second pass writes y.
A row of -inf gives NaN and a NaN anywhere in a row gives NaN, as in torch.
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr

from .base import ADD, RowKernel, fmax

LOG2_E = math.log2(math.e)
NEG_INF = float("-inf")
FLT_MAX = 3.4028234663852886e38


class Softmax(RowKernel):
    stages = 2
    name = "softmax"

    @cute.jit
    def __call__(self, mX: cute.Tensor, mO: cute.Tensor, stream: cuda.CUstream):
        self.launch(self.kernel(mX, mO), mX.shape[0], stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mO: cute.Tensor):
        rows = mX.shape[0]
        thr, block, first = self.thread_slice()
        buffer, mbar = self.reduction_storage()
        if const_expr(self.tiles == 1):
            row_ok, cols = self.predicates(thr, rows, block, first)
            tXgO = self.part(thr, mO, block, first)
            x = self.load(self.part(thr, mX, block, first), row_ok, cols, NEG_INF).load().to(Float32)
            top = self.row_reduce(x.reduce(cute.ReductionOp.MAX, NEG_INF, 0), fmax, NEG_INF, 0, buffer, mbar)
            e = cute.math.exp2((x - top) * LOG2_E, fastmath=True)
            total = self.row_reduce(e.reduce(cute.ReductionOp.ADD, 0.0, 0), ADD, 0.0, 1, buffer, mbar)
            self.store(e * (1.0 / total), tXgO, row_ok, cols)
        else:
            top = Float32(NEG_INF)
            total = Float32(0.0)
            for t in cutlass.range(self.tiles):
                row_ok, cols = self.predicates(thr, rows, block, first + t)
                x = self.load(self.part(thr, mX, block, first + t), row_ok, cols, NEG_INF).load().to(Float32)
                new_top = fmax(top, x.reduce(cute.ReductionOp.MAX, NEG_INF, 0))
                # a thread that has seen only -inf so far keeps sum 0 (exp(-inf - -inf) would be NaN)
                shift = fmax(new_top, Float32(-FLT_MAX))
                e = cute.math.exp2((x - shift) * LOG2_E, fastmath=True)
                total = total * cute.math.exp2((top - shift) * LOG2_E, fastmath=True) + e.reduce(
                    cute.ReductionOp.ADD, 0.0, 0)
                top = new_top
            row_top = self.row_reduce(top, fmax, NEG_INF, 0, buffer, mbar)
            total = total * cute.math.exp2((top - row_top) * LOG2_E, fastmath=True)
            total = self.row_reduce(total, ADD, 0.0, 1, buffer, mbar)
            scale = 1.0 / total
            for t in cutlass.range(self.tiles):
                row_ok, cols = self.predicates(thr, rows, block, first + t)
                x = self.load(self.part(thr, mX, block, first + t), row_ok, cols, NEG_INF).load().to(Float32)
                e = cute.math.exp2((x - row_top) * LOG2_E, fastmath=True)
                self.store(e * scale, self.part(thr, mO, block, first + t), row_ok, cols)
