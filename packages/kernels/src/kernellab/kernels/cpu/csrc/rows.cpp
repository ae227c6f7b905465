// Softmax, RMSNorm and LayerNorm over rows. Each row is read from memory once; the later passes
// over it hit L1. So that the memory time of the next row overlaps the compute on this one
// instead of following it, the last pass over a row (which has no misses of its own) either
// prefetches the next row a line per vector (softmax, RMSNorm), or (LayerNorm) one loop runs all
// passes at once over consecutive rows while prefetching rows ahead, outputs included. Rows are
// split across threads only when there is enough work to repay the fork.
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

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

// Long rows are summed in blocks: fp32 vector partial sums within a block of kSumBlock elements,
// the blocks' totals added in double, so that rounding grows with the block's length rather than the
// row's (a 4M-element row summed in fp32 alone drifts by ~1e-5 relative; torch's blocked sum by ~5e-7).
constexpr long kSumBlock = 4096;  // a multiple of 4 * VW

// Whether `done` elements (a multiple of 4 * VW) end a summation block.
inline bool block_ends(long done) { return done % kSumBlock == 0; }

// Sum of squares of a row, four accumulators wide to hide the add latency.
double sum_squares(const float* h, long n) {
    const long nv = n - n % VW;
    vf a0 = vf{}, a1 = vf{}, a2 = vf{}, a3 = vf{};
    double blocks = 0.0;
    long i = 0;
    for (; i + 4 * VW <= nv; i += 4 * VW) {
        vf v0 = loadu(h + i), v1 = loadu(h + i + VW), v2 = loadu(h + i + 2 * VW), v3 = loadu(h + i + 3 * VW);
        a0 += v0 * v0;
        a1 += v1 * v1;
        a2 += v2 * v2;
        a3 += v3 * v3;
        if (block_ends(i + 4 * VW)) {
            blocks += hsum((a0 + a1) + (a2 + a3));
            a0 = a1 = a2 = a3 = vf{};
        }
    }
    for (; i < nv; i += VW) {
        vf v = loadu(h + i);
        a0 += v * v;
    }
    double s = blocks + hsum((a0 + a1) + (a2 + a3));
    for (; i < n; ++i) s += h[i] * h[i];
    return s;
}

// Horizontal sum in log2(VW) dependent adds rather than VW: it ends each row's chain of sums.
template <int W = VW, int... K>
inline float hsum_pairwise(vf v, std::integer_sequence<int, K...> lanes) {
    if constexpr (W == 1)
        return v[0];
    else
        return hsum_pairwise<W / 2>(v + __builtin_shufflevector(v, v, ((K + W / 2) % VW)...), lanes);
}

// Sum of (x - pivot) over a row, accumulated in exactly the order of the fused loop in
// layernorm_stages, so that a row's result does not depend on which thread's first rows it is in.
double sum_dev(const float* x, long n, float pivot) {
    constexpr auto lanes = std::make_integer_sequence<int, VW>{};
    const long nv = n - n % VW;
    const vf vp = splat(pivot);
    vf a0 = vf{}, a1 = vf{}, a2 = vf{}, a3 = vf{};
    double blocks = 0.0;
    long i = 0;
    for (; i + 4 * VW <= nv; i += 4 * VW) {
        a0 += loadu(x + i) - vp;
        a1 += loadu(x + i + VW) - vp;
        a2 += loadu(x + i + 2 * VW) - vp;
        a3 += loadu(x + i + 3 * VW) - vp;
        if (block_ends(i + 4 * VW)) {
            blocks += hsum_pairwise((a0 + a1) + (a2 + a3), lanes);
            a0 = a1 = a2 = a3 = vf{};
        }
    }
    for (; i < nv; i += VW) a0 += loadu(x + i) - vp;
    double s = blocks + hsum_pairwise((a0 + a1) + (a2 + a3), lanes);
    for (; i < n; ++i) s += x[i] - pivot;
    return s;
}

