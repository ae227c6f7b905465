"""``persistent`` and ``persistent-global``: one launch runs both GEMMs of every row tile.

The grid is min(row tiles, resident CTAs) and CTA b owns tiles b, b + grid, ... (static round
robin). Each kernel is compiled for its sizes (``Variant``: channels, hidden, rows per tile). For each tile the
CTA stages the fp16 input rows in shared memory as fp32, computes the
hidden rows, and then the output rows, all with ``scalar.linear_rows``. Where each lane's share of both
weights fits in registers and a tile is one row block (``planning.register_weights_fit``), the CTA loads that
share into registers once, before its first tile, all loads in flight together with the first tile's input rows,
and both sums run from registers. Else, where the weights fit beside the tile and their rows are whole K steps
(``planning.scalar_weights_whole_steps``: 16-byte cp.async copies), a CTA reads them more than once (more than
one row block) or they are many (``planning.SCALAR_GLOBAL_WEIGHTS_MAX``), W1 and W2 are copied into shared
memory once per CTA and serve all its tiles; otherwise they are read from global memory. Each tile's bias and
residual reads are issued before its input rows are staged, and the first tile's input rows load while the
weights' copies to shared memory are in flight.

``persistent-global`` is the same kernel with the hidden rows in a global workspace instead of
shared memory: same owners, same arithmetic in the same order, so the pair isolates the cost of
keeping the hidden tile on chip. A CTA reads back only hidden rows it wrote itself, after a CTA
barrier, which makes them visible (no grid-wide synchronization is needed).
"""

from __future__ import annotations

import dataclasses

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float16, Float32, Int32

from ..model import ACTIVATION_CODES
from ..planning import SCALAR_THREADS, Plan, ceil_div, scalar_occupancy, scalar_row_stride, staged_weight_bytes
from . import scalar
from .common import DTYPES, HiddenWorkspace, Symbols, compile_variant, compiled


@dataclasses.dataclass(frozen=True)
class Variant:
    """One compiled kernel: a hidden placement, a weight placement and the sizes it is compiled for (channels,
    hidden and rows per tile are compile-time, so that its loops, lane groups and index arithmetic are constants;
    rows, the grid and the activation stay runtime values)."""

    hidden_on_chip: bool
    weights: str  # "smem", "global" or "registers" (planning's SharedMemory.weights)
    channels: int
    hidden: int
    tile_rows: int
    residual: str = "float16"  # dtype of the residual stream (float32 for the later blocks of a stack)

    @property
    def name(self) -> str:
        where = "persistent" if self.hidden_on_chip else "persistent-global"
        return (f"{where}_{self.weights}-weights_res-{self.residual}_c{self.channels}-h{self.hidden}"
                f"-rows{self.tile_rows}")

    @classmethod
    def of(cls, plan: Plan, residual: str = "float16") -> Variant:
        """The variant a persistent or persistent-global plan runs."""
        return cls(plan.engine == "persistent", plan.smem.weights, plan.channels, plan.hidden, plan.tile.rows,
                   residual)

    def compile(self, arch: str | None = None):
        s = Symbols()
        f16, f32 = Float16, Float32
        c, h = self.channels, self.hidden
        args = [s.matrix(f16, s.rows, c), s.matrix(DTYPES[self.residual], s.rows, c), s.matrix(f16, h, c),
                s.vector(f32, h), s.matrix(f16, c, h), s.vector(f32, c), s.matrix(f32, s.rows, c)]
        if not self.hidden_on_chip:
            args.append(s.matrix(f16, s.rows, h))
        args += [Int32(0), Int32(1), Int32(0)]  # activation, grid, shared memory bytes
        kernel = OnChipRows(self) if self.hidden_on_chip else GlobalRows(self)
        return compile_variant(self.name, kernel, tuple(args), arch)


def launcher(plan: Plan, activation: str, residual: str = "float16"):
    """``run(u, residual, w1, b1, w2, b2, y)`` for a persistent or persistent-global plan."""
    variant = Variant.of(plan, residual)
    fn = compiled(variant)
    act, grid, smem = ACTIVATION_CODES[activation], plan.owners.grid, plan.smem.bytes
    if variant.hidden_on_chip:
        def run(u, res, w1, b1, w2, b2, y):
            fn(u, res, w1, b1, w2, b2, y, act, grid, smem)
    else:
        workspace = HiddenWorkspace(plan.rows, plan.hidden)

        def run(u, res, w1, b1, w2, b2, y):
            fn(u, res, w1, b1, w2, b2, y, workspace.get(u.shape[0]), act, grid, smem)
    return run


