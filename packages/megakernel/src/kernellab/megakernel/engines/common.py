"""What every CuTe DSL engine shares: the activation in device code, fake tensors for compiling
without a GPU, and the per-process cache of compiled variants with their cubins (kept on disk under
``cache.artifact_dir``).

A *variant* is everything an engine fixes at compile time (tile shape, where the hidden lives, the
residual dtype). For the tensor-core engines, rows, channels, hidden and the activation are runtime
values, so one compiled variant serves every shape it is planned for; the CUDA-core engines compile
one per layer size (channels, hidden and rows per tile fixed; rows and the activation at run time),
whose loops and index arithmetic the compiler then settles. Variants compile for the TVM-FFI calling convention:
they take torch tensors and launch on the current torch stream (so CUDA-graph capture just works).
"""

from __future__ import annotations

import math
import os
import warnings

import cutlass
import cutlass.cute as cute
from cutlass import Float16, Float32, Int32
from cutlass.base_dsl.ast_helpers import DSLOptimizationWarning

from ..model import ACTIVATION_CODES, GELU_TANH_CUBIC, GELU_TANH_SCALE
from .cache import artifact_dir

RELU, GELU, SILU = (ACTIVATION_CODES[name] for name in ("relu", "gelu", "silu"))
DTYPES = {"float16": Float16, "float32": Float32}


# ---- device code ---------------------------------------------------------------------------------

def relu(v):
    return cute.arch.fmax(v, Float32(0.0))


LOG2_E = math.log2(math.e)


def sigmoid(z):
    """1 / (1 + e^-z) by the hardware's ex2.approx and rcp.approx: a few instructions instead of libdevice's
    exp and IEEE division. e^-z errs by a relative d under 2^-20 while |z| < 20 (ex2's own 2^-22 and the
    rounding of its argument), which moves the sigmoid by sigmoid (1 - sigmoid) d <= d / 4 (beyond |z| = 20
    that factor is under e^-20); the reciprocal adds 2^-23 of the sigmoid. So v sigmoid(z) errs by under
    2^-21 |v|: half of what ``model.ACTIVATION_UNIT`` allows."""
    return cute.arch.rcp_approx(Float32(1.0) + cute.math.exp2(z * Float32(-LOG2_E), fastmath=True))


def gelu(v):
    """tanh-approximation GELU as v sigmoid(2 inner), which equals 0.5 v (1 + tanh(inner)) without the
    cancellation in 1 + tanh for negative v. It takes a fraction of the accurate-tanh form's instructions, which
    bound the hidden epilogue of the tensor-core engines (a phase trace: 1,350 of a chunk's 3,400 clocks)."""
    inner = Float32(GELU_TANH_SCALE) * (v + Float32(GELU_TANH_CUBIC) * v * v * v)
    return v * sigmoid(Float32(2.0) * inner)


def silu(v):
    return v * sigmoid(v)


@cute.jit
def activate(v: Float32, code: Int32) -> Float32:
    """One value through the activation chosen at run time (a warp-uniform branch)."""
    out = v
    if code == RELU:
        out = relu(v)
    elif code == GELU:
        out = gelu(v)
    else:
        out = silu(v)
    return out


def gather_clamped(t: cute.Tensor, row, first, stride, count: int, limit) -> list:
    """``count`` fp32 values of row ``row`` of ``t`` (of the vector ``t``: row None) at columns first, first +
    stride, ..., each column clamped below ``limit`` so that every load is issued before any is used (a guarded
    load waits for the one before it: a warp walking a row took a memory latency a load); the caller drops the
    values of columns at or past ``limit``."""
    out = []
    for k in range(count):
        c = cutlass.min(first + k * stride, limit - 1)
        out.append((t[c] if row is None else t[row, c]).to(Float32))
    return out


@cute.jit
def round_to_fp16(v: Float32) -> Float32:
    """The hidden's rounding point: round to nearest-even fp16, kept as fp32 for the next GEMM."""
    return v.to(Float16).to(Float32)


# ---- compiling -------------------------------------------------------------------------------------