// Sum of ((x - pivot) - shift)^2 over a row, in the fused loop's order too.
double sum_sq_dev(const float* x, long n, float pivot, float shift) {
    constexpr auto lanes = std::make_integer_sequence<int, VW>{};
    const long nv = n - n % VW;
    const vf vp = splat(pivot), vs = splat(shift);
    vf a0 = vf{}, a1 = vf{}, a2 = vf{}, a3 = vf{};
    double blocks = 0.0;
    long i = 0;
    for (; i + 4 * VW <= nv; i += 4 * VW) {
        vf v0 = (loadu(x + i) - vp) - vs, v1 = (loadu(x + i + VW) - vp) - vs;
        vf v2 = (loadu(x + i + 2 * VW) - vp) - vs, v3 = (loadu(x + i + 3 * VW) - vp) - vs;
        a0 += v0 * v0;
        a1 += v1 * v1;
        a2 += v2 * v2;
        a3 += v3 * v3;
        if (block_ends(i + 4 * VW)) {
            blocks += hsum_pairwise((a0 + a1) + (a2 + a3), lanes);
            a0 = a1 = a2 = a3 = vf{};
        }
    }
    for (; i < nv; i += VW) {
        vf v = (loadu(x + i) - vp) - vs;
        a0 += v * v;
    }
    double s = blocks + hsum_pairwise((a0 + a1) + (a2 + a3), lanes);
    for (; i < n; ++i) s += ((x[i] - pivot) - shift) * ((x[i] - pivot) - shift);
    return s;
}

inline float shift_of(double sum_dev, long n) {
    return static_cast<float>(sum_dev / static_cast<double>(n));
}

// The row scalar in double: free at one per row, and it keeps eps exact.
inline float rstd_of(double sum_sq_dev, long n, double eps) {
    return static_cast<float>(1.0 / std::sqrt(sum_sq_dev / static_cast<double>(n) + eps));
}

// A LayerNorm row and what is known of it so far.
struct LnRow {
    const float* x;
    float pivot, shift, rstd;
};

// One loop over three rows, each at another stage: c's output, y = ((x - pivot) - shift) * rstd [* w]
// [+ b]; b's sum of squared deviations (giving b.rstd); a's sum of deviations (giving a.shift).
// The three are independent, so the loop is not a chain of dependent adds, and a, the row read from
// memory, streams in while the others compute. px and py (optional) are rows ahead to prefetch.
template <bool HasW, bool HasB>
void layernorm_stages(const LnRow& c, float* y, LnRow& b, LnRow& a, const float* w, const float* bias, long n,
                      double eps, const float* px, float* py) {
    constexpr int line = 64 / sizeof(float);
    const long nv = n - n % VW;
    const vf cp = splat(c.pivot), cs = splat(c.shift), ck = splat(c.rstd);
    const vf bp = splat(b.pivot), bs = splat(b.shift), ap = splat(a.pivot);
    auto out = [&](long i) {
        vf v = ((loadu(c.x + i) - cp) - cs) * ck;
        if constexpr (HasW) v = v * loadu(w + i);
        if constexpr (HasB) v = v + loadu(bias + i);
        storeu(y + i, v);
    };
    auto sq = [&](long i) {
        vf v = (loadu(b.x + i) - bp) - bs;
        return v * v;
    };
    constexpr auto lanes = std::make_integer_sequence<int, VW>{};
    vf s0 = vf{}, s1 = vf{}, s2 = vf{}, s3 = vf{}, q0 = vf{}, q1 = vf{}, q2 = vf{}, q3 = vf{};
    double s_blocks = 0.0, q_blocks = 0.0;
    long i = 0;
    for (; i + 4 * VW <= nv; i += 4 * VW) {
        for (int j = 0; j < 4 * VW; j += line) {
            if (px) __builtin_prefetch(px + i + j);
            if (py) __builtin_prefetch(py + i + j, 1);
        }
        s0 += loadu(a.x + i) - ap;
        s1 += loadu(a.x + i + VW) - ap;
        s2 += loadu(a.x + i + 2 * VW) - ap;
        s3 += loadu(a.x + i + 3 * VW) - ap;
        q0 += sq(i);
        q1 += sq(i + VW);
        q2 += sq(i + 2 * VW);
        q3 += sq(i + 3 * VW);
        out(i);
        out(i + VW);
        out(i + 2 * VW);
        out(i + 3 * VW);
        if (block_ends(i + 4 * VW)) {  // the blocks of sum_dev and sum_sq_dev
            s_blocks += hsum_pairwise((s0 + s1) + (s2 + s3), lanes);
            q_blocks += hsum_pairwise((q0 + q1) + (q2 + q3), lanes);
            s0 = s1 = s2 = s3 = q0 = q1 = q2 = q3 = vf{};
        }
    }
    for (; i < nv; i += VW) {
        if (px) __builtin_prefetch(px + i);
        if (py) __builtin_prefetch(py + i, 1);
        s0 += loadu(a.x + i) - ap;
        q0 += sq(i);
        out(i);
    }
    double s = s_blocks + hsum_pairwise((s0 + s1) + (s2 + s3), lanes);
    double q = q_blocks + hsum_pairwise((q0 + q1) + (q2 + q3), lanes);
    for (; i < n; ++i) {
        s += a.x[i] - a.pivot;
        q += ((b.x[i] - b.pivot) - b.shift) * ((b.x[i] - b.pivot) - b.shift);
        float v = ((c.x[i] - c.pivot) - c.shift) * c.rstd;
        if constexpr (HasW) v = v * w[i];
        if constexpr (HasB) v = v + bias[i];
        y[i] = v;
    }
    a.shift = shift_of(s, n);
    b.rstd = rstd_of(q, n, eps);
}

