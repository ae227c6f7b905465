// fp32 GEMM for the linear layer: C (m, n) = A (m, k) B (k, n) [+ bias]. Operands are described
// by (row, column) strides and the packing routines read whichever layout they have, so the
// caller never materializes W^T or dy^T.
//
// Blocking: k is cut into blocks of KC. Per block, A is packed into MR-row panels (k-major, MR
// values per k) and B into NR-column panels (k-major, NR values per k), zero-padded at the edges;
// transposing packs go through VW x VW register transposes, the others sweep the source rows in
// memory order. The microkernel keeps an MR x NR tile of C in registers (8 x 32 with AVX-512: 16
// zmm accumulators) and per k does NR/VW aligned loads of B, MR broadcasts of A and MR*NR/VW
// FMAs; on the 2-core EPYC it was tuned on, 12 x 32, 14 x 32, 8 x 48 and KC = 256 measured no
// better. Threads split the B panels, then the C tiles in B-panel-major order, so a thread
// computes with the B panels it packed itself while sweeping every A panel, which stays in L2.
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

#include <unistd.h>

#include "kernels.h"
#include "simd.h"

namespace kl {
namespace {

constexpr int NR = 2 * VW;
// 16 accumulators fill half the 32 AVX-512 registers; with 16 registers (AVX2, SSE) 12 is the most
// that leaves room for the B vectors and the broadcast.
constexpr int MR = VW == 16 ? 8 : 6;
// k blocks of KC, or of KC_LONG where every A panel and one B panel of that depth (what the microkernel
// sweeps for one column of tiles) fit in half of L2: one pass over C instead of two. A function of the
// shape alone, so that the result stays the same bitwise for any thread count. Measured on the 2-core
// Xeon (2 MiB L2; A/B against KC alone, 2 rounds x 15, every cpu-ops linear shape): forward 128x1024x256
// 1.21x [1.14, 1.29]; linear_backward 128x256x1024 0.90x [0.86, 0.95] (its dx product, where one thread
// packs all of B); every other shape not significant.
constexpr long KC = 512;
constexpr long KC_LONG = 1024;
// Below this many multiply-adds a second thread costs more than it saves (measured on a 2-core
// EPYC with cold caches: no gain at 64x128x128, 0.7-0.9x at 64x256x256).
constexpr long kParallelMinMacs = 1L << 20;

long ceil_div(long a, long b) { return (a + b - 1) / b; }

// This core's L2 in bytes (glibc's sysconf), 1 MiB where the system does not say.
long l2_bytes() {
    static const long bytes = [] {
        const long v = sysconf(_SC_LEVEL2_CACHE_SIZE);
        return v > 0 ? v : 1L << 20;
    }();
    return bytes;
}

// Grow-only, 64-byte aligned scratch per calling thread: no allocation (and no page faults) in the
// steady state, and concurrent callers (the GIL is released) never share one.
float* scratch(long floats) {
    struct Buffer {
        float* data = nullptr;
        long size = 0;
        ~Buffer() { std::free(data); }
    };
    thread_local Buffer buf;
    if (buf.size < floats) {
        std::free(buf.data);
        buf.data = static_cast<float*>(std::aligned_alloc(64, ceil_div(floats * sizeof(float), 64) * 64));
        if (!buf.data) {
            buf.size = 0;
            throw std::bad_alloc();
        }
        buf.size = floats;
    }
    return buf.data;
}

struct Operand {
    const float* p;
    long s0, s1;  // strides of the (row, column) index in elements
};

// One A panel: dst[p * MR + i] = A(i, p) for i < mr, p < kc, rows mr..MR-1 zero; `a` points at
// A(0, 0) of the panel. Rows contiguous in k (x, dy) are transposed VW x VW blocks at a time.
void pack_a(const float* a, long si, long sk, int mr, long kc, float* dst) {
    long p = 0;
    if constexpr (MR <= VW) {
        for (; sk == 1 && p + VW <= kc; p += VW) {
            vf r[VW];
            for (int i = 0; i < VW; ++i) r[i] = i < mr ? loadu(a + i * si + p) : vf{};
            transpose(r);
            for (int u = 0; u < VW; ++u) std::memcpy(dst + (p + u) * MR, &r[u], MR * sizeof(float));
        }
    }
    for (; p < kc; ++p)
        for (int i = 0; i < MR; ++i) dst[p * MR + i] = i < mr ? a[i * si + p * sk] : 0.0f;
}

// One B panel: dst[p * NR + j] = B(p, j) for j < nr, p < kc, columns nr..NR-1 zero; `b` points at
// B(0, 0) of the panel. Columns contiguous in k (W^T in the forward) are transposed VW x VW
// blocks at a time.
void pack_b(const float* b, long sk, long sj, int nr, long kc, float* dst) {
    long p = 0;
    for (; sk == 1 && p + VW <= kc; p += VW) {
        for (int j0 = 0; j0 < NR; j0 += VW) {
            vf r[VW];
            for (int j = 0; j < VW; ++j) r[j] = j0 + j < nr ? loadu(b + (j0 + j) * sj + p) : vf{};
            transpose(r);
            for (int u = 0; u < VW; ++u) storeu(dst + (p + u) * NR + j0, r[u]);
        }
    }
    for (; p < kc; ++p)
        for (int j = 0; j < NR; ++j) dst[p * NR + j] = j < nr ? b[j * sj + p * sk] : 0.0f;
}

// Copies the `len` values at src into dst and zero-fills dst up to `width`.
void copy_padded(const float* src, long len, float* dst, int width) {
    long j = 0;
    for (; j + VW <= len; j += VW) storeu(dst + j, loadu(src + j));
    for (; j < len; ++j) dst[j] = src[j];
    for (; j < width; ++j) dst[j] = 0.0f;
}

// A's panels [ib0, ib1) for the k block [p0, p0 + kc), panel ib at ap + ib * MR * kc. When A's
// columns are contiguous (dy^T) the rows of the source are swept once, in order, scattering MR
// wide pieces into the panels: walking one panel down a 2 KB-strided column instead would defeat
// the prefetchers. sums (optional, length m): row sums of A, set in the first k block and added
// to in later ones; that sweep is where db is computed.
void pack_a_panels(Operand a, long m, long p0, long kc, long ib0, long ib1, float* ap, float* sums) {
    const long i_end = std::min(m, ib1 * MR);
    if (a.s0 == 1 && a.s1 != 1) {
        if (sums && p0 == 0)
            for (long i = ib0 * MR; i < i_end; ++i) sums[i] = 0.0f;
        for (long p = 0; p < kc; ++p) {
            const float* col = a.p + (p0 + p) * a.s1;
            for (long ib = ib0; ib < ib1; ++ib)
                copy_padded(col + ib * MR, std::min<long>(MR, m - ib * MR), ap + (ib * kc + p) * MR, MR);
            if (sums)
                for (long i = ib0 * MR; i < i_end; ++i) sums[i] += col[i];
        }
        return;
    }
    for (long ib = ib0; ib < ib1; ++ib) {
        const int mr = static_cast<int>(std::min<long>(MR, m - ib * MR));
        float* dst = ap + ib * MR * kc;
        pack_a(a.p + ib * MR * a.s0 + p0 * a.s1, a.s0, a.s1, mr, kc, dst);
        if (sums) {
            for (int i = 0; i < mr; ++i) {
                float s = p0 > 0 ? sums[ib * MR + i] : 0.0f;
                for (long p = 0; p < kc; ++p) s += dst[p * MR + i];
                sums[ib * MR + i] = s;
            }
        }
    }
}

// B's panels [jb0, jb1) for the k block [p0, p0 + kc), panel jb at bp + jb * NR * kc. Rows of B
// contiguous (W in dx, x in dW): one in-order sweep over the rows, as for A above.
void pack_b_panels(Operand b, long n, long p0, long kc, long jb0, long jb1, float* bp) {
    if (b.s1 == 1) {
        for (long p = 0; p < kc; ++p) {
            const float* row = b.p + (p0 + p) * b.s0;
            for (long jb = jb0; jb < jb1; ++jb)
                copy_padded(row + jb * NR, std::min<long>(NR, n - jb * NR), bp + (jb * kc + p) * NR, NR);
        }
        return;
    }
    for (long jb = jb0; jb < jb1; ++jb)
        pack_b(b.p + p0 * b.s0 + jb * NR * b.s1, b.s0, b.s1, static_cast<int>(std::min<long>(NR, n - jb * NR)), kc,
               bp + jb * NR * kc);
}

enum class Init { Zero, Bias, Accumulate };

// C tile (mr x nr at c, row stride ldc) = [0 | bias | C] + Ap-panel . Bp-panel over kc. stream: a
// full tile goes out with streaming stores (the caller checked the alignment and fences).
void microkernel(long kc, const float* __restrict ap, const float* __restrict bp, float* c, long ldc, int mr,
                 int nr, Init init, const float* bias, bool stream) {
    constexpr int NV = NR / VW;
    const bool full = mr == MR && nr == NR;
    alignas(64) float edge[MR * NR];  // staging for partial tiles at the matrix edges
    float* out = c;
    long ldo = ldc;
    if (!full) {
        out = edge;
        ldo = NR;
        if (init == Init::Accumulate)
            for (int i = 0; i < mr; ++i)
                for (int j = 0; j < nr; ++j) edge[i * NR + j] = c[i * ldc + j];
    }
    vf acc[MR][NV];
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
            if (init == Init::Zero) acc[i][v] = vf{};
            else if (init == Init::Bias) acc[i][v] = loadu(bias + v * VW);
            else acc[i][v] = loadu(out + i * ldo + v * VW);
        }
#pragma GCC unroll 4
    for (long p = 0; p < kc; ++p) {
        vf b[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) b[v] = *reinterpret_cast<const vf*>(bp + p * NR + v * VW);
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i) {
            const vf a = bcast(ap + p * MR + i);
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) acc[i][v] += a * b[v];
        }
    }
    if (full && stream) {
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) kl::stream(out + i * ldo + v * VW, acc[i][v]);
        return;
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) storeu(out + i * ldo + v * VW, acc[i][v]);
    if (!full)
        for (int i = 0; i < mr; ++i)
            for (int j = 0; j < nr; ++j) c[i * ldc + j] = edge[i * NR + j];
}

