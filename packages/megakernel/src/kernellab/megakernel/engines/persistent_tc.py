"""``persistent-tc``: the whole block in one launch on tensor cores, the hidden never leaves the SM.

Grid: min(row tiles, SMs x CTAs per SM); CTA b owns row tiles b, b + grid, ... For one tile of
``tile_rows`` rows the CTA keeps the fp16 input rows in shared memory and the fp32 output tile
(tile_rows x channels_tile) in registers, and walks the hidden dimension in chunks of 64:

    h_chunk = fp16(act(x_tile W1[chunk]^T + b1[chunk]))      (GEMM1, epilogue -> shared memory)
    y_acc  += h_chunk W2[:, chunk]^T                          (GEMM2 from shared memory)

then writes ``y = y_acc + b2 + residual`` (``tensorcore.store_output``: in batches, loads before stores, in column
pairs where rows are 16 bytes). W1 and W2 chunks stream through ``stages`` shared-memory buffers each with cp.async:
chunk j + stages loads into the buffer chunk j freed, so with one buffer W1(j+1) loads while GEMM2(j) runs, and with
S buffers (up to 4, and no more than the chunks, where the planner finds the shared memory: planning.tc_stages) it
has 2S - 1 GEMMs' time to land; with as many buffers as chunks every load of a tile is issued at its start. b1 of a
chunk is read into registers before its GEMM1, so that load waits under the GEMM. Shared memory: x tile + the W1 and
W2 chunk buffers + the hidden chunk, all fp16 (planning.persistent_tc_smem_bytes). 8 warps tiled 2 x 4 over every
product; the 64 x 512 output tile costs 128 accumulator registers per thread, the largest tile the planner allows.

Padding: channels are padded to the channel tile and the last hidden chunk and row tile may be
partial. Loads zero-fill everything outside the tensors, so padded hidden units have W1 rows and
W2 columns of zeros: whatever the activation makes of their bias, they add exactly 0 to y.

Hidden split (``split`` S of 2, 4 or 8, where ``planning.tc_layout`` takes it): a cluster of S CTAs owns each row
tile, CTA r runs hidden chunks r, r + S, ..., so each streams 1/S of the weights. The CTAs' threads hold the same
output coordinates; at a tile's end each sends the elements every peer finishes (pairs of neighbouring columns go
round the CTAs: ``tensorcore.split_owner``) into that peer's shared memory, a run of the receive buffer per sender
(``tensorcore.split_recv_slot``), with asynchronous DSMEM stores counted by a transaction barrier, after a cluster
barrier that frees the receive buffers (arrived at at the tile's start, waited for here), and finishes its own
1/S of the tile.

TMA loads (``loads="tma"``, the planner's choice for 64-row wgmma tiles: planning.tc_loads): one thread
of warp 0 issues each weight chunk by TMA into its buffer, and two mbarrier pipelines (W1, W2) track the
buffers; the x tile stays on cp.async. Weight multicast (``multicast`` 2 or 4, which loads by TMA): a cluster of CTAs
on their own row tiles loads every W1 / W2 chunk once, by TMA, each CTA its share of it into the buffers
of all; the buffers are two TMA pipelines (a full barrier per buffer, and an empty one that every warp of
every CTA of the cluster releases before any reloads it). The cluster's CTAs run the same number of
tiles, the later CTAs' last one empty where the tiles run out.

Overlapped chunk schedule (``overlap``, wgmma with TMA loads): GEMM1 of chunk j + 1 and GEMM2 of chunk j are
issued together as two wgmma groups; waiting for the first alone lets the activation of chunk j + 1 go into a
second hidden buffer while GEMM2 of chunk j still runs, so the epilogue no longer stands between the GEMMs. The
W2 chunk of GEMM2(j), whose load can begin only as GEMM2(j - 1) ends, is waited for after GEMM1(j + 1) is issued.

Alignment: where channels and hidden are multiples of 8 every row is 16-byte aligned and tiles load
by cp.async (``vector=8``); any other shape (odd channels such as 63) compiles the ``vector=1``
variant, whose tiles load element by element, synchronously, into the same shared-memory tiles.
"""

from __future__ import annotations

import dataclasses

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float16, Float32, Int32, pipeline
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.memory import SmemAllocator

from ..model import ACTIVATION_CODES
from ..planning import TC_HIDDEN_CHUNK, TC_THREADS, VECTOR_ELEMENTS, Plan, Tile, ceil_div, tc_occupancy_limit
from . import persistent_tc_registers, tensorcore
from .common import block_signature, compile_variant, compiled

