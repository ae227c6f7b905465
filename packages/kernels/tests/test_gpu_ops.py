"""GPU property tests of softmax, RMSNorm and LayerNorm against the float64 references: random
shapes (M 1..5000, N 1..20000 incl. primes and N = 1), dtypes, weight dtypes, row strides, base
offsets and scales; fresh inputs per example, NaN-poisoned out buffers, inputs checked unchanged;
the residual variant, -inf / NaN / inf rows, cluster and streamed rows, leading shapes, in-place
calls, streams, CUDA graphs, torch.compile and autograd."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernellab.harness.suites import reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="skipped: no CUDA device")]
if torch.cuda.is_available():
    pytest.importorskip("cutlass", reason="CuTe DSL not installed")
    pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi not installed")

from kernellab.kernels import gpu  # noqa: E402

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}  # rtol = atol, as the harness
NS = (1, 2, 3, 7, 8, 13, 31, 64, 100, 127, 257, 1000, 1024, 1536, 1537, 2048, 3072, 4096, 4099, 6144, 8191,
      8192, 12289, 16384, 16387, 20000)


def check(out, ref, dtype, what=""):
    """|out - ref| <= tol (1 + |ref|) where ref is finite; NaN and inf exactly where ref has them."""
    o, r = out.double(), ref.to(out.device).double()
    tol = TOL[dtype]
    assert o.shape == r.shape, what
    nan, inf = torch.isnan(r), torch.isinf(r)
    assert torch.equal(torch.isnan(o), nan), f"{what}: NaN where the reference has none (or the reverse)"
    assert torch.equal(o[inf], r[inf]), f"{what}: infinities differ"
    fin = ~(nan | inf)
    err = (o[fin] - r[fin]).abs() - tol * (1 + r[fin].abs())
    assert err.numel() == 0 or float(err.max()) <= 0, f"{what}: max excess error {float(err.max()):.3g}"


@st.composite
def matrices(draw, max_elements=6_000_000):
    """(x, description): a (M, N) CUDA tensor, maybe with leading dims, a row stride > N and a base
    pointer off the 16-byte grid, scaled, rounded to its dtype."""
    dtype = draw(st.sampled_from(DTYPES))
    n = draw(st.one_of(st.sampled_from(NS), st.integers(1, 20000)))
    m = draw(st.one_of(st.sampled_from((1, 2, 37, 256)), st.integers(1, 5000)))
    m = max(1, min(m, max_elements // n))
    pad = draw(st.sampled_from((0, 0, 0, 1, 8, 61)))
    offset = draw(st.sampled_from((0, 0, 1, 2, 4)))
    # a shifted row keeps its spread: |mean| >> std would leave fp32 statistics (anyone's) short of 1e-5
    scale, shift = draw(st.sampled_from(((1.0, 0.0), (1.0, 0.0), (1e-3, 0.0), (40.0, 0.0), (1.0, 3.0))))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator(device="cuda").manual_seed(seed)
    base = torch.randn(offset + m * (n + pad), device="cuda", generator=g).mul_(scale).add_(shift).to(dtype)
    x = base[offset:].as_strided((m, n), (n + pad, 1))
    if m % 2 == 0 and pad == 0 and draw(st.booleans()):
        x = x.view(2, m // 2, n)
    return x, f"{tuple(x.shape)} {dtype} stride {x.stride()} offset {offset} scale {scale} seed {seed}"


def vector(x, dtype_choice, seed, scale=0.5, shift=1.0):
    if dtype_choice is None:
        return None
    g = torch.Generator(device="cuda").manual_seed(seed)
    dtype = torch.float32 if dtype_choice == "fp32" else x.dtype
    return (torch.randn(x.shape[-1], device="cuda", generator=g) * scale + shift).to(dtype)


def poisoned(x):
    return torch.full(x.shape, float("nan"), dtype=x.dtype, device=x.device)


def unchanged(before, after):
    return torch.equal(torch.nan_to_num(before, 0.0), torch.nan_to_num(after, 0.0)) and torch.equal(
        torch.isnan(before), torch.isnan(after))


# ---- properties ----------------------------------------------------------------------------------------
@given(matrices(), st.booleans())
def test_softmax(case, use_out):
    x, what = case
    keep = x.clone()
    if use_out:
        out = poisoned(x)
        assert gpu.softmax(x, out=out) is out
    else:
        out = gpu.softmax(x)
    check(out, reference.softmax(x), x.dtype, what)
    assert unchanged(keep, x), "softmax wrote its input"


@given(matrices(), st.sampled_from((None, "x", "fp32")), st.booleans(), st.integers(0, 1000))
def test_rmsnorm(case, wdt, with_residual, seed):
    x, what = case
    w = vector(x, wdt, seed)
    r = None
    if with_residual:
        g = torch.Generator(device="cuda").manual_seed(seed + 1)
        r = torch.randn(x.shape, device="cuda", generator=g).to(x.dtype)
    keep = [t.clone() for t in (x, w, r) if t is not None]
    out, res_out = poisoned(x), poisoned(x) if r is not None else None
    got = gpu.rmsnorm(x, w, 1e-6, r, out=out, residual_out=res_out)
    want_y, want_h = reference.rmsnorm(x, w, 1e-6, r)
    if r is None:
        assert got is out
        check(out, want_y, x.dtype, what)
    else:
        assert got[0] is out and got[1] is res_out
        check(out, want_y, x.dtype, what)
        check(res_out, want_h, x.dtype, what + " (x + residual)")
    assert all(unchanged(a, b) for a, b in zip(keep, [t for t in (x, w, r) if t is not None], strict=True))


@given(matrices(), st.sampled_from((None, "x", "fp32")), st.sampled_from((None, "x", "fp32")), st.integers(0, 1000),
       st.booleans())
def test_layernorm(case, wdt, bdt, seed, use_out):
    x, what = case
    w, b = vector(x, wdt, seed), vector(x, bdt, seed + 1, shift=0.0)
    keep = [t.clone() for t in (x, w, b) if t is not None]
    if use_out:
        out = poisoned(x)
        assert gpu.layernorm(x, w, b, 1e-5, out=out) is out
    else:
        out = gpu.layernorm(x, w, b, 1e-5)
    check(out, reference.layernorm(x, w, b, 1e-5), x.dtype, what)
    assert all(unchanged(a, c) for a, c in zip(keep, [t for t in (x, w, b) if t is not None], strict=True))


@given(st.sampled_from(DTYPES), st.sampled_from((1, 5, 1537, 4096, 40000)), st.integers(0, 2**31 - 1))
def test_special_rows_behave_as_torch(dtype, n, seed):
    """Rows of -inf, rows with a NaN, rows with +inf or -inf among finite values: the same NaN / inf
    pattern as torch's float64 results, the other rows unaffected."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(6, n, device="cuda", generator=g).to(dtype)
    col = int(torch.randint(n, (1,), generator=g, device="cuda"))
    x[0] = float("-inf")
    x[1, col] = float("nan")
    x[2, col] = float("inf")
    x[3, col] = float("-inf")
    x[4] = float("nan")
    check(gpu.softmax(x), reference.softmax(x), dtype, "softmax")
    check(gpu.rmsnorm(x, None, 1e-6), reference.rmsnorm(x, None, 1e-6)[0], dtype, "rmsnorm")
    check(gpu.layernorm(x, None, None, 1e-5), reference.layernorm(x, None, None, 1e-5), dtype, "layernorm")