// C (m, n) = A (m, k) B (k, n) [+ bias (n)], every element of C overwritten. a_row_sums (optional,
// length m) receives the sums of A's rows, computed while packing A. stream_c: C's final values go
// out with streaming stores where C is aligned for them, sparing the read of each line that a
// plain store first makes; for an output that a later op, not the next one, reads (dW).
void gemm(long m, long n, long k, Operand a, Operand b, float* c, long ldc, const float* bias, float* a_row_sums,
          int threads, bool stream_c = false) {
    const long tiles_m = ceil_div(m, MR), tiles_n = ceil_div(n, NR), tiles = tiles_m * tiles_n;
    const long macs = m * n * k;
    int team = threads;
    if (macs < kParallelMinMacs) team = 1;
    team = static_cast<int>(std::min<long>(team, tiles));
    const long sweep_bytes = KC_LONG * static_cast<long>(sizeof(float)) * (tiles_m * MR + NR);
    const long kc_block = 2 * sweep_bytes <= l2_bytes() ? KC_LONG : KC;
    const long kc_max = std::min(k, kc_block);
    // Both panels start 64-byte aligned: the microkernel reads B with aligned vector loads.
    const long a_size = ceil_div(tiles_m * MR * kc_max, 16) * 16, b_size = tiles_n * NR * kc_max;
    float* ws = scratch(a_size + b_size + tiles_n * NR);
    float* ap = ws;
    float* bp = ws + a_size;
    float* bias_pad = bias ? bp + b_size : nullptr;  // the bias padded to whole NR panels
    if (bias) {
        for (long j = 0; j < tiles_n * NR; ++j) bias_pad[j] = j < n ? bias[j] : 0.0f;
    }
    // Full tiles start on whole NR columns, so C's base and row stride decide every tile's alignment.
    const bool stream = stream_c && stream_aligned(c) && ldc % VW == 0;

    run_team(team, [&](int t, int nt) {
        long begin, end;
        for (long p0 = 0; p0 < k; p0 += kc_block) {
            const long kc = std::min(kc_block, k - p0);
            split(tiles_n, t, nt, begin, end);
            pack_b_panels(b, n, p0, kc, begin, end, bp);
            split(tiles_m, t, nt, begin, end);
            pack_a_panels(a, m, p0, kc, begin, end, ap, a_row_sums);
            // Barriers only in a team of their own: a team of one may run inside another team's
            // parallel region (linear_backward's two products), whose threads would meet them.
            if (nt > 1) {
#pragma omp barrier
            }
            const Init init = p0 > 0 ? Init::Accumulate : (bias ? Init::Bias : Init::Zero);
            const bool last = p0 + kc_block >= k;
            split(tiles, t, nt, begin, end);
            for (long tile = begin; tile < end; ++tile) {
                const long jb = tile / tiles_m, ib = tile % tiles_m;
                const long i0 = ib * MR, j0 = jb * NR;
                microkernel(kc, ap + ib * MR * kc, bp + jb * NR * kc, c + i0 * ldc + j0, ldc,
                            static_cast<int>(std::min<long>(MR, m - i0)), static_cast<int>(std::min<long>(NR, n - j0)),
                            init, bias ? bias_pad + j0 : nullptr, stream && last);
            }
            if (stream && last) fence_streams();
            if (nt > 1 && p0 + kc_block < k) {
#pragma omp barrier
            }
        }
    });
}


