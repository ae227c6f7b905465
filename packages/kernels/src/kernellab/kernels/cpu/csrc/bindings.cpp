// Python entry points. Each op has two: `<op>` runs on tensors the Python layer has already
// checked, and `<op>_fast` first accepts or declines the common case itself (contiguous fp32 CPU
// tensors of matching shapes), returning None when it declines so that Python's checks, which
// name the offending argument, take over. The fast entry exists because each Python-level
// attribute read of a tensor costs a cache miss or two once the caller's data has pushed the
// tensor objects out of cache; checking in C++ touches each tensor's metadata once. Both read
// torch's intra-op thread count at call time and run the kernel without holding the GIL.
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <tuple>
#include <variant>
#include <utility>

#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include "kernels.h"

namespace {

using Opt = std::optional<at::Tensor>;

const float* in(const at::Tensor& t) { return t.const_data_ptr<float>(); }
const float* in(const Opt& t) { return t ? t->const_data_ptr<float>() : nullptr; }
float* out(const at::Tensor& t) { return t.mutable_data_ptr<float>(); }
float* out(const Opt& t) { return t ? t->mutable_data_ptr<float>() : nullptr; }

// Tensors arrive as rows of their last dimension: any number of leading dims that flatten to one
// row stride (the Python side guarantees that, copying inputs that do not). The row stride is
// the stride of the innermost leading dim of size > 1 (torch leaves the strides of size-1 dims
// arbitrary, even in contiguous tensors).
long ld(const at::Tensor& t) {
    for (int64_t d = t.dim() - 2; d >= 0; --d)
        if (t.size(d) > 1) return t.stride(d);
    return t.size(-1);
}
long ld(const Opt& t) { return t ? ld(*t) : 0; }
long rows(const at::Tensor& t) { return t.numel() / t.size(-1); }

void softmax(const at::Tensor& x, const at::Tensor& y) {
    kl::softmax(in(x), ld(x), out(y), ld(y), rows(x), x.size(-1), at::get_num_threads());
}

// rstd (and mean), optional: contiguous, one value per row, for the backward.
void rmsnorm(const at::Tensor& x, const Opt& residual, const Opt& weight, double eps, const at::Tensor& y,
             const Opt& h, const Opt& rstd) {
    kl::rmsnorm(in(x), ld(x), in(residual), ld(residual), in(weight), out(y), ld(y), out(h), ld(h), rows(x),
                x.size(-1), eps, at::get_num_threads(), out(rstd));
}

void layernorm(const at::Tensor& x, const Opt& weight, const Opt& bias, double eps, const at::Tensor& y,
               const Opt& mean, const Opt& rstd) {
    kl::layernorm(in(x), ld(x), in(weight), in(bias), out(y), ld(y), rows(x), x.size(-1), eps,
                  at::get_num_threads(), out(mean), out(rstd));
}

// The backward entries: row tensors as above, statistics one value per row, per-feature
// gradients (N,) contiguous and optional.
void softmax_backward(const at::Tensor& y, const at::Tensor& dy, const at::Tensor& dx) {
    kl::softmax_backward(in(y), ld(y), in(dy), ld(dy), out(dx), ld(dx), rows(y), y.size(-1), at::get_num_threads());
}

void rmsnorm_backward(const at::Tensor& h, const at::Tensor& rstd, const Opt& weight, const at::Tensor& dy,
                      const Opt& dh_extra, const at::Tensor& dx, const Opt& dweight) {
    kl::rmsnorm_backward(in(h), ld(h), in(rstd), in(weight), in(dy), ld(dy), in(dh_extra), ld(dh_extra), out(dx),
                         ld(dx), out(dweight), rows(h), h.size(-1), at::get_num_threads());
}

void layernorm_backward(const at::Tensor& x, const at::Tensor& mean, const at::Tensor& rstd, const Opt& weight,
                        const at::Tensor& dy, const at::Tensor& dx, const Opt& dweight, const Opt& dbias) {
    kl::layernorm_backward(in(x), ld(x), in(mean), in(rstd), in(weight), in(dy), ld(dy), out(dx), ld(dx),
                           out(dweight), out(dbias), rows(x), x.size(-1), at::get_num_threads());
}

// x (m, k), w (n, k), dy (m, n) and the outputs are 2-D.
void linear_forward(const at::Tensor& x, const at::Tensor& w, const Opt& bias, const at::Tensor& y) {
    kl::linear_forward(in(x), ld(x), in(w), ld(w), in(bias), out(y), ld(y), x.size(0), x.size(1), w.size(0),
                       at::get_num_threads());
}

void linear_backward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& dy, const at::Tensor& dx,
                     const at::Tensor& dw, const at::Tensor& db) {
    kl::linear_backward(in(x), ld(x), in(w), ld(w), in(dy), ld(dy), out(dx), ld(dx), out(dw), ld(dw), out(db),
                        x.size(0), x.size(1), w.size(0), at::get_num_threads());
}

