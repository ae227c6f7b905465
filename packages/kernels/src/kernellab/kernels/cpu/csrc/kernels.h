// The native kernels on raw fp32 pointers. The Python layer has already checked shapes,
// dtypes and strides; "ld" arguments are row strides in elements, the last dimension has stride 1.
#pragma once

#include <algorithm>

#include <omp.h>

namespace kl {

void softmax(const float* x, long ldx, float* y, long ldy, long rows, long n, int threads);

// h = x + residual (written to h when residual is given), y = h / sqrt(mean(h^2) + eps) * weight.
// rstd (optional, one per row) receives 1 / sqrt(mean(h^2) + eps), the statistic the backward reads.
void rmsnorm(const float* x, long ldx, const float* residual, long ldr, const float* weight, float* y, long ldy,
             float* h, long ldh, long rows, long n, double eps, int threads, float* rstd = nullptr);

// mean and rstd (optional, one per row) receive the row statistics the backward reads.
void layernorm(const float* x, long ldx, const float* weight, const float* bias, float* y, long ldy, long rows,
               long n, double eps, int threads, float* mean = nullptr, float* rstd = nullptr);

// Backward passes over rows. Per-feature gradients (dweight, dbias) are optional (null: not
// computed) and overwritten, never accumulated into; each thread sums its rows into its own
// partial vector and the partials are added at the end.

// dx = y * (dy - sum(y * dy)) per row.
void softmax_backward(const float* y, long ldy, const float* dy, long lddy, float* dx, long lddx, long rows, long n,
                      int threads);

// h is the normalized input (x, or x + residual), rstd the forward's. dh_extra (optional) is the
// gradient reaching h directly (the residual output's). dx = rstd * (g - xhat * mean(g * xhat))
// + dh_extra with xhat = h * rstd and g = dy * weight; dweight = sum over rows of dy * xhat.
void rmsnorm_backward(const float* h, long ldh, const float* rstd, const float* weight, const float* dy, long lddy,
                      const float* dh_extra, long ldde, float* dx, long lddx, float* dweight, long rows, long n,
                      int threads);

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with xhat = (x - mean) * rstd, g = dy * weight;
// dweight = sum over rows of dy * xhat, dbias = sum over rows of dy.
void layernorm_backward(const float* x, long ldx, const float* mean, const float* rstd, const float* weight,
                        const float* dy, long lddy, float* dx, long lddx, float* dweight, float* dbias, long rows,
                        long n, int threads);

// y (m, n) = x (m, k) w (n, k)^T + bias (n).
void linear_forward(const float* x, long ldx, const float* w, long ldw, const float* bias, float* y, long ldy,
                    long m, long k, long n, int threads);

// dx = dy w, dw = dy^T x, db = column sums of dy; every output is overwritten, never accumulated into.
void linear_backward(const float* x, long ldx, const float* w, long ldw, const float* dy, long lddy, float* dx,
                     long lddx, float* dw, long lddw, float* db, long m, long k, long n, int threads);

// Runs body(thread, team_size) on `threads` OpenMP threads, or inline when one suffices, so that
// small problems pay no fork/join.
template <class Body>
void run_team(int threads, Body&& body) {
    if (threads <= 1) {
        body(0, 1);
        return;
    }
#pragma omp parallel num_threads(threads)
    body(omp_get_thread_num(), omp_get_num_threads());
}

// The part [begin, end) of [0, n) that thread `t` of `team` owns (contiguous, balanced).
inline void split(long n, int t, int team, long& begin, long& end) {
    begin = n * t / team;
    end = n * (t + 1) / team;
}

}  // namespace kl