class Symbols:
    """The runtime sizes shared by a kernel's tensors. Reusing one symbol makes TVM-FFI check at
    every call that those sizes agree (and that rows are contiguous, as strides use them too)."""

    def __init__(self, divisibility: int = 1):
        self.rows = cute.sym_int()
        self.channels = cute.sym_int(divisibility=divisibility)
        self.hidden = cute.sym_int(divisibility=divisibility)
        self.divisibility = divisibility

    def _align(self, dtype) -> int:
        return max(dtype.width // 8, min(16, self.divisibility * dtype.width // 8))

    def matrix(self, dtype, rows, cols):
        """A row-major (rows, cols) tensor with contiguous rows."""
        return cute.runtime.make_fake_tensor(dtype, (rows, cols), stride=(cols, 1), assumed_align=self._align(dtype))

    def vector(self, dtype, n):
        return cute.runtime.make_fake_tensor(dtype, (n,), stride=(1,), assumed_align=dtype.width // 8)


def block_signature(divisibility: int, residual: str) -> tuple:
    """Fake arguments of a kernel called ``(u, residual, w1, b1, w2, b2, y, activation, grid)`` (both forms of
    persistent-tc): the block's tensors, channels and hidden divisible by ``divisibility``."""
    s = Symbols(divisibility=divisibility)
    f16, f32 = Float16, Float32
    return (s.matrix(f16, s.rows, s.channels), s.matrix(DTYPES[residual], s.rows, s.channels),
            s.matrix(f16, s.hidden, s.channels), s.vector(f32, s.hidden),
            s.matrix(f16, s.channels, s.hidden), s.vector(f32, s.channels), s.matrix(f32, s.rows, s.channels),
            Int32(0), Int32(1))


def fake_stream():
    """Compile against TVM-FFI's environment stream: each call launches on torch's current stream."""
    return cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)


def compile_variant(name: str, kernel, args: tuple, arch: str | None = None):
    """cute.compile for TVM-FFI, keeping the cubin under ``artifact_dir(arch)/name`` (``cache.artifact_dir``:
    a directory per arch and fingerprint of the kernel sources)."""
    out = artifact_dir(arch) / name
    out.mkdir(parents=True, exist_ok=True)
    options = f"--enable-tvm-ffi --keep-cubin --dump-dir={out}"
    if os.environ.get("KERNELLAB_MEGAKERNEL_KEEP_PTX"):
        options += " --keep-ptx"  # for reading the generated code: ptxas -arch=sm_90a -v <file>.ptx
    if arch:
        options += f" --gpu-arch {arch}"
    with warnings.catch_warnings():
        # our fully unrolled epilogues are deliberate: static indices keep the accumulators in registers
        warnings.simplefilter("ignore", DSLOptimizationWarning)
        fn = cute.compile(kernel, *args, fake_stream(), options=options)
    cubin = fn.__cubin__
    if isinstance(cubin, str) and os.path.exists(cubin):
        _ARTIFACTS[name] = cubin
    return fn


_COMPILED: dict = {}
_ARTIFACTS: dict[str, str] = {}


def compiled(variant):
    """The variant's compiled function, compiled on first use in this process."""
    fn = _COMPILED.get(variant)
    if fn is None:
        fn = _COMPILED.setdefault(variant, variant.compile())
    return fn


def artifacts() -> list[str]:
    """Cubins of every variant compiled in this process (their sha256 goes into provenance)."""
    return sorted(set(_ARTIFACTS.values()))


class HiddenWorkspace:
    """The fp16 hidden buffer of the engines that keep it in global memory, allocated when bound
    (outside any CUDA-graph capture) and reallocated only if a call brings another row count."""

    def __init__(self, rows: int, hidden: int):
        import torch

        self.buffer = torch.empty((rows, hidden), dtype=torch.float16, device="cuda")

    def get(self, rows: int):
        if self.buffer.shape[0] != rows:
            import torch

            self.buffer = torch.empty((rows, self.buffer.shape[1]), dtype=torch.float16, device=self.buffer.device)
        return self.buffer
