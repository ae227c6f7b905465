"""``persistent-stack``: a whole residual-MLP stack in one launch (``planning/stack.py`` says which form).

Per block i of the stack, for a row tile of ``tile_rows`` rows:

    u = fp16(norm_i(s))                                   (or fp16(s); into shared memory, tile_rows x channels_tile)
    for each hidden chunk g of 64 units:
        a   = u W1[g]^T            [gate = u W3[g]^T]     (mma.sync, K along the channels in 64-wide tiles)
        h_g = fp16(act(a + b1[g]) [* (gate + b3[g])])    (shared memory, tile_rows x 64)
        s  += h_g W2[:, g]^T                              (one 64-column output tile at a time)
    s += b2                                               (added once per block)

then ``y = final_norm(s)`` or ``y = s``. Every weight tile (64 x 64 fp16, K contiguous) comes through one ring of
``stages`` shared-memory buffers filled by cp.async, tile q + stages - 1 issued as tile q is computed on, in the
order the tiles are used: W1 tiles of a chunk, [W3 tiles,] W2 tiles, then the next chunk's, across block
boundaries, so the next block's first weights are in flight while this block finishes.

Forms (compile-time): ``rows`` keeps the fp32 stream of the row tile in shared memory through every block (rows
are independent: no grid barrier); ``grid`` (decode rows) gives each row tile ``grid // tiles`` CTAs, CTA v of a
tile running chunks v, v + grid // tiles, ... of each block and adding its partial product into the next
stream buffer in global memory by fp32 atomic adds (the chunk-0 CTA adds the old stream and b2 too), with a grid
barrier between blocks. Buffers rotate over three: block i reads buffer i % 3 (block 0: x), adds into
(i + 1) % 3 (the last block without a final norm: y) and zeroes the next block's target meanwhile.

Parameters come packed (``stack_packing.pack``): every weight tile whole, padding zero, a row of ``meta`` per
block (first chunk, chunks, activation code, norm kind) and one for the final norm.
"""

from __future__ import annotations

import dataclasses
import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float16, Float32, Int32
from cutlass.memory import SmemAllocator

from ..planning import DeviceSpec, ceil_div
from ..planning.stack import ALIGN, MATRIX_VECTOR_FORMS, STACK_TILE, StackPlan, call_plan, stack_threads
from . import tensorcore
from .common import compile_variant, compiled, gather_clamped
from .stack_packing import ACT_CODES, META_COLUMNS, NORM_CODES

GELU_ERF = ACT_CODES["gelu_erf"]
NORM_NONE, NORM_LAYER = NORM_CODES[None], NORM_CODES["layernorm"]
WARPS_N = 4  # the mma layout's warps along the 64 output columns of a tile
INV_SQRT2 = 1.0 / math.sqrt(2.0)
GAINS_AT_ONCE = 16  # a lane's norm gains (and biases) loaded at once, before any is used, at most (registers)
GAINS_BATCH = 8  # past GAINS_AT_ONCE a lane's channels: its values, gains and biases loaded this many at a time


@dataclasses.dataclass(frozen=True)
class Variant:
    form: str  # "rows", "grid", "gemv" or "mma"
    tile_rows: int
    channels_tile: int
    stages: int
    gated: bool
    split: int = 1  # the mma form: warps of a CTA that share a phase A unit tile (``planning.stack.mma_split``)

    @property
    def name(self) -> str:
        return (f"persistent-stack_{self.form}_m{self.tile_rows}_c{self.channels_tile}_s{self.stages}"
                f"{'_gated' if self.gated else ''}{f'_k{self.split}' if self.split > 1 else ''}")

    @property
    def threads(self) -> int:
        return stack_threads(self.form, self.tile_rows)

    def signature(self) -> tuple:
        """Fake arguments: ``(x, y, w1, w3, w2, b1, b3, b2, norm_w, norm_b, meta, eps, ws, sync, grid)``."""
        rows, channels = cute.sym_int(), cute.sym_int()
        hidden = cute.sym_int(divisibility=STACK_TILE)  # the packed (padded) hidden of all blocks
        blocks, finals, ws_rows = cute.sym_int(), cute.sym_int(), cute.sym_int()
        cols = self.channels_tile

        def fake(dtype, shape, stride, align):
            return cute.runtime.make_fake_tensor(dtype, shape, stride=stride, assumed_align=align)

        return (fake(Float16, (rows, channels), (channels, 1), 2), fake(Float32, (rows, channels), (channels, 1), 4),
                fake(Float16, (hidden, cols), (cols, 1), 16), fake(Float16, (hidden, cols), (cols, 1), 16),
                fake(Float16, (cols, hidden), (hidden, 1), 16),
                fake(Float32, (hidden,), (1,), 16), fake(Float32, (hidden,), (1,), 16),
                fake(Float32, (blocks, cols), (cols, 1), 16),
                fake(Float32, (finals, cols), (cols, 1), 16), fake(Float32, (finals, cols), (cols, 1), 16),
                fake(Int32, (finals, META_COLUMNS), (META_COLUMNS, 1), 16), fake(Float32, (finals,), (1,), 4),
                fake(Float32, (ws_rows, cols), (cols, 1), 16), fake(Int32, (1,), (1,), 4), Int32(1))

    def compile(self, arch: str | None = None):
        if self.form == "gemv":
            from .persistent_stack_gemv import StackGemv

            return compile_variant(self.name, StackGemv(self), self.signature(), arch)
        if self.form == "mma":
            from .persistent_stack_mma import StackMma

            return compile_variant(self.name, StackMma(self), self.signature(), arch)
        return compile_variant(self.name, PersistentStack(self), self.signature(), arch)