// ---- skinny products: few rows of x (decode) ----------------------------------------------------------
// With few rows of x the GEMM's packing of W costs as much as the product itself, which is bound by
// reading W once (forward) or reading W and writing dW once (backward). These loops stream W in
// place, each W vector loaded once and used for every row of x. The row limits: up to them these
// loops beat the GEMM on the development Xeon (forward at 8 rows 35 us). Backward, measured with one
// thread over rotated inputs once both paths streamed dW: at 9-16 rows of a 512x512 W the GEMM took
// 0.5-0.85x the loops' time; at 8 rows the loops won for a 2048x2048 W (5.9 ms against 7.7 ms, the
// GEMM packing 16 MB of W) and lost by 0.8x for a 512x512 one.
constexpr long kSkinnyForwardRows = 8;
constexpr long kSkinnyBackwardRows = 8;
// A second thread repays its fork once W holds this many elements (128 KiB).
constexpr long kSkinnyParallelMin = 1L << 15;

// y(i, r) = x_i . w_r [+ bias_r] for MB rows of x and RB rows of w, over k.
template <int MB, int RB>
void dot_tile(const float* x, long ldx, const float* w, long ldw, long k, const float* bias, float* y, long ldy) {
    vf acc[MB][RB];
    for (int i = 0; i < MB; ++i)
        for (int r = 0; r < RB; ++r) acc[i][r] = vf{};
    const long kv = k - k % VW;
    for (long p = 0; p < kv; p += VW) {
        vf wv[RB];
        for (int r = 0; r < RB; ++r) wv[r] = loadu(w + r * ldw + p);
        for (int i = 0; i < MB; ++i) {
            const vf xv = loadu(x + i * ldx + p);
            for (int r = 0; r < RB; ++r) acc[i][r] += xv * wv[r];
        }
    }
    if (kv < k) {
        vf wv[RB];
        for (int r = 0; r < RB; ++r) wv[r] = load_part(w + r * ldw + kv, k - kv, 0.0f);
        for (int i = 0; i < MB; ++i) {
            const vf xv = load_part(x + i * ldx + kv, k - kv, 0.0f);
            for (int r = 0; r < RB; ++r) acc[i][r] += xv * wv[r];
        }
    }
    for (int i = 0; i < MB; ++i)
        for (int r = 0; r < RB; ++r) y[i * ldy + r] = hsum(acc[i][r]) + (bias ? bias[r] : 0.0f);
}