# ---- long rows, many rows ---------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [16385, 32768, 65537, 131072, 140000, 300001])
@pytest.mark.parametrize("dtype", DTYPES)
def test_long_rows(n, dtype):
    """Rows split over a cluster of CTAs (N <= 131072) and rows streamed in tiles (longer)."""
    g = torch.Generator(device="cuda").manual_seed(n)
    for m in (1, 3):
        x = torch.randn(m, n, device="cuda", generator=g).mul_(2).add_(0.5).to(dtype)
        w = torch.randn(n, device="cuda", generator=g).to(dtype)
        r = torch.randn(m, n, device="cuda", generator=g).to(dtype)
        check(gpu.softmax(x), reference.softmax(x), dtype, f"softmax {m}x{n}")
        y, h = gpu.rmsnorm(x, w, 1e-6, r)
        want_y, want_h = reference.rmsnorm(x, w, 1e-6, r)
        check(y, want_y, dtype, f"rmsnorm {m}x{n}")
        check(h, want_h, dtype, f"rmsnorm residual {m}x{n}")
        check(gpu.layernorm(x, w, w, 1e-5), reference.layernorm(x, w, w, 1e-5), dtype, f"layernorm {m}x{n}")


@pytest.mark.parametrize("shape", [(70000, 1), (65537, 64), (66000, 1000)])
def test_many_rows(shape):
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(shape[1], device="cuda")
    check(gpu.softmax(x), reference.softmax(x), x.dtype, "softmax")
    check(gpu.rmsnorm(x, w), reference.rmsnorm(x, w)[0], x.dtype, "rmsnorm")
    check(gpu.layernorm(x, w, w), reference.layernorm(x, w, w), x.dtype, "layernorm")


# ---- call forms -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1537, 4096, 140000])
def test_in_place(n):
    x = torch.randn(4, n, device="cuda")
    want = reference.softmax(x)
    gpu.softmax(x, out=x)
    check(x, want, x.dtype, "softmax in place")
    x, r = torch.randn(4, n, device="cuda"), torch.randn(4, n, device="cuda")
    want_y, want_h = reference.rmsnorm(x, None, 1e-6, r)
    y, h = gpu.rmsnorm(x, None, 1e-6, r, residual_out=r)  # the residual stream updated in place
    check(y, want_y, x.dtype, "rmsnorm y")
    check(r, want_h, x.dtype, "rmsnorm residual in place")


