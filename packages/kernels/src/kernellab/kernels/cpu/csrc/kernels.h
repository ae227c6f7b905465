// The native kernels on raw fp32 pointers. The Python layer has already checked shapes,
// dtypes and strides; "ld" arguments are row strides in elements, the last dimension has stride 1.
#pragma once

#include <algorithm>

#include <omp.h>

namespace kl {

void softmax(const float* x, long ldx, float* y, long ldy, long rows, long n, int threads);

// h = x + residual (written to h when residual is given), y = h / sqrt(mean(h^2) + eps) * weight.
void rmsnorm(const float* x, long ldx, const float* residual, long ldr, const float* weight, float* y, long ldy,
             float* h, long ldh, long rows, long n, double eps, int threads);

void layernorm(const float* x, long ldx, const float* weight, const float* bias, float* y, long ldy, long rows,
               long n, double eps, int threads);

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