template <int RB>
void dot_rows(const float* x, long ldx, long m, const float* w, long ldw, long k, const float* bias, float* y,
              long ldy) {
    for (long i = 0; i < m; i += 4) {
        const float* xi = x + i * ldx;
        float* yi = y + i * ldy;
        switch (std::min<long>(4, m - i)) {
            case 1: dot_tile<1, RB>(xi, ldx, w, ldw, k, bias, yi, ldy); break;
            case 2: dot_tile<2, RB>(xi, ldx, w, ldw, k, bias, yi, ldy); break;
            case 3: dot_tile<3, RB>(xi, ldx, w, ldw, k, bias, yi, ldy); break;
            default: dot_tile<4, RB>(xi, ldx, w, ldw, k, bias, yi, ldy); break;
        }
    }
}

// y (m, n) = x (m, k) w (n, k)^T + bias; threads split the rows of w in groups of four.
void skinny_forward(const float* x, long ldx, const float* w, long ldw, const float* bias, float* y, long ldy, long m,
                    long k, long n, int threads) {
    const long groups = ceil_div(n, 4);
    const int team = n * k < kSkinnyParallelMin ? 1 : static_cast<int>(std::min<long>(threads, groups));
    run_team(team, [&](int t, int nt) {
        long g0, g1;
        split(groups, t, nt, g0, g1);
        for (long g = g0; g < g1; ++g) {
            const long j = 4 * g;
            if (j + 4 <= n) {
                dot_rows<4>(x, ldx, m, w + j * ldw, ldw, k, bias ? bias + j : nullptr, y + j, ldy);
            } else {
                for (long r = j; r < n; ++r)
                    dot_rows<1>(x, ldx, m, w + r * ldw, ldw, k, bias ? bias + r : nullptr, y + r, ldy);
            }
        }
    });
}

