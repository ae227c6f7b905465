"""The operand of a stacked block: ``u = fp16(rmsnorm(s) * g)`` or ``u = fp16(s)`` from the fp32 stream.

Only the compiler's multi-block models need it (a single block takes its fp16 input as the
operand directly). ``split`` warps a row (1 to ``WARPS``, a runtime argument: ``row_split``): lanes stride the
channels, ``UNROLL`` loads of a lane issued at once, a butterfly sum and (split > 1) the split
warps' sums in shared memory give the mean square, and each lane writes its channels rounded to fp16. At decode
rows a warp a row left a handful of warps on the GPU, each walking a row one dependent load at a time (a block's
prologue took about 10 us at one row of 512 channels on an H100, `reports/h100/stack-profile/`); many rows keep
a warp a row. With ``pdl`` (the per-block chain's programmatic dependent launch, ``compile_model(pdl=True)``) the
kernel is launched to start while the block kernel before it runs, lets the next one start at its own start, and
waits for the kernel before it to finish before its first read of the stream (and its first write of the operand,
which that kernel may still read).
"""

from __future__ import annotations

import dataclasses
import functools

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float16, Float32, Int32
from cutlass.memory import SmemAllocator

from ..planning import ceil_div
from .common import DTYPES, Symbols, compile_variant, compiled, gather_clamped

WARPS = 8
UNROLL = 8  # loads a lane issues at once before it uses them (``common.gather_clamped``)


@dataclasses.dataclass(frozen=True)
class Variant:
    norm: bool
    stream: str = "float32"  # dtype of the residual stream read (float16 for a first block with a norm)
    pdl: bool = False  # programmatic dependent launch: starts early, waits for the kernel before at its first read

    @property
    def name(self) -> str:
        return f"prologue-{'rmsnorm' if self.norm else 'cast'}_{self.stream}{'_pdl' if self.pdl else ''}"

    def compile(self, arch: str | None = None):
        s = Symbols()
        stream_in = s.matrix(DTYPES[self.stream], s.rows, s.channels)
        operand = s.matrix(Float16, s.rows, s.channels)
        if self.norm:
            args = (stream_in, s.vector(Float32, s.channels), operand, Float32(1e-6), Int32(1))
            return compile_variant(self.name, RmsNormOperand(self.pdl), args, arch)
        return compile_variant(self.name, CastOperand(self.pdl), (stream_in, operand, Int32(1)), arch)


@functools.cache
def _sm_count(device_index: int) -> int:
    import torch

    return torch.cuda.get_device_properties(device_index).multi_processor_count


def row_split(rows: int, sms: int) -> int:
    """Warps a row: as many (a power of two up to ``WARPS``) as keep the grid within about a CTA of ``WARPS`` warps
    an SM, so that few rows still spread their loads over a CTA each; a warp a row past ``WARPS`` / 2 x SMs rows."""
    split = WARPS
    while split > 1 and rows * split > WARPS * sms:
        split //= 2
    return split


def launcher(norm: bool, eps: float, stream: str = "float32", pdl: bool = False):
    """``run(s, g, u)`` writing the fp16 operand ``u``; ``g`` is ignored without a norm."""
    fn = compiled(Variant(norm, stream, pdl))

    def split_of(s):
        return row_split(s.shape[0], _sm_count(s.device.index if s.device.index is not None else 0))

    if norm:
        return lambda s, g, u: fn(s, g, u, eps, split_of(s))
    return lambda s, g, u: fn(s, u, split_of(s))


class RowsKernel:
    def __init__(self, pdl: bool = False):
        self.pdl = pdl

    @cute.jit
    def rows_op(self, s: cute.Tensor, weight: cute.Tensor | None, u: cute.Tensor, eps: Float32, split: Int32):
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()  # the next block kernel may launch (and wait) now
            cute.arch.griddepcontrol_wait()  # the stream is the kernel before's output, the operand its input
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        lane, warp = tid % 32, tid // 32
        row = cta * (WARPS // split) + warp // split
        rows, channels = s.shape
        r = cutlass.min(row, rows - 1)  # a warp past the rows reads the last one and writes nothing
        first, stride = warp % split * 32 + lane, 32 * split  # this lane's channels: first, first + stride, ...
        scale = Float32(1.0)
        if cutlass.const_expr(weight is not None):
            total = Float32(0.0)
            for c0 in cutlass.range(first, channels, stride * UNROLL):
                values = gather_clamped(s, r, c0, stride, UNROLL, channels)
                for k in cutlass.range_constexpr(UNROLL):
                    if c0 + k * stride < channels:
                        total = total + values[k] * values[k]
            total = cute.arch.warp_reduction_sum(total)
            sums = SmemAllocator().allocate_tensor(Float32, cute.make_layout(WARPS), byte_alignment=16)
            if lane == 0:
                sums[warp] = total
            cute.arch.sync_threads()  # every warp arrives, rows or not
            total = Float32(0.0)
            for k in cutlass.range(split):
                total = total + sums[warp // split * split + k]
            scale = cute.math.rsqrt(total / Float32(channels) + eps)
        if row < rows:
            for c0 in cutlass.range(first, channels, stride * UNROLL):
                values = gather_clamped(s, r, c0, stride, UNROLL, channels)
                gains = (gather_clamped(weight, None, c0, stride, UNROLL, channels)
                         if cutlass.const_expr(weight is not None) else None)
                for k in cutlass.range_constexpr(UNROLL):
                    c = c0 + k * stride
                    if c < channels:
                        value = values[k] * scale
                        if cutlass.const_expr(weight is not None):
                            value = value * gains[k]
                        u[row, c] = value.to(Float16)


class RmsNormOperand(RowsKernel):
    @cute.jit
    def __call__(self, s: cute.Tensor, weight: cute.Tensor, u: cute.Tensor, eps: Float32, split: Int32,
                 stream: cuda.CUstream):
        self.kernel(s, weight, u, eps, split).launch(grid=[ceil_div(s.shape[0], WARPS // split), 1, 1],
                                                     block=[WARPS * 32, 1, 1], use_pdl=self.pdl, stream=stream)

    @cute.kernel
    def kernel(self, s: cute.Tensor, weight: cute.Tensor, u: cute.Tensor, eps: Float32, split: Int32):
        self.rows_op(s, weight, u, eps, split)


class CastOperand(RowsKernel):
    @cute.jit
    def __call__(self, s: cute.Tensor, u: cute.Tensor, split: Int32, stream: cuda.CUstream):
        self.kernel(s, u, split).launch(grid=[ceil_div(s.shape[0], WARPS // split), 1, 1], block=[WARPS * 32, 1, 1],
                                        use_pdl=self.pdl, stream=stream)

    @cute.kernel
    def kernel(self, s: cute.Tensor, u: cute.Tensor, split: Int32):
        self.rows_op(s, None, u, Float32(0.0), split)
