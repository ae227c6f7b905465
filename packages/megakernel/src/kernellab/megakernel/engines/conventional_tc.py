"""``conventional-tc``: the conventional two-kernel schedule on tensor cores.

Stage 1 is the GEMM ``hidden = fp16(act(u W1^T + b1))`` (M = rows, N = hidden, K = channels),
stage 2 the GEMM ``y = hidden W2^T + b2 + residual`` (M = rows, N = channels, K = hidden). Both are
one tiled kernel: a CTA of 4 warps (2 x 2) owns a 128 x 64 output tile and walks K in 32-wide
steps through a 3-stage cp.async pipeline (the load of step k + 2 overlaps the MMAs of step k),
then applies its stage's epilogue straight from the accumulators.
"""

from __future__ import annotations

import dataclasses

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float16, Float32, Int32
from cutlass.memory import SmemAllocator

from ..model import ACTIVATION_CODES
from ..planning import (
    CONVENTIONAL_TC_STAGES,
    CONVENTIONAL_TC_THREADS,
    CONVENTIONAL_TC_TILE,
    VECTOR_ELEMENTS,
    Plan,
    ceil_div,
)
from . import tensorcore
from .common import DTYPES, HiddenWorkspace, Symbols, compile_variant, compiled

BLOCK_M, BLOCK_N, BLOCK_K = CONVENTIONAL_TC_TILE
STAGES = CONVENTIONAL_TC_STAGES
ALIGN = 1024


@dataclasses.dataclass(frozen=True)
class Variant:
    stage: str  # "hidden" or "output"
    residual: str = "float16"

    @property
    def name(self) -> str:
        return f"conventional-tc-{self.stage}" + (f"_res-{self.residual}" if self.stage == "output" else "")

    def compile(self, arch: str | None = None):
        s = Symbols(divisibility=VECTOR_ELEMENTS)
        f16, f32 = Float16, Float32
        if self.stage == "hidden":
            kernel = HiddenGemm()
            args = (s.matrix(f16, s.rows, s.channels), s.matrix(f16, s.hidden, s.channels), s.vector(f32, s.hidden),
                    s.matrix(f16, s.rows, s.hidden), Int32(0))
        else:
            kernel = OutputGemm()
            args = (s.matrix(f16, s.rows, s.hidden), s.matrix(DTYPES[self.residual], s.rows, s.channels),
                    s.matrix(f16, s.channels, s.hidden), s.vector(f32, s.channels), s.matrix(f32, s.rows, s.channels))
        return compile_variant(self.name, kernel, args, arch)


def launcher(plan: Plan, activation: str, residual: str = "float16"):
    """``run(u, residual, w1, b1, w2, b2, y)``: the two GEMM kernels back to back."""
    hidden_gemm, output_gemm = compiled(Variant("hidden")), compiled(Variant("output", residual))
    act = ACTIVATION_CODES[activation]
    workspace = HiddenWorkspace(plan.rows, plan.hidden)

    def run(u, res, w1, b1, w2, b2, y):
        hidden = workspace.get(u.shape[0])
        hidden_gemm(u, w1, b1, hidden, act)
        output_gemm(hidden, res, w2, b2, y)

    return run