WARPS_M, WARPS_N = 2, 4
ALIGN = 1024  # the swizzle pattern repeats every 8 rows of 128 bytes
EARLY_EPILOGUE = 16  # output elements per thread up to which b2 and the residual are read at a tile's start
FUSED_LOAD_ELEMENTS = 96
"""Element loads (``vector=1``): a tile's x rows and its first chunks' W1 and W2 are loaded into registers
together, then stored, so that they wait out one memory latency instead of one each; as many chunks as keep
a thread's staged elements within this many (x tile and chunk buffers of 64 channels: two chunks)."""


@dataclasses.dataclass(frozen=True)
class Variant:
    tile_rows: int
    channels_tile: int
    residual: str = "float16"
    stages: int = 1
    vector: int = VECTOR_ELEMENTS  # fp16 elements per global load: 8 (16-byte cp.async) or 1
    mma: str = "mma.sync"  # or "wgmma" (sm_90a; 64 or 128 row tiles)
    split: int = 1  # CTAs of a cluster sharing a row tile, each running 1/split of the hidden chunks
    multicast: int = 1  # CTAs of a cluster on their own row tiles, each weight chunk loaded once for all (TMA)
    loads: str = "cp.async"  # how weight chunks load: "cp.async" (every thread) or "tma" (one thread, mbarriers)
    overlap: bool = False  # GEMM1 of chunk j + 1 beside GEMM2 of chunk j (wgmma with TMA loads)
    pdl: bool = False  # programmatic dependent launch: the next kernel launches early, this one waits for the last

    @property
    def name(self) -> str:
        narrow = "" if self.vector == VECTOR_ELEMENTS else f"_v{self.vector}"
        wg = "_wg" if self.mma == "wgmma" else ""
        shared = "" if self.split == 1 else f"_x{self.split}"
        shared += "" if self.loads == "cp.async" else "_tma" if self.multicast == 1 else f"_mc{self.multicast}"
        schedule = "_ov" if self.overlap else ""
        schedule += "_pdl" if self.pdl else ""
        return (f"persistent-tc_m{self.tile_rows}_c{self.channels_tile}_s{self.stages}{narrow}{wg}{shared}{schedule}"
                f"_res-{self.residual}")

    @property
    def occupancy(self) -> int:
        tile = Tile("persistent-tc", self.tile_rows, self.channels_tile, TC_HIDDEN_CHUNK, TC_THREADS, 1, self.stages,
                    split=self.split, multicast=self.multicast, loads=self.loads, overlap=self.overlap)
        return tc_occupancy_limit(tile)

    @property
    def fused_stages(self) -> int:
        """Chunks whose W1 and W2 element loads fly with the x tile's at a tile's start (``FUSED_LOAD_ELEMENTS``);
        0 for 16-byte rows, whose cp.async copies are all in flight together anyway."""
        if self.vector == VECTOR_ELEMENTS:
            return 0
        x, chunk = (n * self.channels_tile // TC_THREADS for n in (self.tile_rows, TC_HIDDEN_CHUNK))
        fused = 0
        while fused < self.stages and x + 2 * (fused + 1) * chunk <= FUSED_LOAD_ELEMENTS:
            fused += 1
        return fused

    def compile(self, arch: str | None = None):
        kernel = PersistentTensorCore(self)
        return compile_variant(self.name, kernel, block_signature(self.vector, self.residual), arch)


def variant(plan: Plan, residual: str = "float16"):
    """The compiled variant a persistent-tc plan runs: the shared-memory form's, or the register form's
    (``engines/persistent_tc_registers.py``). Both take ``(u, residual, w1, b1, w2, b2, y, activation, grid)``."""
    tile = plan.tile
    if tile.registers:
        return persistent_tc_registers.Variant(tile.channels_tile, tile.hidden_chunk, residual, tile.vector)
    return Variant(tile.rows, tile.channels_tile, residual, tile.stages, tile.vector, tile.mma, tile.split,
                   tile.multicast, tile.loads, tile.overlap, tile.pdl)


def launcher(plan: Plan, activation: str, residual: str = "float16"):
    """``run(u, residual, w1, b1, w2, b2, y)``: one launch of ``plan.owners.grid`` CTAs."""
    fn = compiled(variant(plan, residual))
    act, grid = ACTIVATION_CODES[activation], plan.owners.grid

    def run(u, res, w1, b1, w2, b2, y):
        fn(u, res, w1, b1, w2, b2, y, act, grid)

    return run


class PersistentTensorCore:
    def __init__(self, variant: Variant):
        self.tile_rows = variant.tile_rows
        self.channels_tile = variant.channels_tile
        self.stages = variant.stages
        self.vector = variant.vector
        self.wgmma = variant.mma == "wgmma"
        self.split = variant.split
        self.multicast = variant.multicast
        self.tma = variant.loads == "tma"
        self.overlap = variant.overlap
        self.pdl = variant.pdl
        self.fused_stages = variant.fused_stages
        self.occupancy = variant.occupancy
        self.output_width = 2 if variant.vector == VECTOR_ELEMENTS else 1  # y pairs (tensorcore.store_output)

    @cute.jit
    def __call__(self, u: cute.Tensor, residual: cute.Tensor, w1: cute.Tensor, b1: cute.Tensor, w2: cute.Tensor,
                 b2: cute.Tensor, y: cute.Tensor, act: Int32, grid: Int32, stream: cuda.CUstream):
        rows, cols, chunk, stages = self.tile_rows, self.channels_tile, TC_HIDDEN_CHUNK, self.stages
        layout = tensorcore.wgmma_smem_layout if cutlass.const_expr(self.wgmma) else tensorcore.smem_layout
        hidden_buffers = 2 if self.overlap else 1
        layouts = (layout((rows, cols)), layout((chunk, cols, stages)), layout((cols, chunk, stages)),
                   layout((rows, chunk, hidden_buffers)))
        if cutlass.const_expr(self.wgmma):  # GEMM1 is (rows, chunk), GEMM2 (rows, cols): two instruction widths
            warpgroups = TC_THREADS // 128
            # the overlapped schedule's last GEMM2 of a tile has its own MMA object: the accumulate flag set
            # on the loop's one is a value of the loop body, which the code after the loop cannot use
            mmas = (tensorcore.wgmma_tiled(rows, chunk, warpgroups), tensorcore.wgmma_tiled(rows, cols, warpgroups),
                    tensorcore.wgmma_tiled(rows, cols, warpgroups) if self.overlap else None)
        else:
            mmas = (tensorcore.tiled_mma(WARPS_M, WARPS_N),) * 2 + (None,)
        tmas = (None,) * 4
        if cutlass.const_expr(self.tma):  # TMA atoms for one chunk buffer of each weight
            op = cpasync.CopyBulkTensorTileG2SMulticastOp() if self.multicast > 1 else cpasync.CopyBulkTensorTileG2SOp()
            tma_w1, g_w1 = cpasync.make_tiled_tma_atom(op, w1, cute.slice_(layouts[1], (None, None, 0)), (chunk, cols),
                                                      self.multicast)
            tma_w2, g_w2 = cpasync.make_tiled_tma_atom(op, w2, cute.slice_(layouts[2], (None, None, 0)), (cols, chunk),
                                                      self.multicast)
            tmas = (tma_w1, g_w1, tma_w2, g_w2)
        cluster = self.split * self.multicast
        self.kernel(u, residual, w1, b1, w2, b2, y, act, *layouts, tensorcore.g2s_copy(TC_THREADS, 64),
                    *mmas, *tmas).launch(
            grid=[grid, 1, 1], block=[TC_THREADS, 1, 1],
            cluster=[cluster, 1, 1] if cutlass.const_expr(cluster > 1) else None,
            min_blocks_per_mp=self.occupancy, preferred_smem_carveout=100, use_pdl=self.pdl, stream=stream)

    @cute.kernel
    def kernel(self, u: cute.Tensor, residual: cute.Tensor, w1: cute.Tensor, b1: cute.Tensor, w2: cute.Tensor,
               b2: cute.Tensor, y: cute.Tensor, act: Int32, x_layout: cute.ComposedLayout,
               w1_layout: cute.ComposedLayout, w2_layout: cute.ComposedLayout, h_layout: cute.ComposedLayout,
               g2s: cute.TiledCopy, mma_h: cute.TiledMma, mma_y: cute.TiledMma, mma_y_last, tma_w1, g_w1, tma_w2,
               g_w2):
        tile_rows, cols, chunk, split, multicast = (self.tile_rows, self.channels_tile, TC_HIDDEN_CHUNK, self.split,
                                                    self.multicast)
        if cutlass.const_expr(self.pdl):  # the next kernel of the stream may launch now: its CTAs take the SMs
            cute.arch.griddepcontrol_launch_dependents()  # this grid leaves idle and wait there (below)
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        rank, group, groups = cta % split, cta // split, grid // split  # a cluster of `split` CTAs per row tile
        rows, channels = u.shape
        hidden = w1.shape[0]

        smem = SmemAllocator()
        s_x, s_w1, s_w2, s_h = (self.tile_tensor(smem, layout) for layout in (x_layout, w1_layout, w2_layout, h_layout))

        copy_a, copy_b = None, None
        if cutlass.const_expr(not self.wgmma):
            copy_a, copy_b = tensorcore.s2r_copies(mma_h)
        thr_h, thr_y = mma_h.get_slice(tid), mma_y.get_slice(tid)
        acc_h = cute.make_rmem_tensor(thr_h.partition_shape_C((tile_rows, chunk)), Float32)
        bias_h = cute.make_rmem_tensor(thr_h.partition_shape_C((tile_rows, chunk)), Float32)
        acc_y = cute.make_rmem_tensor(thr_y.partition_shape_C((tile_rows, cols)), Float32)
        h_coords = thr_h.partition_C(cute.make_identity_tensor((tile_rows, chunk)))
        y_coords = thr_y.partition_C(cute.make_identity_tensor((tile_rows, cols)))
        h_dst = thr_h.partition_C(s_h[None, None, 0])
        recv, mbar = None, None
        if cutlass.const_expr(split > 1):  # the peers' partials of the outputs this CTA finishes, and its barrier
            recv = smem.allocate_tensor(Float32, cute.make_layout(((split - 1) * cute.size(acc_y) // split, TC_THREADS),
                                                                  stride=(TC_THREADS, 1)), 16)
            mbar = smem.allocate_array(cutlass.Int64, num_elems=1, byte_alignment=8)
            if tid == 0:
                cute.arch.mbarrier_init(mbar, 1)
            cute.arch.mbarrier_init_fence()  # made visible to the peer by the first tile's cluster barrier

        # TMA loads: W1 and W2 chunks come through two pipelines of `stages` buffers; with a multicast every
        # CTA of the cluster loads its share of each chunk into all of them (mask), and a buffer is reloaded
        # once every warp of every CTA released it
        pipe_w1, pipe_w2, t_s_w1, t_g_w1, t_s_w2, t_g_w2 = None, None, None, None, None, None
        load_w1, load_w2, use_w1, use_w2 = None, None, None, None
        is_loader = tid < 32  # warp 0 issues the TMA copies (one elected lane)
        mask = None
        if cutlass.const_expr(self.tma):
            pipe_w1, pipe_w2, t_s_w1, t_g_w1, t_s_w2, t_g_w2 = self.weight_pipelines(
                smem, cta % multicast, s_w1, s_w2, tma_w1, g_w1, tma_w2, g_w2, tid)
            mask = cutlass.Int16((1 << multicast) - 1)
            load_w1 = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
            load_w2 = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
            use_w1 = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            use_w2 = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)

        x_coords = cute.make_identity_tensor(u.shape)
        w1_coords = cute.make_identity_tensor(w1.shape)
        w2_coords = cute.make_identity_tensor(w2.shape)
        num_chunks = ceil_div(hidden, chunk)
        local_chunks = (num_chunks - rank + split - 1) // split  # this CTA's chunks: rank, rank + split, ...

        stages = self.stages
        pending = 2 * stages - 1  # cp.async groups that may still fly once the one a step needs has landed
        # small output tiles: the epilogue's b2 and residual are read into registers at the tile's start, and
        # each chunk's b1 before its wait, so that their latency hides under the weight loads
        early = cute.size(acc_y) <= EARLY_EPILOGUE and split == 1
        epi_b2, epi_res = None, None
        if cutlass.const_expr(early):
            epi_b2 = cute.make_rmem_tensor(thr_y.partition_shape_C((tile_rows, cols)), Float32)
            epi_res = cute.make_rmem_tensor(thr_y.partition_shape_C((tile_rows, cols)), Float32)
        tiles_end = ceil_div(rows, tile_rows)
        if cutlass.const_expr(self.pdl):  # the set-up above touches shared memory only; every global read and write
            cute.arch.griddepcontrol_wait()  # comes after the kernel before this one has finished and flushed
        if cutlass.const_expr(multicast > 1):  # a cluster loads every chunk together: all its CTAs run as many
            tiles_end = tiles_end + cta % multicast  # tiles as its first, the others' last one past the rows
        for tile in range(group, tiles_end, groups):
            row0 = tile * tile_rows
            if cutlass.const_expr(split > 1):  # done with the last tile's recv; the exchange waits for the peer's
                cute.arch.cluster_arrive()
            x_tile = cute.local_tile(u, (tile_rows, cols), (tile, 0))
            x_crd = cute.local_tile(x_coords, (tile_rows, cols), (tile, 0))
            if cutlass.const_expr(self.fused_stages > 0):  # element loads of x and the first chunks in flight
                self.load_fused(g2s, tid, x_tile, x_crd, s_x, w1, w1_coords, s_w1, w2, w2_coords, s_w2, rows,
                                channels, hidden)
            else:
                tensorcore.load_tile(g2s, tid, x_tile, s_x, x_crd, rows, channels, self.vector)
            if cutlass.const_expr(self.tma):
                cute.arch.cp_async_commit_group()  # the x tile alone: the weights come by TMA
                if is_loader:
                    for s in cutlass.range_constexpr(stages):
                        if s < local_chunks:
                            self.tma_load(pipe_w1, load_w1, tma_w1, t_g_w1, t_s_w1, rank + split * s, mask)
                            load_w1.advance()
                            self.tma_load(pipe_w2, load_w2, tma_w2, t_g_w2, t_s_w2, rank + split * s, mask)
                            load_w2.advance()
            else:
                for s in cutlass.range_constexpr(stages):  # groups: x + W1(0), W2(0), W1(1), W2(1), ...
                    if s >= self.fused_stages and s < local_chunks:  # (the fused ones' groups stay empty)
                        self.load_w1(g2s, tid, w1, w1_coords, s_w1[None, None, s], rank + split * s, hidden,
                                     channels)
                    cute.arch.cp_async_commit_group()
                    if s >= self.fused_stages and s < local_chunks:
                        self.load_w2(g2s, tid, w2, w2_coords, s_w2[None, None, s], rank + split * s, hidden,
                                     channels)
                    cute.arch.cp_async_commit_group()
            if cutlass.const_expr(early):
                for i in cutlass.range_constexpr(cute.size(acc_y)):
                    r, c = y_coords[i]
                    tensorcore.read_output_terms(epi_b2, epi_res, i, row0 + r < rows and c < channels, c, row0 + r,
                                                 b2, residual, 1)
            acc_y.fill(0.0)
            if cutlass.const_expr(self.overlap):
                # chunk 0's GEMM1 and activation; then GEMM1(j + 1) beside GEMM2(j), the activation of j + 1
                # into the other hidden buffer while GEMM2(j) runs; the last GEMM2 alone (every CTA has a
                # chunk: planning.overlap_plan)
                self.read_b1(bias_h, h_coords, b1, rank, hidden)
                cute.arch.cp_async_wait_group(0)  # the x tile
                pipe_w1.consumer_wait(use_w1)
                self.fence_for_wgmma()
                cute.arch.sync_threads()
                tensorcore.wgmma_from_smem(mma_h, tid, acc_h, s_x, s_w1[None, None, use_w1.index], False)
                pipe_w1.consumer_release(use_w1)
                use_w1.advance()
                if stages < local_chunks and is_loader:
                    self.tma_load(pipe_w1, load_w1, tma_w1, t_g_w1, t_s_w1, rank + split * stages, mask)
                    load_w1.advance()
                self.hidden_epilogue(acc_h, bias_h, act, h_dst)
                for jj in range(local_chunks - 1):
                    j = rank + split * jj
                    self.read_b1(bias_h, h_coords, b1, j + split, hidden)
                    pipe_w1.consumer_wait(use_w1)  # W1(j + 1) landed
                    self.fence_for_wgmma()
                    cute.arch.sync_threads()  # hidden chunk j is complete, every GEMM2(j - 1) done with the other
                    tensorcore.wgmma_issue(mma_h, tid, acc_h, s_x, s_w1[None, None, use_w1.index], False)
                    # W2(j), whose load began as GEMM2(j - 1) ended, is waited for only now, under GEMM1(j + 1)
                    pipe_w2.consumer_wait(use_w2)
                    tensorcore.wgmma_issue(mma_y, tid, acc_y, s_h[None, None, jj % 2], s_w2[None, None, use_w2.index],
                                           True)
                    warpgroup.wait_group(1)  # GEMM1(j + 1) is done, GEMM2(j) runs on
                    pipe_w1.consumer_release(use_w1)
                    use_w1.advance()
                    if jj + 1 + stages < local_chunks and is_loader:
                        self.tma_load(pipe_w1, load_w1, tma_w1, t_g_w1, t_s_w1, j + split * (stages + 1), mask)
                        load_w1.advance()
                    self.hidden_epilogue(acc_h, bias_h, act, thr_h.partition_C(s_h[None, None, (jj + 1) % 2]))
                    warpgroup.wait_group(0)  # GEMM2(j) is done
                    pipe_w2.consumer_release(use_w2)
                    use_w2.advance()
                    if jj + stages < local_chunks and is_loader:
                        self.tma_load(pipe_w2, load_w2, tma_w2, t_g_w2, t_s_w2, j + split * stages, mask)
                        load_w2.advance()
                pipe_w2.consumer_wait(use_w2)  # the last chunk's W2
                self.fence_for_wgmma()
                cute.arch.sync_threads()
                tensorcore.wgmma_from_smem(mma_y_last, tid, acc_y, s_h[None, None, (local_chunks - 1) % 2],
                                           s_w2[None, None, use_w2.index], True)
                cute.arch.sync_threads()  # every warp is done with the hidden buffers (the next tile writes them)
                pipe_w2.consumer_release(use_w2)
                use_w2.advance()
            else:
                for jj in range(local_chunks):
                    j, slot = rank + split * jj, jj % stages
                    if cutlass.const_expr(early):  # in flight under the wait too (a large tile would spill more)
                        self.read_b1(bias_h, h_coords, b1, j, hidden)
                    if cutlass.const_expr(self.tma):
                        cute.arch.cp_async_wait_group(0)  # the x tile
                        pipe_w1.consumer_wait(use_w1)  # W1(j) landed
                        slot = use_w1.index
                    else:
                        cute.arch.cp_async_wait_group(pending)  # x tile and W1(j) landed
                    self.fence_for_wgmma()
                    cute.arch.sync_threads()
                    if cutlass.const_expr(not early):  # in flight under GEMM1
                        self.read_b1(bias_h, h_coords, b1, j, hidden)
                    self.gemm(mma_h, tid, acc_h, s_x, s_w1[None, None, slot], copy_a, copy_b, False)
                    if cutlass.const_expr(self.tma):  # this warp is done with W1(j)'s buffer, in every CTA
                        pipe_w1.consumer_release(use_w1)
                        use_w1.advance()
                        if jj + stages < local_chunks and is_loader:
                            self.tma_load(pipe_w1, load_w1, tma_w1, t_g_w1, t_s_w1, j + split * stages, mask)
                            load_w1.advance()
                    else:
                        cute.arch.sync_threads()  # every warp is done with W1(j)'s buffer
                        if jj + stages < local_chunks:
                            self.load_w1(g2s, tid, w1, w1_coords, s_w1[None, None, slot], j + split * stages, hidden,
                                         channels)
                        cute.arch.cp_async_commit_group()  # possibly empty: keeps the group count uniform
                    self.hidden_epilogue(acc_h, bias_h, act, h_dst)
                    if cutlass.const_expr(self.tma):
                        pipe_w2.consumer_wait(use_w2)  # W2(j) landed
                        slot = use_w2.index
                    else:
                        cute.arch.cp_async_wait_group(pending)  # W2(j) landed
                    self.fence_for_wgmma()
                    cute.arch.sync_threads()  # and the hidden chunk is complete
                    self.gemm(mma_y, tid, acc_y, s_h[None, None, 0], s_w2[None, None, slot], copy_a, copy_b, True)
                    cute.arch.sync_threads()  # every warp is done with W2(j)'s buffer and the hidden chunk
                    if cutlass.const_expr(self.tma):
                        pipe_w2.consumer_release(use_w2)
                        use_w2.advance()
                        if jj + stages < local_chunks and is_loader:
                            self.tma_load(pipe_w2, load_w2, tma_w2, t_g_w2, t_s_w2, j + split * stages, mask)
                            load_w2.advance()
                    else:
                        if jj + stages < local_chunks:
                            self.load_w2(g2s, tid, w2, w2_coords, s_w2[None, None, slot], j + split * stages, hidden,
                                         channels)
                        cute.arch.cp_async_commit_group()
            if cutlass.const_expr(split > 1):
                cute.arch.cp_async_wait_group(0)  # a CTA without chunks never waited for its x tile
                self.exchange(acc_y, recv, mbar, rank, (tile - group) // groups % 2, tid)
            if cutlass.const_expr(early):
                for i in cutlass.range_constexpr(cute.size(acc_y)):
                    r, c = y_coords[i]
                    if row0 + r < rows and c < channels:
                        y[row0 + r, c] = acc_y[i] + epi_b2[i] + epi_res[i]
            elif cutlass.const_expr(split > 1):  # element i is finished by the CTA of rank split_owner(i)
                per = cute.size(acc_y) // split  # slots of one peer's run in recv
                for i in cutlass.range_constexpr(cute.size(acc_y)):
                    if tensorcore.split_owner(i, split) == rank:
                        for p in cutlass.range_constexpr(split - 1):
                            acc_y[i] = acc_y[i] + recv[p * per + tensorcore.split_slot(i, split), tid]
                tensorcore.store_output(acc_y, y_coords, row0, 0, rows, channels, b2, residual, y, self.output_width,
                                        split, rank)
            else:
                tensorcore.store_output(acc_y, y_coords, row0, 0, rows, channels, b2, residual, y, self.output_width)
        if cutlass.const_expr(split * multicast > 1):  # no CTA leaves while a peer may still write into it
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()

    @cute.jit
    def weight_pipelines(self, smem: SmemAllocator, rank: Int32, s_w1: cute.Tensor, s_w2: cute.Tensor, tma_w1,
                            g_w1: cute.Tensor, tma_w2, g_w2: cute.Tensor, tid: Int32):
        """The two weight pipelines (full and empty barriers of every chunk buffer; a buffer is free again
        once every warp of every CTA of the multicast cluster released it) and each weight's TMA partition:
        chunk j of the global weight against the chunk buffers, this CTA's share of every copy."""
        stages, multicast, chunk, cols = self.stages, self.multicast, TC_HIDDEN_CHUNK, self.channels_tile
        barriers = smem.allocate_array(cutlass.Int64, num_elems=4 * stages, byte_alignment=8)
        cluster = cute.make_layout((1, multicast, 1, 1))
        pipes = []
        for w in cutlass.range_constexpr(2):
            pipes.append(pipeline.PipelineTmaAsync.create(
                num_stages=stages, producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
                consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, multicast * (TC_THREADS // 32)),
                tx_count=2 * chunk * cols, barrier_storage=barriers + 2 * stages * w, cta_layout_vmnk=cluster,
                tidx=tid, defer_sync=True))
        pipeline.pipeline_init_arrive(cluster_shape_mn=(multicast, 1), is_relaxed=True)
        peers = cute.make_layout(multicast)
        t_s_w1, t_g_w1 = cpasync.tma_partition(tma_w1, rank, peers, cute.group_modes(s_w1, 0, 2),
                                               cute.group_modes(cute.local_tile(g_w1, (chunk, cols), (None, 0)), 0, 2))
        t_s_w2, t_g_w2 = cpasync.tma_partition(tma_w2, rank, peers, cute.group_modes(s_w2, 0, 2),
                                               cute.group_modes(cute.local_tile(g_w2, (cols, chunk), (0, None)), 0, 2))
        if tid < 32:
            cpasync.prefetch_descriptor(tma_w1)
            cpasync.prefetch_descriptor(tma_w2)
        pipeline.pipeline_init_wait(cluster_shape_mn=(multicast, 1))  # every CTA's barriers exist
        return pipes[0], pipes[1], t_s_w1, t_g_w1, t_s_w2, t_g_w2

    @cute.jit
    def tma_load(self, pipe, state, tma, t_g: cute.Tensor, t_s: cute.Tensor, j: Int32, mask):
        """Once every CTA of the cluster freed ``state``'s buffer: this CTA's share of weight chunk j into it,
        in every CTA of the mask. The caller advances ``state`` (and releases and advances its consumer state)
        in its own loop body: CuTe DSL carries a pipeline state through a dynamic loop or branch only where
        that body advances it, and an advance inside a helper fails IR verification (tried)."""
        pipe.producer_acquire(state)
        cute.copy(tma, t_g[(None, j)], t_s[(None, state.index)], tma_bar_ptr=pipe.producer_get_barrier(state),
                  mcast_mask=mask)
        pipe.producer_commit(state)

    @cute.jit
    def exchange(self, acc_y: cute.Tensor, recv: cute.Tensor, mbar, rank: Int32, phase: Int32, tid: Int32):
        """Sum a cluster's partial output tiles: the same thread of every CTA holds the same output coordinates,
        so each sends the elements a peer finishes (``tensorcore.split_owner``) into that peer's
        ``recv[split_recv_slot(i, ...), tid]`` by asynchronous DSMEM stores, counted by the peer's transaction
        barrier, which expects the split - 1 senders' runs."""
        count, split = cute.size(acc_y), self.split
        cute.arch.cluster_wait()  # every CTA is done with the last tile's recv (and the barrier exists): the
        # arrive went out at the tile's start, so the barrier's round trip is over by now
        if tid == 0:
            cute.arch.mbarrier_arrive_and_expect_tx(mbar, (split - 1) * (count // split) * TC_THREADS * 4)
        for owner in cutlass.range_constexpr(split):  # a peer at a time: one run's address live, not split - 1
            if owner != rank:
                for i in cutlass.range_constexpr(count):
                    if cutlass.const_expr(tensorcore.split_owner(i, split) == owner):
                        ptr = recv.iterator + cute.crd2idx((tensorcore.split_recv_slot(i, count, split, rank), tid),
                                                           recv.layout)
                        cute.arch.store_async_dsmem(ptr, acc_y[i].bitcast(Int32), mbar, owner)
        cute.arch.mbarrier_wait(mbar, phase)

    def tile_tensor(self, smem: SmemAllocator, layout: cute.ComposedLayout) -> cute.Tensor:
        """A swizzled fp16 tile in shared memory; for wgmma the swizzle goes on the pointer (its descriptors
        take an affine layout)."""
        if cutlass.const_expr(self.wgmma):
            return smem.allocate_tensor(Float16, layout.outer, ALIGN, swizzle=layout.inner)
        return smem.allocate_tensor(Float16, layout, ALIGN)

    @cute.jit
    def gemm(self, mma: cute.TiledMma, tid: Int32, acc: cute.Tensor, s_a: cute.Tensor, s_b: cute.Tensor,
             copy_a, copy_b, accumulate: cutlass.Constexpr):
        """acc (+)= s_a s_b^T with the variant's instruction; ``accumulate=False`` starts from zero."""
        if cutlass.const_expr(self.wgmma):
            tensorcore.wgmma_from_smem(mma, tid, acc, s_a, s_b, accumulate)
        else:
            if cutlass.const_expr(not accumulate):
                acc.fill(0.0)
            tensorcore.gemm_from_smem(mma, tid, acc, s_a, s_b, copy_a, copy_b)

    @cute.jit
    def fence_for_wgmma(self):
        """Shared memory this thread wrote (cp.async, stores) made visible to wgmma's async proxy, before
        the barrier that hands it over; nothing for mma.sync, which reads it by ldmatrix."""
        if cutlass.const_expr(self.wgmma):
            cute.arch.fence_view_async_shared()

    @cute.jit
    def load_fused(self, g2s: cute.TiledCopy, tid: Int32, x_tile: cute.Tensor, x_crd: cute.Tensor, s_x: cute.Tensor,
                   w1: cute.Tensor, w1_coords: cute.Tensor, s_w1: cute.Tensor, w2: cute.Tensor, w2_coords: cute.Tensor,
                   s_w2: cute.Tensor, rows: Int32, channels: Int32, hidden: Int32):
        """The x tile and chunks 0 .. fused_stages - 1 of W1 and W2 (element loads; no split), every load
        issued before the first store. A chunk past the hidden loads as zeros, into a buffer no GEMM reads."""
        w1_tiler, w2_tiler = (TC_HIDDEN_CHUNK, self.channels_tile), (self.channels_tile, TC_HIDDEN_CHUNK)
        staged = [tensorcore.fetch_elements(g2s, tid, x_tile, x_crd, rows, channels)]
        for s in cutlass.range_constexpr(self.fused_stages):
            staged.append(tensorcore.fetch_elements(g2s, tid, cute.local_tile(w1, w1_tiler, (s, 0)),
                                                    cute.local_tile(w1_coords, w1_tiler, (s, 0)), hidden, channels))
            staged.append(tensorcore.fetch_elements(g2s, tid, cute.local_tile(w2, w2_tiler, (0, s)),
                                                    cute.local_tile(w2_coords, w2_tiler, (0, s)), channels, hidden))
        tensorcore.store_elements(g2s, tid, staged[0], s_x)
        for s in cutlass.range_constexpr(self.fused_stages):
            tensorcore.store_elements(g2s, tid, staged[1 + 2 * s], s_w1[None, None, s])
            tensorcore.store_elements(g2s, tid, staged[2 + 2 * s], s_w2[None, None, s])

    @cute.jit
    def hidden_epilogue(self, acc_h: cute.Tensor, bias_h: cute.Tensor, act: Int32, h_dst: cute.Tensor):
        """A GEMM1 chunk's epilogue: fp16(act(acc_h + b1)) into this thread's elements of a hidden buffer. The
        fp16 values go as one vector (neighbouring columns: packed conversions and 4-byte stores, half the
        instructions of one element at a time)."""
        tensorcore.activate_in_place(acc_h, bias_h, act)
        h = cute.make_rmem_tensor(acc_h.layout, Float16)
        h.store(acc_h.load().to(Float16))
        cute.autovec_copy(h, h_dst)

    @cute.jit
    def read_b1(self, bias_h: cute.Tensor, h_coords: cute.Tensor, b1: cute.Tensor, j: Int32, hidden: Int32):
        """b1 of hidden chunk j at this thread's GEMM1 accumulators (past the hidden: its last value, which
        meets zero W1 rows and W2 columns)."""
        for i in cutlass.range_constexpr(cute.size(bias_h)):
            bias_h[i] = b1[cutlass.min(j * TC_HIDDEN_CHUNK + h_coords[i][1], hidden - 1)]

    @cute.jit
    def load_w1(self, g2s: cute.TiledCopy, tid: Int32, w1: cute.Tensor, coords: cute.Tensor, s_w1: cute.Tensor,
                j: Int32, hidden: Int32, channels: Int32):
        """Rows [64 j, 64 j + 64) of W1 (hidden units), all channels, into one chunk buffer."""
        tiler = (TC_HIDDEN_CHUNK, self.channels_tile)
        tensorcore.load_tile(g2s, tid, cute.local_tile(w1, tiler, (j, 0)), s_w1,
                             cute.local_tile(coords, tiler, (j, 0)), hidden, channels, self.vector)

    @cute.jit
    def load_w2(self, g2s: cute.TiledCopy, tid: Int32, w2: cute.Tensor, coords: cute.Tensor, s_w2: cute.Tensor,
                j: Int32, hidden: Int32, channels: Int32):
        """Columns [64 j, 64 j + 64) of W2 (hidden units), all channels, into one chunk buffer."""
        tiler = (self.channels_tile, TC_HIDDEN_CHUNK)
        tensorcore.load_tile(g2s, tid, cute.local_tile(w2, tiler, (0, j)), s_w2,
                             cute.local_tile(coords, tiler, (0, j)), channels, hidden, self.vector)
