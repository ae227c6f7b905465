"""``persistent-stack``'s gemv form: the fewest rows (decode), each block as two matrix-vector phases over every SM.

Per block i, with the rows taken ``tile_rows`` at a time (one tile for rows <= tile_rows):

    phase A  u = fp16(norm_i(s)) of the rows, by every CTA into its shared memory;
             hidden unit j (a warp each, units dealt round-robin over all warps of the grid):
             h[r, j] = fp16(act(u[r] . W1[j] + b1[j]) [* (u[r] . W3[j] + b3[j])]) into the workspace (fp32)
    grid barrier
    phase B  output channel c, K slice k of W2's row (a warp each item, items dealt over all warps):
             s'[r, c] += h[r, k] . W2[c, k] (+ s[r, c] + b2[c] by the first slice), fp32 atomic adds
    grid barrier

then ``y = final_norm(s)`` or ``y = s``, a warp a row. A lane reads 8 fp16 weights with one 16-byte load, all of a
row's (or slice's) loads issued before its products, so each weight is read once a call by one warp and many loads
are in flight per SM; the operand rows come from shared memory, the hidden values (a few KB) from L2. Stream
buffers rotate over three as in the grid form (block i reads buffer i % 3, block 0 reads x, and adds into
(i + 1) % 3, zeroed during phase A: nobody reads it then), the hidden units of every row follow them in the
workspace. The barrier is the grid form's (``PersistentStack.grid_barrier``, one word zeroed once).
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float16, Float32, Int32
from cutlass.memory import SmemAllocator

from ..planning.stack import ALIGN, STACK_TILE
from .common import activate
from .persistent_stack import GELU_ERF, INV_SQRT2, PersistentStack

VEC = 8  # fp16 values of one 16-byte load
WARP = 32
LOADS_IN_FLIGHT = 8  # 16-byte weight loads a lane issues before their products (a batch: bounded registers)
SLICE_VECTORS = (4, 2)  # 16-byte loads a lane issues per W2 slice at 1-2 rows, and past: a slice is WARP * VEC *
# that many hidden units (at few rows a slice's time is its loads' latency: more of them in flight)


class StackGemv(PersistentStack):
    def __init__(self, variant):
        super().__init__(variant)
        self.steps = math.ceil(self.cols / (WARP * VEC))  # a lane's 16-byte loads along one W1 row
        # a batch takes the same columns of W1 and (gated) W3, so the gate's loads fly with W1's; at more rows the
        # operand reads and accumulators need the registers, so the batch is halved past 2 rows
        loads = LOADS_IN_FLIGHT if self.tile_rows <= 2 else LOADS_IN_FLIGHT // 2
        self.batch = max(1, min(self.steps, loads // (2 if self.gated else 1)))
        self.batches = math.ceil(self.steps / self.batch)
        self.slice_vectors = SLICE_VECTORS[0] if self.tile_rows <= 2 else SLICE_VECTORS[1]
        self.slice = WARP * VEC * self.slice_vectors

    @cute.jit
    def __call__(self, x: cute.Tensor, y: cute.Tensor, w1: cute.Tensor, w3: cute.Tensor, w2: cute.Tensor,
                 b1: cute.Tensor, b3: cute.Tensor, b2: cute.Tensor, norm_w: cute.Tensor, norm_b: cute.Tensor,
                 meta: cute.Tensor, eps: cute.Tensor, ws: cute.Tensor, sync: cute.Tensor, grid: Int32,
                 stream: cuda.CUstream):
        self.kernel(x, y, w1, w3, w2, b1, b3, b2, norm_w, norm_b, meta, eps, ws, sync).launch(
            grid=[grid, 1, 1], block=[self.threads, 1, 1], min_blocks_per_mp=1, cooperative=True, stream=stream)

    @cute.kernel
    def kernel(self, x: cute.Tensor, y: cute.Tensor, w1: cute.Tensor, w3: cute.Tensor, w2: cute.Tensor,
               b1: cute.Tensor, b3: cute.Tensor, b2: cute.Tensor, norm_w: cute.Tensor, norm_b: cute.Tensor,
               meta: cute.Tensor, eps: cute.Tensor, ws: cute.Tensor, sync: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        rows, channels = x.shape
        blocks = meta.shape[0] - 1
        lane, warp = tid % WARP, tid // WARP
        first_warp, all_warps = cta * self.warps + warp, grid * self.warps
        hidden_rows = (ws.shape[0] - 3 * rows) // rows  # workspace rows of one row's hidden units

        smem = SmemAllocator()
        # the operand tile as the rows/grid forms' ``operand`` indexes it, (row, column in chunk, chunk), laid out
        # row-major so that a lane's 8 columns are one 16-byte read
        s_u = smem.allocate_tensor(Float16, cute.make_layout((self.tile_rows, STACK_TILE, self.k_tiles),
                                                             stride=(self.cols, 1, STACK_TILE)), ALIGN)
        u_rows = cute.make_tensor(s_u.iterator, cute.make_layout((self.tile_rows, self.cols), stride=(self.cols, 1)))

        for i in range(blocks):
            units = meta[i, 1] * STACK_TILE
            unit0 = meta[i, 0] * STACK_TILE
            target = (i + 1) % 3 * rows
            for e in range(cta * self.threads + tid, rows * self.cols, grid * self.threads):  # nobody reads it now
                ws[target + e // self.cols, e % self.cols] = Float32(0.0)
            for row0 in range(0, rows, self.tile_rows):
                cute.arch.sync_threads()  # every warp is done with the last row tile's operand
                self.stream_operand(x, ws, i, row0, rows, s_u, meta, eps, norm_w, norm_b, channels, tid)
                cute.arch.sync_threads()
                for j in range(first_warp, units, all_warps):
                    self.hidden_unit(w1, w3, b1, b3, u_rows, ws, unit0, j, meta[i, 2], rows, row0, hidden_rows,
                                     lane)
            self.grid_barrier(sync, grid, tid)
            slices = (units + self.slice - 1) // self.slice
            for item in range(first_warp, channels * slices, all_warps):
                self.output_slice(w2, ws, x, b2, i, item // slices, item % slices, unit0, units, rows, hidden_rows,
                                  lane)
            self.grid_barrier(sync, grid, tid)
        for rr in range(first_warp, rows, all_warps):  # the final norm (or a copy), a warp a row
            self.finish_row(ws, blocks % 3 * rows + rr, rr, channels, y, meta[blocks, 3], eps[blocks], norm_w,
                            norm_b, blocks, lane)

    @cute.jit
    def load_vector(self, row: cute.Tensor, index: Int32, valid) -> cute.Tensor:
        """Elements index * VEC ... index * VEC + VEC - 1 of a contiguous row in registers, in the row's type (one
        16-byte load of fp16, two of fp32); zeros where ``valid`` is false."""
        run = cute.make_rmem_tensor((VEC,), row.element_type)
        run.fill(0.0)
        if valid:
            cute.autovec_copy(cute.local_tile(row, (VEC,), (index,)), run)
        return run

    @cute.jit
    def row_products(self, weight_rows: list, u_rows: cute.Tensor, accs: list, lane: Int32):
        """accs[k][r] = this lane's share of u[r] . weight_rows[k], every row of the tile and every weight row (W1's,
        and W3's for a gated block): a batch of each weight row's 16-byte loads issued, then their products with
        every row's operand (a loop over the batches, so that the registers hold one batch)."""
        for acc in accs:
            acc.fill(0.0)
        for b in cutlass.range(self.batches, unroll=1):
            loaded = []
            for weight_row in weight_rows:
                for t in cutlass.range_constexpr(self.batch):
                    index = (b * self.batch + t) * WARP + lane
                    loaded.append(self.load_vector(weight_row, index, index * VEC < self.cols))
            for t in cutlass.range_constexpr(self.batch):
                index = (b * self.batch + t) * WARP + lane
                if index * VEC < self.cols:
                    for r in cutlass.range_constexpr(self.tile_rows):
                        u = self.load_vector(u_rows[r, None], index, True).load().to(Float32)
                        for k in cutlass.range_constexpr(len(weight_rows)):
                            w32 = loaded[k * self.batch + t].load().to(Float32)
                            accs[k][r] = accs[k][r] + (u * w32).reduce(cute.ReductionOp.ADD, 0.0, 0)

    @cute.jit
    def hidden_unit(self, w1, w3, b1, b3, u_rows, ws, unit0: Int32, j: Int32, act: Int32, rows: Int32, row0: Int32,
                    hidden_rows: Int32, lane: Int32):
        """h[r, j] for the tile's rows, by one warp, into the workspace."""
        acc = cute.make_rmem_tensor((self.tile_rows,), Float32)
        gate = None
        if cutlass.const_expr(self.gated):
            gate = cute.make_rmem_tensor((self.tile_rows,), Float32)
            self.row_products([w1[unit0 + j, None], w3[unit0 + j, None]], u_rows, [acc, gate], lane)
        else:
            self.row_products([w1[unit0 + j, None]], u_rows, [acc], lane)
        for r in cutlass.range_constexpr(self.tile_rows):
            value = cute.arch.warp_reduction_sum(acc[r]) + b1[unit0 + j]
            if act == GELU_ERF:
                value = Float32(0.5) * value * (Float32(1.0) + cute.math.erf(value * Float32(INV_SQRT2)))
            else:
                value = activate(value, act)
            if cutlass.const_expr(self.gated):
                value = value * (cute.arch.warp_reduction_sum(gate[r]) + b3[unit0 + j])
            if lane == r % WARP:
                if row0 + r < rows:
                    ws[3 * rows + (row0 + r) * hidden_rows + j // self.cols, j % self.cols] = (
                        value.to(Float16).to(Float32))

    @cute.jit
    def output_slice(self, w2, ws, x, b2, i: Int32, c: Int32, k: Int32, unit0: Int32, units: Int32, rows: Int32,
                     hidden_rows: Int32, lane: Int32):
        """s'[r, c] += h[r, slice k] . W2[c, slice k] for every row (the first slice adds s[r, c] + b2[c] too), by
        one warp: the slice's W2 loads issued once, then a row at a time."""
        w2_row = w2[c, None]
        vectors = []
        for v in cutlass.range_constexpr(self.slice_vectors):
            unit = k * self.slice + (v * WARP + lane) * VEC
            vectors.append(self.load_vector(w2_row, (unit0 + unit) // VEC, unit < units))
        for r in range(rows):
            acc = Float32(0.0)
            for v in cutlass.range_constexpr(self.slice_vectors):
                unit = k * self.slice + (v * WARP + lane) * VEC
                if unit < units:
                    h = self.load_vector(ws[3 * rows + r * hidden_rows + unit // self.cols, None],
                                         unit % self.cols // VEC, True)
                    acc = acc + (h.load() * vectors[v].load().to(Float32)).reduce(cute.ReductionOp.ADD, 0.0, 0)
            total = cute.arch.warp_reduction_sum(acc)
            if lane == 0:
                if k == 0:
                    total = total + b2[i, c]
                    if i == 0:
                        total = total + x[r, c].to(Float32)
                    else:
                        total = total + ws[i % 3 * rows + r, c]
                self.red_add(ws, (i + 1) % 3 * rows + r, c, total)