// Rows [begin, end) of one thread. Each row is centred on its first element, then on the mean of
// what is left: x - pivot is exact for values within a factor of two of each other, so a large
// common offset costs no precision (fp32 cannot even represent mean(x) closely enough to subtract
// it directly). The variance is a second pass over squared deviations, never E[x^2] - E[x]^2.
template <bool HasW, bool HasB>
void layernorm_rows(const float* x, long ldx, const float* w, const float* b, float* y, long ldy, long begin,
                    long end, long n, double eps, float* mean, float* rstd) {
    // Rows past the end are stood in for by the last one: L1 re-reads whose results are dropped.
    auto row = [&](long r) {
        LnRow o;
        o.x = x + std::min(r, end - 1) * ldx;
        o.pivot = o.x[0];
        return o;
    };
    // Prefetch at least ~2 KiB ahead, so that short rows still keep enough lines in flight.
    const long ahead = std::max(1L, 512 / n);
    LnRow c = row(begin), bb = row(begin + 1);
    c.shift = shift_of(sum_dev(c.x, n, c.pivot), n);
    c.rstd = rstd_of(sum_sq_dev(c.x, n, c.pivot, c.shift), n, eps);
    bb.shift = shift_of(sum_dev(bb.x, n, bb.pivot), n);
    for (long r = begin; r < end; ++r) {
        LnRow a = row(r + 2);
        const long rx = r + 2 + ahead, ry = r + ahead;
        layernorm_stages<HasW, HasB>(c, y + r * ldy, bb, a, w, b, n, eps, rx < end ? x + rx * ldx : nullptr,
                                     ry < end ? y + ry * ldy : nullptr);
        if (mean) mean[r] = c.pivot + c.shift;
        if (rstd) rstd[r] = c.rstd;
        c = bb;
        bb = a;
    }
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
             float* h, long ldh, long rows, long n, double eps, int threads, float* rstd_out) {
    for_rows(rows, n, threads, [&](long r, bool more) {
        const float* src = x + r * ldx;
        if (residual) {
            float* hr = h + r * ldh;
            add_rows(src, residual + r * ldr, hr, n);
            src = hr;
        }
        // The row scalar in double: free at one per row, and it keeps eps exact.
        const double ms = sum_squares(src, n) / static_cast<double>(n);
        const float rstd = static_cast<float>(1.0 / std::sqrt(ms + eps));
        if (rstd_out) rstd_out[r] = rstd;
        const float* next = more ? x + (r + 1) * ldx : nullptr;
        const float* next_residual = more && residual ? residual + (r + 1) * ldr : nullptr;
        if (weight)
            scale_row<true>(src, rstd, weight, y + r * ldy, n, next, next_residual);
        else
            scale_row<false>(src, rstd, weight, y + r * ldy, n, next, next_residual);
    });
}