// How two tensors share memory: "no", "full" (the same elements in the same layout: an op that
// reads each element before writing it may run in place) or "partial". torch's own rule
// (at::get_overlap_status) decides; where it cannot (a view that is not dense), two views of one
// storage whose element spans intersect count as partial.
const char* overlap(const at::Tensor& a, const at::Tensor& b) {
    switch (at::get_overlap_status(a, b)) {
        case at::MemOverlapStatus::No: return "no";
        case at::MemOverlapStatus::Full: return "full";
        case at::MemOverlapStatus::Partial: return "partial";
        case at::MemOverlapStatus::TooHard: break;
    }
    if (!a.has_storage() || !b.has_storage() || !a.storage().is_alias_of(b.storage())) return "no";
    auto span = [](const at::Tensor& t) {
        int64_t last = 0;
        for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * std::abs(t.stride(d));
        const auto* begin = static_cast<const char*>(t.const_data_ptr());
        return std::make_pair(begin, begin + (last + 1) * static_cast<int64_t>(t.element_size()));
    };
    const auto [a_begin, a_end] = span(a);
    const auto [b_begin, b_end] = span(b);
    return a_begin < b_end && b_begin < a_end ? "partial" : "no";
}

const at::Tensor* ptr(const Opt& t) { return t ? &*t : nullptr; }

// Whether an output (if given) shares no memory with any of the tensors listed (null ones skipped).
bool apart(const Opt& written, std::initializer_list<const at::Tensor*> others) {
    if (!written) return true;
    for (const at::Tensor* t : others)
        if (t && at::get_overlap_status(*written, *t) != at::MemOverlapStatus::No) return false;
    return true;
}

// ---- the fast entries: accept the common case, or decline with None ----
// They also decline when an output shares memory with another tensor of the call, so that the
// checks in Python name the pair (or let an exact in-place call through).

// A tensor autograd must see (it requires grad and grad mode is on) is left to the Python layer. The forward
// entries tell it apart: with every input plain but such a one, and no out= buffer, they answer False, and
// Python records the call through the op's autograd Function without checking its arguments again (that
// check costs as much as a 128x512 kernel). Otherwise (an out= buffer, which then raises) they decline.
bool untracked(const at::Tensor& t) { return !t.requires_grad() || !at::GradMode::is_enabled(); }

// Where `tracked` is given, a tensor autograd must see is plain too, and sets it.
bool plain(const at::Tensor& t, bool* tracked = nullptr) {
    if (t.scalar_type() != at::kFloat || !t.device().is_cpu() || !t.is_contiguous() || t.dim() == 0 ||
        t.numel() == 0)
        return false;
    if (untracked(t)) return true;
    return tracked && (*tracked = true);
}

bool plain_like(const at::Tensor& t, at::IntArrayRef sizes, bool* tracked = nullptr) {
    if (t.scalar_type() != at::kFloat || !t.device().is_cpu() || !t.is_contiguous() || t.sizes() != sizes)
        return false;
    if (untracked(t)) return true;
    return tracked && (*tracked = true);
}

bool absent_or_like(const Opt& t, at::IntArrayRef sizes, bool* tracked = nullptr) {
    return !t || plain_like(*t, sizes, tracked);
}

// A forward entry's answer: its result, or false (plain inputs that autograd must record; see above).
template <class T>
using Forward = std::optional<std::variant<T, bool>>;

at::Tensor given_or_new(const Opt& t, at::IntArrayRef sizes) {
    return t ? *t : at::empty(sizes, at::TensorOptions().dtype(at::kFloat));
}

Forward<at::Tensor> softmax_fast(const at::Tensor& x, const Opt& out) {
    bool tracked = false;
    if (!plain(x, &tracked) || !absent_or_like(out, x.sizes()) || !apart(out, {&x})) return std::nullopt;
    if (tracked) return out ? Forward<at::Tensor>() : Forward<at::Tensor>(false);
    at::Tensor y = given_or_new(out, x.sizes());
    softmax(x, y);
    return y;
}

