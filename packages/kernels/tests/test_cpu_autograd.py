"""Autograd and torch.compile of the CPU ops: the custom ops ``kernellab_cpu::*``, their native backward
kernels against float64 autograd of the references, opcheck, and torch's rules for out= with autograd."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cpu_ops import SCALES, SEEDS, assert_close, generator, inject, row_shapes, strided

import kernellab.kernels as kernels
from kernellab.harness.suites import reference
from kernellab.kernels.cpu import ops

GRAD_SPECIALS = st.sampled_from(["none", "none", "nan", "+inf", "-inf", "-inf row"])


def assert_grad_close(actual, truth, torch_fp32, reduction: int) -> None:
    """Within tolerance of the float64 truth and NaN exactly where torch's own fp32 autograd gives NaN.
    atol grows with the truth's size and the reduction length, and is at least 4x the error of torch's
    fp32 gradient (where fp32 rounding of the saved output cancels, as in softmax's near one-hot rows)."""
    assert torch.equal(actual.isnan(), torch_fp32.isnan()), "NaN pattern differs from torch's"
    finite = truth.isfinite() & torch_fp32.isfinite()
    scale = float(truth[finite].abs().max()) if finite.any() else 1.0
    torch_error = float((torch_fp32.double() - truth)[finite].abs().max()) if finite.any() else 0.0
    atol = max(2e-6 * max(scale, 1e-30) * math.sqrt(reduction), 4 * torch_error)
    torch.testing.assert_close(actual.to(torch.float64), truth, rtol=1e-4, atol=atol, equal_nan=True)


def leaf(t):
    return t.detach().clone().requires_grad_()


# ---- the report: the outputs track gradients and backward runs --------------------------------
def test_outputs_require_grad_and_backward_fills_grads():
    x = torch.randn(4, 32, requires_grad=True)
    weight, bias = torch.nn.Parameter(torch.randn(32)), torch.nn.Parameter(torch.randn(32))
    w_lin = torch.nn.Parameter(torch.randn(8, 32))
    outs = [kernels.softmax(x), kernels.rmsnorm(x, weight), kernels.layernorm(x, weight, bias),
            kernels.linear_forward(x, w_lin, None), kernels.rmsnorm(x, weight, 1e-6, torch.randn(4, 32))[0]]
    for y in outs:
        assert y.requires_grad and y.grad_fn is not None
    sum(y.square().sum() for y in outs).backward()
    for p in (x, weight, bias, w_lin):
        assert p.grad is not None and p.grad.isfinite().all() and p.grad.abs().sum() > 0


def test_eager_autograd_calls_the_kernels_without_the_custom_ops_dispatch():
    """In eager mode each op's graph node is its autograd Function (the op bodies called directly, as on the
    GPU); the custom ops are what torch.compile traces."""
    x = torch.randn(4, 32, requires_grad=True)
    weight, bias = torch.nn.Parameter(torch.randn(32)), torch.nn.Parameter(torch.randn(32))
    nodes = {"SoftmaxFunction": kernels.softmax(x), "RMSNormFunction": kernels.rmsnorm(x, weight),
             "RMSNormResidualFunction": kernels.rmsnorm(x, weight, 1e-6, torch.randn(4, 32))[0],
             "LayerNormFunction": kernels.layernorm(x, weight, bias),
             "LinearFunction": kernels.linear_forward(x, torch.nn.Parameter(torch.randn(8, 32)), bias[:8])}
    for function, y in nodes.items():
        assert type(y.grad_fn).__name__ == f"{function}Backward"


def test_no_grad_mode_returns_untracked_tensors():
    x = torch.randn(4, 32, requires_grad=True)
    with torch.no_grad():
        assert not kernels.softmax(x).requires_grad
        assert not kernels.layernorm(x).requires_grad


def test_backward_of_non_contiguous_grad():
    """sum().backward() hands the backward an expanded (stride 0) gradient."""
    x = torch.randn(3, 5, 17, requires_grad=True)
    weight = torch.nn.Parameter(torch.randn(17))
    kernels.layernorm(x, weight).sum().backward()
    x2, w2 = leaf(x), leaf(weight)
    F.layer_norm(x2, (17,), w2).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(weight.grad, w2.grad, rtol=1e-4, atol=1e-5)


# ---- out= with autograd raises, as torch's out= functions do ------------------------------------------
OUT_CALLS = {
    "softmax": lambda x, o: kernels.softmax(x, out=o),
    "rmsnorm": lambda x, o: kernels.rmsnorm(x, None, 1e-6, out=o),
    "layernorm": lambda x, o: kernels.layernorm(x, out=o),
    "linear_forward": lambda x, o: kernels.linear_forward(x, torch.randn(8, 8), out=o),
}


@pytest.mark.parametrize("op", sorted(OUT_CALLS))
@pytest.mark.parametrize("which", ["out", "input"])
def test_out_with_autograd_raises(op, which):
    x = torch.randn(4, 8, requires_grad=which == "input")
    out = torch.empty(4, 8, requires_grad=which == "out")
    with pytest.raises(RuntimeError, match=r"functions with out=\.\.\. arguments don't support automatic"):
        OUT_CALLS[op](x, out)
    with torch.no_grad():
        assert OUT_CALLS[op](x, out) is out


def test_linear_backward_is_not_differentiable():
    x, w, dy = torch.randn(4, 8, requires_grad=True), torch.randn(3, 8), torch.randn(4, 3)
    with pytest.raises(RuntimeError, match="not differentiable"):
        kernels.linear_backward(x, w, dy)
    with torch.no_grad():
        dx, dw, db = kernels.linear_backward(x, w, dy)
    torch.testing.assert_close(dx, dy @ w)


# ---- opcheck of every custom op ----------------------------------------------------------------------
def _samples():
    g = generator(0)

    def r(*shape, grad=False, pad=0):
        return strided(shape, g, pad=pad).requires_grad_(grad)

    x3, w, b = r(3, 5, 16, grad=True), r(16, grad=True), r(16, grad=True)
    xs = r(6, 13, grad=True, pad=3)  # strided rows
    return [
        ("softmax", ops.softmax, (x3,)), ("softmax_strided", ops.softmax, (xs,)),
        ("rmsnorm", ops.rmsnorm, (x3, w, 1e-6)), ("rmsnorm_noweight", ops.rmsnorm, (xs, None, 1e-5)),
        ("rmsnorm_residual", ops.rmsnorm_residual, (x3, r(3, 5, 16, grad=True), w, 1e-6)),
        ("layernorm", ops.layernorm, (x3, w, b, 1e-5)), ("layernorm_bare", ops.layernorm, (xs, None, None, 1e-5)),
        ("linear", ops.linear, (r(5, 16, grad=True), r(7, 16, grad=True), r(7, grad=True))),
        ("linear_nobias", ops.linear, (r(1, 13, grad=True), r(9, 13, grad=True), None)),
        ("softmax_backward", ops.softmax_backward, (r(4, 16), r(4, 16))),
        ("rmsnorm_backward", ops.rmsnorm_backward, (r(4, 16), r(4).abs(), r(16), r(4, 16), r(4, 16), True)),
        ("rmsnorm_backward_bare", ops.rmsnorm_backward, (r(4, 16), r(4).abs(), None, r(4, 16), None, False)),
        ("layernorm_backward", ops.layernorm_backward, (r(4, 16), r(4), r(4).abs(), r(16), r(4, 16), True, True)),
        ("layernorm_backward_dx", ops.layernorm_backward, (r(4, 16), r(4), r(4).abs(), None, r(4, 16), False, False)),
        ("linear_backward", ops.linear_backward, (r(4, 16), r(8, 16), r(4, 8))),
    ]


@pytest.mark.parametrize("name,op,args", _samples(), ids=[s[0] for s in _samples()])
def test_opcheck(name, op, args):
    torch.library.opcheck(op, args)


# ---- torch.compile ------------------------------------------------------------------------------------
class Block(torch.nn.Module):
    """linear -> LayerNorm -> RMSNorm with a residual -> softmax, every op ours."""

    def __init__(self):
        super().__init__()
        g = generator(1)
        self.w = torch.nn.Parameter(torch.randn(32, 16, generator=g) / 4)
        self.b = torch.nn.Parameter(torch.randn(32, generator=g))
        self.gain = torch.nn.Parameter(torch.randn(32, generator=g) * 0.1 + 1)
        self.shift = torch.nn.Parameter(torch.randn(32, generator=g) * 0.1)

    def forward(self, x):
        h = kernels.linear_forward(x, self.w, self.b)
        h = kernels.layernorm(h, self.gain, self.shift)
        y, h = kernels.rmsnorm(h, self.gain, 1e-6, h)
        return kernels.softmax(y) + h


def test_compile_without_graph_breaks_matches_eager():
    model, x = Block(), torch.randn(8, 16, generator=generator(2))
    explained = torch._dynamo.explain(model)(x)
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = torch.compile(model, fullgraph=True)
    y = compiled(x)
    y.square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    y_eager = model(x)
    y_eager.square().sum().backward()
    torch.testing.assert_close(y, y_eager)
    for g, p in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad)


