"""What the row kernels share: the launch plan chosen from N and the dtypes, one thread's share of a
row (partitions, predicates, predicated loads and stores), and reductions of one value per row
across lanes, warps and the CTAs of a thread block cluster.

A row of N elements is split across ``ctas`` CTAs (one cluster) and each CTA's part across
``threads_per_row`` threads. A thread moves ``vec`` contiguous elements per access (128 bits where
the alignment class allows), ``chunks`` accesses per tile, so one tile of one CTA covers
``tile_cols = threads_per_row * chunks * vec`` columns. When the whole row fits in the registers of
the cluster (``tiles == 1``) every element is read from global memory once and kept in registers
between the reductions and the output; a longer row is streamed in ``tiles`` tiles per CTA, one pass
over global memory per reduction stage (the re-reads mostly hit L2).
"""

from __future__ import annotations

import dataclasses
import operator

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, const_expr
from cutlass.memory import SmemAllocator

MAX_CLUSTER = 8  # the portable thread block cluster size on Hopper
WARP = 32


@dataclasses.dataclass(frozen=True)
class Tuning:
    """The knobs of a launch plan (compile-time). The defaults are the heuristic; a sweep on the GPU
    (tools/device/norm_sweep.py) overrides them to measure alternatives."""

    accesses: int = 4  # vector accesses per thread and tile: 64 bytes or more in flight per thread
    register_values: int = 32  # fp32 values of x one thread keeps in registers
    min_threads: int = 128  # small rows: several rows per CTA so that a CTA still moves enough bytes
    resident_threads: int = 1024  # asked-for resident threads per SM when a thread holds register_values
    vectors: str = "auto"  # when weight / bias are read: "early" or "late" (see RowKernel)
    ctas_per_sm: int = 0  # a launch bound of this many resident CTAs per SM; 0: from resident_threads
    tile_values: int | None = None  # stream every row on one CTA, this many values per thread and tile (the
    # passes after the first re-read x, mostly from L2, for fewer registers and more rows in flight); 0: stream
    # only rows that overflow a cluster's registers; None: the kernel's rule (RowKernel.stream_values)
    max_threads_per_row: int = 512  # one CTA's share of a row; 512 keeps two or more CTAs resident per SM
    ring_stages: int = 0  # a persistent backward's held rows: a shared-memory ring of this many row blocks, filled
    # by cp.async ring_stages - 1 blocks ahead (GradKernel.row_source); 0: the next block in registers

# The backward kernels hold two row tensors (x or y, and dy) and fp32 accumulators of the vector gradients:
# 16 values per thread and tensor (two 128-bit accesses of a 16-bit row, four of an fp32 row); a longer row is
# split over a cluster of CTAs that hold it in registers (each element read once), and one past a cluster's
# registers is streamed on one CTA in tiles of 16 (GradKernel). No launch bound.
BACKWARD = Tuning(accesses=2, register_values=16, resident_threads=0, tile_values=0)
# 16-bit norm rows from WIDE_BACKWARD_N columns: 32 values a thread in CTAs of at most 256 threads, a cluster past
# them (the sweep's plan B7). On an H100 (reports/h100/norm-backward/backward-sweep-bf16-b7.json) it gained at
# 8192x16384 and tied at 16384x8192; at 4096x2560 it lost, so narrower rows keep BACKWARD.
WIDE_BACKWARD = Tuning(accesses=4, register_values=32, resident_threads=0, tile_values=0, max_threads_per_row=256)
WIDE_BACKWARD_N = 8192
STREAMED_BACKWARD_VALUES = 16
# Rows of the partials a lane loads before it adds them (the sum's loop unrolled): its loads are independent, and
# one at a time the sum took a latency per row (2.3-10.5 us on an H100, reports/h100/norm-backward/).
PARTIAL_ROWS_IN_FLIGHT = 4
# Columns a CTA takes at once in the sum by CTAs (``GradKernel.sum_partials_by_ctas``), in groups of ``part_vec``:
# at 65536x1024 (256 groups of 4 over 396 CTAs) 4 leaves one group a CTA, so twice the CTAs have work as at 8, each
# lane loading half as much a row (LayerNorm's two pairs: 4 loads a row where 8 gave 8).
SPREAD_BATCH_VALUES = 4
# Shared memory a CTA's ring of row blocks takes at most (``Tuning.ring_stages``): 4 stages of a wide 16-bit row's
# CTA, whose registers alone leave it one an SM; the grid counts the ring in the CTAs an SM holds
# (``compiler.resident_ctas``).
RING_BYTES = 160 << 10

ADD = operator.add


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _pow2_at_least(v: int) -> int:
    return 1 << max(0, (v - 1).bit_length())


def fmax(a, b):
    """max that ignores NaN (PTX max.f32); a NaN in a row still reaches the result through the sums."""
    return cute.arch.fmax(a, b)


