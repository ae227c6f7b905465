"""Softmax backward from the forward's output: dx = y * (dy - sum(dy * y)).

One row reduction; one CTA (or cluster of CTAs, each holding its columns of the row) per row block: no
vector gradients, so no persistent loop. Rows past a cluster's registers are streamed on one CTA and read y
and dy twice (the second pass mostly from L2).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr

from .base import ADD, GradKernel


class SoftmaxBackward(GradKernel):
    reductions = 1
    name = "softmax_backward"

    @cute.jit
    def __call__(self, mY: cute.Tensor, mDY: cute.Tensor, mDX: cute.Tensor, stream: cuda.CUstream):
        self.launch(self.kernel(mY, mDY, mDX), mY.shape[0], stream)

    @cute.kernel
    def kernel(self, mY: cute.Tensor, mDY: cute.Tensor, mDX: cute.Tensor):
        rows = mY.shape[0]
        thr, block, first = self.thread_slice()
        buffer, mbar = self.reduction_storage()
        if const_expr(self.tiles == 1):
            row_ok, cols = self.predicates(thr, rows, block, first)
            y, dy = self.pair(thr, mY, mDY, block, first, row_ok, cols)
            dot = self.row_reduce((y * dy).reduce(cute.ReductionOp.ADD, 0.0, 0), ADD, 0.0, 0, buffer, mbar)
            self.store(y * (dy - dot), self.part(thr, mDX, block, first), row_ok, cols)
        else:
            dot = Float32(0.0)
            for t in cutlass.range(self.tiles):
                row_ok, cols = self.predicates(thr, rows, block, t)
                y, dy = self.pair(thr, mY, mDY, block, t, row_ok, cols)
                dot = dot + (y * dy).reduce(cute.ReductionOp.ADD, 0.0, 0)
            dot = self.row_reduce(dot, ADD, 0.0, 0, buffer, None)
            for t in cutlass.range(self.tiles):
                row_ok, cols = self.predicates(thr, rows, block, t)
                y, dy = self.pair(thr, mY, mDY, block, t, row_ok, cols)
                self.store(y * (dy - dot), self.part(thr, mDX, block, t), row_ok, cols)

    @cute.jit
    def pair(self, thr, mY, mDY, block, tile, row_ok, cols):
        """(y, dy) in fp32 for one tile, 0 past N."""
        y = self.load(self.part(thr, mY, block, tile), row_ok, cols, 0.0).load().to(Float32)
        dy = self.load(self.part(thr, mDY, block, tile), row_ok, cols, 0.0).load().to(Float32)
        return y, dy