def test_a_first_call_under_compile_has_no_graph_break():
    """In a fresh process, before any eager call has loaded the native library: a fullgraph compile of a module
    using the ops traces nothing of the library's loading (its lock broke the graph)."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import torch, kernellab.kernels as k\n"
            "def f(x, w, b): return k.softmax(k.layernorm(k.linear_forward(x, w, b), None, None))\n"
            "x, w, b = torch.randn(4, 8), torch.randn(6, 8), torch.randn(6)\n"
            "e = torch._dynamo.explain(f)(x, w, b)\n"
            "assert e.graph_break_count == 0, e.break_reasons\n"
            "torch.testing.assert_close(torch.compile(f, fullgraph=True)(x, w, b), f(x, w, b))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         cwd=Path(__file__).parent)
    assert run.returncode == 0, run.stderr[-3000:]


# ---- float64 gradcheck of the reference path -----------------------------------------------------------
def test_reference_gradients_pass_gradcheck():
    g = generator(3)
    x, r = torch.randn(3, 7, dtype=torch.float64, generator=g), torch.randn(3, 7, dtype=torch.float64, generator=g)
    w, b = torch.randn(7, dtype=torch.float64, generator=g), torch.randn(7, dtype=torch.float64, generator=g)
    leaves = [t.requires_grad_() for t in (x, r, w, b)]
    assert torch.autograd.gradcheck(reference._softmax, (leaves[0],))
    assert torch.autograd.gradcheck(lambda x_, w_, r_: reference._rmsnorm(x_, w_, 1e-6, r_), (x, w, r))
    assert torch.autograd.gradcheck(lambda x_, w_, b_: reference._layernorm(x_, w_, b_, 1e-5), (x, w, b))


# ---- the native gradients against float64 autograd, hypothesis-drawn ------------------------------------
def _rows(shape) -> int:
    return math.prod(shape[:-1])


@settings(deadline=None)
@given(shape=row_shapes(), pad=st.sampled_from([0, 0, 3]), scale=SCALES, special=GRAD_SPECIALS, seed=SEEDS)
def test_softmax_gradient_matches_float64(shape, pad, scale, special, seed):
    g = generator(seed)
    x = strided(shape, g, scale=scale, pad=pad)
    inject(x, special, g)
    dy = strided(shape, g, pad=pad)
    xl = leaf(x)
    (dx,) = torch.autograd.grad(kernels.softmax(xl), xl, dy)
    xt = leaf(x)
    (dx_torch,) = torch.autograd.grad(torch.softmax(xt, -1), xt, dy)
    assert_grad_close(dx, reference.softmax_backward_of_x(x, dy), dx_torch, shape[-1])


@settings(deadline=None)
@given(shape=row_shapes(), pad=st.sampled_from([0, 0, 3]), scale=SCALES, use_weight=st.booleans(),
       use_residual=st.booleans(), eps=st.sampled_from([1e-6, 0.1]), special=GRAD_SPECIALS, seed=SEEDS)
def test_rmsnorm_gradients_match_float64(shape, pad, scale, use_weight, use_residual, eps, special, seed):
    g = generator(seed)
    n = shape[-1]
    x = strided(shape, g, scale=scale, pad=pad)
    inject(x, special, g)
    weight = torch.randn(n, generator=g) * 0.5 + 1.0 if use_weight else None
    residual = strided(shape, g, scale=scale, pad=pad) if use_residual else None
    dy = strided(shape, g, pad=pad)
    dh = strided(shape, g, pad=pad) if use_residual else None
    truth = reference.rmsnorm_backward(x, weight, eps, dy, residual, dh)

    def grads(fn):
        primals = [leaf(t) for t in (x, weight, residual) if t is not None]
        it = iter(primals)
        xl, wl, rl = next(it), (next(it) if use_weight else None), (next(it) if use_residual else None)
        out = fn(xl, wl, rl)
        outputs, cotangents = (out, (dy, dh)) if use_residual else ((out,), (dy,))
        return iter(torch.autograd.grad(outputs, primals, cotangents))

    ours = grads(lambda xl, wl, rl: kernels.rmsnorm(xl, wl, eps, rl))

    def torch_rmsnorm(xl, wl, rl):
        h = xl if rl is None else xl + rl
        y = F.rms_norm(h, (n,), wl, eps)
        return (y, h) if rl is not None else y

    theirs = grads(torch_rmsnorm)
    assert_grad_close(next(ours), truth[0], next(theirs), n)
    if use_weight:
        assert_grad_close(next(ours), truth[1], next(theirs), _rows(shape) * n)
    if use_residual:
        assert_grad_close(next(ours), truth[2], next(theirs), n)


@settings(deadline=None)
@given(shape=row_shapes(), pad=st.sampled_from([0, 0, 3]), scale=SCALES, offset=st.sampled_from([0.0, 1.0, 30.0]),
       use_weight=st.booleans(), use_bias=st.booleans(), special=GRAD_SPECIALS, seed=SEEDS)
def test_layernorm_gradients_match_float64(shape, pad, scale, offset, use_weight, use_bias, special, seed):
    g = generator(seed)
    n = shape[-1]
    x = strided(shape, g, scale=scale, shift=offset * scale, pad=pad)
    inject(x, special, g)
    weight = torch.randn(n, generator=g) * 0.5 + 1.0 if use_weight else None
    bias = torch.randn(n, generator=g) * 0.5 if use_bias else None
    dy = strided(shape, g, pad=pad)
    truth = reference.layernorm_backward(x, weight, bias, 1e-5, dy)
    present = [t for t in (x, weight, bias) if t is not None]
    ours_leaves, torch_leaves = [leaf(t) for t in present], [leaf(t) for t in present]

    def split(leaves):
        it = iter(leaves)
        return next(it), next(it) if use_weight else None, next(it) if use_bias else None

    xl, wl, bl = split(ours_leaves)
    ours = torch.autograd.grad(kernels.layernorm(xl, wl, bl, 1e-5), ours_leaves, dy)
    xt, wt, bt = split(torch_leaves)
    theirs = torch.autograd.grad(F.layer_norm(xt, (n,), wt, bt, 1e-5), torch_leaves, dy)
    truths = [t for t in truth if t is not None]
    reductions = [n] + [_rows(shape) * n] * (len(present) - 1)
    for a, t, f, red in zip(ours, truths, theirs, reductions, strict=True):
        assert_grad_close(a, t, f, red)


LINEAR_SIZES = st.one_of(st.sampled_from([1, 2, 7, 16, 33, 129]), st.integers(1, 80))


@settings(deadline=None)
@given(m=LINEAR_SIZES, k=LINEAR_SIZES, n=LINEAR_SIZES, use_bias=st.booleans(), seed=SEEDS)
def test_linear_gradients_match_float64(m, k, n, use_bias, seed):
    g = generator(seed)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) / math.sqrt(k)
    b = torch.randn(n, generator=g) if use_bias else None
    dy = torch.randn(m, n, generator=g)
    leaves = [leaf(t) for t in (x, w, b) if t is not None]
    grads = torch.autograd.grad(kernels.linear_forward(*leaves, *([] if use_bias else [None])), leaves, dy)
    dx, dw, db = reference.linear_backward(x, w, dy)
    truths = [dx, dw, db][:len(leaves)]
    torch_leaves = [leaf(t) for t in leaves]
    torch_grads = torch.autograd.grad(F.linear(*torch_leaves), torch_leaves, dy)
    for a, t, f, red in zip(grads, truths, torch_grads, (n, m, m), strict=False):
        assert_grad_close(a, t, f, red)


@pytest.mark.parametrize("rows", [1, 3, 200])
def test_backward_kernels_split_rows_across_threads_identically(rows):
    """Many rows take the threaded path (partial per-feature sums per thread): the same truth holds."""
    g = generator(rows)
    x, w, b, dy = torch.randn(rows, 300, generator=g), torch.randn(300, generator=g), torch.randn(300, generator=g), \
        torch.randn(rows, 300, generator=g)
    xl, wl, bl = leaf(x), leaf(w), leaf(b)
    ours = torch.autograd.grad(kernels.layernorm(xl, wl, bl), (xl, wl, bl), dy)
    for a, t in zip(ours, reference.layernorm_backward(x, w, b, 1e-5, dy), strict=True):
        torch.testing.assert_close(a.double(), t, rtol=1e-4, atol=1e-4 * math.sqrt(rows))


# ---- the public backward functions: saved statistics in, gradients into out= buffers ----------------------
def layernorm_dx_error_bound(x64, mean64, rstd32, dy, weight):
    """Per-row absolute error that LayerNorm's dx may carry from statistics saved in fp32: x^ = (x - mean) rstd
    is off by about u rstd |mean| when mean is rounded (u: fp32's unit roundoff), and dx = rstd (g - mean(g) -
    x^ mean(g x^)) carries that times rstd |g|. Where the row's spread is tiny against its mean (rstd |mean|
    large) this outgrows any fixed atol; elsewhere it is below 1e-5."""
    u = 2.0**-24
    rstd = rstd32.double().unsqueeze(-1)
    g = dy.double() * (weight.double() if weight is not None else 1.0)
    xhat = ((x64 - mean64.unsqueeze(-1)) * rstd).abs().amax(-1, keepdim=True)
    gmax = g.abs().amax(-1, keepdim=True)
    n = x64.shape[-1]
    return 8 * u * n * rstd * gmax * (1 + rstd * mean64.abs().unsqueeze(-1) + xhat) + 1e-5


@settings(deadline=None)
@given(shape=row_shapes(), pad=st.sampled_from([0, 0, 3]), use_weight=st.booleans(), seed=SEEDS)
def test_public_backward_functions_match_float64(shape, pad, use_weight, seed):
    g = generator(seed)
    n, rows = shape[-1], _rows(shape)
    x, dy = strided(shape, g, pad=pad), strided(shape, g, pad=pad)
    weight = torch.randn(n, generator=g) + 1.0 if use_weight else None
    unit = torch.ones(n)
    x64 = x.double()
    rstd_rms = torch.rsqrt(x64.pow(2).mean(-1) + 1e-6).float()
    mean = x64.mean(-1)
    rstd_ln = torch.rsqrt((x64 - mean.unsqueeze(-1)).pow(2).mean(-1) + 1e-5).float()

    dx, dweight = kernels.cpu.rmsnorm_backward(x, rstd_rms, dy, weight)
    truth = reference.rmsnorm_backward(x, weight if use_weight else unit, 1e-6, dy)
    torch.testing.assert_close(dx.double(), truth[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dweight.double(), truth[1], rtol=1e-4, atol=1e-5 * math.sqrt(rows))

    out = torch.full((n,), float("nan"))
    dx, dweight, dbias = kernels.cpu.layernorm_backward(x, mean.float(), rstd_ln, dy, weight, dbias=out)
    assert dbias is out
    truth = reference.layernorm_backward(x, weight if use_weight else unit, torch.zeros(n), 1e-5, dy)
    assert_close(dx, truth[0], rtol=1e-4, atol=layernorm_dx_error_bound(x64, mean, rstd_ln, dy, weight))
    for a, t in zip((dweight, dbias), truth[1:], strict=True):
        torch.testing.assert_close(a.double(), t, rtol=1e-4, atol=1e-5 * math.sqrt(rows))

    y = torch.softmax(x, -1)
    torch.testing.assert_close(kernels.cpu.softmax_backward(y, dy).double(), reference.softmax_backward_of_x(x, dy),
                               rtol=1e-4, atol=1e-6)


def test_public_backward_functions_name_bad_arguments():
    x, dy = torch.randn(4, 8), torch.randn(4, 8)
    with pytest.raises(ValueError, match="rstd must have shape"):
        kernels.cpu.rmsnorm_backward(x, torch.ones(4, 1), dy)
    with pytest.raises(ValueError, match="mean must be contiguous"):
        kernels.cpu.layernorm_backward(x, torch.ones(4, 2)[:, 0], torch.ones(4), dy)
    with pytest.raises(ValueError, match="grad_out must have shape"):
        kernels.cpu.softmax_backward(x, torch.randn(4, 9))
    with pytest.raises(TypeError, match="rstd must have dtype"):
        kernels.cpu.rmsnorm_backward(x, torch.ones(4, dtype=torch.float64), dy)
    with pytest.raises(RuntimeError, match="not differentiable"):
        kernels.cpu.softmax_backward(x, dy.requires_grad_())


def test_backward_fast_entries_take_the_common_case_and_decline_the_rest():
    """The library's backward entries run contiguous untracked fp32 arguments of matching shapes, and
    return None (so that the checks in Python name the argument) for anything else: a shape mismatch,
    a tensor autograd must track, an output that overlaps an input."""
    lib = kernels.cpu.library()
    g = generator(11)
    x, dy = torch.randn(5, 24, generator=g), torch.randn(5, 24, generator=g)
    mean, rstd, w = x.mean(-1), torch.rand(5, generator=g) + 0.5, torch.randn(24, generator=g)
    y = torch.softmax(x, -1)

    dx = lib.softmax_backward_fast(y, dy, None)
    torch.testing.assert_close(dx.double(), reference.softmax_backward(y.double(), dy.double()))
    assert lib.softmax_backward_fast(y, dy[:, :23], None) is None
    assert lib.softmax_backward_fast(y, dy, dy) is None  # an output on an input: Python decides

    got = lib.rmsnorm_backward_fast(x, rstd, dy, w, None, None, None)
    want = kernels.cpu.rmsnorm_backward(x.clone(), rstd, dy, w, dx=torch.empty(5, 25)[:, :24])  # the checked path
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    assert lib.rmsnorm_backward_fast(x, rstd[:4], dy, w, None, None, None) is None
    assert lib.rmsnorm_backward_fast(x, rstd, dy, w, None, None, w) is None  # dweight is the weight
    with torch.enable_grad():
        assert lib.rmsnorm_backward_fast(x, rstd, dy.clone().requires_grad_(), w, None, None, None) is None

    got = lib.layernorm_backward_fast(x, mean, rstd, dy, w, None, None, None)
    want = kernels.cpu.layernorm_backward(x, mean, rstd, dy, w, dx=torch.empty(5, 25)[:, :24])
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    assert lib.layernorm_backward_fast(x, mean[:, None], rstd, dy, w, None, None, None) is None
    shared = torch.empty(24)
    assert lib.layernorm_backward_fast(x, mean, rstd, dy, w, None, shared, shared) is None  # dweight is dbias