class RowKernel:
    """Compile-time plan and shared device code of a kernel that reduces every row of (M, N).

    Subclasses set ``stages`` (scalar row reductions per row) and ``name`` and write the kernel.
    Only N, the vector width and the dtypes are compile-time; M and the row strides are runtime.
    """

    stages = 1
    name = "row"
    # a 16-bit row that one CTA of max_threads_per_row threads would hold at more than 16 values per thread (two
    # rows per SM in flight at most) is streamed on that CTA instead, this many values per thread and tile
    # (0: held). LayerNorm sets it: its held row keeps x and x - mean live in fp32 (64 registers).
    stream_values = 0

    def __init__(self, dtype, n: int, vec: int, tuning: Tuning | None = None):
        if n < 1 or vec < 1 or n % vec or 128 % (vec * dtype.width):
            raise ValueError(f"bad row shape: N={n}, vector width {vec} of {dtype}")
        self.dtype, self.n, self.vec = dtype, n, vec
        self.tuning = tuning = tuning or Tuning()
        vectors = n // vec
        target = max(tuning.accesses, 16 // vec)  # accesses per thread and tile
        limit = max(target, tuning.register_values // vec)  # accesses whose values still fit in registers
        cap = tuning.max_threads_per_row
        if cap < WARP or cap > 1024 or cap & (cap - 1):
            raise ValueError(f"max_threads_per_row must be a power of two from {WARP} to 1024, got {cap}")
        tpr = min(cap, _pow2_at_least(_ceil_div(vectors, target)))
        chunks, tiles, ctas = _ceil_div(vectors, tpr), 1, 1
        stream = tuning.tile_values
        if stream is None:
            held = chunks <= limit and tpr == cap and chunks * vec > 16 and dtype.width == 16
            stream = self.stream_values if held else 0
        if stream:
            chunks = min(chunks, max(1, stream // vec))
            tiles = _ceil_div(vectors, tpr * chunks)
        elif chunks > limit:  # the row does not fit in one CTA's registers: split it over a cluster
            ctas = _ceil_div(vectors, tpr * limit)
            if ctas <= MAX_CLUSTER:
                chunks = _ceil_div(vectors, ctas * tpr)
            else:  # nor in a cluster's: stream it, tile by tile, 16 values per thread and tile
                ctas, chunks = MAX_CLUSTER, max(1, 16 // vec)
                tiles = _ceil_div(vectors, ctas * tpr * chunks)
            ctas = _ceil_div(vectors, tiles * tpr * chunks)  # every CTA gets columns
        self.threads_per_row, self.chunks, self.tiles, self.ctas = tpr, chunks, tiles, ctas
        self.num_threads = max(tpr, tuning.min_threads)
        self.rows_per_cta = self.num_threads // tpr
        self.warps_per_row = max(1, tpr // WARP)
        self.tile_cols = tpr * chunks * vec
        self.tiler = (self.rows_per_cta, self.tile_cols)
        self.even = ctas * tiles * self.tile_cols == n  # no column predicates needed
        self.values_per_thread = chunks * vec
        # a thread holding all its register_values of x: ask for resident_threads per SM (which caps the
        # registers per thread), so that enough loads stay in flight per SM
        full = self.values_per_thread >= tuning.register_values
        self.min_ctas_per_sm = max(1, tuning.resident_threads // self.num_threads) if full else 1
        if tuning.ctas_per_sm:
            self.min_ctas_per_sm = tuning.ctas_per_sm
        # weight / bias (L2 hits): "early" loads them in fp32 beside x, before the reductions; "late" reads
        # them after the reductions, a chunk at a time (store_affine), so that only x's values are live while
        # the row's loads are in flight. More than 16 values of x per thread: fp32 copies beside x would cost
        # up to half the resident CTAs, so late.
        if tuning.vectors not in ("auto", "early", "late"):
            raise ValueError(f"unknown vectors timing {tuning.vectors!r}")
        self.vectors = tuning.vectors
        if self.vectors == "auto":
            self.vectors = "late" if self.values_per_thread > 16 else "early"

    def __repr__(self) -> str:
        # names the compiled function and its dumped artifacts
        return f"{self.name}_{self.dtype.__name__}_n{self.n}_v{self.vec}"

    def describe(self) -> dict:
        return {"threads_per_row": self.threads_per_row, "rows_per_cta": self.rows_per_cta,
                "num_threads": self.num_threads, "vec": self.vec, "chunks": self.chunks,
                "tiles": self.tiles, "cluster": self.ctas, "min_ctas_per_sm": self.min_ctas_per_sm,
                "vectors": self.vectors}

    # ---- host side ----------------------------------------------------------------------------
    def launch(self, kernel, rows, stream) -> None:
        """Grid: one CTA per row block and column part; a cluster spans the column parts of a block."""
        kernel.launch(
            grid=[cute.ceil_div(rows, self.rows_per_cta), self.ctas, 1],
            block=[self.num_threads, 1, 1],
            cluster=[1, self.ctas, 1] if const_expr(self.ctas > 1) else None,
            min_blocks_per_mp=self.min_ctas_per_sm,
            # with a minimum: the driver's default L1/shared split, given so that compiling queries no GPU
            preferred_smem_carveout=-1 if const_expr(self.min_ctas_per_sm > 1) else None,
            stream=stream,
        )

    # ---- device side: this thread's share of the rows --------------------------------------------
    def tiled_copy(self):
        """Threads row-major over (rows_per_cta, threads_per_row), each owning vec contiguous columns
        per access; repeated over the tile, so chunk k of a thread sits k * threads_per_row * vec
        columns after chunk 0 (neighbouring threads touch neighbouring vectors: coalesced)."""
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype,
                                   num_bits_per_copy=self.vec * self.dtype.width)
        threads = cute.make_ordered_layout((self.rows_per_cta, self.threads_per_row), order=(1, 0))
        return cute.make_tiled_copy_tv(atom, threads, cute.make_layout((1, self.vec)))

    def thread_slice(self):
        """(copy slice of this thread, row block, first column tile of this CTA)."""
        tidx, _, _ = cute.arch.thread_idx()
        bidx, bidy, _ = cute.arch.block_idx()
        return self.tiled_copy().get_slice(tidx), bidx, bidy * self.tiles

    def part(self, thr, m_tensor, block, tile):
        """This thread's (vec, 1, chunks) view of a tensor's tile at (row block, column tile)."""
        return thr.partition_S(cute.local_tile(m_tensor, self.tiler, (block, tile)))

    def broadcast_rows(self, m_vector):
        """An (N,) vector (or None) as (rows_per_cta, N) with row stride 0, to partition like the rows."""
        if const_expr(m_vector is None):
            return None
        layout = cute.make_layout((self.rows_per_cta, self.n), stride=(0, 1))
        return cute.make_tensor(m_vector.iterator, layout)

    @cute.jit
    def predicates(self, thr, rows, block, tile):
        """(row in range, per-chunk column in range or None when N needs no column predicates)."""
        coords = self.part(thr, cute.make_identity_tensor((rows, self.n)), block, tile)
        row_ok = coords[0][0] < rows
        cols = None
        if const_expr(not self.even):
            cols = cute.make_rmem_tensor(cute.make_layout(self.chunks), cutlass.Boolean)
            for k in cutlass.range_constexpr(self.chunks):
                cols[k] = coords[0, 0, k][1] < self.n
        return row_ok, cols

    @cute.jit
    def load(self, src, row_ok, cols, fill):
        """Register fragment of src; chunks out of range hold ``fill`` (the reduction's neutral value)."""
        frag = cute.make_rmem_tensor_like(src)
        frag.fill(fill)
        if const_expr(row_ok is None):
            self._copy_chunks(src, frag, cols)
        else:
            if row_ok:
                self._copy_chunks(src, frag, cols)
        return frag

    @cute.jit
    def load_vector(self, thr, g_vector, tile, cols):
        """fp32 values of a broadcast vector (weight, bias) at a column tile; None where it is absent."""
        if const_expr(g_vector is None):
            return None
        return self.load(self.part(thr, g_vector, 0, tile), None, cols, 0.0).load().to(Float32)

    @cute.jit
    def early_vector(self, thr, g_vector, tile, cols):
        """A vector's fp32 values where the plan reads vectors before the reductions, else None."""
        if const_expr(self.vectors == "early"):
            return self.load_vector(thr, g_vector, tile, cols)
        return None

    @cute.jit
    def store(self, values, dst, row_ok, cols):
        frag = cute.make_rmem_tensor_like(dst)
        frag.store(values.to(dst.element_type))
        if row_ok:
            self._copy_chunks(frag, dst, cols)

    @cute.jit
    def store_affine(self, values, thr, g_scale, g_shift, tile, dst, row_ok, cols):
        """Store values * scale + shift (scale, shift: broadcast vectors or None), reading the vectors one
        chunk at a time: only a chunk of each is live beside the values (the "late" plan's registers)."""
        y = cute.make_rmem_tensor(values.shape, Float32)
        y.store(values)
        frag = cute.make_rmem_tensor_like(dst)
        scale, shift = None, None
        if const_expr(g_scale is not None):
            scale = self.part(thr, g_scale, 0, tile)
        if const_expr(g_shift is not None):
            shift = self.part(thr, g_shift, 0, tile)
        for k in cutlass.range_constexpr(self.chunks):
            v = y[None, 0, k].load()
            if const_expr(g_scale is not None):
                v = v * self._chunk(scale, k, cols)
            if const_expr(g_shift is not None):
                v = v + self._chunk(shift, k, cols)
            frag[None, 0, k].store(v.to(dst.element_type))
        if row_ok:
            self._copy_chunks(frag, dst, cols)

    @cute.jit
    def _chunk(self, src, k, cols):
        """fp32 values of chunk k of a vector's partition (0 past N)."""
        frag = cute.make_rmem_tensor_like(src[None, 0, k])
        frag.fill(0.0)
        if const_expr(cols is None):
            cute.autovec_copy(src[None, 0, k], frag)
        else:
            if cols[k]:
                cute.autovec_copy(src[None, 0, k], frag)
        return frag.load().to(Float32)

    @cute.jit
    def _copy_chunks(self, src, dst, cols):
        for k in cutlass.range_constexpr(self.chunks):
            if const_expr(cols is None):
                cute.autovec_copy(src[None, 0, k], dst[None, 0, k])
            else:
                if cols[k]:
                    cute.autovec_copy(src[None, 0, k], dst[None, 0, k])

    @cute.jit
    def zero_out_of_range(self, frag, cols):
        """Zero the chunks past N of an fp32 fragment (so that they add nothing to a sum)."""
        if const_expr(cols is not None):
            for k in cutlass.range_constexpr(self.chunks):
                if not cols[k]:
                    frag[None, 0, k].fill(0.0)

    @cute.jit
    def row_coord(self, thr, rows, block, tile):
        """(row, column) of this thread's first element at (row block, column tile)."""
        return self.part(thr, cute.make_identity_tensor((rows, self.n)), block, tile)[0]

    @cute.jit
    def load_row_value(self, thr, m_rows, rows, block, tile, fill: float):
        """This thread's row's entry of an (M,) fp32 tensor (rstd, mean); ``fill`` past M."""
        row = self.row_coord(thr, rows, block, tile)[0]
        value = Float32(fill)
        if row < rows:
            value = Float32(m_rows[row])
        return value

    @cute.jit
    def store_row_value(self, thr, m_rows, rows, block, tile, value):
        """Store one fp32 value per row (rstd, mean) from the thread that holds the row's column 0
        (nothing where ``m_rows`` is None)."""
        if const_expr(m_rows is not None):
            crd = self.row_coord(thr, rows, block, tile)
            if crd[0] < rows and crd[1] == 0:
                m_rows[crd[0]] = value

    # ---- device side: reductions ------------------------------------------------------------------
    def reduction_storage(self):
        """Shared memory for the row reductions: one fp32 slot per warp (and per cluster CTA) and per
        stage; with a cluster also one transaction barrier per stage. Call once, before any reduction."""
        slots = self.warps_per_row * self.ctas
        if const_expr(slots == 1):
            return None, None
        smem = SmemAllocator()
        layout = cute.make_ordered_layout((self.rows_per_cta, slots, self.stages), order=(1, 0, 2))
        buffer = smem.allocate_tensor(Float32, layout, byte_alignment=16)
        mbar = None
        if const_expr(self.ctas > 1):
            mbar = smem.allocate_array(Int64, num_elems=self.stages, byte_alignment=8)
            self._init_cluster(mbar)
        return buffer, mbar

    @cute.jit
    def _init_cluster(self, mbar):
        tidx, _, _ = cute.arch.thread_idx()
        if tidx == 0:
            for s in cutlass.range_constexpr(self.stages):
                cute.arch.mbarrier_init(mbar + s, 1)
        cute.arch.mbarrier_init_fence()
        # peers may push into this CTA only once its barriers exist: wait before the first reduction
        cute.arch.cluster_arrive_relaxed()

    @cute.jit
    def row_reduce(self, value, op, identity: float, stage: int, buffer, mbar, phase=None):
        """Reduce one fp32 value per thread over the threads (and cluster CTAs) of its row; every
        thread of the row gets the result. Stage s uses its own buffer slice and barrier, so
        successive stages need no barrier to protect reuse. ``value`` may be a tuple of independent values:
        they take stages stage, stage + 1, ... and one CTA barrier (or one cluster transaction barrier, that
        of ``stage``) for all, and a tuple of results comes back.

        ``phase``: in a kernel whose cluster reduces many rows (the persistent backward), the parity of this
        use of the stage's transaction barrier. Such a row first waits at the cluster barrier until every
        CTA of the cluster has read the previous row's values (none is overwritten, and no transaction of
        this row lands in the previous row's barrier phase), and arrives there once it has read this row's.
        None: a kernel that reduces each row once (the forwards)."""
        many = isinstance(value, tuple)
        values = value if many else (value,)
        lanes = min(self.threads_per_row, WARP)
        values = [cute.arch.warp_reduction(v, op, threads_in_group=lanes) for v in values]
        if const_expr(buffer is not None):
            lane, warp = cute.arch.lane_idx(), cute.arch.warp_idx()
            row, col = warp // self.warps_per_row, warp % self.warps_per_row
            slots = self.warps_per_row * self.ctas
            if const_expr(self.ctas == 1):
                if lane == 0:
                    for k, v in enumerate(values):
                        buffer[row, col, stage + k] = v
                cute.arch.barrier()
            else:
                if const_expr(phase is not None or stage == 0):
                    cute.arch.cluster_wait()
                rank = cute.arch.block_idx_in_cluster()
                warps = self.rows_per_cta * self.warps_per_row
                if warp == 0 and lane == 0:
                    cute.arch.mbarrier_arrive_and_expect_tx(mbar + stage, warps * self.ctas * 4 * len(values))
                if lane < self.ctas:  # lane p sends this warp's values to peer CTA p, same slots
                    slot = rank * self.warps_per_row + col
                    for k, v in enumerate(values):
                        ptr = buffer.iterator + cute.crd2idx((row, slot, stage + k), buffer.layout)
                        cute.arch.store_async_dsmem(ptr, v.bitcast(Int32), mbar + stage, lane)
                cute.arch.mbarrier_wait(mbar + stage, 0 if const_expr(phase is None) else phase)
            combined = [Float32(identity) for _ in values]
            for i in cutlass.range_constexpr(_ceil_div(slots, WARP)):
                if lane + i * WARP < slots:
                    combined = [op(c, buffer[row, lane + i * WARP, stage + k]) for k, c in enumerate(combined)]
            values = [cute.arch.warp_reduction(c, op, threads_in_group=WARP) for c in combined]
            if const_expr(self.ctas > 1 and phase is not None):
                cute.arch.cluster_arrive()  # this CTA has read the row's values (the results depend on them)
        return tuple(values) if many else values[0]


class GradKernel(RowKernel):
    """A backward kernel: the BACKWARD plan, and for the ones with vector gradients (dweight, dbias) a
    persistent grid. Each CTA (or cluster of CTAs, each holding its columns of the row) loops over row blocks
    ``bidx, bidx + grid, ...`` and sums its rows' terms of each vector gradient in fp32 (in registers for
    held rows; in its own row of the partials for streamed rows), then leaves one fp32 row per thread row in
    a (grid * rows_per_cta, N) partials tensor. Without a cluster a grid barrier follows (the launch is
    cooperative, so every CTA is resident) and the grid sums the partials into the vector gradients in their
    own dtype: one launch. With a cluster (a cooperative launch takes none) a second launch sums them. No
    atomics on the outputs, the same order of additions on every run. Successive rows use alternate halves
    of the reduction buffer (``reductions`` stages each), so that a warp already in the next row never
    overwrites a value another warp of the CTA is still reading."""

    reductions = 1
    wide_16_bit = False  # the norms: WIDE_BACKWARD for 16-bit rows from WIDE_BACKWARD_N columns

    def __init__(self, dtype, n: int, vec: int, tuning: Tuning | None = None, spread_sum: bool = False):
        if tuning is None:
            wide = self.wide_16_bit and dtype.width == 16 and n >= WIDE_BACKWARD_N
            tuning = WIDE_BACKWARD if wide else BACKWARD
        super().__init__(dtype, n, vec, tuning)
        if self.ctas > 1 and self.tiles > 1:  # past a cluster's registers: streamed on one CTA instead
            super().__init__(dtype, n, vec, dataclasses.replace(self.tuning, tile_values=STREAMED_BACKWARD_VALUES))
        self.stages = 2 * self.reductions
        self.part_vec = min(vec, 4)  # fp32 columns per load of the partials (their rows are aligned as x's)
        self.spread_sum = spread_sum  # the partials' sum by CTAs (``spread_sum_of``: many partial rows)
        # A held row keeps the weight (fp32) and its vector gradients' sums in registers across rows, unless the
        # CTA is so large (512 threads: at most 128 registers each) that x, dy and the next row's prefetch fill
        # them already: then each row re-reads the weight (an L1 hit) and the sums live in shared memory, each
        # thread's own slots, rather than spill.
        self.spare_registers = self.num_threads <= 256
        self.ring = self.ring_depth()

    def ring_depth(self) -> int:
        """Stages of the held rows' shared-memory ring (``Tuning.ring_stages``, as many as ``RING_BYTES`` holds of
        the two row tensors' blocks), or 0: streamed rows, accesses narrower than cp.async's 4 bytes, or room for
        fewer than two stages keep the register prefetch."""
        if not self.tuning.ring_stages or self.tiles > 1 or self.vec * self.dtype.width < 32:
            return 0
        stages = min(self.tuning.ring_stages, RING_BYTES // self.ring_stage_bytes())
        return stages if stages >= 2 else 0

    def ring_stage_bytes(self) -> int:
        """One ring stage: a block of the two row tensors and each thread's slots of two row values."""
        return 2 * self.rows_per_cta * self.tile_cols * self.dtype.width // 8 + 2 * 4 * self.num_threads

    def describe(self) -> dict:
        return super().describe() | {"ring_stages": self.ring, "ring_bytes": self.ring * self.ring_stage_bytes()}

    def __repr__(self) -> str:
        return f"{super().__repr__()}{'_spread' if self.spread_sum else ''}"

    def thread_slice(self):
        """As RowKernel's; the first column tile is a constant 0 without a cluster (simpler addressing)."""
        thr, bidx, first = super().thread_slice()
        return thr, bidx, first if const_expr(self.ctas > 1) else 0

    def launch_persistent(self, kernel, grid, stream, pairs) -> None:
        """A grid of ``grid`` CTAs (clusters of ``ctas`` CTAs with a cluster). ``pairs``: the (partials,
        vector gradient) pairs to sum. Without a cluster the kernel sums them after a grid barrier, so the
        launch is cooperative: all CTAs resident at once, or the launch fails rather than hang. With a
        cluster the sum is a second launch (sum_kernel)."""
        kernel.launch(grid=[grid, self.ctas, 1], block=[self.num_threads, 1, 1],
                      cluster=[1, self.ctas, 1] if const_expr(self.ctas > 1) else None,
                      min_blocks_per_mp=self.min_ctas_per_sm,
                      preferred_smem_carveout=-1 if const_expr(self.min_ctas_per_sm > 1) else None,
                      cooperative=self.ctas == 1 and len(pairs) > 0, stream=stream)
        if const_expr(self.ctas > 1 and len(pairs) > 0):
            second = pairs[1] if const_expr(len(pairs) > 1) else (None, None)
            ctas = grid * self.ctas
            self.sum_kernel(pairs[0][0], pairs[0][1], second[0], second[1], ctas).launch(
                grid=[ctas, 1, 1], block=[self.num_threads, 1, 1], stream=stream)

    @cute.kernel
    def sum_kernel(self, mPartials: cute.Tensor, mOut: cute.Tensor, mPartials2: cute.Tensor | None,
                   mOut2: cute.Tensor | None, grid: Int32):
        """The partials' sum as a launch of its own (after a cluster kernel)."""
        pairs = [(mPartials, mOut)]
        if const_expr(mPartials2 is not None):
            pairs.append((mPartials2, mOut2))
        self.reduce_partials(pairs, None, grid)

    def phase(self, visit):
        """The transaction barrier's phase at a cluster's ``visit``-th row (each of the two halves' barriers
        serves every other row); None without a cluster."""
        return visit // 2 % 2 if const_expr(self.ctas > 1) else None

    @staticmethod
    def wanted(*pairs) -> list:
        """The (partials, vector gradient) pairs a call computes: those whose partials are given."""
        return [(partials, out) for partials, out in pairs if partials is not None]

    @cute.jit
    def finish_rows(self, pairs, m_sync: cute.Tensor | None, grid: Int32):
        """After a CTA's last row: with a cluster, its last wait at the cluster barrier (pairing the last row's
        arrive, or for a cluster without rows the mbarriers' initialization; ``sum_kernel`` sums the partials);
        without one, the grid barrier and the partials' sum (``reduce_partials``)."""
        if const_expr(self.ctas > 1):
            cute.arch.cluster_wait()
        elif const_expr(len(pairs) > 0):
            self.reduce_partials(pairs, m_sync, grid)

    @cute.jit
    def grid_barrier(self, m_sync: cute.Tensor, grid: Int32):
        """Wait until every CTA of the grid has arrived, with what each wrote before visible to all: one int32
        word, one atomic a CTA. CTA 0 adds 2**31 - (grid - 1), every other CTA 1, so the word's top bit flips
        exactly when the last CTA arrives, whatever the order, and its low 31 bits are zero again: the word is
        zeroed once, not before every launch. Each CTA's arrival releases what its threads wrote (cumulative over
        the CTA barrier before it); the poll's acquire load sees every CTA's writes once the bit has flipped.
        kernellab-megakernel's ``PersistentStack.grid_barrier`` is the same protocol (change both together)."""
        cute.arch.barrier()
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        if tidx == 0:
            add = Int32(1)
            if bidx == 0:
                add = Int32(2**31 - 1) - (grid - 2)  # 2**31 - (grid - 1): wraps to 0x80000000 at grid 1
            old = cute.arch.atomic_add(m_sync.iterator, add, sem="release", scope="gpu")
            seen = old
            while (old ^ seen) >= 0:  # the top bits agree: not every CTA has arrived
                seen = cute.arch.load(m_sync.iterator, Int32, sem="acquire", scope="gpu")
        cute.arch.barrier()

    @cute.jit
    def reduce_partials(self, pairs, m_sync: cute.Tensor | None, grid: Int32):
        """After the grid barrier (none where ``m_sync`` is None: a launch of its own), each (partials, output)
        pair's output = the sum of its partials' rows, in the output's dtype: by CTAs (every warp of a CTA on the
        same columns) in the variant compiled for many partial rows (``spread_sum``, chosen by
        ``compiler.spread_sum_of``), by warps otherwise. A compile-time choice: with both paths behind a runtime
        branch, fp32 and bf16 LayerNorm at 1537 columns took 255 registers and a stack where either path alone
        takes about 160."""
        if const_expr(m_sync is not None):
            self.grid_barrier(m_sync, grid)
        if const_expr(self.spread_sum):
            self.sum_partials_by_ctas(pairs, grid)
        else:
            self.sum_partials_by_warps(pairs, grid)

    @cute.jit
    def sum_partials_by_warps(self, pairs, grid: Int32):
        """Column groups of ``part_vec`` columns go to the grid's warps in batches of ``batch`` groups per warp;
        lanes sum every 32nd row of the batch's groups (its loads independent, in flight together), then one warp
        reduction per group."""
        warps = self.num_threads // WARP
        bidx, _, _ = cute.arch.block_idx()
        lane, warp = cute.arch.lane_idx(), cute.arch.warp_idx()
        rows = pairs[0][0].shape[0]
        groups, batch = self.n // self.part_vec, max(1, 8 // self.part_vec)
        stride = grid * warps
        for first in cutlass.range(bidx * warps + warp, groups, stride * batch):
            sums = self.partial_sums(pairs, batch)
            for r in cutlass.range(lane, rows, WARP, unroll=PARTIAL_ROWS_IN_FLIGHT):
                self.add_partial_row(pairs, sums, r, first, stride, groups, batch)
            for p, (_, m_out) in enumerate(pairs):
                for b in cutlass.range_constexpr(batch):
                    group = first + b * stride
                    acc = sums[p * batch + b]
                    for k in cutlass.range_constexpr(self.part_vec):
                        acc[0, k] = cute.arch.warp_reduction(acc[0, k], ADD, threads_in_group=WARP)
                    if lane == 0 and group < groups:
                        self.store_group(m_out, acc, group)

    @cute.jit
    def sum_partials_by_ctas(self, pairs, grid: Int32):
        """Batches of ``batch`` consecutive column groups go to the grid's CTAs; every lane of a CTA's warps sums
        every (warps * 32)-th row of its CTA's batch, then a warp reduction per group, and the warps' sums meet in
        shared memory (``batch * part_vec`` floats a warp), where the first lane adds them and stores: a lane walks
        1 / warps of the rows a lane of ``sum_partials_by_warps`` walks."""
        warps = self.num_threads // WARP
        bidx, _, _ = cute.arch.block_idx()
        lane, warp = cute.arch.lane_idx(), cute.arch.warp_idx()
        rows = pairs[0][0].shape[0]
        groups, batch = self.n // self.part_vec, max(1, SPREAD_BATCH_VALUES // self.part_vec)
        staged = SmemAllocator().allocate_tensor(Float32, cute.make_layout((self.part_vec, batch, warps)),
                                                 byte_alignment=16)
        for first in cutlass.range(bidx * batch, groups, grid * batch):  # the same trip count for the whole CTA
            sums = self.partial_sums(pairs, batch)
            for r in cutlass.range(warp * WARP + lane, rows, warps * WARP, unroll=PARTIAL_ROWS_IN_FLIGHT):
                self.add_partial_row(pairs, sums, r, first, 1, groups, batch)
            for p, (_, m_out) in enumerate(pairs):  # a pair at a time through the staging buffer
                for b in cutlass.range_constexpr(batch):
                    for k in cutlass.range_constexpr(self.part_vec):
                        value = cute.arch.warp_reduction(sums[p * batch + b][0, k], ADD, threads_in_group=WARP)
                        if lane == 0:
                            staged[k, b, warp] = value
                cute.arch.barrier()
                if warp == 0 and lane == 0:
                    for b in cutlass.range_constexpr(batch):
                        if first + b < groups:
                            total = cute.make_rmem_tensor_like(sums[p * batch + b])
                            for k in cutlass.range_constexpr(self.part_vec):
                                value = Float32(0.0)
                                for w in cutlass.range_constexpr(warps):
                                    value = value + staged[k, b, w]
                                total[0, k] = value
                            self.store_group(m_out, total, first + b)
                cute.arch.barrier()  # the first lane has read the staged sums before the next ones land

    def partial_sums(self, pairs, batch: int) -> list:
        """Zeroed fp32 sums of one column group, ``batch`` a pair."""
        sums = []
        for m_part, _ in pairs:
            for _ in range(batch):
                acc = cute.make_rmem_tensor_like(cute.local_tile(m_part, (1, self.part_vec), (0, 0)), Float32)
                acc.fill(0.0)
                sums.append(acc)
        return sums

    @cute.jit
    def add_partial_row(self, pairs, sums: list, r: Int32, first: Int32, stride, groups: Int32, batch: int):
        """Partials' row r of groups first + b * stride (b < batch) into the sums, every pair's loads issued before
        any is added, each past the last group skipped: a load whose add followed it under the same guard waited for
        it (at 37x1537 LayerNorm's sum, two pairs, took about twice RMSNorm's, one pair), and a clamped load in its
        place re-read the last group wherever a warp's later groups are past it (at 256x3072 every warp's second
        one: reports/h100/norm-backward/, seventh session). The first group is never past it (the callers' loops)."""
        tile = (1, self.part_vec)
        frags = []
        for m_part, _ in pairs:
            for b in cutlass.range_constexpr(batch):
                src = cute.local_tile(m_part, tile, (r, cutlass.min(first + b * stride, groups - 1)))
                frag = cute.make_rmem_tensor_like(src)
                if const_expr(b == 0):
                    cute.autovec_copy(src, frag)
                elif first + b * stride < groups:
                    cute.autovec_copy(src, frag)
                frags.append(frag)
        for p in cutlass.range_constexpr(len(pairs)):
            for b in cutlass.range_constexpr(batch):
                acc = sums[p * batch + b]
                if const_expr(b == 0):
                    acc.store(acc.load() + frags[p * batch].load())
                elif first + b * stride < groups:
                    acc.store(acc.load() + frags[p * batch + b].load())

    @cute.jit
    def store_group(self, m_out: cute.Tensor, total: cute.Tensor, group: Int32):
        """One column group's fp32 sums into the output, in its dtype."""
        dst = cute.local_tile(self.broadcast_rows(m_out), (1, self.part_vec), (0, group))
        out = cute.make_rmem_tensor_like(dst)
        out.store(total.load().to(m_out.element_type))
        cute.autovec_copy(out, dst)

    @cute.jit
    def partials(self, thr, m_partials, block, tile, cols, later, values, held):
        """Add a tile's fp32 terms of one vector gradient: into the register accumulator ``held`` (held
        rows), or into this thread row's row of the partials (streamed rows: the CTA's first row block
        stores, ``later`` ones add to what is there)."""
        if const_expr(m_partials is not None):
            if const_expr(self.tiles == 1):
                held.store(held.load() + values)
            else:
                dst = self.part(thr, m_partials, block, tile)
                previous = self.load(dst, later, cols, 0.0).load()
                self.store(previous + values, dst, True, cols)

    @cute.jit
    def prefetch(self, thr, tensors, frags, rows, block, tile, cols):
        """Load row block ``block`` of each tensor (at this CTA's column tile) into its register fragment
        (zeros past M and N): issued a row ahead, the next row's loads are in flight while this row reduces
        and stores."""
        row_ok, _ = self.predicates(thr, rows, block, tile)
        for src, frag in zip(tensors, frags, strict=True):
            frag.fill(0.0)
            if row_ok:
                self._copy_chunks(self.part(thr, src, block, tile), frag, cols)

    @cute.jit
    def row_source(self, thr, tensors, row_tensors, rows, bidx, first, cols, grid):
        """Start reading this CTA's held row blocks ``bidx, bidx + grid, ...`` of two row tensors (x or y, dy) and
        their (M,) fp32 row values (rstd, mean): a register copy of the next block (``prefetch``), or a ring of
        ``self.ring`` blocks in shared memory that cp.async fills ``ring - 1`` blocks ahead, more bytes in flight
        an SM than registers hold. ``next_row`` takes the blocks in order."""
        if const_expr(self.ring == 0):
            frags = [cute.make_rmem_tensor_like(self.part(thr, t, 0, 0)) for t in tensors]
            stats = cute.make_rmem_tensor(cute.make_layout(len(row_tensors)), Float32)
            self.prefetch(thr, tensors, frags, rows, bidx, first, cols)
            self.prefetch_row_values(thr, row_tensors, stats, rows, bidx)
            return frags, stats
        smem = SmemAllocator()
        layout = cute.make_ordered_layout((*self.tiler, self.ring), order=(1, 0, 2))
        rings = [smem.allocate_tensor(self.dtype, layout, byte_alignment=16) for _ in tensors]
        stats = smem.allocate_tensor(Float32, cute.make_layout((self.num_threads, len(row_tensors), self.ring)),
                                     byte_alignment=16)
        for s in cutlass.range_constexpr(self.ring - 1):
            self.ring_issue(thr, tensors, row_tensors, rings, stats, rows, bidx + s * grid, s, first, cols)
        return rings, stats

    @cute.jit
    def ring_issue(self, thr, tensors, row_tensors, rings, stats, rows, block, stage, first, cols):
        """cp.async of row block ``block`` (nothing past M) into ring stage ``stage``: each thread its own columns
        and its row's values, so it alone reads them back (no CTA barrier); one commit group a block, empty or not."""
        row_ok, _ = self.predicates(thr, rows, block, first)
        if row_ok:
            bits = self.vec * self.dtype.width
            modes = cute.nvgpu.cpasync.LoadCacheMode
            mode = modes.GLOBAL if const_expr(bits == 128) else modes.ALWAYS  # .cg takes 16 bytes only
            atom = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(cache_mode=mode), self.dtype,
                                       num_bits_per_copy=bits)
            for src, ring in zip(tensors, rings, strict=True):
                g, r = self.part(thr, src, block, first), self.part(thr, ring[None, None, stage], 0, 0)
                for k in cutlass.range_constexpr(self.chunks):
                    if const_expr(cols is None):
                        cute.copy(atom, g[None, 0, k], r[None, 0, k])
                    else:
                        if cols[k]:
                            cute.copy(atom, g[None, 0, k], r[None, 0, k])
            word = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(), Float32, num_bits_per_copy=32)
            row = self.row_coord(thr, rows, block, 0)[0]
            tidx, _, _ = cute.arch.thread_idx()
            for i, src in enumerate(row_tensors):
                cute.copy(word, cute.local_tile(src, (1,), (row,)), cute.local_tile(stats[tidx, i, None], (1,),
                                                                                    (stage,)))
        cute.arch.cp_async_commit_group()

    @cute.jit
    def next_row(self, thr, source, tensors, row_tensors, rows, block, visit, grid, first, cols, row_ok, terms):
        """``terms(values, row_values)`` of this CTA's ``visit``-th row block ``block`` (``row_ok``: this thread's row
        is before M): the row tensors' values in fp32 (zeros past M and N) and its row values (1.0 past M); and the
        read of a later block issued. With the register prefetch ``terms`` runs before the next block's loads
        overwrite the registers, in the order the kernels' own loops had before the ring (their default cubins keep
        their registers)."""
        frags, stats = source
        if const_expr(self.ring == 0):
            found = terms([f.load().to(Float32) for f in frags], [stats[i] for i, _ in enumerate(row_tensors)])
            self.prefetch(thr, tensors, frags, rows, block + grid, first, cols)
            self.prefetch_row_values(thr, row_tensors, stats, rows, block + grid)
            return found
        # the stage refilled here was read into registers (and used) at the previous visit
        ahead = self.ring - 1
        self.ring_issue(thr, tensors, row_tensors, frags, stats, rows, block + ahead * grid,
                        (visit + ahead) % self.ring, first, cols)
        cute.arch.cp_async_wait_group(ahead)  # this block's group is complete
        stage = visit % self.ring
        tidx, _, _ = cute.arch.thread_idx()
        values = []
        for ring in frags:
            held = self.part(thr, ring[None, None, stage], 0, 0)
            frag = cute.make_rmem_tensor_like(held)
            cute.autovec_copy(held, frag)
            if not row_ok:
                frag.fill(0.0)
            self.zero_out_of_range(frag, cols)
            values.append(frag.load().to(Float32))
        row_values = []
        for i in cutlass.range_constexpr(len(row_tensors)):
            value = Float32(1.0)
            if row_ok:
                value = stats[tidx, i, stage]
            row_values.append(value)
        return terms(values, row_values)

    @cute.jit
    def prefetch_row_values(self, thr, tensors, frag, rows, block):
        """Load row block ``block``'s entries of (M,) fp32 tensors (rstd, mean) into ``frag``, one per tensor
        (1.0 past M), alongside the row's prefetch: issued a row ahead, they are not a dependent load at the
        row's start."""
        for i, src in enumerate(tensors):
            frag[i] = self.load_row_value(thr, src, rows, block, 0, 1.0)

    @cute.jit
    def accumulator(self, thr, m_partials):
        """A zeroed fp32 accumulator of one tile (held rows and a partials tensor), else None: this thread's
        registers, or (without spare registers) its slots of a tile in shared memory."""
        acc = None
        if const_expr(m_partials is not None and self.tiles == 1):
            zeros = cute.make_rmem_tensor_like(self.part(thr, m_partials, 0, 0))
            zeros.fill(0.0)
            if const_expr(self.spare_registers):
                acc = zeros
            else:
                layout = cute.make_ordered_layout(self.tiler, order=(1, 0))
                acc = self.part(thr, SmemAllocator().allocate_tensor(Float32, layout, byte_alignment=16), 0, 0)
                cute.autovec_copy(zeros, acc)
        return acc

    @cute.jit
    def store_accumulator(self, thr, m_partials, acc, block, tile, cols):
        if const_expr(acc is not None):
            self.store(acc.load(), self.part(thr, m_partials, block, tile), True, cols)
