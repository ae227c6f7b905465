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
    stage: str  # "hidden" or "output"
    residual: str = "float16"

    @property
    def name(self) -> str:
        return f"conventional-{self.stage}" + (f"_res-{self.residual}" if self.stage == "output" else "")

    def compile(self, arch: str | None = None):
        s = Symbols()
        f16, f32 = Float16, Float32
        if self.stage == "hidden":
            kernel = HiddenStage()
            args = (s.matrix(f16, s.rows, s.channels), s.matrix(f16, s.hidden, s.channels), s.vector(f32, s.hidden),
                    s.matrix(f16, s.rows, s.hidden), Int32(0), Int32(4))
        else:
            kernel = OutputStage()
            args = (s.matrix(f16, s.rows, s.hidden), s.matrix(DTYPES[self.residual], s.rows, s.channels),
                    s.matrix(f16, s.channels, s.hidden), s.vector(f32, s.channels), s.matrix(f32, s.rows, s.channels),
                    Int32(4))
        return compile_variant(self.name, kernel, args, arch)


def launcher(plan: Plan, activation: str, residual: str = "float16"):
    """``run(u, residual, w1, b1, w2, b2, y)``: the two stage kernels back to back."""
    hidden_stage, output_stage = compiled(Variant("hidden")), compiled(Variant("output", residual))
    act, tile_rows = ACTIVATION_CODES[activation], plan.tile.rows
    workspace = HiddenWorkspace(plan.rows, plan.hidden)

    def run(u, res, w1, b1, w2, b2, y):
        hidden = workspace.get(u.shape[0])
        hidden_stage(u, w1, b1, hidden, act, tile_rows)
        output_stage(hidden, res, w2, b2, y, tile_rows)

    return run


class HiddenStage:
    @cute.jit
    def __call__(self, u: cute.Tensor, w1: cute.Tensor, b1: cute.Tensor, hidden: cute.Tensor, act: Int32,
                 tile_rows: Int32, stream: cuda.CUstream):
        self.kernel(u, w1, b1, hidden, act, tile_rows).launch(
            grid=[ceil_div(u.shape[0], tile_rows), 1, 1], block=[SCALAR_THREADS, 1, 1],
            min_blocks_per_mp=SCALAR_OCCUPANCY, preferred_smem_carveout=0, stream=stream)

    @cute.kernel
    def kernel(self, u: cute.Tensor, w1: cute.Tensor, b1: cute.Tensor, hidden: cute.Tensor, act: Int32,
               tile_rows: Int32):
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        row0 = cta * tile_rows
        valid = cutlass.min(tile_rows, u.shape[0] - row0)
        scalar.linear_rows(u, row0, valid, u.shape[1], w1, b1, w1.shape[0],
                           scalar.HiddenToGlobal(hidden, row0, act), tid)


class OutputStage:
    @cute.jit
    def __call__(self, hidden: cute.Tensor, residual: cute.Tensor, w2: cute.Tensor, b2: cute.Tensor, y: cute.Tensor,
                 tile_rows: Int32, stream: cuda.CUstream):
        self.kernel(hidden, residual, w2, b2, y, tile_rows).launch(
            grid=[ceil_div(hidden.shape[0], tile_rows), 1, 1], block=[SCALAR_THREADS, 1, 1],
            min_blocks_per_mp=SCALAR_OCCUPANCY, preferred_smem_carveout=0, stream=stream)

    @cute.kernel
    def kernel(self, hidden: cute.Tensor, residual: cute.Tensor, w2: cute.Tensor, b2: cute.Tensor, y: cute.Tensor,
               tile_rows: Int32):
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        row0 = cta * tile_rows
        valid = cutlass.min(tile_rows, hidden.shape[0] - row0)
        scalar.linear_rows(hidden, row0, valid, hidden.shape[1], w2, b2, w2.shape[0],
                           scalar.OutputWithResidual(y, residual, row0), tid)