def test_output_that_is_not_a_row_view():
    x = torch.randn(4, 6, 96, device="cuda")
    out = torch.full((6, 4, 96), float("nan"), device="cuda").transpose(0, 1)  # rows cannot be merged
    gpu.layernorm(x, out=out)
    check(out, reference.layernorm(x), x.dtype, "layernorm into a transposed buffer")


def test_side_stream_and_graph_replay():
    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        gpu.rmsnorm(x, w, out=out)
    stream.synchronize()
    check(out, reference.rmsnorm(x, w)[0], x.dtype, "side stream")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gpu.rmsnorm(x, w, out=out)
    x.copy_(torch.randn_like(x))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check(out, reference.rmsnorm(x, w)[0], x.dtype, "graph replay after the input changed")


def test_torch_compile_treats_ops_as_opaque():
    x = torch.randn(32, 1000, device="cuda")
    w = torch.randn(1000, device="cuda")
    r = torch.randn(32, 1000, device="cuda")

    def f(x, w, r):
        y, h = gpu.rmsnorm(x, w, 1e-6, r)
        return gpu.softmax(y) + gpu.layernorm(h, w, None)

    compiled = torch.compile(f, fullgraph=True)
    torch.testing.assert_close(compiled(x, w, r), f(x, w, r))


@pytest.mark.parametrize("dtype", DTYPES)
def test_autograd(dtype):
    x = torch.randn(8, 300, device="cuda").to(dtype).requires_grad_()
    w = torch.randn(300, device="cuda").requires_grad_()
    b = torch.randn(300, device="cuda").requires_grad_()
    r = torch.randn(8, 300, device="cuda").to(dtype).requires_grad_()
    leaves = (x, w, b, r)
    y, h = gpu.rmsnorm(x, w, 1e-6, r)
    loss = (gpu.softmax(y).float() * 3).sum() + gpu.layernorm(h, w, b).float().square().sum()
    got = torch.autograd.grad(loss, leaves)
    x64, w64, b64, r64 = (t.detach().double().requires_grad_() for t in leaves)
    h64 = x64 + r64
    y64 = h64 * torch.rsqrt(h64.pow(2).mean(-1, keepdim=True) + 1e-6) * w64
    ln = torch.nn.functional.layer_norm(h64.to(dtype).double(), (300,), w64, b64, 1e-5)
    loss64 = (torch.softmax(y64.to(dtype).double(), -1) * 3).sum() + ln.square().sum()
    want = torch.autograd.grad(loss64, (x64, w64, b64, r64))
    tol = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}[dtype]
    for name, a, e in zip("x w b r".split(), got, want, strict=True):
        assert a.dtype == leaves["xwbr".index(name)].dtype, f"d{name} has the wrong dtype"
        rel = float((a.double() - e).norm() / e.norm())
        assert rel < tol, f"d{name}: relative error {rel:.3g}"


def test_fast_path_hands_what_it_cannot_serve_to_the_general_path():
    """Once N's widest function is cached, calls of other classes still get correct results or named errors:
    the compiled function refuses them (before launching) and the general path takes over."""
    n = 3072
    x = torch.randn(64, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    check(gpu.rmsnorm(x, w), reference.rmsnorm(x, w, 1e-6)[0], x.dtype, "widest")  # caches the fast function
    base = torch.randn(64 * n + 1, device="cuda", dtype=torch.bfloat16)
    shifted = base[1:].view(64, n)  # base off the 16-byte grid
    check(gpu.rmsnorm(shifted, w), reference.rmsnorm(shifted, w, 1e-6)[0], x.dtype, "misaligned x")
    w32 = w.float()
    check(gpu.rmsnorm(x, w32), reference.rmsnorm(x, w32, 1e-6)[0], x.dtype, "fp32 weight")
    wide = x.view(2, 32, n)
    check(gpu.rmsnorm(wide, w), reference.rmsnorm(wide, w, 1e-6)[0], x.dtype, "leading dims")
    out = poisoned(x)
    check(gpu.softmax(x, out=out), reference.softmax(x), x.dtype, "softmax out")
    with pytest.raises(TypeError, match="out must have dtype bfloat16"):
        gpu.softmax(x, out=torch.empty(64, n, device="cuda"))
    with pytest.raises(ValueError, match="out must have shape"):
        gpu.softmax(x, out=torch.empty(63, n, device="cuda", dtype=x.dtype))
    with pytest.raises(ValueError, match="x must be a CUDA tensor"):
        gpu.softmax(x.cpu())
    with pytest.raises(ValueError, match="weight must have shape"):
        gpu.rmsnorm(x, w[:-1])