void layernorm(const float* x, long ldx, const float* weight, const float* bias, float* y, long ldy, long rows,
               long n, double eps, int threads, float* mean, float* rstd) {
    run_team(row_threads(rows, n, threads), [&](int t, int team) {
        long begin, end;
        split(rows, t, team, begin, end);
        if (begin >= end) return;
        if (weight && bias)
            layernorm_rows<true, true>(x, ldx, weight, bias, y, ldy, begin, end, n, eps, mean, rstd);
        else if (weight)
            layernorm_rows<true, false>(x, ldx, weight, bias, y, ldy, begin, end, n, eps, mean, rstd);
        else if (bias)
            layernorm_rows<false, true>(x, ldx, weight, bias, y, ldy, begin, end, n, eps, mean, rstd);
        else
            layernorm_rows<false, false>(x, ldx, weight, bias, y, ldy, begin, end, n, eps, mean, rstd);
    });
}


namespace {

// Runs row(r, partial, more) over the rows on a team, where partial is the thread's own zeroed block
// of nsums vectors of `width` floats and `more` says whether the thread owns row r + 1 too; then writes the sum over threads of vector s into sums[s]
// (skipped where sums[s] is null).
template <class RowFn>
void rows_with_sums(long rows, long n, int threads, long width, float* const* sums, int nsums, RowFn&& row) {
    const int team = row_threads(rows, n, threads);
    // Each thread's block starts on a cache line of its own: the per-row read-modify-write of the
    // partials then never splits a line, nor shares one with the other thread's block.
    constexpr long line = 64 / sizeof(float);
    const long block = (static_cast<long>(nsums) * width + line - 1) / line * line;
    std::vector<float> storage(static_cast<size_t>(team * block + line), 0.0f);
    const long misaligned = reinterpret_cast<uintptr_t>(storage.data()) / sizeof(float) % line;
    float* const partials = storage.data() + (line - misaligned) % line;
    run_team(team, [&](int t, int nt) {
        long begin, end;
        split(rows, t, nt, begin, end);
        float* mine = width ? partials + t * block : nullptr;
        for (long r = begin; r < end; ++r) row(r, mine, r + 1 < end);
    });
    for (int s = 0; s < nsums; ++s) {
        if (!sums[s]) continue;
        float* dst = sums[s];
        for (long i = 0; i < width; ++i) dst[i] = partials[s * width + i];
        for (int t = 1; t < team; ++t) {
            const float* src = partials + t * block + s * width;
            for (long i = 0; i < width; ++i) dst[i] += src[i];
        }
    }
}

// Calls f with three std::bool_constant arguments of the values a, b, c: one instantiation each.
template <class F>
void with_flags(bool a, bool b, bool c, F&& f) {
    auto third = [&](auto x, auto y) { c ? f(x, y, std::true_type{}) : f(x, y, std::false_type{}); };
    auto second = [&](auto x) { b ? third(x, std::true_type{}) : third(x, std::false_type{}); };
    a ? second(std::true_type{}) : second(std::false_type{});
}

// sum(a * b [* w]) over a row, two accumulators wide.
template <bool HasW>
float dot_row(const float* a, const float* b, const float* w, long n) {
    const long nv = n - n % VW;
    vf s0 = vf{}, s1 = vf{};
    long i = 0;
    for (; i + 2 * VW <= nv; i += 2 * VW) {
        vf p0 = loadu(a + i) * loadu(b + i), p1 = loadu(a + i + VW) * loadu(b + i + VW);
        if constexpr (HasW) {
            p0 = p0 * loadu(w + i);
            p1 = p1 * loadu(w + i + VW);
        }
        s0 += p0;
        s1 += p1;
    }
    for (; i < nv; i += VW) {
        vf p = loadu(a + i) * loadu(b + i);
        if constexpr (HasW) p = p * loadu(w + i);
        s0 += p;
    }
    float s = hsum(s0 + s1);
    for (; i < n; ++i) s += HasW ? a[i] * b[i] * w[i] : a[i] * b[i];
    return s;
}

// The rows after this one (null when there is none), prefetched a line per vector by the last pass
// over this row, which itself hits L1: the next row's misses then overlap this row's compute.
struct NextRows {
    const float* a = nullptr;
    const float* b = nullptr;
    const float* c = nullptr;