// (y, h), h undefined (None) without a residual.
Forward<std::tuple<at::Tensor, at::Tensor>> rmsnorm_fast(const at::Tensor& x, const Opt& weight, double eps,
                                                        const Opt& residual, const Opt& out,
                                                        const Opt& residual_out) {
    bool tracked = false;
    if (!plain(x, &tracked) || !absent_or_like(weight, x.sizes().slice(x.dim() - 1), &tracked) || !(eps > 0.0) ||
        !absent_or_like(residual, x.sizes(), &tracked) || !absent_or_like(out, x.sizes()) ||
        !absent_or_like(residual_out, x.sizes()) || (residual_out && !residual) ||
        !apart(out, {&x, ptr(weight), ptr(residual), ptr(residual_out)}) ||
        !apart(residual_out, {&x, ptr(weight), ptr(residual)}))
        return std::nullopt;
    if (tracked) return out || residual_out ? Forward<std::tuple<at::Tensor, at::Tensor>>() : false;
    at::Tensor y = given_or_new(out, x.sizes());
    at::Tensor h = residual ? given_or_new(residual_out, x.sizes()) : at::Tensor();
    rmsnorm(x, residual, weight, eps, y, residual ? Opt(h) : Opt(), Opt());
    return std::make_tuple(y, h);
}

Forward<at::Tensor> layernorm_fast(const at::Tensor& x, const Opt& weight, const Opt& bias, double eps,
                                   const Opt& out) {
    bool tracked = false;
    if (!plain(x, &tracked)) return std::nullopt;  // first: a 0-d x has no last dimension to slice
    const auto n = x.sizes().slice(x.dim() - 1);
    if (!absent_or_like(weight, n, &tracked) || !absent_or_like(bias, n, &tracked) || !(eps > 0.0) ||
        !absent_or_like(out, x.sizes()) || !apart(out, {&x, ptr(weight), ptr(bias)}))
        return std::nullopt;
    if (tracked) return out ? Forward<at::Tensor>() : Forward<at::Tensor>(false);
    at::Tensor y = given_or_new(out, x.sizes());
    layernorm(x, weight, bias, eps, y, Opt(), Opt());
    return y;
}

Forward<at::Tensor> linear_forward_fast(const at::Tensor& x, const at::Tensor& w, const Opt& bias, const Opt& out) {
    bool tracked = false;
    if (!plain(x, &tracked) || x.dim() != 2 || !plain(w, &tracked) || w.dim() != 2 || w.size(1) != x.size(1))
        return std::nullopt;
    const int64_t shape[] = {x.size(0), w.size(0)};
    if (!absent_or_like(bias, at::IntArrayRef(shape + 1, 1), &tracked) || !absent_or_like(out, shape) ||
        !apart(out, {&x, &w, ptr(bias)}))
        return std::nullopt;
    if (tracked) return out ? Forward<at::Tensor>() : Forward<at::Tensor>(false);
    at::Tensor y = given_or_new(out, shape);
    linear_forward(x, w, bias, y);
    return y;
}

std::optional<std::tuple<at::Tensor, at::Tensor, at::Tensor>> linear_backward_fast(
    const at::Tensor& x, const at::Tensor& w, const at::Tensor& dy, const Opt& dx, const Opt& dw, const Opt& db) {
    if (!plain(x) || x.dim() != 2 || !plain(w) || w.dim() != 2 || w.size(1) != x.size(1)) return std::nullopt;
    const int64_t dy_shape[] = {x.size(0), w.size(0)};
    if (!plain_like(dy, dy_shape) || !absent_or_like(dx, x.sizes()) || !absent_or_like(dw, w.sizes()) ||
        !absent_or_like(db, w.sizes().slice(0, 1)) || !apart(dx, {&x, &w, &dy, ptr(dw), ptr(db)}) ||
        !apart(dw, {&x, &w, &dy, ptr(db)}) || !apart(db, {&x, &w, &dy}))
        return std::nullopt;
    at::Tensor dx_ = given_or_new(dx, x.sizes()), dw_ = given_or_new(dw, w.sizes());
    at::Tensor db_ = given_or_new(db, w.sizes().slice(0, 1));
    linear_backward(x, w, dy, dx_, dw_, db_);
    return std::make_tuple(dx_, dw_, db_);
}

// The backward entries compute every gradient (the per-feature ones too), as their Python functions do.
std::optional<at::Tensor> softmax_backward_fast(const at::Tensor& y, const at::Tensor& dy, const Opt& out) {
    if (!plain(y) || !plain_like(dy, y.sizes()) || !absent_or_like(out, y.sizes()) || !apart(out, {&y, &dy}))
        return std::nullopt;
    at::Tensor dx = given_or_new(out, y.sizes());
    softmax_backward(y, dy, dx);
    return dx;
}

