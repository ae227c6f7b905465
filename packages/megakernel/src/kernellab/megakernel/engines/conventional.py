"""``conventional``: one kernel per stage, the hidden in global memory between them.

Stage 1 writes ``hidden = fp16(act(u W1^T + b1))``; stage 2 writes ``y = hidden W2^T + b2 +
residual``. Each CTA owns one tile of rows for the whole launch and reads its operands straight
from global memory (L1 serves the re-reads); nothing limits the sizes, which makes this the engine
every fallback chain ends on.
"""

from __future__ import annotations

import dataclasses

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float16, Float32, Int32

from ..model import ACTIVATION_CODES
from ..planning import SCALAR_OCCUPANCY, SCALAR_THREADS, Plan, ceil_div
from . import scalar
from .common import DTYPES, HiddenWorkspace, Symbols, compile_variant, compiled


@dataclasses.dataclass(frozen=True)
class Variant:
    """One stage kernel, compiled for its sizes (the GEMM's K and N and the rows per tile: its loops, lane groups
    and index arithmetic are constants; rows and the activation stay runtime values)."""

    stage: str  # "hidden" (K channels, N hidden) or "output" (K hidden, N channels)
    k: int
    n: int
    tile_rows: int
    residual: str = "float16"

    @property
    def name(self) -> str:
        return (f"conventional-{self.stage}" + (f"_res-{self.residual}" if self.stage == "output" else "")
                + f"_k{self.k}-n{self.n}-rows{self.tile_rows}")

    def compile(self, arch: str | None = None):
        s = Symbols()
        f16, f32 = Float16, Float32
        k, n = self.k, self.n
        if self.stage == "hidden":
            kernel = HiddenStage(self.tile_rows)
            args = (s.matrix(f16, s.rows, k), s.matrix(f16, n, k), s.vector(f32, n), s.matrix(f16, s.rows, n), Int32(0))
        else:
            kernel = OutputStage(self.tile_rows)
            args = (s.matrix(f16, s.rows, k), s.matrix(DTYPES[self.residual], s.rows, n), s.matrix(f16, n, k),
                    s.vector(f32, n), s.matrix(f32, s.rows, n))
        return compile_variant(self.name, kernel, args, arch)


def launcher(plan: Plan, activation: str, residual: str = "float16"):
    """``run(u, residual, w1, b1, w2, b2, y)``: the two stage kernels back to back."""
    rows = plan.tile.rows
    hidden_stage = compiled(Variant("hidden", plan.channels, plan.hidden, rows))
    output_stage = compiled(Variant("output", plan.hidden, plan.channels, rows, residual))
    act = ACTIVATION_CODES[activation]
    workspace = HiddenWorkspace(plan.rows, plan.hidden)

    def run(u, res, w1, b1, w2, b2, y):
        hidden = workspace.get(u.shape[0])
        hidden_stage(u, w1, b1, hidden, act)
        output_stage(hidden, res, w2, b2, y)

    return run


class HiddenStage:
    def __init__(self, tile_rows: int):
        self.tile_rows = tile_rows

    @cute.jit
    def __call__(self, u: cute.Tensor, w1: cute.Tensor, b1: cute.Tensor, hidden: cute.Tensor, act: Int32,
                 stream: cuda.CUstream):
        self.kernel(u, w1, b1, hidden, act).launch(
            grid=[ceil_div(u.shape[0], self.tile_rows), 1, 1], block=[SCALAR_THREADS, 1, 1],
            min_blocks_per_mp=SCALAR_OCCUPANCY, preferred_smem_carveout=0, stream=stream)

    @cute.kernel
    def kernel(self, u: cute.Tensor, w1: cute.Tensor, b1: cute.Tensor, hidden: cute.Tensor, act: Int32):
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        row0 = cta * self.tile_rows
        valid = cutlass.min(self.tile_rows, u.shape[0] - row0)
        scalar.linear_rows(u, row0, valid, u.shape[1], w1, b1, w1.shape[0],
                           scalar.HiddenToGlobal(hidden, row0, act), tid, self.tile_rows)


class OutputStage:
    def __init__(self, tile_rows: int):
        self.tile_rows = tile_rows

    @cute.jit
    def __call__(self, hidden: cute.Tensor, residual: cute.Tensor, w2: cute.Tensor, b2: cute.Tensor, y: cute.Tensor,
                 stream: cuda.CUstream):
        self.kernel(hidden, residual, w2, b2, y).launch(
            grid=[ceil_div(hidden.shape[0], self.tile_rows), 1, 1], block=[SCALAR_THREADS, 1, 1],
            min_blocks_per_mp=SCALAR_OCCUPANCY, preferred_smem_carveout=0, stream=stream)

    @cute.kernel
    def kernel(self, hidden: cute.Tensor, residual: cute.Tensor, w2: cute.Tensor, b2: cute.Tensor, y: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        row0 = cta * self.tile_rows
        valid = cutlass.min(self.tile_rows, hidden.shape[0] - row0)
        scalar.linear_rows(hidden, row0, valid, hidden.shape[1], w2, b2, w2.shape[0],
                           scalar.OutputWithResidual(y, residual, row0), tid, self.tile_rows)