// For RB rows j.. of w and the columns [p0, p1): dx_i += sum_r dy(i, j + r) w_{j+r} and
// dw_{j+r} = sum_i dy(i, j + r) x_i. coef[i * 4 + r] holds dy(i, j + r) splatted.
template <int RB, bool Stream>
void outer_rows(const float* x, long ldx, long m, const float* w, long ldw, const vf* coef, float* dx, long lddx,
                float* dw, long lddw, long p0, long p1) {
    long p = p0;
    for (; p + VW <= p1; p += VW) {
        vf wv[RB], acc[RB];
        for (int r = 0; r < RB; ++r) {
            wv[r] = loadu(w + r * ldw + p);
            acc[r] = vf{};
        }
        for (long i = 0; i < m; ++i) {
            const vf xv = loadu(x + i * ldx + p);
            vf d = loadu(dx + i * lddx + p);
            for (int r = 0; r < RB; ++r) {
                const vf c = coef[i * 4 + r];
                d += c * wv[r];
                acc[r] += c * xv;
            }
            storeu(dx + i * lddx + p, d);
        }
        for (int r = 0; r < RB; ++r) {
            if constexpr (Stream) stream(dw + r * lddw + p, acc[r]);
            else storeu(dw + r * lddw + p, acc[r]);
        }
    }
    for (; p < p1; ++p) {
        float acc[RB] = {};
        for (long i = 0; i < m; ++i) {
            float d = dx[i * lddx + p];
            for (int r = 0; r < RB; ++r) {
                const float c = coef[i * 4 + r][0];
                d += c * w[r * ldw + p];
                acc[r] += c * x[i * ldx + p];
            }
            dx[i * lddx + p] = d;
        }
        for (int r = 0; r < RB; ++r) dw[r * lddw + p] = acc[r];
    }
}