std::optional<std::tuple<at::Tensor, at::Tensor>> rmsnorm_backward_fast(const at::Tensor& h, const at::Tensor& rstd,
                                                                        const at::Tensor& dy, const Opt& weight,
                                                                        const Opt& dh_extra, const Opt& dx,
                                                                        const Opt& dweight) {
    if (!plain(h)) return std::nullopt;  // first: a 0-d h has no last dimension to slice
    const auto n = h.sizes().slice(h.dim() - 1);
    if (!plain_like(rstd, h.sizes().slice(0, h.dim() - 1)) || !plain_like(dy, h.sizes()) ||
        !absent_or_like(weight, n) || !absent_or_like(dh_extra, h.sizes()) || !absent_or_like(dx, h.sizes()) ||
        !absent_or_like(dweight, n) || !apart(dx, {&h, &rstd, &dy, ptr(weight), ptr(dh_extra), ptr(dweight)}) ||
        !apart(dweight, {&h, &rstd, &dy, ptr(weight), ptr(dh_extra)}))
        return std::nullopt;
    at::Tensor dx_ = given_or_new(dx, h.sizes()), dw_ = given_or_new(dweight, n);
    rmsnorm_backward(h, rstd, weight, dy, dh_extra, dx_, dw_);
    return std::make_tuple(dx_, dw_);
}

std::optional<std::tuple<at::Tensor, at::Tensor, at::Tensor>> layernorm_backward_fast(
    const at::Tensor& x, const at::Tensor& mean, const at::Tensor& rstd, const at::Tensor& dy, const Opt& weight,
    const Opt& dx, const Opt& dweight, const Opt& dbias) {
    if (!plain(x)) return std::nullopt;
    const auto n = x.sizes().slice(x.dim() - 1);
    const auto stats = x.sizes().slice(0, x.dim() - 1);
    if (!plain_like(mean, stats) || !plain_like(rstd, stats) || !plain_like(dy, x.sizes()) ||
        !absent_or_like(weight, n) || !absent_or_like(dx, x.sizes()) || !absent_or_like(dweight, n) ||
        !absent_or_like(dbias, n) ||
        !apart(dx, {&x, &mean, &rstd, &dy, ptr(weight), ptr(dweight), ptr(dbias)}) ||
        !apart(dweight, {&x, &mean, &rstd, &dy, ptr(weight), ptr(dbias)}) ||
        !apart(dbias, {&x, &mean, &rstd, &dy, ptr(weight)}))
        return std::nullopt;
    at::Tensor dx_ = given_or_new(dx, x.sizes()), dw_ = given_or_new(dweight, n), db_ = given_or_new(dbias, n);
    layernorm_backward(x, mean, rstd, weight, dy, dx_, dw_, db_);
    return std::make_tuple(dx_, dw_, db_);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    const auto nogil = py::call_guard<py::gil_scoped_release>();
    m.def("softmax", &softmax, nogil);
    m.def("rmsnorm", &rmsnorm, nogil);
    m.def("layernorm", &layernorm, nogil);
    m.def("linear_forward", &linear_forward, nogil);
    m.def("linear_backward", &linear_backward, nogil);
    m.def("softmax_backward", &softmax_backward, nogil);
    m.def("rmsnorm_backward", &rmsnorm_backward, nogil);
    m.def("layernorm_backward", &layernorm_backward, nogil);
    m.def("softmax_fast", &softmax_fast, nogil);
    m.def("rmsnorm_fast", &rmsnorm_fast, nogil);
    m.def("layernorm_fast", &layernorm_fast, nogil);
    m.def("linear_forward_fast", &linear_forward_fast, nogil);
    m.def("linear_backward_fast", &linear_backward_fast, nogil);
    m.def("softmax_backward_fast", &softmax_backward_fast, nogil);
    m.def("rmsnorm_backward_fast", &rmsnorm_backward_fast, nogil);
    m.def("layernorm_backward_fast", &layernorm_backward_fast, nogil);
    m.def("overlap", &overlap);
    // The vector width this build compiled to, for tests and diagnostics.
#if defined(__AVX512F__)
    m.attr("isa") = "avx512";
#elif defined(__AVX2__)
    m.attr("isa") = "avx2";
#elif defined(__AVX__)
    m.attr("isa") = "avx";
#else
    m.attr("isa") = "baseline";
#endif
}
