"""``persistent-stack``'s gemv form: the fewest rows (decode), each block as two matrix-vector phases over every SM.

Per block i, with the rows taken ``tile_rows`` at a time (one tile for rows <= tile_rows):

    phase A  u = fp16(norm_i(s)) of the rows, by every CTA into its shared memory;
             hidden unit j (a warp each, units dealt round-robin over all warps of the grid):
             h[r, j] = fp16(act(u[r] . W1[j] + b1[j]) [* (u[r] . W3[j] + b3[j])]) into the workspace (fp32)
    grid barrier
    phase B  output channel c, K slice k of W2's row (a warp each item, a run of consecutive items a warp):
             s'[r, c] += h[r, k] . W2[c, k], fp32 atomic adds into s' seeded with s + b2
    grid barrier

then ``y = final_norm(s)`` or ``y = s``, a warp a row. Each warp streams its weights through a ring of the plan's
stages (``GEMV_RING_STAGES`` where they fit) in shared memory by 16-byte cp.async copies (a stage: a batch of a
unit's W1 [and W3] row, or a W2 slice; a lane copies and later reads its own vectors, so no warp or CTA sync guards
the ring): while it computes on one stage the next are in flight, and each weight is read once a call by one warp.
Weights do not depend on the stream, so each phase's first stages are copied before the grid barrier ahead of it and
land while the grid waits; the operand rows come from shared memory, the hidden values from L2 (at one-row tiles
held in registers for a warp's items of one slice). Stream buffers rotate over three as in the grid form (block i
reads buffer i % 3, block 0 reads x, and adds into (i + 1) % 3, set to s + b2 during phase A: nobody reads it then), the
hidden units of every row follow them in the workspace. The barrier is the grid form's
(``PersistentStack.grid_barrier``, one word zeroed once).
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float16, Float32, Int32
from cutlass.cute.nvgpu import cpasync
from cutlass.memory import SmemAllocator

from ..planning.stack import ALIGN, GEMV_STAGE_VECTORS, STACK_TILE
from .common import activate
from .persistent_stack import GELU_ERF, INV_SQRT2, PersistentStack

VEC = 8  # fp16 values of one 16-byte load
WARP = 32
ROW_GROUP = 4  # rows of a W2 slice's products whose hidden values are loaded together (a round trip a group)
CHANNEL_BLOCK = 2  # output channels a phase B item takes past 2 rows at 1024 channels and more: each hidden value a
# lane loads serves that many channels (a warp a channel reads every row's hidden values once a channel: at 16 rows
# of the 1B-sized stack about 1 GB a block against 32 MB of W2); fewer channels keep more items for small models.
# At one row from FULL_STAGE_CHANNELS too, where an item of one channel fills half its ring stage (its slice is 4
# vectors a lane of the stage's 8): phase B had half phase A's bytes in flight (48 KB an SM against 96 KB). At two
# rows it spills (sm_90a, 2048 gated channels: 255 registers and 20 B of spill stores)
FULL_STAGE_CHANNELS = 2048  # from here 1024 channel blocks or more: about one a warp of the grid for every slice
SLICE_VECTORS = (4, 2)  # 16-byte vectors a lane copies per W2 slice at 1-2 rows, and past: a slice is WARP * VEC *
# that many hidden units (smaller slices: more items to spread over the warps when the hidden units are few)


class StackGemv(PersistentStack):
    def __init__(self, variant):
        super().__init__(variant)
        self.steps = math.ceil(self.cols / (WARP * VEC))  # a lane's 16-byte vectors along one W1 row
        # a batch (one ring stage) takes the same columns of W1 and (gated) W3
        self.batch = max(1, min(self.steps, GEMV_STAGE_VECTORS // (2 if self.gated else 1)))
        self.batches = math.ceil(self.steps / self.batch)
        self.slice_vectors = SLICE_VECTORS[0] if self.tile_rows <= 2 else SLICE_VECTORS[1]
        self.slice = WARP * VEC * self.slice_vectors
        self.row_group = min(self.tile_rows, ROW_GROUP)
        self.unit_block = 1  # hidden units a phase A item takes (the mma form: a tile of them)
        wide = self.tile_rows == 1 and self.cols >= FULL_STAGE_CHANNELS or self.tile_rows > 2 and self.cols >= 1024
        self.channel_block = CHANNEL_BLOCK if wide else 1
        # fewer rows than warps: each row's operand over warps // tile_rows warps (at one row a warp had walked it)
        self.row_split = self.warps // self.tile_rows if self.tile_rows < self.warps else 1
        assert self.channel_block * self.slice_vectors <= GEMV_STAGE_VECTORS, "a phase B item is one ring stage"

    @cute.jit
    def __call__(self, x: cute.Tensor, y: cute.Tensor, w1: cute.Tensor, w3: cute.Tensor, w2: cute.Tensor,
                 b1: cute.Tensor, b3: cute.Tensor, b2: cute.Tensor, norm_w: cute.Tensor, norm_b: cute.Tensor,
                 meta: cute.Tensor, eps: cute.Tensor, ws: cute.Tensor, sync: cute.Tensor, grid: Int32,
                 stream: cuda.CUstream):
        self.kernel(x, y, w1, w3, w2, b1, b3, b2, norm_w, norm_b, meta, eps, ws, sync).launch(
            grid=[grid, 1, 1], block=[self.threads, 1, 1], min_blocks_per_mp=1, preferred_smem_carveout=100,
            cooperative=True, stream=stream)

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
        # the operand tile as the rows/grid forms' ``operand`` indexes it, (row, column in chunk, chunk)
        s_u = self.make_operand(smem)
        ring = self.make_ring(smem, warp, s_u)
        s_stats = None  # the gemv form's row sums over warps: its operand's rows (fewer than warps), its final norm
        if cutlass.const_expr(self.form == "gemv"):
            s_stats = smem.allocate_tensor(Float32, cute.make_layout(self.warps), byte_alignment=16)
        acc, gate = self.accumulators()
        cache = self.slice_cache()

        # weights do not depend on the stream: each phase's first stages are copied before the barrier ahead of it
        self.first_unit_batches(w1, w3, ring, meta, Int32(0), first_warp, all_warps, lane)
        for i in range(blocks):
            units = meta[i, 1] * STACK_TILE
            unit0 = meta[i, 0] * STACK_TILE
            for e in range(cta * self.threads + tid, rows * self.cols, grid * self.threads):  # nobody reads it now
                self.seed_stream(ws, x, b2, i, e // self.cols, e % self.cols, rows, channels)
            unit_items = self.unit_items(units, first_warp, all_warps)
            for row0 in range(0, rows, self.tile_rows):
                if row0 > 0:  # the first row tile's stages are in flight already
                    self.first_unit_batches(w1, w3, ring, meta, i, first_warp, all_warps, lane)
                cute.arch.sync_threads()  # every warp is done with the last row tile's operand
                self.stream_operand(x, ws, i, row0, rows, s_u, meta, eps, norm_w, norm_b, channels, s_stats, tid)
                cute.arch.sync_threads()
                for m in range(unit_items):
                    self.copy_unit_batch(w1, w3, ring, unit0, units, first_warp, all_warps, m + self.stages - 1,
                                         unit_items, lane)
                    cute.arch.cp_async_wait_group(self.stages - 1)  # item m's copies have landed
                    self.unit_batch(ring, s_u, acc, gate, m, lane)
                    if m % self.batches == self.batches - 1:
                        self.finish_unit(ring, acc, gate, b1, b3, ws, unit0, units,
                                         self.unit_block_of(first_warp, all_warps, m), meta[i, 2], rows, row0,
                                         hidden_rows, lane)
            # phase B's items, (channel block, slice) slice-major, in a run of consecutive ones a warp: a warp's
            # items mostly share their slice, so its hidden values serve them all (``slice_cache``)
            slices = (units + self.slice - 1) // self.slice
            channel_blocks = (channels + self.channel_block - 1) // self.channel_block
            first_item, slice_items = self.slice_run(channel_blocks, slices, first_warp, all_warps)
            for m in cutlass.range_constexpr(self.stages - 1):
                self.copy_slice(w2, ring, unit0, units, channel_blocks, first_item, Int32(m), slice_items, lane)
            self.grid_barrier(sync, grid, tid)
            if cutlass.const_expr(cache is not None):
                self.forget_slice(cache)  # this block's hidden values are new
            for m in range(slice_items):
                self.copy_slice(w2, ring, unit0, units, channel_blocks, first_item, m + self.stages - 1, slice_items,
                                lane)
                cute.arch.cp_async_wait_group(self.stages - 1)
                block, k = self.slice_item(first_item, m, channel_blocks)
                self.output_slice(ring, ws, i, block * self.channel_block, k, m % self.stages, units, rows,
                                  channels, hidden_rows, cache, lane)
            if i + 1 < blocks:
                self.first_unit_batches(w1, w3, ring, meta, i + 1, first_warp, all_warps, lane)
            self.grid_barrier(sync, grid, tid)
        if cutlass.const_expr(self.form == "gemv"):  # the final norm (or a copy), a CTA a row
            for rr in range(cta, rows, grid):
                self.finish_row_by_warps(ws, blocks % 3 * rows + rr, rr, channels, y, meta[blocks, 3], eps[blocks],
                                         norm_w, norm_b, blocks, s_stats, warp, lane)
        else:  # a warp a row (a CTA a row took the mma form at 2048 channels past its registers)
            for rr in range(first_warp, rows, all_warps):
                self.finish_row(ws, blocks % 3 * rows + rr, rr, channels, y, meta[blocks, 3], eps[blocks], norm_w,
                                norm_b, blocks, lane)

    # ---- what the mma form (``persistent_stack_mma``) replaces --------------------------------------------------

    def make_operand(self, smem: SmemAllocator) -> cute.Tensor:
        """Row-major, so that a lane's 8 columns are one 16-byte read."""
        return smem.allocate_tensor(Float16, cute.make_layout((self.tile_rows, STACK_TILE, self.k_tiles),
                                                              stride=(self.cols, 1, STACK_TILE)), ALIGN)

    def make_ring(self, smem: SmemAllocator, warp: Int32, s_u: cute.Tensor) -> cute.Tensor:
        """This warp's ring: (vector element, lane, vector, stage); a lane's vector is 16 contiguous bytes."""
        s_ring = smem.allocate_tensor(Float16, cute.make_layout((VEC, WARP, GEMV_STAGE_VECTORS, self.stages,
                                                                 self.warps)), ALIGN)
        return s_ring[None, None, None, None, warp]

    def accumulators(self):
        """A lane's share of each row's W1 [and W3] products for the unit in hand."""
        return cute.make_rmem_tensor((self.tile_rows,), Float32), cute.make_rmem_tensor((self.tile_rows,), Float32)

    def slice_cache(self):
        """At one-row tiles, (a lane's hidden values of one W2 slice, the slice's index): held in registers from one
        of a warp's phase B items to the next, which mostly keep the slice (``slice_item``), so that they load once a
        slice, not once an item (at one row of the 1B-sized stack they were most of phase B's reads, 4 KB an item
        against W2's 2 KB). None past one row: a lane would hold a row group's."""
        if self.tile_rows > 1:
            return None
        return cute.make_rmem_tensor((VEC, self.slice_vectors), Float32), cute.make_rmem_tensor((1,), Int32)

    def forget_slice(self, cache):
        """No slice's hidden values held (a block's phase B starts)."""
        cache[1][0] = Int32(-1)

    def slice_run(self, channel_blocks: Int32, slices: Int32, first_warp: Int32, all_warps: Int32):
        """(first item, items) of this warp's run of phase B's (channel block, slice) items: runs of equal length,
        the last ones short or empty."""
        items = channel_blocks * slices
        per_warp = (items + all_warps - 1) // all_warps
        first_item = first_warp * per_warp
        return first_item, cutlass.max(cutlass.min(items - first_item, per_warp), 0)

    def slice_item(self, first_item: Int32, m: Int32, channel_blocks: Int32):
        """(channel block, slice) of a warp's phase B item m: its run of items starts at ``first_item``, slice-major,
        so consecutive items change the channel block and keep the slice."""
        item = first_item + m
        return item % channel_blocks, item // channel_blocks

    @cute.jit
    def unit_items(self, units: Int32, first_warp: Int32, all_warps: Int32) -> Int32:
        """This warp's phase A items: (unit block, batch) pairs of the unit blocks first_warp, first_warp +
        all_warps, ..."""
        unit_blocks = (units + self.unit_block - 1) // self.unit_block
        return (unit_blocks + all_warps - 1 - first_warp) // all_warps * self.batches

    def unit_block_of(self, first_warp: Int32, all_warps: Int32, m: Int32) -> Int32:
        """The unit block of this warp's phase A item m (``unit_items``)."""
        return first_warp + m // self.batches * all_warps

    @cute.jit
    def seed_stream(self, ws, x, b2, i: Int32, r: Int32, c: Int32, rows: Int32, channels: Int32):
        """s'[r, c] = s[r, c] + b2[c] (0 past the channels), block i's output before phase B adds into it: every
        slice's add is then alike (the first slice's had loaded s and b2 ahead of its atomic, a round trip an item
        for the warps of slice 0)."""
        value = Float32(0.0)
        if c < channels:
            value = b2[i, c]
            if i == 0:
                value = value + x[r, c].to(Float32)
            else:
                value = value + ws[i % 3 * rows + r, c]
        ws[(i + 1) % 3 * rows + r, c] = value

    @cute.jit
    def add_to_stream(self, ws, i: Int32, r: Int32, c: Int32, rows: Int32, total: Float32):
        """s'[r, c] += total, a slice's share of block i's output (``seed_stream`` put s + b2 there)."""
        self.red_add(ws, (i + 1) % 3 * rows + r, c, total)

    @cute.jit
    def hidden_value(self, value: Float32, gate: Float32, b1, b3, unit: Int32, act: Int32) -> Float32:
        """fp32 act(value + b1[unit]) [* (gate + b3[unit])], a hidden unit's value before its fp16 rounding."""
        value = value + b1[unit]
        if act == GELU_ERF:
            value = Float32(0.5) * value * (Float32(1.0) + cute.math.erf(value * Float32(INV_SQRT2)))
        else:
            value = activate(value, act)
        if cutlass.const_expr(self.gated):
            value = value * (gate + b3[unit])
        return value

    @cute.jit
    def load_vector(self, row: cute.Tensor, index: Int32) -> cute.Tensor:
        """Elements index * VEC ... index * VEC + VEC - 1 of a contiguous row in registers, in the row's type (one
        16-byte load of fp16, two of fp32)."""
        run = cute.make_rmem_tensor((VEC,), row.element_type)
        cute.autovec_copy(cute.local_tile(row, (VEC,), (index,)), run)
        return run

    @cute.jit
    def hidden_vector(self, ws: cute.Tensor, rows: Int32, hidden_rows: Int32, row: Int32, unit: Int32,
                      units: Int32, valid) -> cute.Tensor:
        """Hidden units unit ... unit + VEC - 1 of a row (fp32, in the workspace) in registers, zeros where ``valid``
        is false. Loaded whether valid or not (the row and the unit clamped into the block's hidden values), so
        that a group's loads are all issued before any is used: each behind its own guard, they had waited one
        after another (the 1B-sized stack's phase B at 16 rows in the gemv form: about 125 us a block, H100)."""
        row = cutlass.min(row, rows - 1)
        unit = cutlass.min(unit, units - VEC)
        run = self.load_vector(ws[3 * rows + row * hidden_rows + unit // self.cols, None], unit % self.cols // VEC)
        out = cute.make_rmem_tensor((VEC,), Float32)
        out.fill(0.0)
        if valid:
            out.store(run.load())
        return out

    @cute.jit
    def copy_vector(self, row: cute.Tensor, index: Int32, dst: cute.Tensor):
        """cp.async of elements index * VEC ... + VEC - 1 of a contiguous fp16 row (16-byte aligned: rows are padded
        to STACK_TILE columns) into ``dst``, around L1 (each weight is read once)."""
        atom = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), Float16,
                                   num_bits_per_copy=VEC * 16)
        src = cute.make_ptr(Float16, (row.iterator + index * VEC).toint(), cute.AddressSpace.gmem, assumed_align=16)
        cute.copy(atom, cute.make_tensor(src, cute.make_layout(VEC)), dst)

    @cute.jit
    def copy_unit_batch(self, w1, w3, ring: cute.Tensor, unit0: Int32, units: Int32, first_warp: Int32,
                        all_warps: Int32, m: Int32, items: Int32, lane: Int32):
        """Item m of this warp's phase A (unit first_warp + m // batches * all_warps, batch m % batches): this lane's
        vectors of the batch of W1's row [and W3's] into ring stage m % stages, then one commit (an empty
        group past the last item, so that a wait counts one group an item)."""
        if m < items:
            j = unit0 + self.unit_block_of(first_warp, all_warps, m)
            b = m % self.batches
            for t in cutlass.range_constexpr(self.batch):
                index = (b * self.batch + t) * WARP + lane
                if index * VEC < self.cols:
                    self.copy_vector(w1[j, None], index, ring[None, lane, t, m % self.stages])
                    if cutlass.const_expr(self.gated):
                        self.copy_vector(w3[j, None], index, ring[None, lane, self.batch + t, m % self.stages])
        cute.arch.cp_async_commit_group()

    @cute.jit
    def first_unit_batches(self, w1, w3, ring: cute.Tensor, meta: cute.Tensor, i: Int32, first_warp: Int32,
                           all_warps: Int32, lane: Int32):
        """The copies of this warp's first stages - 1 items of block i's phase A (one row tile's)."""
        units = meta[i, 1] * STACK_TILE
        items = self.unit_items(units, first_warp, all_warps)
        for m in cutlass.range_constexpr(self.stages - 1):
            self.copy_unit_batch(w1, w3, ring, meta[i, 0] * STACK_TILE, units, first_warp, all_warps, Int32(m), items,
                                 lane)

    @cute.jit
    def unit_batch(self, ring: cute.Tensor, s_u: cute.Tensor, acc: cute.Tensor, gate: cute.Tensor, m: Int32,
                   lane: Int32):
        """acc[r] (gate[r]) += this lane's share of u[r] . W1[unit] (W3[unit]) over item m's batch, from its ring
        stage; a unit's first batch starts the sums."""
        u_rows = cute.make_tensor(s_u.iterator, cute.make_layout((self.tile_rows, self.cols), stride=(self.cols, 1)))
        b = m % self.batches
        if b == 0:
            acc.fill(0.0)
            gate.fill(0.0)
        for t in cutlass.range(self.batch, unroll=self.batch if self.tile_rows <= 2 else 1):  # registers at more rows
            index = (b * self.batch + t) * WARP + lane
            if index * VEC < self.cols:
                w = ring[None, lane, t, m % self.stages].load().to(Float32)
                g = w
                if cutlass.const_expr(self.gated):
                    g = ring[None, lane, self.batch + t, m % self.stages].load().to(Float32)
                for r in cutlass.range_constexpr(self.tile_rows):
                    u = self.load_vector(u_rows[r, None], index).load().to(Float32)
                    acc[r] = acc[r] + (u * w).reduce(cute.ReductionOp.ADD, 0.0, 0)
                    if cutlass.const_expr(self.gated):
                        gate[r] = gate[r] + (u * g).reduce(cute.ReductionOp.ADD, 0.0, 0)

    @cute.jit
    def finish_unit(self, ring, acc: cute.Tensor, gate: cute.Tensor, b1, b3, ws, unit0: Int32, units: Int32, j: Int32,
                    act: Int32, rows: Int32, row0: Int32, hidden_rows: Int32, lane: Int32):
        """h[r, j] = fp16(act(acc + b1) [* (gate + b3)]) for the tile's rows, the warp's sums reduced, into the
        workspace."""
        # every row's reductions first, with no branch between them, so that their shuffle chains interleave
        for r in cutlass.range_constexpr(self.tile_rows):
            acc[r] = cute.arch.warp_reduction_sum(acc[r])
            if cutlass.const_expr(self.gated):
                gate[r] = cute.arch.warp_reduction_sum(gate[r])
        for r in cutlass.range_constexpr(self.tile_rows):
            value = self.hidden_value(acc[r], gate[r], b1, b3, unit0 + j, act)
            if lane == r % WARP:
                if row0 + r < rows:
                    ws[3 * rows + (row0 + r) * hidden_rows + j // self.cols, j % self.cols] = (
                        value.to(Float16).to(Float32))

    @cute.jit
    def copy_slice(self, w2, ring: cute.Tensor, unit0: Int32, units: Int32, channel_blocks: Int32, first_item: Int32,
                   m: Int32, items: Int32, lane: Int32):
        """Item m of this warp's phase B (channels c0 ... c0 + channel_block - 1, slice k of their W2 rows:
        ``slice_item``): this lane's vectors of the slice of each channel into ring stage m % stages, then one
        commit."""
        if m < items:
            block, k = self.slice_item(first_item, m, channel_blocks)
            c0 = block * self.channel_block
            for cc in cutlass.range_constexpr(self.channel_block):
                if c0 + cc < w2.shape[0]:
                    for v in cutlass.range_constexpr(self.slice_vectors):
                        unit = k * self.slice + (v * WARP + lane) * VEC
                        if unit < units:
                            self.copy_vector(w2[c0 + cc, None], (unit0 + unit) // VEC,
                                             ring[None, lane, cc * self.slice_vectors + v, m % self.stages])
        cute.arch.cp_async_commit_group()

    @cute.jit
    def slice_hidden(self, ws, k: Int32, r0: Int32, rows: Int32, units: Int32, hidden_rows: Int32, cache,
                     lane: Int32) -> list:
        """This lane's hidden values of slice k for the rows r0 ... r0 + row_group - 1, loaded together (one L2
        round trip a group, not a row: ``hidden_vector``); with a ``slice_cache``, from its registers where they are
        slice k's of the one row."""
        hidden = []
        if cutlass.const_expr(cache is None):
            for g in cutlass.range_constexpr(self.row_group):
                for v in cutlass.range_constexpr(self.slice_vectors):
                    unit = k * self.slice + (v * WARP + lane) * VEC
                    hidden.append(self.hidden_vector(ws, rows, hidden_rows, r0 + g, unit, units,
                                                     unit < units and r0 + g < rows).load())
        else:
            held, key = cache
            if key[0] != k or rows > 1:
                for v in cutlass.range_constexpr(self.slice_vectors):
                    unit = k * self.slice + (v * WARP + lane) * VEC
                    held[None, v].store(self.hidden_vector(ws, rows, hidden_rows, r0, unit, units, unit < units).load())
                key[0] = k
            for v in cutlass.range_constexpr(self.slice_vectors):
                hidden.append(held[None, v].load())
        return hidden

    @cute.jit
    def output_slice(self, ring: cute.Tensor, ws, i: Int32, c0: Int32, k: Int32, stage: Int32, units: Int32,
                     rows: Int32, channels: Int32, hidden_rows: Int32, cache, lane: Int32):
        """s'[r, c] += h[r, slice k] . W2[c, slice k] for every row and the item's channels c0 ..., by one warp: the
        slice's W2 vectors from its ring stage, the rows in groups of ``row_group`` whose hidden values
        (``slice_hidden``) serve all the item's channels."""
        for r0 in range(0, rows, self.row_group):
            hidden = self.slice_hidden(ws, k, r0, rows, units, hidden_rows, cache, lane)
            sums = []
            for cc in cutlass.range_constexpr(self.channel_block):
                weights = [ring[None, lane, cc * self.slice_vectors + v, stage].load().to(Float32)
                           for v in range(self.slice_vectors)]
                for g in cutlass.range_constexpr(self.row_group):
                    acc = Float32(0.0)
                    for v in cutlass.range_constexpr(self.slice_vectors):
                        if k * self.slice + (v * WARP + lane) * VEC < units:  # the ring holds stale values past
                            acc = acc + (hidden[g * self.slice_vectors + v] * weights[v]).reduce(
                                cute.ReductionOp.ADD, 0.0, 0)
                    sums.append(acc)
            for e in cutlass.range_constexpr(self.channel_block * self.row_group):
                sums[e] = cute.arch.warp_reduction_sum(sums[e])
            if lane == 0:
                for cc in cutlass.range_constexpr(self.channel_block):
                    c = c0 + cc
                    for g in cutlass.range_constexpr(self.row_group):
                        r = r0 + g
                        if r < rows and c < channels:
                            self.add_to_stream(ws, i, r, c, rows, sums[cc * self.row_group + g])