    void prefetch(long i) const {
        prefetch_line(at(a, i));
        prefetch_line(at(b, i));
        prefetch_line(at(c, i));
    }
};

template <bool HasW, bool HasExtra, bool HasDw>
void rmsnorm_backward_row(const float* h, float rstd, const float* w, const float* dy, const float* extra, float* dx,
                          float* dw, long n, const NextRows& next) {
    // dx = rstd * g - h * (rstd^3 * sum(g * h) / n), g = dy * w.
    const float c = static_cast<float>(static_cast<double>(rstd) * rstd * rstd * dot_row<HasW>(dy, h, w, n) / n);
    const long nv = n - n % VW;
    const vf vr = splat(rstd), vc = splat(c);
    long i = 0;
    for (; i < nv; i += VW) {
        next.prefetch(i);
        const vf hv = loadu(h + i), d = loadu(dy + i);
        vf g = d;
        if constexpr (HasW) g = g * loadu(w + i);
        vf v = vr * g - hv * vc;
        if constexpr (HasExtra) v = v + loadu(extra + i);
        storeu(dx + i, v);
        if constexpr (HasDw) storeu(dw + i, loadu(dw + i) + d * (hv * vr));
    }
    for (; i < n; ++i) {
        const float g = HasW ? dy[i] * w[i] : dy[i];
        float v = rstd * g - h[i] * c;
        if constexpr (HasExtra) v += extra[i];
        dx[i] = v;
        if constexpr (HasDw) dw[i] += dy[i] * (h[i] * rstd);
    }
}

template <bool HasW, bool HasDw, bool HasDb>
void layernorm_backward_row(const float* x, float mean, float rstd, const float* w, const float* dy, float* dx,
                            float* dw, float* db, long n, const NextRows& next) {
    // First pass: sum(g) and sum(g * xhat), g = dy * w.
    const long nv = n - n % VW;
    const vf vm = splat(mean), vr = splat(rstd);
    vf sg0 = vf{}, sg1 = vf{}, sx0 = vf{}, sx1 = vf{};
    long i = 0;
    for (; i + 2 * VW <= nv; i += 2 * VW) {
        vf g0 = loadu(dy + i), g1 = loadu(dy + i + VW);
        if constexpr (HasW) {
            g0 = g0 * loadu(w + i);
            g1 = g1 * loadu(w + i + VW);
        }
        sg0 += g0;
        sg1 += g1;
        sx0 += g0 * ((loadu(x + i) - vm) * vr);
        sx1 += g1 * ((loadu(x + i + VW) - vm) * vr);
    }
    for (; i < nv; i += VW) {
        vf g = loadu(dy + i);
        if constexpr (HasW) g = g * loadu(w + i);
        sg0 += g;
        sx0 += g * ((loadu(x + i) - vm) * vr);
    }
    float sg = hsum(sg0 + sg1), sx = hsum(sx0 + sx1);
    for (; i < n; ++i) {
        const float g = HasW ? dy[i] * w[i] : dy[i];
        sg += g;
        sx += g * ((x[i] - mean) * rstd);
    }
    const float a = sg / n, b = sx / n;
    const vf va = splat(a), vb = splat(b);
    for (i = 0; i < nv; i += VW) {
        next.prefetch(i);
        const vf d = loadu(dy + i), xh = (loadu(x + i) - vm) * vr;
        vf g = d;
        if constexpr (HasW) g = g * loadu(w + i);
        storeu(dx + i, vr * ((g - va) - xh * vb));
        if constexpr (HasDw) storeu(dw + i, loadu(dw + i) + d * xh);
        if constexpr (HasDb) storeu(db + i, loadu(db + i) + d);
    }
    for (; i < n; ++i) {
        const float xh = (x[i] - mean) * rstd, g = HasW ? dy[i] * w[i] : dy[i];
        dx[i] = rstd * ((g - a) - xh * b);
        if constexpr (HasDw) dw[i] += dy[i] * xh;
        if constexpr (HasDb) db[i] += dy[i];
    }
}

}  // namespace