class TiledGemm:
    """The mainloop both stages share: acc = A[tile rows] B[tile cols]^T over all of K."""

    @staticmethod
    def launch_args():
        return (tensorcore.smem_layout((BLOCK_M, BLOCK_K, STAGES)), tensorcore.smem_layout((BLOCK_N, BLOCK_K, STAGES)),
                tensorcore.g2s_copy(CONVENTIONAL_TC_THREADS, BLOCK_K), tensorcore.tiled_mma(2, 2))

    @staticmethod
    def grid(m, n):
        return [ceil_div(m, BLOCK_M), ceil_div(n, BLOCK_N), 1]

    @cute.jit
    def mainloop(self, a: cute.Tensor, b: cute.Tensor, a_layout: cute.ComposedLayout, b_layout: cute.ComposedLayout,
                 g2s: cute.TiledCopy, mma: cute.TiledMma, tid: Int32, block_m: Int32, block_n: Int32,
                 acc: cute.Tensor):
        m, k_size = a.shape
        n = b.shape[0]
        smem = SmemAllocator()
        s_a = smem.allocate_tensor(Float16, a_layout, ALIGN)
        s_b = smem.allocate_tensor(Float16, b_layout, ALIGN)
        copy_a, copy_b = tensorcore.s2r_copies(mma)
        a_coords = cute.make_identity_tensor(a.shape)
        b_coords = cute.make_identity_tensor(b.shape)
        k_tiles = ceil_div(k_size, BLOCK_K)

        for s in cutlass.range_constexpr(STAGES - 1):
            if s < k_tiles:
                self.load_step(g2s, tid, a, a_coords, s_a, block_m, b, b_coords, s_b, block_n, Int32(s), Int32(s),
                               m, n, k_size)
            cute.arch.cp_async_commit_group()
        acc.fill(0.0)
        for kt in range(k_tiles):
            cute.arch.cp_async_wait_group(STAGES - 2)  # step kt has landed
            cute.arch.sync_threads()  # and every warp is done with step kt - 1, whose stage we refill now
            if kt + STAGES - 1 < k_tiles:
                self.load_step(g2s, tid, a, a_coords, s_a, block_m, b, b_coords, s_b, block_n, kt + STAGES - 1,
                               (kt + STAGES - 1) % STAGES, m, n, k_size)
            cute.arch.cp_async_commit_group()
            stage = kt % STAGES
            tensorcore.gemm_from_smem(mma, tid, acc, s_a[None, None, stage], s_b[None, None, stage], copy_a, copy_b)
        cute.arch.cp_async_wait_group(0)

    @cute.jit
    def load_step(self, g2s: cute.TiledCopy, tid: Int32, a: cute.Tensor, a_coords: cute.Tensor, s_a: cute.Tensor,
                  block_m: Int32, b: cute.Tensor, b_coords: cute.Tensor, s_b: cute.Tensor, block_n: Int32,
                  kt: Int32, stage: Int32, m: Int32, n: Int32, k_size: Int32):
        """K step ``kt`` of the A and B tiles into pipeline stage ``stage``."""
        tensorcore.load_tile(g2s, tid, cute.local_tile(a, (BLOCK_M, BLOCK_K), (block_m, kt)), s_a[None, None, stage],
                             cute.local_tile(a_coords, (BLOCK_M, BLOCK_K), (block_m, kt)), m, k_size)
        tensorcore.load_tile(g2s, tid, cute.local_tile(b, (BLOCK_N, BLOCK_K), (block_n, kt)), s_b[None, None, stage],
                             cute.local_tile(b_coords, (BLOCK_N, BLOCK_K), (block_n, kt)), n, k_size)


class HiddenGemm(TiledGemm):
    @cute.jit
    def __call__(self, u: cute.Tensor, w1: cute.Tensor, b1: cute.Tensor, hidden: cute.Tensor, act: Int32,
                 stream: cuda.CUstream):
        self.kernel(u, w1, b1, hidden, act, *self.launch_args()).launch(
            grid=self.grid(u.shape[0], w1.shape[0]), block=[CONVENTIONAL_TC_THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, u: cute.Tensor, w1: cute.Tensor, b1: cute.Tensor, hidden: cute.Tensor, act: Int32,
               a_layout: cute.ComposedLayout, b_layout: cute.ComposedLayout, g2s: cute.TiledCopy,
               mma: cute.TiledMma):
        tid, _, _ = cute.arch.thread_idx()
        block_m, block_n, _ = cute.arch.block_idx()
        thr_mma = mma.get_slice(tid)
        acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((BLOCK_M, BLOCK_N)), Float32)
        self.mainloop(u, w1, a_layout, b_layout, g2s, mma, tid, block_m, block_n, acc)
        coords = thr_mma.partition_C(cute.make_identity_tensor((BLOCK_M, BLOCK_N)))
        rows, units = hidden.shape
        row0, col0 = block_m * BLOCK_M, block_n * BLOCK_N
        for i in cutlass.range_constexpr(cute.size(acc)):
            acc[i] = acc[i] + b1[cutlass.min(col0 + coords[i][1], units - 1)]

        def store(i, v):
            r, c = coords[i]
            tensorcore.store_inside(hidden, row0 + r, col0 + c, rows, units, v.to(Float16))

        tensorcore.apply_activation(acc, act, store)


class OutputGemm(TiledGemm):
    @cute.jit
    def __call__(self, hidden: cute.Tensor, residual: cute.Tensor, w2: cute.Tensor, b2: cute.Tensor, y: cute.Tensor,
                 stream: cuda.CUstream):
        self.kernel(hidden, residual, w2, b2, y, *self.launch_args()).launch(
            grid=self.grid(hidden.shape[0], w2.shape[0]), block=[CONVENTIONAL_TC_THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, hidden: cute.Tensor, residual: cute.Tensor, w2: cute.Tensor, b2: cute.Tensor, y: cute.Tensor,
               a_layout: cute.ComposedLayout, b_layout: cute.ComposedLayout, g2s: cute.TiledCopy,
               mma: cute.TiledMma):
        tid, _, _ = cute.arch.thread_idx()
        block_m, block_n, _ = cute.arch.block_idx()
        thr_mma = mma.get_slice(tid)
        acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((BLOCK_M, BLOCK_N)), Float32)
        self.mainloop(hidden, w2, a_layout, b_layout, g2s, mma, tid, block_m, block_n, acc)
        coords = thr_mma.partition_C(cute.make_identity_tensor((BLOCK_M, BLOCK_N)))
        rows, channels = y.shape
        row0, col0 = block_m * BLOCK_M, block_n * BLOCK_N
        tensorcore.store_output(acc, coords, row0, col0, rows, channels, b2, residual, y, 2)  # 16-byte rows
