"""``persistent-stack``'s mma form: the gemv form's two phases a block over every SM, each warp's item a tensor-core
tile instead of one hidden unit or output channel, for decode rows past what CUDA-core dot products serve well.

Per block i, the rows in tiles of ``tile_rows`` (16, 32 or 64: the M of a warp's ``mma.sync`` m16n8k16 tile):

    phase A  u = fp16(norm_i(s)) of the rows, by every CTA into its shared memory (swizzled, as the grid form's);
             a warp's item is 16 hidden units and one 64-column chunk of W1 [and W3]: acc (rows x 16) += u_chunk .
             W_chunk^T; after a unit tile's last chunk, h = fp16(act(acc + b1) [* (acc3 + b3)]) into the workspace.
             With ``split`` > 1, that many warps of a CTA share a unit tile, each every split-th chunk, and their
             sums meet in the CTA's shared memory before the first of them writes h (``finish_unit``): a unit tile
             a warp had left most warps idle where the tiles are fewer than the grid's warps
    grid barrier
    phase B  a warp's item is 16 output channels and 128 hidden units (two 64-unit chunks of W2), a warp's items
             a run of consecutive ones that mostly share their hidden units: the slice's hidden values of the rows
             staged into the warp's shared memory as fp16 once for the run (they are fp16-rounded already; the
             staging reuses the operand's buffer, dead in phase B), acc (rows x 16) = h . W2_tile^T, added into
             the next stream buffer (seeded with s + b2) by fp32 atomics. With ``split`` > 1 (the CTA has
             the partial sums' buffer) an item is the CTA's: 16 channels and a group of as many slices as the CTA
             has warps, a slice a warp, their sums added in shared memory before one atomic an element
             (``add_tile_by_cta``), where a warp an item had made an atomic an element a slice
    grid barrier

The weights go through each warp's ring of (16 x 64) fp16 tiles, two a stage, by 16-byte cp.async, as in the gemv
form (``persistent_stack_gemv``, whose phases, barriers, stream buffers and final rows this form keeps). Each hidden
value is read from L2 about once a warp that takes its slice, and each weight once a call.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float16, Float32, Int32
from cutlass.cute.nvgpu import warp as warp_ops
from cutlass.memory import SmemAllocator

from ..planning.stack import ALIGN, MMA_TILE_UNITS, STACK_TILE, mma_staging_elements
from . import tensorcore
from .persistent_stack_gemv import WARP, StackGemv


class StackMma(StackGemv):
    def __init__(self, variant):
        super().__init__(variant)
        self.unit_block = MMA_TILE_UNITS  # a phase A item: 16 hidden units ...
        self.split = variant.split  # ... shared by this many warps of a CTA (a power of two dividing its warps) ...
        self.batches = -(-self.k_tiles // self.split)  # ... each taking this many 64-column chunks of W1 [and W3]
        self.channel_block = MMA_TILE_UNITS  # a phase B item: 16 output channels ...
        self.slice = 2 * STACK_TILE  # ... and 128 hidden units of their W2 rows
        self.row_group = self.tile_rows

    # ---- the pieces of the gemv form's skeleton this form replaces ----------------------------------------------

    def make_operand(self, smem: SmemAllocator) -> cute.Tensor:
        """The operand tile (swizzled, as the grid form's) over a buffer that phase B reuses to stage hidden values
        (``make_ring``): the operand is dead from phase A's end to the next block's, each side of a barrier."""
        elements = max(self.tile_rows * self.cols, mma_staging_elements(self.tile_rows))
        buffer = smem.allocate_array(Float16, num_elems=elements, byte_alignment=ALIGN)
        return cute.make_tensor(buffer, tensorcore.smem_layout((self.tile_rows, STACK_TILE, self.k_tiles)))

    def make_ring(self, smem: SmemAllocator, warp: Int32, s_u: cute.Tensor):
        """This warp's ring of (16 x 64) weight tiles, two a stage, and its staging of a slice's hidden values for
        phase B (two (rows x 64) chunks), over the operand's buffer."""
        s_ring = smem.allocate_tensor(Float16, tensorcore.smem_layout((MMA_TILE_UNITS, STACK_TILE,
                                                                        2 * self.stages * self.warps)), ALIGN)
        s_h = cute.make_tensor(s_u.iterator, tensorcore.smem_layout((self.tile_rows, STACK_TILE, 2 * self.warps)))
        s_part = None  # each warp's partial sums of its unit tile, lane-major (no bank conflicts), W1's then W3's
        if cutlass.const_expr(self.split > 1):
            values = self.tile_rows * MMA_TILE_UNITS // WARP
            s_part = smem.allocate_tensor(Float32, cute.make_layout((WARP, 2 * values, self.warps),
                                                                    stride=(1, WARP, WARP * 2 * values)), ALIGN)
        return s_ring, s_h, warp, s_part

    def slice_cache(self):
        """The slice whose hidden values this warp has staged (its items mostly share one: ``slice_item``), so
        that they are staged once a slice, not once an item: the staging had read 8 KB from L2 an item against
        W2's 4 KB, in two round trips."""
        return cute.make_rmem_tensor((1,), Int32)

    def forget_slice(self, cache):
        cache[0] = Int32(-1)

    def accumulators(self):
        mma = self.tiled_mma()
        thr = mma.get_slice(Int32(0))  # the shape only: every lane's partition has it
        shape = thr.partition_shape_C((self.tile_rows, MMA_TILE_UNITS))
        return cute.make_rmem_tensor(shape, Float32), cute.make_rmem_tensor(shape, Float32)

    def tiled_mma(self):
        """One warp's (tile_rows x 16 x 16) tile of m16n8k16 MMAs."""
        op = warp_ops.MmaF16BF16Op(Float16, Float32, tensorcore.MMA_SHAPE)
        return cute.make_tiled_mma(op, cute.make_layout((1, 1, 1)),
                                   permutation_mnk=(self.tile_rows, MMA_TILE_UNITS, tensorcore.MMA_SHAPE[2]))

    @cute.jit
    def slot(self, ring, stage: Int32, which: int) -> cute.Tensor:
        s_ring, _, warp, _ = ring
        return s_ring[None, None, (warp * self.stages + stage) * 2 + which]

    @cute.jit
    def copy_weight_tile(self, src: cute.Tensor, dst: cute.Tensor, lane: Int32):
        """A whole (16 x 64) tile of packed (padded) weights by this warp's 16-byte cp.async copies. A lane's copies
        land where other lanes' ldmatrix read: the warp syncs first, so the stage it overwrites has been read."""
        cute.arch.sync_warp()
        g2s = tensorcore.g2s_copy(WARP, STACK_TILE)
        thr = g2s.get_slice(lane)
        cute.copy(g2s, thr.partition_S(src), thr.partition_D(dst))

    def slice_run(self, channel_blocks: Int32, slices: Int32, first_warp: Int32, all_warps: Int32):
        """(first item, items) of phase B's run: with ``split`` > 1 the CTA's run of its (channel tile, slice group)
        items, the same for each of its warps (they meet once an item), runs of equal length over the CTAs."""
        if cutlass.const_expr(self.split == 1):
            return super().slice_run(channel_blocks, slices, first_warp, all_warps)
        groups = (slices + self.warps - 1) // self.warps
        return super().slice_run(channel_blocks, groups, first_warp // self.warps, all_warps // self.warps)

    def slice_item(self, first_item: Int32, m: Int32, channel_blocks: Int32):
        """(channel tile, slice) of this warp's phase B item m, slice-major: with ``split`` > 1 the CTA's item m
        names a slice group and this warp takes its place in the group (past the block's slices in the last group:
        ``output_slice`` adds nothing for it)."""
        block, k = super().slice_item(first_item, m, channel_blocks)
        if cutlass.const_expr(self.split > 1):
            tid, _, _ = cute.arch.thread_idx()
            k = self.group_slice(k, tid // WARP)
        return block, k

    def group_slice(self, group: Int32, warp: Int32) -> Int32:
        """The slice that warp ``warp`` of a CTA takes of slice group ``group`` (``split`` > 1)."""
        return group * self.warps + warp

    def unit_items(self, units: Int32, first_warp: Int32, all_warps: Int32) -> Int32:
        """This warp's phase A items: (unit tile, chunk) pairs, the unit tiles first_warp, first_warp + all_warps,
        ...; with ``split`` > 1 the same count for every warp of a CTA (its warps meet once a unit tile), the rounds
        of the CTA's first group of ``split`` warps (the groups a unit tile each, every ``groups``-th), each
        ``batches`` chunks a warp."""
        tiles = (units + MMA_TILE_UNITS - 1) // MMA_TILE_UNITS
        if cutlass.const_expr(self.split == 1):
            return (tiles + all_warps - 1 - first_warp) // all_warps * self.batches
        groups = all_warps // self.split
        first_group = first_warp // self.warps * (self.warps // self.split)  # this CTA's first
        return (tiles + groups - 1 - first_group) // groups * self.batches

    def unit_block_of(self, first_warp: Int32, all_warps: Int32, m: Int32) -> Int32:
        """The unit tile of this warp's phase A item m (past the block's tiles where a CTA's groups take unequal
        counts: ``unit_items``)."""
        return first_warp // self.split + m // self.batches * (all_warps // self.split)

    def chunk_of(self, first_warp: Int32, m: Int32) -> Int32:
        """The 64-column chunk of this warp's phase A item m: every split-th, from the warp's place in its group."""
        return first_warp % self.split + m % self.batches * self.split

    @cute.jit
    def copy_unit_batch(self, w1, w3, ring, unit0: Int32, units: Int32, first_warp: Int32, all_warps: Int32,
                        m: Int32, items: Int32, lane: Int32):
        """Item m of phase A (``unit_block_of``, ``chunk_of``): its W1 [and W3] tile into ring stage m % stages,
        then one commit (an empty group past the last item, or for a unit tile or chunk past the block's)."""
        if m < items:
            t = self.unit_block_of(first_warp, all_warps, m)
            k = self.chunk_of(first_warp, m)
            if cutlass.const_expr(self.split == 1):  # every item of a warp's count is the block's
                self.copy_unit_tiles(w1, w3, ring, unit0 // MMA_TILE_UNITS + t, k, m, lane)
            else:
                if t * MMA_TILE_UNITS < units:
                    if k < self.k_tiles:
                        self.copy_unit_tiles(w1, w3, ring, unit0 // MMA_TILE_UNITS + t, k, m, lane)
        cute.arch.cp_async_commit_group()

    @cute.jit
    def copy_unit_tiles(self, w1, w3, ring, t: Int32, k: Int32, m: Int32, lane: Int32):
        """Chunk k of unit tile t (of the packed weights) of W1 [and W3] into ring stage m % stages."""
        tiler = (MMA_TILE_UNITS, STACK_TILE)
        self.copy_weight_tile(cute.local_tile(w1, tiler, (t, k)), self.slot(ring, m % self.stages, 0), lane)
        if cutlass.const_expr(self.gated):
            self.copy_weight_tile(cute.local_tile(w3, tiler, (t, k)), self.slot(ring, m % self.stages, 1), lane)

    @cute.jit
    def unit_batch(self, ring, s_u: cute.Tensor, acc: cute.Tensor, gate: cute.Tensor, m: Int32, lane: Int32):
        """acc (gate) += u_chunk . W1_tile^T (W3_tile^T) for item m's chunk; a unit tile's first chunk starts them
        (a chunk past the operand's adds nothing: with ``split`` > 1 a warp's last may be)."""
        k = m % self.batches
        cute.arch.sync_warp()  # every lane's copies of the stage have landed (each waited for its own)
        if k == 0:
            acc.fill(0.0)
            gate.fill(0.0)
        if cutlass.const_expr(self.split == 1):
            self.unit_products(ring, s_u, acc, gate, k, m, lane)
        else:
            tid, _, _ = cute.arch.thread_idx()
            k = tid // WARP % self.split + k * self.split
            if k < self.k_tiles:
                self.unit_products(ring, s_u, acc, gate, k, m, lane)

    @cute.jit
    def unit_products(self, ring, s_u: cute.Tensor, acc: cute.Tensor, gate: cute.Tensor, k: Int32, m: Int32,
                      lane: Int32):
        """acc (gate) += u_chunk k . W1_tile^T (W3_tile^T), the tiles from ring stage m % stages."""
        mma = self.tiled_mma()
        copy_a, copy_b = tensorcore.s2r_copies(mma)
        tensorcore.gemm_from_smem(mma, lane, acc, s_u[None, None, k], self.slot(ring, m % self.stages, 0), copy_a,
                                  copy_b)
        if cutlass.const_expr(self.gated):
            tensorcore.gemm_from_smem(mma, lane, gate, s_u[None, None, k], self.slot(ring, m % self.stages, 1),
                                      copy_a, copy_b)

    @cute.jit
    def finish_unit(self, ring, acc: cute.Tensor, gate: cute.Tensor, b1, b3, ws, unit0: Int32, units: Int32,
                    j: Int32, act: Int32, rows: Int32, row0: Int32, hidden_rows: Int32, lane: Int32):
        """h[r, u] = fp16(act(acc + b1) [* (gate + b3)]) of unit tile j into the workspace. With ``split`` > 1 every
        warp of the CTA leaves its sums in shared memory, and the first warp of each group adds its partners' (a
        lane's elements are the same (row, unit) in every warp) and writes; the CTA syncs before (every sum is
        there) and after (the next tile's may overwrite them)."""
        if cutlass.const_expr(self.split == 1):
            self.write_unit(acc, gate, b1, b3, ws, unit0, j, act, rows, row0, hidden_rows, lane)
        else:
            _, _, warp, s_part = ring
            values = cute.size(acc)
            for e in cutlass.range_constexpr(values):
                s_part[lane, e, warp] = acc[e]
                if cutlass.const_expr(self.gated):
                    s_part[lane, values + e, warp] = gate[e]
            cute.arch.sync_threads()
            if warp % self.split == 0:
                if j * MMA_TILE_UNITS < units:
                    for p in cutlass.range_constexpr(1, self.split):
                        for e in cutlass.range_constexpr(values):
                            acc[e] = acc[e] + s_part[lane, e, warp + p]
                            if cutlass.const_expr(self.gated):
                                gate[e] = gate[e] + s_part[lane, values + e, warp + p]
                    self.write_unit(acc, gate, b1, b3, ws, unit0, j, act, rows, row0, hidden_rows, lane)
            cute.arch.sync_threads()

    @cute.jit
    def write_unit(self, acc: cute.Tensor, gate: cute.Tensor, b1, b3, ws, unit0: Int32, j: Int32, act: Int32,
                   rows: Int32, row0: Int32, hidden_rows: Int32, lane: Int32):
        """h[r, u] = fp16(act(acc + b1) [* (gate + b3)]) of unit tile j, each lane its accumulator elements."""
        coords = self.tiled_mma().get_slice(lane).partition_C(
            cute.make_identity_tensor((self.tile_rows, MMA_TILE_UNITS)))
        for e in cutlass.range_constexpr(cute.size(acc)):
            r, c = coords[e]
            unit = j * MMA_TILE_UNITS + c
            value = self.hidden_value(acc[e], gate[e], b1, b3, unit0 + unit, act)
            if row0 + r < rows:
                ws[3 * rows + (row0 + r) * hidden_rows + unit // self.cols, unit % self.cols] = (
                    value.to(Float16).to(Float32))

    @cute.jit
    def copy_slice(self, w2, ring, unit0: Int32, units: Int32, channel_blocks: Int32, first_item: Int32, m: Int32,
                   items: Int32, lane: Int32):
        """Item m of this warp's phase B (channel tile c, slice k: ``slice_item``): the W2 tiles of its one or two
        64-unit chunks into ring stage m % stages, then one commit."""
        if m < items:
            c, k = self.slice_item(first_item, m, channel_blocks)
            tiler = (MMA_TILE_UNITS, STACK_TILE)
            for half in cutlass.range_constexpr(2):
                if k * self.slice + half * STACK_TILE < units:
                    chunk = unit0 // STACK_TILE + k * 2 + half
                    self.copy_weight_tile(cute.local_tile(w2, tiler, (c, chunk)),
                                          self.slot(ring, m % self.stages, half), lane)
        cute.arch.cp_async_commit_group()

    @cute.jit
    def output_slice(self, ring, ws, i: Int32, c0: Int32, k: Int32, stage: Int32, units: Int32,
                     rows: Int32, channels: Int32, hidden_rows: Int32, cache, lane: Int32):
        """s'[r, c] += h[r, slice k] . W2[c, slice k] for the item's 16 channels and every row, a row tile at a time:
        the slice's hidden values of the tile staged in the warp's shared memory as fp16 (kept for the warp's next items
        of the slice where the rows are one tile: ``cache``), then the MMAs against the slice's W2 tiles, then one
        atomic add an element (with ``split`` > 1 one for the CTA's warps together: ``add_tile_by_cta``)."""
        _, s_h, warp, _ = ring
        mma = self.tiled_mma()
        copy_a, copy_b = tensorcore.s2r_copies(mma)
        thr = mma.get_slice(lane)
        acc = cute.make_rmem_tensor(thr.partition_shape_C((self.tile_rows, MMA_TILE_UNITS)), Float32)
        coords = thr.partition_C(cute.make_identity_tensor((self.tile_rows, MMA_TILE_UNITS)))
        for row0 in range(0, rows, self.tile_rows):
            acc.fill(0.0)
            if cache[0] != k or rows > self.tile_rows:
                cute.arch.sync_warp()  # every lane has read the last staged slice
                for half in cutlass.range_constexpr(2):
                    if k * self.slice + half * STACK_TILE < units:
                        # a (tile_rows x 64) chunk as 8-value vectors, the lanes over them, 4 a lane in flight
                        for e in cutlass.range(self.tile_rows * STACK_TILE // 8 // WARP, unroll=4):
                            v = e * WARP + lane
                            r, kv = v // (STACK_TILE // 8), v % (STACK_TILE // 8)
                            unit = k * self.slice + half * STACK_TILE + kv * 8
                            h = self.hidden_vector(ws, rows, hidden_rows, row0 + r, unit, units, row0 + r < rows)
                            dst = cute.local_tile(s_h[r, None, 2 * warp + half], (8,), (kv,))
                            dst.store(h.load().to(Float16))
                cute.arch.sync_warp()
                cache[0] = k
            for half in cutlass.range_constexpr(2):
                if k * self.slice + half * STACK_TILE < units:
                    tensorcore.gemm_from_smem(mma, lane, acc, s_h[None, None, 2 * warp + half],
                                              self.slot(ring, stage, half), copy_a, copy_b)
            if cutlass.const_expr(self.split == 1):
                for e in cutlass.range_constexpr(cute.size(acc)):
                    r, cc = coords[e]
                    row, c = row0 + r, c0 + cc
                    if row < rows and c < channels:
                        self.add_to_stream(ws, i, row, c, rows, acc[e])
            else:
                self.add_tile_by_cta(ring, acc, coords, ws, i, c0, row0, rows, channels, lane)

    @cute.jit
    def add_tile_by_cta(self, ring, acc: cute.Tensor, coords: cute.Tensor, ws, i: Int32, c0: Int32,
                        row0: Int32, rows: Int32, channels: Int32, lane: Int32):
        """The CTA's warps' sums of one (rows x 16) tile, a slice of the group each, added in shared memory and then
        into the stream by one atomic an element, the elements dealt over the warps (a lane's elements are the same
        (row, channel) in every warp). The CTA syncs before writing (the last tile's sums are read) and after (every
        warp's are there)."""
        _, _, warp, s_part = ring
        values = cute.size(acc)
        cute.arch.sync_threads()
        for e in cutlass.range_constexpr(values):
            s_part[lane, e, warp] = acc[e]
        cute.arch.sync_threads()
        for e in cutlass.range_constexpr(values):
            if e % self.warps == warp:
                total = s_part[lane, e, 0]
                for p in cutlass.range_constexpr(1, self.warps):
                    total = total + s_part[lane, e, p]
                r, cc = coords[e]
                row, c = row0 + r, c0 + cc
                if row < rows and c < channels:
                    self.add_to_stream(ws, i, row, c, rows, total)
