"""The operand of a stacked block: ``u = fp16(rmsnorm(s) * g)`` or ``u = fp16(s)`` from the fp32 stream.

Only the compiler's multi-block models need it (a single block takes its fp16 input as the
operand directly). One warp per row: lanes stride the channels, a butterfly sum gives the mean
square, and each lane writes its channels rounded to fp16.
"""

from __future__ import annotations

import dataclasses

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float16, Float32

from ..planning import ceil_div
from .common import DTYPES, Symbols, compile_variant, compiled

WARPS = 8


@dataclasses.dataclass(frozen=True)
class Variant:
    norm: bool
    stream: str = "float32"  # dtype of the residual stream read (float16 for a first block with a norm)

    @property
    def name(self) -> str:
        return f"prologue-{'rmsnorm' if self.norm else 'cast'}_{self.stream}"

    def compile(self, arch: str | None = None):
        s = Symbols()
        stream_in = s.matrix(DTYPES[self.stream], s.rows, s.channels)
        operand = s.matrix(Float16, s.rows, s.channels)
        if self.norm:
            args = (stream_in, s.vector(Float32, s.channels), operand, Float32(1e-6))
            return compile_variant(self.name, RmsNormOperand(), args, arch)
        return compile_variant(self.name, CastOperand(), (stream_in, operand), arch)


def launcher(norm: bool, eps: float, stream: str = "float32"):
    """``run(s, g, u)`` writing the fp16 operand ``u``; ``g`` is ignored without a norm."""
    fn = compiled(Variant(norm, stream))
    if norm:
        return lambda s, g, u: fn(s, g, u, eps)
    return lambda s, g, u: fn(s, u)


class RowsKernel:
    @cute.jit
    def rows_op(self, s: cute.Tensor, weight: cute.Tensor | None, u: cute.Tensor, eps: Float32):
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        lane = tid % 32
        row = cta * WARPS + tid // 32
        rows, channels = s.shape
        if row < rows:
            scale = Float32(1.0)
            if cutlass.const_expr(weight is not None):
                total = Float32(0.0)
                for c in range(lane, channels, 32):
                    v = s[row, c].to(Float32)
                    total = total + v * v
                total = cute.arch.warp_reduction_sum(total)
                scale = cute.math.rsqrt(total / Float32(channels) + eps)
            for c in range(lane, channels, 32):
                value = s[row, c].to(Float32) * scale
                if cutlass.const_expr(weight is not None):
                    value = value * weight[c]
                u[row, c] = value.to(Float16)


class RmsNormOperand(RowsKernel):
    @cute.jit
    def __call__(self, s: cute.Tensor, weight: cute.Tensor, u: cute.Tensor, eps: Float32, stream: cuda.CUstream):
        self.kernel(s, weight, u, eps).launch(grid=[ceil_div(s.shape[0], WARPS), 1, 1], block=[WARPS * 32, 1, 1],
                                              stream=stream)

    @cute.kernel
    def kernel(self, s: cute.Tensor, weight: cute.Tensor, u: cute.Tensor, eps: Float32):
        self.rows_op(s, weight, u, eps)


class CastOperand(RowsKernel):
    @cute.jit
    def __call__(self, s: cute.Tensor, u: cute.Tensor, stream: cuda.CUstream):
        self.kernel(s, u).launch(grid=[ceil_div(s.shape[0], WARPS), 1, 1], block=[WARPS * 32, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, s: cute.Tensor, u: cute.Tensor):
        self.rows_op(s, None, u, Float32(0.0))