class FusedRows:
    def __init__(self, variant: Variant):
        self.variant = variant

    @cute.kernel
    def kernel(self, u: cute.Tensor, residual: cute.Tensor, w1: cute.Tensor, b1: cute.Tensor, w2: cute.Tensor,
               b2: cute.Tensor, y: cute.Tensor, hidden: cute.Tensor | None, act: Int32):
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        rows = u.shape[0]
        channels, hidden_size, tile_rows = self.variant.channels, self.variant.hidden, self.variant.tile_rows
        base = scalar.dynamic_smem()
        offset = 0
        w1_src, w2_src = w1, w2
        w1_held = w2_held = None
        if cutlass.const_expr(self.variant.weights == "registers"):
            w1_held = scalar.register_weights(w1, channels, hidden_size, tid)
            w2_held = scalar.register_weights(w2, hidden_size, channels, tid)
        if cutlass.const_expr(self.variant.weights == "smem"):
            w1_bytes = staged_weight_bytes(hidden_size, channels)
            w1_src = scalar.smem_weight(base, 0, hidden_size, channels)
            w2_src = scalar.smem_weight(base, w1_bytes, channels, hidden_size)
            scalar.stage_weight(w1, w1_src, tid)
            scalar.stage_weight(w2, w2_src, tid)
            offset = w1_bytes + staged_weight_bytes(channels, hidden_size)  # published by the first barrier
        x_s = scalar.smem_rows(base, offset, tile_rows, channels)
        h_s = None
        if cutlass.const_expr(self.variant.hidden_on_chip):
            h_s = scalar.smem_rows(base, offset + tile_rows * scalar_row_stride(channels) * 4, tile_rows, hidden_size)
        staged = self.variant.weights == "smem"
        for tile in range(cta, ceil_div(rows, tile_rows), grid):
            row0 = tile * tile_rows
            valid = cutlass.min(tile_rows, rows - row0)
            if cutlass.const_expr(self.variant.hidden_on_chip):
                first = scalar.HiddenToSmem(h_s, act)
            else:
                first = scalar.HiddenToGlobal(hidden, row0, act)
            second = scalar.OutputWithResidual(y, residual, row0)
            # both GEMMs' bias and residual reads fly with the input rows' staging
            early1 = scalar.read_early(valid, b1, hidden_size, first, tid, tile_rows)
            early2 = scalar.read_early(valid, b2, channels, second, tid, tile_rows)
            scalar.stage_rows(u, row0, valid, x_s, tid, tile_rows)
            if cutlass.const_expr(self.variant.weights == "smem"):
                cute.arch.cp_async_wait_group(0)  # the weights' copies (first tile) flew with the rows' loads
            cute.arch.sync_threads()
            scalar.linear_rows(x_s, Int32(0), valid, channels, w1_src, b1, hidden_size, first, tid, tile_rows, early1,
                               w1_held, a_staged=True, w_staged=staged)
            cute.arch.sync_threads()  # also makes the CTA's global hidden writes visible to the CTA
            if cutlass.const_expr(self.variant.hidden_on_chip):
                scalar.linear_rows(h_s, Int32(0), valid, hidden_size, w2_src, b2, channels, second, tid, tile_rows,
                                   early2, w2_held, a_staged=True, w_staged=staged)
            else:
                scalar.linear_rows(hidden, row0, valid, hidden_size, w2_src, b2, channels, second, tid, tile_rows,
                                   early2, w2_held, w_staged=staged)
            cute.arch.sync_threads()  # the next tile overwrites x_s (and h_s)


class OnChipRows(FusedRows):
    @cute.jit
    def __call__(self, u: cute.Tensor, residual: cute.Tensor, w1: cute.Tensor, b1: cute.Tensor, w2: cute.Tensor,
                 b2: cute.Tensor, y: cute.Tensor, act: Int32, grid: Int32, smem_bytes: Int32, stream: cuda.CUstream):
        self.kernel(u, residual, w1, b1, w2, b2, y, None, act).launch(
            grid=[grid, 1, 1], block=[SCALAR_THREADS, 1, 1], smem=smem_bytes,
            min_blocks_per_mp=scalar_occupancy(self.variant.weights), preferred_smem_carveout=100, stream=stream)


class GlobalRows(FusedRows):
    @cute.jit
    def __call__(self, u: cute.Tensor, residual: cute.Tensor, w1: cute.Tensor, b1: cute.Tensor, w2: cute.Tensor,
                 b2: cute.Tensor, y: cute.Tensor, hidden: cute.Tensor, act: Int32, grid: Int32, smem_bytes: Int32,
                 stream: cuda.CUstream):
        self.kernel(u, residual, w1, b1, w2, b2, y, hidden, act).launch(
            grid=[grid, 1, 1], block=[SCALAR_THREADS, 1, 1], smem=smem_bytes,
            min_blocks_per_mp=scalar_occupancy(self.variant.weights), preferred_smem_carveout=100, stream=stream)
