// Portable SIMD vocabulary: one vector type whose width follows the target ISA (16 floats with
// AVX-512, 8 with AVX/AVX2, 4 otherwise). GCC vector extensions (also understood by Clang) lower
// it to the widest registers the build flags allow, so a -march=native build and a portable build
// share this code.
#pragma once

#include <cstdint>
#include <cstring>
#include <utility>

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace kl {

#if defined(__AVX512F__)
inline constexpr int VW = 16;
#elif defined(__AVX__)
inline constexpr int VW = 8;
#else
inline constexpr int VW = 4;
#endif

typedef float vf __attribute__((vector_size(VW * sizeof(float))));
typedef uint32_t vu __attribute__((vector_size(VW * sizeof(uint32_t))));

inline vf splat(float s) {
    vf v;
    for (int i = 0; i < VW; ++i) v[i] = s;  // folds to one broadcast (vf{} + s would add a 0.0f first)
    return v;
}

// Broadcast of one float from memory. Spelled with intrinsics where they exist: GCC otherwise
// merges neighbouring broadcasts into one vector load plus shuffles, which costs more.
inline vf bcast(const float* p) {
#if defined(__AVX512F__)
    return (vf)_mm512_set1_ps(*p);
#elif defined(__AVX__)
    return (vf)_mm256_broadcast_ss(p);
#else
    return splat(*p);
#endif
}

// memcpy keeps unaligned access well defined; compilers turn it into one vector load/store.
inline vf loadu(const float* p) {
    vf v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

inline void storeu(float* p, vf v) { std::memcpy(p, &v, sizeof v); }

// Whether p may take a streaming store (aligned to the vector).
inline bool stream_aligned(const float* p) { return reinterpret_cast<uintptr_t>(p) % sizeof(vf) == 0; }

// A store that bypasses the caches (p aligned to the vector): for outputs written once and read by
// a later op, it spares the read of each line that a plain store first makes. fence_streams() must
// follow before another thread may read what was stored.
inline void stream(float* p, vf v) {
#if defined(__AVX512F__)
    _mm512_stream_ps(p, (__m512)v);
#elif defined(__AVX__)
    _mm256_stream_ps(p, (__m256)v);
#else
    std::memcpy(p, &v, sizeof v);
#endif
}

inline void fence_streams() {
#if defined(__AVX__)
    _mm_sfence();
#endif
}

// The first n (< VW) lanes from p, the others `fill` (a value neutral for the reduction at hand).
inline vf load_part(const float* p, long n, float fill) {
    vf v = splat(fill);
    for (long i = 0; i < n; ++i) v[i] = p[i];
    return v;
}

inline void store_part(float* p, vf v, long n) {
    for (long i = 0; i < n; ++i) p[i] = v[i];
}

// Lanes of the two-source shuffles below (index k < VW picks a[k], VW + k picks b[k]): lo keeps
// a's lanes outside the H-blocks and takes b's in, hi the opposite.
template <int H, int... K>
inline vf shuffle_lo(vf a, vf b, std::integer_sequence<int, K...>) {
    return __builtin_shufflevector(a, b, ((K & H) ? VW + K - H : K)...);
}

template <int H, int... K>
inline vf shuffle_hi(vf a, vf b, std::integer_sequence<int, K...>) {
    return __builtin_shufflevector(a, b, ((K & H) ? VW + K : K + H)...);
}

// In-register transpose of a VW x VW block (r[t][u] <- r[u][t]) in log2(VW) stages; stage H
// swaps the off-diagonal H x H sub-blocks of every 2H x 2H block.
template <int H = VW / 2>
inline void transpose(vf* r) {
    constexpr auto lanes = std::make_integer_sequence<int, VW>{};
    for (int i = 0; i < VW; ++i) {
        if (i & H) continue;
        const vf a = r[i], b = r[i + H];
        r[i] = shuffle_lo<H>(a, b, lanes);
        r[i + H] = shuffle_hi<H>(a, b, lanes);
    }
    if constexpr (H > 1) transpose<H / 2>(r);
}

inline float hsum(vf v) {
    float s = 0.0f;
    for (int i = 0; i < VW; ++i) s += v[i];
    return s;
}

// Lane-wise max that never selects NaN: NaN elements reach the result through later arithmetic.
inline vf vmax(vf a, vf b) { return b > a ? b : a; }

inline float hmax(vf v) {
    float m = v[0];
    for (int i = 1; i < VW; ++i) m = v[i] > m ? v[i] : m;
    return m;
}

// exp(x) for x <= 0, -inf or NaN: the inputs softmax produces after subtracting the row max.
// x = n*ln2 + r with |r| <= ln2/2; e^r by a degree-6 polynomial fitted for relative error on that
// interval (max 8.3e-8 in fp32 arithmetic, about 1.4 ulp); 2^n built in the exponent field.
// Below -87.33 (where 2^n would leave the normal range, and for -inf) the result is 0; nothing is
// clamped before that select, so NaN flows through the arithmetic and comes out NaN.
inline vf exp_nonpositive(vf x) {
    const vf shifter = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
    vf t = x * 1.44269504088896341f + shifter;
    vf n = t - shifter;
    vf r = x - n * 0.693359375f;  // ln2 split in two so that n * ln2_hi is exact
    r = r - n * -2.12194440e-4f;
    vf p = splat(0.001381461275741458f);
    p = p * r + 0.008368710055947304f;
    p = p * r + 0.04166838899254799f;
    p = p * r + 0.1666652113199234f;
    p = p * r + 0.4999999403953552f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    vu bits = ((vu)t - (vu)shifter + 127u) << 23;  // vector casts reinterpret the bits
    vf y = p * (vf)bits;
    return x < -87.33654f ? vf{} : y;
}

}  // namespace kl