def variant(plan: StackPlan) -> Variant:
    return Variant(plan.form, plan.tile_rows, plan.channels_tile, plan.stages, plan.gated, plan.split)


# ---- the host side (packing: ``stack_packing``) -----------------------------------------------------------------

class Launcher:
    """``run(x, y)``: the stack on rows ``x`` (fp16) into ``y`` (fp32), one launch (the grid and gemv forms'
    barrier word is zeroed once, with the workspace). The rows a call runs on which form: ``plan_for``; the grid
    form takes as many CTAs a row tile as keep the grid within the SMs.
    Workspaces are kept per row count, allocated on first use (the graph variant's warm-up call, outside capture)."""

    def __init__(self, plan: StackPlan, packed: dict, device: DeviceSpec):
        self.plan, self.packed, self.device = plan, packed, device
        self._plans: dict[int, StackPlan] = {}
        self._workspaces: dict = {}

    def plan_for(self, rows: int) -> StackPlan | None:
        """The plan a call of ``rows`` rows runs (``planning.stack.call_plan``): the compiled plan while its form
        serves the rows, else the form planning would choose, with the same packing; None where no fused form
        takes them (the compiled model runs its per-block chain)."""
        if rows not in self._plans:
            self._plans[rows] = call_plan(self.plan, rows, self.device)
        return self._plans[rows]

    def workspace(self, plan: StackPlan, rows: int, device):
        import torch

        key = (plan.form, rows, device)
        ws = self._workspaces.get(key)
        if ws is None:
            stream_rows = 3 * rows if plan.form == "grid" else 1
            if plan.form in MATRIX_VECTOR_FORMS:  # three stream buffers, then each row's hidden units (fp16-rounded)
                stream_rows = 3 * rows + rows * ceil_div(max(plan.chunks) * STACK_TILE, plan.channels_tile)
            ws = (torch.empty((stream_rows, plan.channels_tile), dtype=torch.float32, device=device),
                  torch.zeros((1,), dtype=torch.int32, device=device))  # the grid barrier's word, zeroed once
            self._workspaces[key] = ws
        return ws

    def grid(self, plan: StackPlan, rows: int) -> int:
        tiles = ceil_div(rows, plan.tile_rows)
        if plan.form == "grid":  # every CTA resident: at most one a SM
            return tiles * max(1, min(plan.ctas_per_tile, self.device.sm_count // tiles))
        if plan.form in MATRIX_VECTOR_FORMS:
            return self.device.sm_count
        return min(tiles, self.device.sm_count)

    def __call__(self, x, y):
        p, rows = self.packed, x.shape[0]
        plan = self.plan_for(rows)
        if plan is None:
            raise ValueError(f"no fused form takes {rows} rows of this stack (planning.stack.call_plan); the "
                             "compiled model runs its per-block chain for them")
        ws, sync = self.workspace(plan, rows, x.device)
        compiled(variant(plan))(x, y, p["w1"], p["w3"], p["w2"], p["b1"], p["b3"], p["b2"], p["norm_w"], p["norm_b"],
                                p["meta"], p["eps"], ws, sync, self.grid(plan, rows))
        return y


# ---- the kernel ------------------------------------------------------------------------------------------------

class PersistentStack:
    def __init__(self, variant: Variant):
        self.form = variant.form
        self.tile_rows = variant.tile_rows
        self.cols = variant.channels_tile
        self.k_tiles = variant.channels_tile // STACK_TILE
        self.stages = variant.stages
        self.gated = variant.gated
        self.threads = variant.threads
        self.warps = self.threads // 32
        self.row_split = 1  # warps a row of the operand (``operand``; the gemv form splits its few rows)
        self.weight_kinds = 3 if variant.gated else 2
        self.chunk_tiles = self.weight_kinds * self.k_tiles  # ring tiles one hidden chunk consumes

    @cute.jit
    def __call__(self, x: cute.Tensor, y: cute.Tensor, w1: cute.Tensor, w3: cute.Tensor, w2: cute.Tensor,
                 b1: cute.Tensor, b3: cute.Tensor, b2: cute.Tensor, norm_w: cute.Tensor, norm_b: cute.Tensor,
                 meta: cute.Tensor, eps: cute.Tensor, ws: cute.Tensor, sync: cute.Tensor, grid: Int32,
                 stream: cuda.CUstream):
        rows, tile = self.tile_rows, STACK_TILE
        layouts = (tensorcore.smem_layout((rows, tile, self.k_tiles)),
                   tensorcore.smem_layout((tile, tile, self.stages)), tensorcore.smem_layout((rows, tile)))
        mma = tensorcore.tiled_mma(rows // 16, WARPS_N)
        self.kernel(x, y, w1, w3, w2, b1, b3, b2, norm_w, norm_b, meta, eps, ws, sync, *layouts,
                    tensorcore.g2s_copy(self.threads, tile), mma).launch(
            grid=[grid, 1, 1], block=[self.threads, 1, 1], min_blocks_per_mp=1, preferred_smem_carveout=100,
            cooperative=self.form == "grid", stream=stream)  # the grid barrier: the driver checks residency

    @cute.kernel
    def kernel(self, x: cute.Tensor, y: cute.Tensor, w1: cute.Tensor, w3: cute.Tensor, w2: cute.Tensor,
               b1: cute.Tensor, b3: cute.Tensor, b2: cute.Tensor, norm_w: cute.Tensor, norm_b: cute.Tensor,
               meta: cute.Tensor, eps: cute.Tensor, ws: cute.Tensor, sync: cute.Tensor,
               u_layout: cute.ComposedLayout, w_layout: cute.ComposedLayout, h_layout: cute.ComposedLayout,
               g2s: cute.TiledCopy, mma: cute.TiledMma):
        tile_rows, tile = self.tile_rows, STACK_TILE
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        rows, channels = x.shape
        blocks = meta.shape[0] - 1

        smem = SmemAllocator()
        s_u = smem.allocate_tensor(Float16, u_layout, ALIGN)
        s_w = smem.allocate_tensor(Float16, w_layout, ALIGN)
        s_h = smem.allocate_tensor(Float16, h_layout, ALIGN)
        s_s = None
        if cutlass.const_expr(self.form == "rows"):
            s_s = smem.allocate_tensor(Float32, cute.make_layout((tile_rows, self.cols), stride=(self.cols, 1)),
                                       ALIGN)

        copy_a, copy_b = tensorcore.s2r_copies(mma)
        thr = mma.get_slice(tid)
        acc_h = cute.make_rmem_tensor(thr.partition_shape_C((tile_rows, tile)), Float32)
        acc_g = cute.make_rmem_tensor(thr.partition_shape_C((tile_rows, tile)), Float32)
        acc_o = cute.make_rmem_tensor(thr.partition_shape_C((tile_rows, tile)), Float32)
        coords = thr.partition_C(cute.make_identity_tensor((tile_rows, tile)))
        h_dst = thr.partition_C(s_h)
        total_chunks = meta[blocks - 1, 0] + meta[blocks - 1, 1]
        num_tiles = (rows + tile_rows - 1) // tile_rows

        if cutlass.const_expr(self.form == "rows"):
            mine = (num_tiles - cta + grid - 1) // grid  # row tiles cta, cta + grid, ...
            total = mine * total_chunks * self.chunk_tiles  # ring tiles this CTA consumes
            for s in cutlass.range_constexpr(self.stages - 1):
                if s < total:
                    self.issue_rows(g2s, tid, w1, w3, w2, s_w, Int32(s), total_chunks)
                cute.arch.cp_async_commit_group()
            q = Int32(0)
            for t in range(cta, num_tiles, grid):
                row0 = t * tile_rows
                cute.arch.sync_threads()  # every thread is done with the last tile's stream
                for e in range(tid, tile_rows * self.cols, self.threads):
                    r, c = e // self.cols, e % self.cols
                    value = Float32(0.0)
                    if row0 + r < rows and c < channels:
                        value = x[row0 + r, c].to(Float32)
                    s_s[r, c] = value
                for i in range(blocks):
                    cute.arch.sync_threads()  # the stream is complete
                    self.operand(s_s, 0, tile_rows, s_u, meta[i, 3], eps[i], norm_w, norm_b, i, channels, None, tid)
                    cute.arch.sync_threads()  # every warp read its rows of the stream before b2 joins it
                    for e in range(tid, tile_rows * self.cols, self.threads):
                        r, c = e // self.cols, e % self.cols
                        s_s[r, c] = s_s[r, c] + b2[i, c]
                    for jj in range(meta[i, 1]):
                        g = meta[i, 0] + jj
                        q = self.gemm1(g2s, mma, tid, w1, w3, w2, s_w, s_u, acc_h, acc_g, copy_a, copy_b, q, total,
                                       total_chunks, 0, 0)
                        self.hidden_epilogue(acc_h, acc_g, coords, b1, b3, g, meta[i, 2], h_dst)
                        for n in range(self.k_tiles):
                            q = self.consume(g2s, tid, w1, w3, w2, s_w, q, total, total_chunks, 0, 0)
                            tensorcore.gemm_from_smem(mma, tid, self.zeroed(acc_o), s_h,
                                                      s_w[None, None, (q - 1) % self.stages], copy_a, copy_b)
                            for k in cutlass.range_constexpr(cute.size(acc_o)):
                                r, c = coords[k]
                                s_s[r, n * tile + c] = s_s[r, n * tile + c] + acc_o[k]
                cute.arch.sync_threads()  # the stream after the last block
                self.finish(s_s, row0, rows, channels, y, meta[blocks, 3], eps[blocks], norm_w, norm_b, blocks, tid)
        else:
            per_tile = grid // num_tiles
            t, v = cta % num_tiles, cta // num_tiles  # this CTA's row tile and its place among the tile's CTAs
            row0 = t * tile_rows
            total = self.grid_chunks(meta, blocks, v, per_tile) * self.chunk_tiles
            # the chunk of the next ring tile to issue, as (block, chunk within the block): moved once a chunk
            cursor = cute.make_rmem_tensor((2,), Int32)
            cursor[0], cursor[1] = Int32(0), v
            self.skip_blocks_without_chunks(cursor, meta, blocks, v)
            where = (meta, cursor)
            for s in cutlass.range_constexpr(self.stages - 1):
                if s < total:
                    self.issue_grid(g2s, tid, w1, w3, w2, s_w, Int32(s), where, blocks, v, per_tile)
                cute.arch.cp_async_commit_group()
            # block 0 adds into buffer 1 (or y): zeroed before the first barrier
            self.zero_target(ws, y, 0, blocks, meta[blocks, 3], rows, channels, tid)
            self.grid_barrier(sync, grid, tid)
            q = Int32(0)
            for i in range(blocks):
                if v < meta[i, 1]:
                    self.stream_operand(x, ws, i, row0, rows, s_u, meta, eps, norm_w, norm_b, channels, None, tid)
                    cute.arch.sync_threads()
                if i + 1 < blocks:  # the next block's target, untouched in this one
                    self.zero_target(ws, y, i + 1, blocks, meta[blocks, 3], rows, channels, tid)
                for jj in range(v, meta[i, 1], per_tile):
                    g = meta[i, 0] + jj
                    q = self.gemm1(g2s, mma, tid, w1, w3, w2, s_w, s_u, acc_h, acc_g, copy_a, copy_b, q, total,
                                   where, v, per_tile)
                    self.hidden_epilogue(acc_h, acc_g, coords, b1, b3, g, meta[i, 2], h_dst)
                    for n in range(self.k_tiles):
                        q = self.consume(g2s, tid, w1, w3, w2, s_w, q, total, where, v, per_tile)
                        tensorcore.gemm_from_smem(mma, tid, self.zeroed(acc_o), s_h,
                                                  s_w[None, None, (q - 1) % self.stages], copy_a, copy_b)
                        self.add_partial(acc_o, coords, x, ws, y, b2, i, blocks, jj == 0, row0, n * tile, rows,
                                         channels, meta[blocks, 3])
                self.grid_barrier(sync, grid, tid)
            if meta[blocks, 3] != NORM_NONE:  # the final norm, a warp a row over the grid
                for rr in range(cta * self.warps + tid // 32, rows, grid * self.warps):
                    self.finish_row(ws, blocks % 3 * rows + rr, rr, channels, y, meta[blocks, 3], eps[blocks],
                                    norm_w, norm_b, blocks, tid % 32)

    # ---- the weight ring ----------------------------------------------------------------------------------

    @cute.jit
    def zeroed(self, acc: cute.Tensor) -> cute.Tensor:
        """``acc`` cleared, for a product that starts from zero (GEMM2's output tile)."""
        acc.fill(0.0)
        return acc

    @cute.jit
    def consume(self, g2s, tid, w1, w3, w2, s_w, q: Int32, total: Int32, where, v: Int32, per_tile: Int32) -> Int32:
        """Wait for ring tile q (every earlier commit group but the last stages - 2), hand it to every thread,
        and issue tile q + stages - 1 into the buffer tile q - 1 freed. Returns q + 1; the caller computes on
        buffer q % stages. ``where`` is the rows form's chunk count, or the grid form's (meta, cursor)."""
        cute.arch.cp_async_wait_group(self.stages - 2)
        cute.arch.sync_threads()
        ahead = q + self.stages - 1
        if ahead < total:
            if cutlass.const_expr(self.form == "rows"):
                self.issue_rows(g2s, tid, w1, w3, w2, s_w, ahead, where)
            else:
                self.issue_grid(g2s, tid, w1, w3, w2, s_w, ahead, where, where[0].shape[0] - 1, v, per_tile)
        cute.arch.cp_async_commit_group()  # possibly empty: keeps the group count one per tile
        return q + 1

    @cute.jit
    def gemm1(self, g2s, mma, tid, w1, w3, w2, s_w, s_u, acc_h, acc_g, copy_a, copy_b, q: Int32, total: Int32,
              where, v: Int32, per_tile: Int32) -> Int32:
        """acc_h = u W1[g]^T (and acc_g = u W3[g]^T) over the channels' k tiles, from the ring."""
        acc_h.fill(0.0)
        for k in range(self.k_tiles):
            q = self.consume(g2s, tid, w1, w3, w2, s_w, q, total, where, v, per_tile)
            tensorcore.gemm_from_smem(mma, tid, acc_h, s_u[None, None, k], s_w[None, None, (q - 1) % self.stages],
                                      copy_a, copy_b)
        if cutlass.const_expr(self.gated):
            acc_g.fill(0.0)
            for k in range(self.k_tiles):
                q = self.consume(g2s, tid, w1, w3, w2, s_w, q, total, where, v, per_tile)
                tensorcore.gemm_from_smem(mma, tid, acc_g, s_u[None, None, k], s_w[None, None, (q - 1) % self.stages],
                                          copy_a, copy_b)
        return q

    @cute.jit
    def issue_rows(self, g2s, tid, w1, w3, w2, s_w, q: Int32, total_chunks: Int32):
        """Ring tile q of the rows form: every row tile runs every chunk of the packed weights in order."""
        self.issue_tile(g2s, tid, w1, w3, w2, s_w, q, q // self.chunk_tiles % total_chunks)

    @cute.jit
    def issue_grid(self, g2s, tid, w1, w3, w2, s_w, q: Int32, where, blocks: Int32, v: Int32, per_tile: Int32):
        """Ring tile q of the grid form, whose tiles are issued in order, q = 0, 1, ...: the CTA runs chunks v,
        v + per_tile, ... of each block in turn, and the cursor of ``where = (meta, cursor)`` holds the chunk of
        tile q; after a chunk's last tile it moves to the CTA's next chunk (one word read a tile, not a walk over
        every block's chunk count)."""
        meta, cursor = where
        self.issue_tile(g2s, tid, w1, w3, w2, s_w, q, meta[cursor[0], 0] + cursor[1])
        if (q + 1) % self.chunk_tiles == 0:
            cursor[1] = cursor[1] + per_tile
            if cursor[1] >= meta[cursor[0], 1]:
                cursor[0], cursor[1] = cursor[0] + 1, v
                self.skip_blocks_without_chunks(cursor, meta, blocks, v)

    @cute.jit
    def skip_blocks_without_chunks(self, cursor, meta, blocks: Int32, v: Int32):
        """Move the cursor's block past the blocks with no chunk for the CTA at place v (fewer chunks than v + 1)."""
        for _ in range(blocks):
            if cursor[0] < blocks:
                if v >= meta[cursor[0], 1]:
                    cursor[0] = cursor[0] + 1

    @cute.jit
    def block_chunks(self, meta, i: Int32, v: Int32, per_tile: Int32) -> Int32:
        """Chunks of block i run by the CTA at place v of its row tile."""
        n = Int32(0)
        if v < meta[i, 1]:
            n = (meta[i, 1] - v + per_tile - 1) // per_tile
        return n

    @cute.jit
    def grid_chunks(self, meta, blocks: Int32, v: Int32, per_tile: Int32) -> Int32:
        """Chunks the CTA at place v runs over the whole stack."""
        total = Int32(0)
        for i in range(blocks):
            total = total + self.block_chunks(meta, i, v, per_tile)
        return total

    @cute.jit
    def issue_tile(self, g2s, tid, w1, w3, w2, s_w, q: Int32, g: Int32):
        """Tile r = q mod chunk_tiles of chunk g into ring buffer q mod stages: W1[g] k-tile r, [W3[g] k-tile
        r - k_tiles,] then W2 column tile n of chunk g."""
        r = q % self.chunk_tiles
        kind, k = r // self.k_tiles, r % self.k_tiles
        dst = s_w[None, None, q % self.stages]
        tiler = (STACK_TILE, STACK_TILE)
        if kind == 0:
            self.copy_tile(g2s, tid, cute.local_tile(w1, tiler, (g, k)), dst)
        elif kind == self.weight_kinds - 1:
            self.copy_tile(g2s, tid, cute.local_tile(w2, tiler, (k, g)), dst)
        else:
            self.copy_tile(g2s, tid, cute.local_tile(w3, tiler, (g, k)), dst)

    @cute.jit
    def copy_tile(self, g2s, tid, src: cute.Tensor, dst: cute.Tensor):
        """A whole 64 x 64 tile by 16-byte cp.async (packed weights are padded: no predicate)."""
        thr = g2s.get_slice(tid)
        cute.copy(g2s, thr.partition_S(src), thr.partition_D(dst))

    # ---- the block's epilogues ------------------------------------------------------------------------------

    @cute.jit
    def hidden_epilogue(self, acc_h, acc_g, coords, b1, b3, g: Int32, act: Int32, h_dst):
        """h = fp16(act(acc_h + b1[g]) [* (acc_g + b3[g])]) into this thread's elements of the hidden tile."""
        bias = cute.make_rmem_tensor(acc_h.layout, Float32)
        for k in cutlass.range_constexpr(cute.size(acc_h)):
            bias[k] = b1[g * STACK_TILE + coords[k][1]]
        if act == GELU_ERF:
            for k in cutlass.range_constexpr(cute.size(acc_h)):
                value = acc_h[k] + bias[k]
                acc_h[k] = Float32(0.5) * value * (Float32(1.0) + cute.math.erf(value * Float32(INV_SQRT2)))
        else:
            tensorcore.activate_in_place(acc_h, bias, act)
        if cutlass.const_expr(self.gated):
            for k in cutlass.range_constexpr(cute.size(acc_h)):
                acc_h[k] = acc_h[k] * (acc_g[k] + b3[g * STACK_TILE + coords[k][1]])
        h = cute.make_rmem_tensor(acc_h.layout, Float16)
        h.store(acc_h.load().to(Float16))
        cute.autovec_copy(h, h_dst)

    @cute.jit
    def row_norm(self, src: cute.Tensor, row: Int32, inside, first: Int32, split: int, count: int,
                 channels: Int32, kind: Int32, eps: Float32, s_stats, warp: Int32, lane: Int32):
        """(values, mean, 1 / sqrt(var + eps)) of a row of ``src`` (an RMSNorm's mean 0; no norm: 0 and 1) for
        ``split`` warps a row: this lane's ``count`` values, channels first, first + 32 * split, ... (0 past the
        channels or where the row is not ``inside``), every load issued before any is used (``gather_clamped``: one
        after another, a warp had waited a memory latency per 32 channels); the sums over the row's warps (two
        passes for a LayerNorm: the mean, then the centred squares, no cancellation)."""
        loaded = gather_clamped(src, row, first, 32 * split, count, channels)
        values = cute.make_rmem_tensor((count,), Float32)
        for j in cutlass.range_constexpr(count):
            value = Float32(0.0)
            if inside and first + 32 * split * j < channels:
                value = loaded[j]
            values[j] = value
        mean, scale = Float32(0.0), Float32(1.0)
        if kind != NORM_NONE:
            if kind == NORM_LAYER:
                total = Float32(0.0)
                for j in cutlass.range_constexpr(count):
                    total = total + values[j]
                mean = self.row_sum(total, split, s_stats, warp, lane) / Float32(channels)
            squares = Float32(0.0)
            for j in cutlass.range_constexpr(count):
                d = values[j] - mean
                if first + 32 * split * j >= channels:
                    d = Float32(0.0)
                squares = squares + d * d
            scale = cute.math.rsqrt(self.row_sum(squares, split, s_stats, warp, lane) / Float32(channels) + eps)
        return values, mean, scale

    @cute.jit
    def row_sum(self, value: Float32, split: int, s_stats, warp: Int32, lane: Int32) -> Float32:
        """The sum of ``value`` over a row's ``split`` warps (their sums meet in ``s_stats``: every warp of the CTA
        calls it)."""
        total = cute.arch.warp_reduction_sum(value)
        if cutlass.const_expr(split > 1):
            if lane == 0:
                s_stats[warp] = total
            cute.arch.sync_threads()
            total = Float32(0.0)
            for k in cutlass.range_constexpr(split):
                total = total + s_stats[warp // split * split + k]
            cute.arch.sync_threads()  # every warp has read the sums before the next ones land
        return total

    @cute.jit
    def stream_operand(self, x: cute.Tensor, ws: cute.Tensor, i: Int32, row0: Int32, rows: Int32, s_u: cute.Tensor,
                       meta: cute.Tensor, eps: cute.Tensor, norm_w, norm_b, channels: Int32, s_stats, tid: Int32):
        """``operand`` of block i for the rows from ``row0`` in the forms whose stream lives in global memory (grid,
        gemv): block 0 reads x, block i the stream buffer i % 3 of the workspace."""
        if i == 0:
            self.operand(x, row0, rows, s_u, meta[i, 3], eps[i], norm_w, norm_b, i, channels, s_stats, tid)
        else:
            self.operand(ws, i % 3 * rows + row0, (i % 3 + 1) * rows, s_u, meta[i, 3], eps[i], norm_w, norm_b, i,
                         channels, s_stats, tid)

    @cute.jit
    def operand(self, src: cute.Tensor, base: Int32, limit: Int32, s_u: cute.Tensor, kind: Int32, eps: Float32,
                norm_w, norm_b, i: Int32, channels: Int32, s_stats, tid: Int32):
        """u = fp16(norm(s)) of the tile's rows (src rows base .. base + tile_rows, those at or past ``limit``
        zero) into the operand tile, channels past the stream's zero: ``row_split`` warps a row (``row_norm``; past
        one warp a row, their sums meet in ``s_stats``), the norm's gains and biases loaded at once: before the rows
        where a lane has at most ``GAINS_AT_ONCE`` channels (every row takes the same), else ``GAINS_BATCH`` at a
        time with the row's values again, a batch a loop iteration (unrolled, the batches' loads were hoisted
        together and spilled). Each behind its guard, a row's gains had waited a memory latency each: at 2048
        channels and 16 rows (the mma form on the 1B-sized stack) 64 a lane a row."""
        lane, warp = tid % 32, tid // 32
        split = self.row_split
        count = (self.cols + 32 * split - 1) // (32 * split)  # a lane's channels
        first = warp % split * 32 + lane
        stride = 32 * split
        if cutlass.const_expr(count <= GAINS_AT_ONCE):  # the same for every row: loaded once, before the rows
            gains = gather_clamped(norm_w, i, first, stride, count, channels)
            biases = gather_clamped(norm_b, i, first, stride, count, channels)
            for r in range(warp // split, self.tile_rows, self.warps // split):  # split > 1: a row a warp group
                inside = base + r < limit
                values, mean, scale = self.row_norm(src, cutlass.min(base + r, limit - 1), inside, first, split,
                                                    count, channels, kind, eps, s_stats, warp, lane)
                self.store_normed(s_u, r, values, mean, scale, kind, gains, biases, first, stride, inside, channels)
        else:  # a batch of a lane's channels at a time, its values loaded again (L2 hits) beside their gains
            for r in range(warp // split, self.tile_rows, self.warps // split):
                inside = base + r < limit
                row = cutlass.min(base + r, limit - 1)
                _, mean, scale = self.row_norm(src, row, inside, first, split, count, channels, kind, eps, s_stats,
                                               warp, lane)
                for j0 in cutlass.range(0, count, GAINS_BATCH, unroll=1):  # a loop: unrolled, the batches' loads
                    start = first + stride * j0  # were all hoisted together and spilled
                    self.store_normed(s_u, r, gather_clamped(src, row, start, stride, GAINS_BATCH, channels), mean,
                                      scale, kind, gather_clamped(norm_w, i, start, stride, GAINS_BATCH, channels),
                                      gather_clamped(norm_b, i, start, stride, GAINS_BATCH, channels), start, stride,
                                      inside, channels)

    @cute.jit
    def store_normed(self, s_u: cute.Tensor, r: Int32, values, mean: Float32, scale: Float32, kind: Int32, gains,
                     biases, first: Int32, stride: int, inside, channels: Int32):
        """u[r, c] = fp16((values - mean) * scale * gains + biases) (no norm: the values) at columns first, first +
        stride, ... (one a value), 0 past the channels or where the row is not ``inside``."""
        for k in cutlass.range_constexpr(len(gains)):
            c = first + stride * k
            out = Float32(0.0)
            if inside and c < channels:
                out = (values[k] - mean) * scale
                if kind != NORM_NONE:
                    out = out * gains[k] + biases[k]
            self.store_operand(s_u, r, c, out)

    @cute.jit
    def store_operand(self, s_u: cute.Tensor, r: Int32, c: Int32, out: Float32):
        """u[r, c] of the operand tile (columns up to channels_tile: a lane past them, at a split that does not
        divide the tile, stores nothing)."""
        if c < self.cols:
            s_u[r, c % STACK_TILE, c // STACK_TILE] = out.to(Float16)

    @cute.jit
    def finish(self, s_s, row0: Int32, rows: Int32, channels: Int32, y, kind: Int32, eps: Float32, norm_w, norm_b,
               i: Int32, tid: Int32):
        """y = final_norm(s) (or s) for the tile's rows, a warp a row."""
        lane, warp = tid % 32, tid // 32
        for r in range(warp, self.tile_rows, self.warps):
            if row0 + r < rows:
                self.finish_row(s_s, r, row0 + r, channels, y, kind, eps, norm_w, norm_b, i, lane)

    @cute.jit
    def finish_row(self, src, src_row: Int32, row: Int32, channels: Int32, y, kind: Int32, eps: Float32, norm_w,
                   norm_b, i: Int32, lane: Int32):
        """y[row] = final_norm(src[src_row]) (or the row itself) by one warp, from the stream in global memory (the
        grid and mma forms) or the rows form's tile in shared memory: each pass over the row (a LayerNorm's mean,
        the squares, the output) loads a lane's values, and the output's gains and biases, ``GAINS_BATCH`` at once,
        a batch a loop iteration (``gather_clamped``). A column loop had waited a memory latency a load: at 16 rows
        of the 2-block SwiGLU model the final norm outlasted a block's phase A."""
        mean, scale = Float32(0.0), Float32(1.0)
        if kind != NORM_NONE:
            if kind == NORM_LAYER:
                mean = self.row_batch_sum(src, src_row, channels, mean, False, lane) / Float32(channels)
            squares = self.row_batch_sum(src, src_row, channels, mean, True, lane)
            scale = cute.math.rsqrt(squares / Float32(channels) + eps)
        for j0 in cutlass.range(0, (self.cols + 31) // 32, GAINS_BATCH, unroll=1):
            start = lane + 32 * j0
            values = gather_clamped(src, src_row, start, 32, GAINS_BATCH, channels)
            self.store_final(values, y, row, start, 32, GAINS_BATCH, channels, kind, mean, scale, norm_w, norm_b, i)

    @cute.jit
    def row_batch_sum(self, src, src_row: Int32, channels: Int32, mean: Float32, squared: bool,
                      lane: Int32) -> Float32:
        """The warp's sum over a row of its values (``squared``: of their squares about ``mean``, the LayerNorm's
        second pass, no cancellation), a lane's values ``GAINS_BATCH`` at once."""
        total = Float32(0.0)
        for j0 in cutlass.range(0, (self.cols + 31) // 32, GAINS_BATCH, unroll=1):
            start = lane + 32 * j0
            values = gather_clamped(src, src_row, start, 32, GAINS_BATCH, channels)
            for k in cutlass.range_constexpr(GAINS_BATCH):
                if start + 32 * k < channels:
                    d = values[k] - mean
                    total = total + (d * d if squared else values[k])
        return cute.arch.warp_reduction_sum(total)

    @cute.jit
    def finish_row_by_warps(self, src, src_row: Int32, row: Int32, channels: Int32, y, kind: Int32, eps: Float32,
                            norm_w, norm_b, i: Int32, s_stats, warp: Int32, lane: Int32):
        """y[row] = final_norm(src[src_row]) (or the row itself) by every warp of the CTA (``row_norm``: a lane's
        few values and the norm's gains and biases loaded at once, the warps' sums meeting in ``s_stats``); at
        decode rows a warp a row had walked it one load at a time, three times for a LayerNorm."""
        split = self.warps
        count = (self.cols + 32 * split - 1) // (32 * split)
        first = warp * 32 + lane
        values, mean, scale = self.row_norm(src, src_row, True, first, split, count, channels, kind, eps, s_stats,
                                            warp, lane)
        self.store_final(values, y, row, first, 32 * split, count, channels, kind, mean, scale, norm_w, norm_b, i)

    @cute.jit
    def store_final(self, values, y, row: Int32, first: Int32, stride: int, count: int, channels: Int32, kind: Int32,
                    mean: Float32, scale: Float32, norm_w, norm_b, i: Int32):
        """y[row, first + stride * k] = the final norm of ``values[k]`` (the value itself without a norm) for each of
        the ``count`` columns before ``channels``, the norm's gains and biases of those columns loaded at once (the
        operand's counterpart, into the output: ``store_normed``)."""
        gains = gather_clamped(norm_w, i, first, stride, count, channels)
        biases = gather_clamped(norm_b, i, first, stride, count, channels)
        for k in cutlass.range_constexpr(count):
            c = first + stride * k
            if c < channels:
                value = values[k]
                if kind != NORM_NONE:
                    value = (value - mean) * scale * gains[k] + biases[k]
                y[row, c] = value

    # ---- the grid form's stream ------------------------------------------------------------------------------

    @cute.jit
    def add_partial(self, acc_o, coords, x, ws, y, b2, i: Int32, blocks: Int32, first, row0: Int32, col0: Int32,
                    rows: Int32, channels: Int32, final_kind: Int32):
        """Add this CTA's partial W2 product of one 64-column tile into block i's target (fp32 atomics); the
        CTA of the block's chunk 0 adds the block's input stream and b2 as well. Into a stream buffer (rows of
        channels_tile, 16-byte aligned) each pair of neighbouring columns of a fragment goes as one 8-byte
        ``red.add.v2``; into y (the last block without a final norm, any channels) element by element."""
        to_y = i + 1 == blocks and final_kind == NORM_NONE
        for k in cutlass.range_constexpr(0, cute.size(acc_o), 2):  # elements k, k + 1: columns c, c + 1
            r, c = coords[k]
            row, col = row0 + r, col0 + c
            if row < rows:
                pair = cute.make_rmem_tensor((2,), Float32)
                for e in cutlass.range_constexpr(2):
                    value = acc_o[k + e]
                    if first:
                        value = value + b2[i, col + e]
                        if col + e < channels:
                            if i == 0:
                                value = value + x[row, col + e].to(Float32)
                            else:
                                value = value + ws[i % 3 * rows + row, col + e]
                    pair[e] = value
                if to_y:
                    for e in cutlass.range_constexpr(2):
                        if col + e < channels:
                            self.red_add(y, row, col + e, pair[e])
                else:
                    ptr = ws.iterator + cute.crd2idx(((i + 1) % 3 * rows + row, col), ws.layout)
                    cute.arch.red(ptr, pair.load(), op="add", dtype=Float32, sem="relaxed", scope="gpu")

    @cute.jit
    def red_add(self, t: cute.Tensor, row: Int32, col: Int32, value: Float32):
        ptr = t.iterator + cute.crd2idx((row, col), t.layout)
        cute.arch.red(ptr, value, op="add", dtype=Float32, sem="relaxed", scope="gpu")

    @cute.jit
    def zero_target(self, ws, y, i: Int32, blocks: Int32, final_kind: Int32, rows: Int32, channels: Int32,
                    tid: Int32):
        """Zero block i's target (y for the last block without a final norm), a share per CTA."""
        cta, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        to_y = i + 1 == blocks and final_kind == NORM_NONE
        for e in range(cta * self.threads + tid, rows * self.cols, grid * self.threads):
            r, c = e // self.cols, e % self.cols
            if to_y:
                if c < channels:
                    y[r, c] = Float32(0.0)
            else:
                ws[(i + 1) % 3 * rows + r, c] = Float32(0.0)

    @cute.jit
    def grid_barrier(self, sync: cute.Tensor, grid: Int32, tid: Int32):
        """Every CTA of the grid has arrived (all are resident: grid <= SMs), and what each wrote before is visible
        to all: one int32 word, one atomic a CTA. CTA 0 adds 2**31 - (grid - 1), every other CTA 1, so the word's
        top bit flips exactly when the last CTA arrives, whatever the order, and its low 31 bits are zero again:
        the word is zeroed once at allocation, not by a memset before each launch. Each arrival releases what the
        CTA's threads wrote (cumulative over the CTA barrier before it); the poll's acquire load sees every CTA's
        writes once the bit has flipped.
        The protocol of kernellab-kernels' ``GradKernel.grid_barrier``, kept as a copy: the packages install
        alone, and neither depends on the other for one device function (change both together)."""
        cute.arch.sync_threads()
        if tid == 0:
            cta, _, _ = cute.arch.block_idx()
            add = Int32(1)
            if cta == 0:
                add = Int32(2**31 - 1) - (grid - 2)  # 2**31 - (grid - 1): wraps to 0x80000000 at grid 1
            old = cute.arch.atomic_add(sync.iterator, add, sem="release", scope="gpu")
            seen = old
            while (old ^ seen) >= 0:  # the top bits agree: not every CTA has arrived
                seen = cute.arch.load(sync.iterator, Int32, sem="acquire", scope="gpu")
        cute.arch.sync_threads()
