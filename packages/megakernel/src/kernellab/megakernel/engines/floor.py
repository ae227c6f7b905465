"""The launch floor: an empty kernel, compiled and called exactly as the engines' kernels are.

One CTA of 32 threads that does nothing, reached through the same TVM-FFI path (torch tensor in,
argument checks, launch on the current torch stream). Its time is the least any engine call can
take, so the report reads the engines' times at small shapes against it rather than against zero.
The kernel takes the output ``y`` so that it has a tensor parameter to check and pass, as every
engine's kernel does, and writes nothing to it.
"""

from __future__ import annotations

import dataclasses

import cuda.bindings.driver as cuda
import cutlass.cute as cute
from cutlass import Float32

from .common import Symbols, compile_variant, compiled

THREADS = 32


@dataclasses.dataclass(frozen=True)
class Variant:
    @property
    def name(self) -> str:
        return "launch-floor"

    def compile(self, arch: str | None = None):
        s = Symbols()
        return compile_variant(self.name, EmptyKernel(), (s.matrix(Float32, s.rows, s.channels),), arch)


def launcher():
    """``run(y)``: one launch of the empty kernel on the current torch stream (capturable in a CUDA graph)."""
    return compiled(Variant())


class EmptyKernel:
    @cute.jit
    def __call__(self, y: cute.Tensor, stream: cuda.CUstream):
        self.kernel(y).launch(grid=[1, 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, y: cute.Tensor):
        """Does nothing: what is left to time is the launch."""