void softmax_backward(const float* y, long ldy, const float* dy, long lddy, float* dx, long lddx, long rows, long n,
                      int threads) {
    for_rows(rows, n, threads, [&](long r, bool more) {
        const float* yr = y + r * ldy;
        const float* dr = dy + r * lddy;
        float* out = dx + r * lddx;
        const NextRows next = more ? NextRows{yr + ldy, dr + lddy} : NextRows{};
        const vf dot = splat(dot_row<false>(yr, dr, nullptr, n));
        const long nv = n - n % VW;
        long i = 0;
        for (; i < nv; i += VW) {
            next.prefetch(i);
            const vf yv = loadu(yr + i);
            storeu(out + i, yv * (loadu(dr + i) - dot));
        }
        for (; i < n; ++i) out[i] = yr[i] * (dr[i] - dot[0]);
    });
}

void rmsnorm_backward(const float* h, long ldh, const float* rstd, const float* weight, const float* dy, long lddy,
                      const float* dh_extra, long ldde, float* dx, long lddx, float* dweight, long rows, long n,
                      int threads) {
    float* const sums[] = {dweight};
    rows_with_sums(rows, n, threads, dweight ? n : 0, sums, 1, [&](long r, float* partial, bool more) {
        const float* hr = h + r * ldh;
        const float* dr = dy + r * lddy;
        const float* er = dh_extra ? dh_extra + r * ldde : nullptr;
        float* out = dx + r * lddx;
        const NextRows next = more ? NextRows{hr + ldh, dr + lddy, er ? er + ldde : nullptr} : NextRows{};
        with_flags(weight != nullptr, er != nullptr, dweight != nullptr, [&](auto w, auto e, auto d) {
            rmsnorm_backward_row<decltype(w)::value, decltype(e)::value, decltype(d)::value>(hr, rstd[r], weight, dr,
                                                                                            er, out, partial, n, next);
        });
    });
}

void layernorm_backward(const float* x, long ldx, const float* mean, const float* rstd, const float* weight,
                        const float* dy, long lddy, float* dx, long lddx, float* dweight, float* dbias, long rows,
                        long n, int threads) {
    float* const sums[] = {dweight, dbias};
    rows_with_sums(rows, n, threads, dweight || dbias ? n : 0, sums, 2, [&](long r, float* partial, bool more) {
        const float* xr = x + r * ldx;
        const float* dr = dy + r * lddy;
        float* out = dx + r * lddx;
        const NextRows next = more ? NextRows{xr + ldx, dr + lddy} : NextRows{};
        float* pw = partial;
        float* pb = partial ? partial + n : nullptr;
        with_flags(weight != nullptr, dweight != nullptr, dbias != nullptr, [&](auto w, auto d, auto e) {
            layernorm_backward_row<decltype(w)::value, decltype(d)::value, decltype(e)::value>(
                xr, mean[r], rstd[r], weight, dr, out, pw, pb, n, next);
        });
    });
}

}  // namespace kl