// dx = dy w, dw = dy^T x, db = column sums of dy for m <= kSkinnyBackwardRows. Threads split the k columns
// (whole vectors each), so that each owns its slices of dx and dw and nothing is reduced across
// threads; a thread sweeps its columns in blocks small enough for its dx slice to stay in L1.
void skinny_backward(const float* x, long ldx, const float* w, long ldw, const float* dy, long lddy, float* dx,
                     long lddx, float* dw, long lddw, float* db, long m, long k, long n, int threads) {
    constexpr long kBlock = 512;
    const long vectors = ceil_div(k, VW);
    // dW is written once, from registers, and read by a later op: streaming stores spare the read
    // of each of its lines, a third of the traffic where m is small. Every thread's columns start on a
    // whole vector, so one alignment check covers all of them.
    const bool stream_dw = stream_aligned(dw) && lddw % VW == 0;
    auto rows_of_w = [&](auto rb, long j, const vf* coef, long b0, long b1) {
        constexpr int RB = decltype(rb)::value;
        if (stream_dw)
            outer_rows<RB, true>(x, ldx, m, w + j * ldw, ldw, coef, dx, lddx, dw + j * lddw, lddw, b0, b1);
        else
            outer_rows<RB, false>(x, ldx, m, w + j * ldw, ldw, coef, dx, lddx, dw + j * lddw, lddw, b0, b1);
    };
    const int team = n * k < kSkinnyParallelMin ? 1 : static_cast<int>(std::min<long>(threads, vectors));
    run_team(team, [&](int t, int nt) {
        long v0, v1;
        split(vectors, t, nt, v0, v1);
        const long c0 = v0 * VW, c1 = std::min(k, v1 * VW);
        alignas(64) vf coef[kSkinnyBackwardRows * 4];
        for (long b0 = c0; b0 < c1; b0 += kBlock) {
            const long b1 = std::min(c1, b0 + kBlock);
            for (long i = 0; i < m; ++i) std::memset(dx + i * lddx + b0, 0, (b1 - b0) * sizeof(float));
            for (long j = 0; j < n; j += 4) {
                const int rb = static_cast<int>(std::min<long>(4, n - j));
                for (long i = 0; i < m; ++i)
                    for (int r = 0; r < 4; ++r) coef[i * 4 + r] = splat(r < rb ? dy[i * lddy + j + r] : 0.0f);
                if (rb == 4) {
                    rows_of_w(std::integral_constant<int, 4>{}, j, coef, b0, b1);
                } else {
                    for (int r = 0; r < rb; ++r) {
                        for (long i = 0; i < m; ++i) coef[i * 4] = splat(dy[i * lddy + j + r]);
                        rows_of_w(std::integral_constant<int, 1>{}, j + r, coef, b0, b1);
                    }
                }
            }
        }
        if (stream_dw) fence_streams();
        if (t == 0) {
            for (long j = 0; j < n; ++j) {
                float s = 0.0f;
                for (long i = 0; i < m; ++i) s += dy[i * lddy + j];
                db[j] = s;
            }
        }
    });
}

}  // namespace

void linear_forward(const float* x, long ldx, const float* w, long ldw, const float* bias, float* y, long ldy,
                    long m, long k, long n, int threads) {
    if (m <= kSkinnyForwardRows) {
        skinny_forward(x, ldx, w, ldw, bias, y, ldy, m, k, n, threads);
        return;
    }
    // A = x (m, k); B = W^T, B(p, j) = w[j * ldw + p].
    gemm(m, n, k, {x, ldx, 1}, {w, 1, ldw}, y, ldy, bias, nullptr, threads);
}

void linear_backward(const float* x, long ldx, const float* w, long ldw, const float* dy, long lddy, float* dx,
                     long lddx, float* dw, long lddw, float* db, long m, long k, long n, int threads) {
    if (m <= kSkinnyBackwardRows) {
        skinny_backward(x, ldx, w, ldw, dy, lddy, dx, lddx, dw, lddw, db, m, k, n, threads);
        return;
    }
    // dx (m, k) = dy (m, n) W (n, k).
    auto dx_gemm = [&](int team) { gemm(m, k, n, {dy, lddy, 1}, {w, ldw, 1}, dx, lddx, nullptr, nullptr, team); };
    // dW (n, k) = dy^T (n, m) x (m, k); A(i, p) = dy[p * lddy + i], whose row sums are db.
    auto dw_gemm = [&](int team) { gemm(n, k, m, {dy, 1, lddy}, {x, ldx, 1}, dw, lddw, nullptr, db, team, true); };
    // The two products have the same multiply-adds (m n k). With two threads each takes one, packing
    // its own operands into its own scratch: one fork and join instead of two, no barriers between
    // packing and computing, no panel shared across cores, and each core's L2 holds its own panels.
    if (threads == 2 && m * n * k >= kParallelMinMacs) {
        run_team(2, [&](int t, int) { t == 0 ? dx_gemm(1) : dw_gemm(1); });
        return;
    }
    dx_gemm(threads);
    dw_gemm(threads);
}

}  // namespace kl
