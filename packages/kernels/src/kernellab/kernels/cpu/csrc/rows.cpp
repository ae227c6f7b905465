// Softmax, RMSNorm and LayerNorm over rows. Each row is read from memory once; the later passes
// over it hit L1. So that the memory time of the next row overlaps the compute on this one
// instead of following it, the last pass over a row (which has no misses of its own) either
// prefetches the next row a line per vector (softmax, RMSNorm) or does the next row's first pass
// itself (LayerNorm, where that measured 15-20% faster than prefetching). Rows are split across
// threads only when there is enough work to repay the fork.
#include <cmath>
#include <limits>

#include "kernels.h"
#include "simd.h"

namespace kl {
namespace {

// Below this many elements one thread beats forking a team (~1 us). Measured on a 2-core EPYC
// with cold caches: two threads take 0.6x the time of one at 16K elements, 0.9-1.3x at 8K.
constexpr long kParallelMinElements = 1L << 14;

int row_threads(long rows, long n, int threads) {
    if (rows * n < kParallelMinElements) return 1;
    return static_cast<int>(std::min<long>(threads, rows));
}

// Calls row(r, more) for the rows this thread owns; `more` says whether it owns row r + 1 too.
template <class RowFn>
void for_rows(long rows, long n, int threads, RowFn&& row) {
    run_team(row_threads(rows, n, threads), [&](int t, int team) {
        long begin, end;
        split(rows, t, team, begin, end);
        for (long r = begin; r < end; ++r) row(r, r + 1 < end);
    });
}

// Asks for the cache line holding p when there is a next row to prefetch.
inline void prefetch_line(const float* p) {
    if (p) __builtin_prefetch(p);
}

// The pointer i elements into a row that may be absent.
inline const float* at(const float* row, long i) { return row ? row + i : nullptr; }

// One row: max (NaN-blind), exp(x - max) with its sum, then the scaling; next is the row after.
void softmax_row(const float* x, float* y, long n, const float* next) {
    const float ninf = -std::numeric_limits<float>::infinity();
    const long nv = n - n % VW;
    const long rem = n - nv;
    vf m0 = splat(ninf), m1 = m0, m2 = m0, m3 = m0;
    long i = 0;
    for (; i + 4 * VW <= nv; i += 4 * VW) {
        m0 = vmax(m0, loadu(x + i));
        m1 = vmax(m1, loadu(x + i + VW));
        m2 = vmax(m2, loadu(x + i + 2 * VW));
        m3 = vmax(m3, loadu(x + i + 3 * VW));
    }
    for (; i < nv; i += VW) m0 = vmax(m0, loadu(x + i));
    if (rem) m0 = vmax(m0, load_part(x + nv, rem, ninf));
    const vf mx = splat(hmax(vmax(vmax(m0, m1), vmax(m2, m3))));

    // A row of -inf (mx = -inf) or with +inf (mx = +inf) gives NaN here, as torch does; NaN
    // elements never win the max but make the sum NaN, so the whole row becomes NaN.
    vf s0 = vf{}, s1 = vf{};
    for (i = 0; i + 2 * VW <= nv; i += 2 * VW) {  // two independent exps in flight
        prefetch_line(at(next, i));
        prefetch_line(at(next, i + VW));
        vf e0 = exp_nonpositive(loadu(x + i) - mx);
        vf e1 = exp_nonpositive(loadu(x + i + VW) - mx);
        storeu(y + i, e0);
        storeu(y + i + VW, e1);
        s0 += e0;
        s1 += e1;
    }
    for (; i < nv; i += VW) {
        vf e = exp_nonpositive(loadu(x + i) - mx);
        storeu(y + i, e);
        s0 += e;
    }
    vf s = s0 + s1;
    float total = hsum(s);
    if (rem) {
        vf e = exp_nonpositive(load_part(x + nv, rem, 0.0f) - mx);
        store_part(y + nv, e, rem);
        for (long j = 0; j < rem; ++j) total += e[j];
    }
    const vf inv = splat(1.0f / total);
    for (i = 0; i < nv; i += VW) storeu(y + i, loadu(y + i) * inv);
    if (rem) store_part(y + nv, load_part(y + nv, rem, 0.0f) * inv, rem);
}

// Sum of squares of a row, four accumulators wide to hide the add latency.
float sum_squares(const float* h, long n) {
    const long nv = n - n % VW;
    vf a0 = vf{}, a1 = vf{}, a2 = vf{}, a3 = vf{};
    long i = 0;
    for (; i + 4 * VW <= nv; i += 4 * VW) {
        vf v0 = loadu(h + i), v1 = loadu(h + i + VW), v2 = loadu(h + i + 2 * VW), v3 = loadu(h + i + 3 * VW);
        a0 += v0 * v0;
        a1 += v1 * v1;
        a2 += v2 * v2;
        a3 += v3 * v3;
    }
    for (; i < nv; i += VW) {
        vf v = loadu(h + i);
        a0 += v * v;
    }
    float s = hsum((a0 + a1) + (a2 + a3));
    for (; i < n; ++i) s += h[i] * h[i];
    return s;
}

// Sum of (x - pivot) over a row, accumulated in exactly the order of the fused loop in
// layernorm_row_out, so that a row's result does not depend on which thread's first row it is.
float sum_dev(const float* x, long n, float pivot) {
    const long nv = n - n % VW;
    const vf vp = splat(pivot);
    vf acc = vf{};
    long i = 0;
    for (; i < nv; i += VW) acc += loadu(x + i) - vp;
    float s = hsum(acc);
    for (; i < n; ++i) s += x[i] - pivot;
    return s;
}

// Sum of ((x - pivot) - shift)^2 over a row.
float sum_sq_dev(const float* x, long n, float pivot, float shift) {
    const long nv = n - n % VW;
    const vf vp = splat(pivot), vs = splat(shift);
    vf a0 = vf{}, a1 = vf{}, a2 = vf{}, a3 = vf{};
    long i = 0;
    for (; i + 4 * VW <= nv; i += 4 * VW) {
        vf v0 = (loadu(x + i) - vp) - vs, v1 = (loadu(x + i + VW) - vp) - vs;
        vf v2 = (loadu(x + i + 2 * VW) - vp) - vs, v3 = (loadu(x + i + 3 * VW) - vp) - vs;
        a0 += v0 * v0;
        a1 += v1 * v1;
        a2 += v2 * v2;
        a3 += v3 * v3;
    }
    for (; i < nv; i += VW) {
        vf v = (loadu(x + i) - vp) - vs;
        a0 += v * v;
    }
    float s = hsum((a0 + a1) + (a2 + a3));
    for (; i < n; ++i) s += ((x[i] - pivot) - shift) * ((x[i] - pivot) - shift);
    return s;
}

// LayerNorm's output pass for one row, y = ((x - pivot) - shift) * rstd [* w] [+ b], fused with the
// first pass of the next row: returns the sum of (next - next_pivot). Software pipelining of
// this kind keeps a stream of loads from memory in the same loop as the arithmetic and stores.
template <bool HasW, bool HasB>
float layernorm_row_out(const float* x, float pivot, float shift, float rstd, const float* w, const float* b,
                        float* y, long n, const float* next, float next_pivot) {
    const long nv = n - n % VW;
    const vf vp = splat(pivot), vs = splat(shift), vk = splat(rstd), vq = splat(next_pivot);
    vf acc = vf{};
    long i = 0;
    for (; i < nv; i += VW) {
        acc += loadu(next + i) - vq;
        vf v = ((loadu(x + i) - vp) - vs) * vk;
        if constexpr (HasW) v = v * loadu(w + i);
        if constexpr (HasB) v = v + loadu(b + i);
        storeu(y + i, v);
    }
    float s = hsum(acc);
    for (; i < n; ++i) {
        s += next[i] - next_pivot;
        float v = ((x[i] - pivot) - shift) * rstd;
        if constexpr (HasW) v = v * w[i];
        if constexpr (HasB) v = v + b[i];
        y[i] = v;
    }
    return s;
}

float layernorm_row_out(const float* x, float pivot, float shift, float rstd, const float* w, const float* b,
                        float* y, long n, const float* next, float next_pivot) {
    if (w && b) return layernorm_row_out<true, true>(x, pivot, shift, rstd, w, b, y, n, next, next_pivot);
    if (w) return layernorm_row_out<true, false>(x, pivot, shift, rstd, w, b, y, n, next, next_pivot);
    if (b) return layernorm_row_out<false, true>(x, pivot, shift, rstd, w, b, y, n, next, next_pivot);
    return layernorm_row_out<false, false>(x, pivot, shift, rstd, w, b, y, n, next, next_pivot);
}

// RMSNorm's output pass, y = src * scale [* w]; y may be src itself. next and next2 (optional)
// are the following rows of the inputs, prefetched on the way.
template <bool HasW>
void scale_row(const float* src, float scale, const float* w, float* y, long n, const float* next,
               const float* next2) {
    const long nv = n - n % VW;
    const vf vk = splat(scale);
    long i = 0;
    for (; i < nv; i += VW) {
        prefetch_line(at(next, i));
        prefetch_line(at(next2, i));
        vf v = loadu(src + i) * vk;
        if constexpr (HasW) v = v * loadu(w + i);
        storeu(y + i, v);
    }
    for (; i < n; ++i) y[i] = HasW ? src[i] * scale * w[i] : src[i] * scale;
}

// h = x + r, written out; the caller then reads h back from L1.
void add_rows(const float* x, const float* r, float* h, long n) {
    const long nv = n - n % VW;
    long i = 0;
    for (; i < nv; i += VW) storeu(h + i, loadu(x + i) + loadu(r + i));
    for (; i < n; ++i) h[i] = x[i] + r[i];
}

}  // namespace

void softmax(const float* x, long ldx, float* y, long ldy, long rows, long n, int threads) {
    for_rows(rows, n, threads, [&](long r, bool more) {
        softmax_row(x + r * ldx, y + r * ldy, n, more ? x + (r + 1) * ldx : nullptr);
    });
}

void rmsnorm(const float* x, long ldx, const float* residual, long ldr, const float* weight, float* y, long ldy,
             float* h, long ldh, long rows, long n, double eps, int threads) {
    for_rows(rows, n, threads, [&](long r, bool more) {
        const float* src = x + r * ldx;
        if (residual) {
            float* hr = h + r * ldh;
            add_rows(src, residual + r * ldr, hr, n);
            src = hr;
        }
        // The row scalar in double: free at one per row, and it keeps eps exact.
        const double ms = static_cast<double>(sum_squares(src, n)) / static_cast<double>(n);
        const float rstd = static_cast<float>(1.0 / std::sqrt(ms + eps));
        const float* next = more ? x + (r + 1) * ldx : nullptr;
        const float* next_residual = more && residual ? residual + (r + 1) * ldr : nullptr;
        if (weight)
            scale_row<true>(src, rstd, weight, y + r * ldy, n, next, next_residual);
        else
            scale_row<false>(src, rstd, weight, y + r * ldy, n, next, next_residual);
    });
}

void layernorm(const float* x, long ldx, const float* weight, const float* bias, float* y, long ldy, long rows,
               long n, double eps, int threads) {
    run_team(row_threads(rows, n, threads), [&](int t, int team) {
        long begin, end;
        split(rows, t, team, begin, end);
        if (begin >= end) return;
        // Each row is centred on its first element, then on the mean of what is left: x - pivot
        // is exact for values within a factor of two of each other, so a large common offset
        // costs no precision (fp32 cannot even represent mean(x) closely enough to subtract it
        // directly). The variance is a second pass over squared deviations, never
        // E[x^2] - E[x]^2. The first pass of row r + 1 runs inside the output pass of row r.
        float pivot = x[begin * ldx];
        float sum = sum_dev(x + begin * ldx, n, pivot);
        for (long r = begin; r < end; ++r) {
            const float* src = x + r * ldx;
            // The last row "pipelines" into itself, an L1 re-read whose sum is dropped.
            const float* next = r + 1 < end ? src + ldx : src;
            const float next_pivot = next[0];
            const float shift = static_cast<float>(static_cast<double>(sum) / static_cast<double>(n));
            const double var = static_cast<double>(sum_sq_dev(src, n, pivot, shift)) / static_cast<double>(n);
            const float rstd = static_cast<float>(1.0 / std::sqrt(var + eps));
            sum = layernorm_row_out(src, pivot, shift, rstd, weight, bias, y + r * ldy, n, next, next_pivot);
            pivot = next_pivot;
        }
    });
}

}  // namespace kl
