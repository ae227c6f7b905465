"""GPU backend tests that run without a GPU: argument checks (raised before any GPU work, naming the
argument; CUDA tensors are faked), the alignment classes, the launch plans, the custom ops' fake
implementations, and the backward functions' argument checks."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from kernellab.kernels import gpu
from kernellab.kernels.gpu import compiler, ops
from kernellab.kernels.gpu.compiler import Variant


@pytest.fixture
def fake():
    """Make CUDA tensors without a GPU (metadata only: any GPU work on them would fail)."""
    mode = FakeTensorMode()

    def make(*shape, dtype=torch.float32, device="cuda", stride=None, **kw):
        with mode:
            if stride is not None:
                return torch.empty_strided(shape, stride, dtype=dtype, device=device, **kw)
            return torch.empty(shape, dtype=dtype, device=device, **kw)

    return make


def raises(exc, name, fn, *args, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert name in str(info.value), f"error does not name {name!r}: {info.value}"


@pytest.mark.parametrize("op", [gpu.softmax, gpu.rmsnorm, gpu.layernorm])
def test_cpu_tensor_is_refused_naming_x(op):
    raises(ValueError, "x must be a CUDA tensor", op, torch.randn(4, 8))


@pytest.mark.parametrize("op", [gpu.softmax, gpu.rmsnorm, gpu.layernorm])
def test_non_tensor_and_bad_dtype_name_x(op, fake):
    raises(TypeError, "x must be a torch.Tensor", op, [[1.0, 2.0]])
    raises(TypeError, "x must have dtype", op, fake(4, 8, dtype=torch.float64))
    raises(TypeError, "x must have dtype", op, fake(4, 8, dtype=torch.int32))
    raises(ValueError, "x must have at least 1 dimension", op, fake(dtype=torch.float32))


@pytest.mark.parametrize("op", [gpu.softmax, gpu.rmsnorm, gpu.layernorm])
def test_last_dim_stride_must_be_one(op, fake):
    raises(ValueError, "x must be contiguous in its last dimension", op, fake(4, 8, stride=(1, 4)))


def test_weight_and_bias_checks(fake):
    x = fake(4, 8, dtype=torch.bfloat16)
    raises(ValueError, "weight must have shape (8,)", gpu.rmsnorm, x, fake(7, dtype=torch.bfloat16))
    raises(TypeError, "weight must have dtype in (float32, bfloat16)", gpu.rmsnorm, x, fake(8, dtype=torch.float16))
    raises(TypeError, "weight must have dtype", gpu.layernorm, fake(4, 8), fake(8, dtype=torch.bfloat16))
    raises(ValueError, "weight is on cpu", gpu.rmsnorm, x, torch.ones(8, dtype=torch.bfloat16))
    raises(ValueError, "bias must have shape (8,)", gpu.layernorm, x, None, fake(9, dtype=torch.bfloat16))
    raises(ValueError, "bias must be contiguous", gpu.layernorm, x, None, fake(8, dtype=torch.bfloat16, stride=(2,)))


def test_eps_checks(fake):
    x = fake(4, 8)
    for op in (gpu.rmsnorm, gpu.layernorm):
        raises(ValueError, "eps must be > 0", op, x, None, eps=0.0)
        raises(ValueError, "eps must be > 0", op, x, None, eps=-1e-5)
        raises(ValueError, "eps must be > 0", op, x, None, eps=math.nan)
        raises(TypeError, "eps must be a number", op, x, None, eps="small")


def test_residual_checks(fake):
    x = fake(4, 8, dtype=torch.float16)
    raises(ValueError, "residual must have shape (4, 8)", gpu.rmsnorm, x, None, 1e-6, fake(4, 9, dtype=torch.float16))
    raises(TypeError, "residual must have dtype in (float16)", gpu.rmsnorm, x, None, 1e-6, fake(4, 8))
    raises(ValueError, "residual_out is given but residual is None", gpu.rmsnorm, x,
           residual_out=fake(4, 8, dtype=torch.float16))
    raises(ValueError, "residual_out must have shape", gpu.rmsnorm, x, None, 1e-6, fake(4, 8, dtype=torch.float16),
           residual_out=fake(8, dtype=torch.float16))


def test_out_checks(fake):
    x = fake(4, 8)
    for op in (gpu.softmax, gpu.rmsnorm, gpu.layernorm):
        raises(ValueError, "out must have shape (4, 8)", op, x, out=fake(4, 9))
        raises(TypeError, "out must have dtype float32", op, x, out=fake(4, 8, dtype=torch.bfloat16))
        raises(ValueError, "out must be on cuda", op, x, out=torch.empty(4, 8))
        raises(ValueError, "out must be contiguous in its last dimension", op, x, out=fake(4, 8, stride=(1, 4)))
        raises(ValueError, "out must not overlap itself", op, x, out=fake(4, 8, stride=(0, 1)))


def test_out_refuses_autograd(fake):
    x = fake(4, 8, requires_grad=True)
    raises(RuntimeError, "don't support automatic differentiation", gpu.softmax, x, out=fake(4, 8))


def test_dispatch_sends_cuda_tensors_here(fake):
    from kernellab.kernels import dispatch

    raises(ValueError, "weight must have shape", dispatch.rmsnorm, fake(4, 8), fake(3))


# ---- alignment classes ------------------------------------------------------------------------------
def _vec(torch_kernels, op, x, weight=None, out=None):
    ops._launch(op, x, torch.empty(x.shape, dtype=x.dtype) if out is None else out, weight=weight, eps=1e-6)
    return torch_kernels.calls[-1].vec


def test_vector_width_follows_alignment(torch_kernels):
    def vec(x, out=None):
        return _vec(torch_kernels, "softmax", x, out=out)

    assert vec(torch.empty(3, 4096)) == 4
    assert vec(torch.empty(3, 4096, dtype=torch.bfloat16)) == 8
    assert vec(torch.empty(3, 1537)) == 1
    assert vec(torch.empty(3, 1538)) == 2
    assert vec(torch.empty(3, 4100)[:, :4096]) == 4  # row stride 4100: 16-byte rows still
    assert vec(torch.empty(3, 4098)[:, :4096]) == 2  # row stride 4098 fp32: 8-byte rows
    assert vec(torch.empty(3 * 4096 + 1)[1:].view(3, 4096)) == 1  # base pointer off by one element
    assert vec(torch.empty(3, 4096), out=torch.empty(3 * 4096 + 2)[2:].view(3, 4096)) == 2  # out's base
    assert vec(torch.empty(3, 12, dtype=torch.float16)) == 4
    assert vec(torch.empty(1, 8)) == 4


def test_vector_width_respects_weights(torch_kernels):
    x = torch.empty(3, 64, dtype=torch.bfloat16)
    assert _vec(torch_kernels, "rmsnorm", x, torch.empty(64)) == 8  # 8 fp32 weights: two 16-byte loads
    assert _vec(torch_kernels, "rmsnorm", x, torch.empty(66)[2:]) == 2  # weight base 8-byte aligned
    assert _vec(torch_kernels, "rmsnorm", x, torch.empty(65)[1:]) == 1  # weight base 4-byte aligned
    assert _vec(torch_kernels, "rmsnorm", x, torch.empty(66, dtype=torch.bfloat16)[2:]) == 2


# ---- launch plans -----------------------------------------------------------------------------------
PLAN_NS = [1, 2, 3, 7, 8, 20, 31, 64, 100, 127, 1000, 1024, 1537, 3072, 4096, 6144, 8192, 8191, 12345, 16384,
           16385, 20000, 32768, 40000, 65536, 65537, 131072, 140000, 300000, 1 << 20]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_launch_plans(dtype):
    pytest.importorskip("cutlass")
    width = 32 if dtype == "float32" else 16
    for n in PLAN_NS:
        for vec in (v for v in (1, 2, 4, 8) if v * width <= 128 and n % v == 0):
            k = Variant("softmax", dtype, n, vec).kernel()
            tpr, span = k.threads_per_row, k.tiles * k.tile_cols
            assert tpr & (tpr - 1) == 0 and tpr <= 512, (n, vec, k.describe())
            assert k.num_threads % 32 == 0 and k.num_threads == k.rows_per_cta * tpr
            assert 1 <= k.ctas <= 8
            assert k.ctas * span >= n and (k.ctas - 1) * span < n, "a CTA of the cluster without columns"
            assert k.even == (k.ctas * span == n)
            assert (k.tiles > 1) == (n > 8 * 512 * 32), "stream only rows a cluster's registers cannot hold"
            if k.tiles == 1:
                assert k.values_per_thread <= 32, "a row held in registers must fit them"


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_backward_plans_hold_long_rows_in_a_cluster(dtype):
    """A backward row past one CTA's values (16 a thread in up to 512 threads; a 16-bit norm row from
    WIDE_BACKWARD_N columns, 32 a thread in up to 256) is split over a cluster of CTAs that holds it (each element
    read once); past a cluster of 8, it is streamed on one CTA."""
    pytest.importorskip("cutlass")
    from kernellab.kernels.gpu.base import WIDE_BACKWARD_N

    width = 32 if dtype == "float32" else 16
    for n in PLAN_NS:
        for vec in (v for v in (1, 2, 4, 8) if v * width <= 128 and n % v == 0):
            for op in ("softmax_backward", "rmsnorm_backward", "layernorm_backward"):
                k = Variant(op, dtype, n, vec).kernel()
                span = k.tiles * k.tile_cols
                assert k.ctas * span >= n and (k.ctas - 1) * span < n, "a CTA of the cluster without columns"
                wide = op != "softmax_backward" and width == 16 and n >= WIDE_BACKWARD_N and k.tiles == 1
                assert k.values_per_thread <= (32 if wide else 16), (op, n, vec, k.describe())
                assert k.threads_per_row <= (256 if wide else 512), (op, n, vec, k.describe())
                assert (k.ctas > 1) == (8 * 1024 < n <= 64 * 1024), (op, n, vec, k.describe())
                assert (k.tiles > 1) == (n > 64 * 1024), (op, n, vec, k.describe())


def test_plans_of_the_suite_shapes():
    pytest.importorskip("cutlass")
    plan = {n: Variant("rmsnorm", "bfloat16", n, 8).kernel().describe() for n in (1024, 3072, 4096, 16384)}
    assert plan[3072]["threads_per_row"] == 128 and plan[3072]["chunks"] == 3
    assert plan[16384]["cluster"] == 1 and plan[16384]["tiles"] == 1
    wide = Variant("layernorm", "float32", 65536, 4).kernel()
    assert wide.ctas == 4 and wide.tiles == 1  # a cluster of 4 CTAs holds the row in registers
    streamed = Variant("softmax", "float32", 1 << 20, 4).kernel()
    assert streamed.ctas == 8 and streamed.tiles > 1


@pytest.mark.parametrize("cap", [64, 128, 256])
def test_a_capped_cta_splits_the_row_over_more_ctas(cap):
    """Tuning.max_threads_per_row caps a CTA's share of a row; what no longer fits goes to more CTAs of a
    cluster, every one with columns, and the variant's name says so (its cubin is another file)."""
    pytest.importorskip("cutlass")
    from kernellab.kernels.gpu.base import BACKWARD, Tuning

    tuning = dataclasses.replace(BACKWARD, max_threads_per_row=cap)
    for n, dtype in ((8192, "bfloat16"), (16384, "bfloat16"), (12289, "float32"), (6144, "float16")):
        vec = compiler.widest_vector(n, dtype)
        full = Variant("rmsnorm_backward", dtype, n, vec).kernel()
        capped = Variant("rmsnorm_backward", dtype, n, vec, weight=dtype, tuning=tuning)
        k = capped.kernel()
        span = k.tiles * k.tile_cols
        assert k.threads_per_row <= cap and k.ctas * span >= n and (k.ctas - 1) * span < n, k.describe()
        assert k.ctas * k.tiles >= full.ctas * full.tiles, (k.describe(), full.describe())
        assert f"-p{cap}" in capped.name
    assert "-p" not in Variant("softmax", "float32", 64, 4, tuning=Tuning()).name.split("_t", 1)[1]
    for bad in (0, 48, 2048):
        with pytest.raises(ValueError, match="max_threads_per_row"):
            Variant("softmax", "float32", 4096, 4, tuning=Tuning(max_threads_per_row=bad)).kernel()


def test_variant_validation():
    with pytest.raises(ValueError, match="unknown op"):
        Variant("gelu", "float32", 8, 4)
    with pytest.raises(ValueError, match="vector width"):
        Variant("softmax", "float32", 6, 4)
    with pytest.raises(ValueError, match="vector width"):
        Variant("softmax", "bfloat16", 16, 16)
    with pytest.raises(ValueError, match="unsupported dtype"):
        Variant("rmsnorm", "float32", 8, 4, weight="float64")


# ---- custom ops ------------------------------------------------------------------------------------
def test_custom_ops_have_fake_implementations(fake):
    x, r, w = fake(2, 3, 8, dtype=torch.bfloat16), fake(2, 3, 8, dtype=torch.bfloat16), fake(8)
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        x, r, w = (mode.from_tensor(t) for t in (x, r, w))
        assert torch.ops.kernellab.softmax(x).shape == x.shape
        y, h, rstd = torch.ops.kernellab.rmsnorm_residual(x, r, w, 1e-6)
        assert y.shape == h.shape == x.shape and y.dtype == h.dtype == x.dtype
        assert rstd.shape == x.shape[:-1] and rstd.dtype == torch.float32
        y, rstd = torch.ops.kernellab.rmsnorm(x, None, 1e-6)
        assert y.shape == x.shape and rstd.shape == x.shape[:-1]
        y, mean, rstd = torch.ops.kernellab.layernorm(x, w, None, 1e-5)
        assert y.shape == x.shape and mean.shape == rstd.shape == x.shape[:-1] and mean.dtype == torch.float32
        torch.ops.kernellab.softmax_out(x, torch.empty_like(x))
        assert torch.ops.kernellab.softmax_backward(x, x).shape == x.shape
        dx, dw = torch.ops.kernellab.rmsnorm_backward(x, w, x, rstd, None)
        assert dx.shape == x.shape and dw.shape == w.shape and dw.dtype == w.dtype
        dx, dw, db = torch.ops.kernellab.layernorm_backward(x, None, x, mean, rstd, w)
        assert dw.numel() == 0 and db.shape == w.shape


# ---- backward arguments ------------------------------------------------------------------------------
def test_backward_arguments_are_refused_by_name(fake):
    x, rstd = fake(4, 64), fake(4)
    raises(ValueError, "dy", gpu.rmsnorm_backward, x, None, fake(3, 64), rstd)
    raises(TypeError, "dy", gpu.rmsnorm_backward, x, None, fake(4, 64, dtype=torch.float16), rstd)
    raises(ValueError, "rstd", gpu.rmsnorm_backward, x, None, x, fake(4, 1))
    raises(TypeError, "rstd", gpu.rmsnorm_backward, x, None, x, fake(4, dtype=torch.float64))
    raises(ValueError, "weight", gpu.rmsnorm_backward, x, fake(63), x, rstd)
    raises(ValueError, "dh", gpu.rmsnorm_backward, x, None, x, rstd, dh=fake(4, 65))
    raises(ValueError, "mean", gpu.layernorm_backward, x, None, x, fake(5), rstd)
    raises(ValueError, "y", gpu.softmax_backward, torch.randn(4, 64), torch.randn(4, 64))
    raises(TypeError, "dy", gpu.softmax_backward, x, "dy")


# ---- the host side of a launch, with the compiled function replaced by torch -----------------------------
def _torch_kernel(variant):
    """A stand-in for a compiled variant, with its argument order, computing with torch."""

    def run(*args):
        if variant.op == "softmax":
            x, y = args
            y.copy_(torch.softmax(x.double(), -1))
        elif variant.op == "rmsnorm":
            x, w, r, y, h, rstd, eps = args  # the compiled functions' arity: rstd is None unless stats
            assert (rstd is not None) == variant.stats
            hh = x.double() if r is None else x.double() + r.double()
            if h is not None:
                h.copy_(hh)
            inv = torch.rsqrt(hh.pow(2).mean(-1, keepdim=True) + eps)
            y.copy_(hh * inv if w is None else hh * inv * w.double())
            if rstd is not None:
                rstd.copy_(inv.squeeze(-1))
        elif variant.op == "layernorm":
            x, w, b, y, mean, rstd, eps = args
            assert (rstd is not None) == (mean is not None) == variant.stats
            y.copy_(torch.nn.functional.layer_norm(x.double(), (x.shape[-1],), None if w is None else w.double(),
                                                   None if b is None else b.double(), eps))
        elif variant.op == "softmax_backward":
            y, dy, dx = args
            yd, g = y.double(), dy.double()
            dx.copy_(yd * (g - (g * yd).sum(-1, keepdim=True)))
        else:
            _torch_norm_backward(variant, *args)

    return run


def _torch_norm_backward(variant, x, w, dy, *rest):
    """The norm backwards' stand-in: dx, and each row's vector-gradient terms added into the partials row of
    the CTA (grid-strided over row blocks) and thread row that the kernel would give it; then the partials
    summed into each vector gradient in its dtype, as the grid does after its barrier."""
    if variant.op == "rmsnorm_backward":
        rstd, dh, dx, pw, dw, sync, grid = rest
        mean, pb, db = None, None, None
    else:
        mean, rstd, dx, pw, pb, dw, db, sync, grid = rest
        dh = None
    assert (sync is not None) == (pw is not None or pb is not None)
    if sync is not None:
        assert sync.shape == (1,) and sync.dtype == torch.int32, "the barrier's one word"
        assert not sync.item() & 0x7FFFFFFF, "its low 31 bits are zero between barriers"
    rows = torch.arange(x.shape[0])
    xhat = (x.double() - (0 if mean is None else mean.double()[:, None])) * rstd.double()[:, None]
    g = dy.double() * (1 if w is None else w.double())
    n = x.shape[1]
    if mean is None:
        d = rstd.double()[:, None] * (g - xhat * (g * xhat).sum(-1, keepdim=True) / n)
    else:
        d = rstd.double()[:, None] * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    dx.copy_(d if dh is None else d + dh.double())
    for partials, out, terms in ((pw, dw, dy.double() * xhat), (pb, db, dy.double())):
        if partials is not None:
            per_cta = partials.shape[0] // grid
            slot = (rows // per_cta) % grid * per_cta + rows % per_cta
            partials.zero_().index_add_(0, slot, terms.float())
            out.copy_(partials.sum(0))


@pytest.fixture
def torch_kernels(monkeypatch):
    """Replace compiling with torch stand-ins; records the variant of every call and every compile."""
    seen = SimpleNamespace(calls=[], compiles=[])

    def compiled(variant):
        seen.compiles.append(variant)
        kernel = _torch_kernel(variant)

        def call(*args):
            seen.calls.append(variant)
            kernel(*args)

        return call

    monkeypatch.setattr(compiler, "compiled", compiled)
    monkeypatch.setattr(ops, "_FUNCTIONS", {})
    monkeypatch.setattr(ops, "_FAST", {})
    monkeypatch.setattr(ops, "_GRADS", {})
    monkeypatch.setattr(ops, "_GRAD_LAUNCHES", {})
    monkeypatch.setattr(ops, "wave", lambda variant, sms: (2, 3))  # 2 rows per CTA, 3 CTAs per wave
    monkeypatch.setattr(ops, "_grid_sync", lambda device: torch.zeros(1, dtype=torch.int32, device=device))
    return seen


def test_only_the_widest_class_joins_the_fast_path(torch_kernels):
    ops._launch("softmax", torch.empty(3 * 4096 + 1)[1:].view(3, 4096), torch.empty(3, 4096))  # vec 1
    assert ("softmax", torch.float32, 4096, None, None, False) not in ops._FAST
    ops._launch("rmsnorm", torch.empty(3, 4096), torch.empty(3, 4096), weight=torch.empty(4096), eps=1e-6)
    assert ops._FAST[("rmsnorm", torch.float32, 4096, torch.float32, None, False)] is ops._FUNCTIONS[
        ("rmsnorm", torch.float32, 4096, 16, torch.float32, None, False, False)]
    x, r = torch.empty(3, 4096), torch.empty(3, 4096)
    ops._launch("rmsnorm", x, torch.empty_like(x), residual=r, h=torch.empty_like(x), eps=1e-6)
    assert not [k for k in ops._FAST if k[3] is None and k[0] == "rmsnorm"], "residual calls have no fast path"


def _plans(fn):
    """A cache entry whose one plan is fn (no denser plan)."""
    return SimpleNamespace(for_rows=lambda m: fn)


def test_fast_path_calls_the_cached_function_and_falls_back_on_its_refusal(monkeypatch):
    """The fast path calls the cached function directly. The compiled function checks dtypes, N, rows,
    device and alignment itself and raises TypeError / ValueError before launching; the call then takes the
    general path, whose checks name the argument."""
    key = ("softmax", torch.float32, 8, None, None, False)
    seen = []
    monkeypatch.setattr(ops, "_FAST", {key: _plans(lambda x, y: seen.append((x, y)))})
    x = torch.randn(4, 8)
    y = gpu.softmax(x)
    assert len(seen) == 1 and seen[0][0] is x and seen[0][1] is y
    assert y.shape == x.shape and y.dtype == x.dtype and y.is_contiguous()
    out = torch.empty(4, 8)
    assert gpu.softmax(x, out=out) is out and seen[-1][1] is out

    def refusing(*args):
        raise ValueError("Mismatched Tensor on argument #0, expected device_type=cuda")

    monkeypatch.setattr(ops, "_FAST", {key: _plans(refusing)})
    raises(ValueError, "x must be a CUDA tensor", gpu.softmax, x)
    raises(ValueError, "x must be a CUDA tensor", gpu.softmax, x, out=out)

    def launch_failure(*args):
        raise RuntimeError("CUDA Error Code: 700")

    monkeypatch.setattr(ops, "_FAST", {key: _plans(launch_failure)})
    with pytest.raises(RuntimeError, match="700"):  # a failed launch is not retried on the general path
        gpu.softmax(x)


def test_fast_path_is_not_taken_where_the_function_cannot_check(monkeypatch):
    def never(*args):
        raise AssertionError("fast path taken")

    keys = [("softmax", torch.float32, 8, None, None, False), ("rmsnorm", torch.float32, 8, torch.float32, None, False)]
    monkeypatch.setattr(ops, "_FAST", dict.fromkeys(keys, _plans(never)))
    x = torch.randn(4, 8)
    refused = "x must be a CUDA tensor"
    raises(ValueError, refused, gpu.softmax, torch.randn(4, 8, requires_grad=True))  # autograd
    raises(ValueError, refused, gpu.softmax, x, out=torch.empty(4, 16)[:, ::2])  # output rows not contiguous
    raises(ValueError, refused, gpu.softmax, x, out=torch.empty(1, 8).expand(4, 8))  # overlapping rows
    raises(ValueError, refused, gpu.softmax, torch.randn(0, 8))  # nothing to launch
    raises(ValueError, refused, gpu.rmsnorm, x, torch.ones(8, requires_grad=True))  # autograd through weight
    raises(ValueError, refused, gpu.rmsnorm, x, torch.ones(8), 1e-6, torch.randn(4, 8))  # residual


def test_launch_rows_views_and_alignment_classes(torch_kernels):
    from kernellab.harness.suites import reference

    x = torch.randn(2, 3, 96)
    out = torch.full((3, 2, 96), math.nan).transpose(0, 1)  # leading dims cannot merge: copied back
    ops._launch("softmax", x, out)
    torch.testing.assert_close(out, reference.softmax(x).float())
    assert torch_kernels.calls[-1] == Variant("softmax", "float32", 96, 4)

    x, r, w = torch.randn(5, 1537, dtype=torch.bfloat16), torch.randn(5, 1537, dtype=torch.bfloat16), torch.randn(1537)
    y, h = torch.empty_like(x), torch.empty_like(x)
    ops._launch("rmsnorm", x, y, weight=w, residual=r, h=h, eps=1e-6)
    want_y, want_h = reference.rmsnorm(x, w, 1e-6, r)
    torch.testing.assert_close(y.double(), want_y, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(h.double(), want_h, rtol=2e-2, atol=2e-2)
    assert torch_kernels.calls[-1] == Variant("rmsnorm", "bfloat16", 1537, 1, weight="float32", residual=True)

    x = torch.randn(4, 1030, dtype=torch.float16)[:, 6:1030]  # 12-byte base offset, row stride 1030
    ops._launch("layernorm", x, torch.empty(4, 1024, dtype=torch.float16), eps=1e-5)
    assert torch_kernels.calls[-1] == Variant("layernorm", "float16", 1024, 2)
    compiles = len(torch_kernels.compiles)
    ops._launch("layernorm", x, torch.empty(4, 1024, dtype=torch.float16), eps=1e-5)
    assert len(torch_kernels.compiles) == compiles, "a variant is compiled once"

    column = torch.randn(1, 5).t()  # N = 1 with last-dim stride 5 (and row stride 1)
    out = torch.full((5, 1), math.nan)
    ops._launch("softmax", column, out)
    assert torch.equal(out, torch.ones(5, 1)) and torch_kernels.calls[-1] == Variant("softmax", "float32", 1, 1)


def _grads64(forward, inputs, dy):
    leaves = [None if t is None else t.detach().double().requires_grad_() for t in inputs]
    found = iter(torch.autograd.grad(forward(*leaves), [t for t in leaves if t is not None], dy.double()))
    return [None if t is None else next(found) for t in leaves]


def test_backward_host_side_views_grids_and_partials(torch_kernels):
    """Leading dims, an expanded and a transposed dy, the persistent grid (3 CTAs over 7 row blocks), the
    partials and the gradients' dtypes, with the kernels replaced by torch."""
    from kernellab.harness.suites import reference

    x = torch.randn(2, 7, 40)
    w, b = torch.randn(40) + 1, torch.randn(40)
    xf = x.reshape(-1, 40)
    mean = xf.mean(-1).view(2, 7)
    rstd = torch.rsqrt((x - mean[..., None]).pow(2).mean(-1) + 1e-5)
    for dy in (torch.randn(40).expand(2, 7, 40), torch.randn(2, 40, 7).transpose(1, 2)):
        dx, dw, db = ops._grad_launch("layernorm_backward", x, dy, weight=w, mean=mean, rstd=rstd,
                                      dbias=torch.float32)
        want = _grads64(lambda a, c, d: reference.layernorm(a, c, d, 1e-5), (x, w, b), dy)
        for got, e in zip((dx, dw, db), want, strict=True):
            torch.testing.assert_close(got.double(), e, rtol=1e-4, atol=1e-4)
        assert dx.shape == x.shape and dx.is_contiguous()
    assert torch_kernels.calls[-1] == Variant("layernorm_backward", "float32", 40, 4, weight="float32",
                                              bias="float32")
    rstd = torch.rsqrt(x.pow(2).mean(-1) + 1e-6)
    dy, dh = torch.randn(2, 7, 40), torch.randn(2, 7, 40)
    dx, dw, db = ops._grad_launch("rmsnorm_backward", x, dy, weight=None, dh=dh, rstd=rstd)
    (want,) = _grads64(lambda a: reference.rmsnorm(a, None, 1e-6)[0], (x,), dy)
    torch.testing.assert_close(dx.double(), want + dh.double(), rtol=1e-4, atol=1e-4)
    assert dw is None and db is None
    assert torch_kernels.calls[-1] == Variant("rmsnorm_backward", "float32", 40, 4, residual=True)
    y = torch.softmax(torch.randn(5, 1), -1)
    dx, _, _ = ops._grad_launch("softmax_backward", y, torch.randn(5, 1))
    assert torch.equal(dx, torch.zeros(5, 1))  # softmax over one column: y = 1, dx = 0
    assert torch_kernels.calls[-1] == Variant("softmax_backward", "float32", 1, 1)


def test_backward_of_no_rows_gives_zero_vector_gradients(torch_kernels):
    x = torch.empty(0, 16)
    dx, dw, db = ops._grad_launch("layernorm_backward", x, x, weight=torch.ones(16), mean=torch.empty(0),
                                  rstd=torch.empty(0), dbias=torch.float32)
    assert dx.shape == (0, 16) and torch.equal(dw, torch.zeros(16)) and torch.equal(db, torch.zeros(16))
    assert not torch_kernels.calls, "nothing to launch"


@pytest.mark.parametrize("op", ["softmax", "rmsnorm", "layernorm"])
def test_autograd_forward_calls_the_widest_class_function_directly(torch_kernels, monkeypatch, op):
    """Under autograd the forward's first call takes the general path, which caches the widest class's function
    (with the row statistics for the norms); later calls of that class call it directly, parameters included,
    and one it refuses (a narrower class) goes back to the general path. Every result is the float64 truth's."""
    from kernellab.harness.suites import reference

    n = 64
    w = torch.nn.Parameter(torch.randn(n) + 1)
    b = torch.nn.Parameter(torch.randn(n))
    function = {"softmax": lambda x: ops._SoftmaxFunction.apply(x),
                "rmsnorm": lambda x: ops._RMSNormFunction.apply(x, w, 1e-6),
                "layernorm": lambda x: ops._LayerNormFunction.apply(x, w, b, 1e-5)}[op]
    truth = {"softmax": lambda x: reference.softmax(x),
             "rmsnorm": lambda x: reference.rmsnorm(x, w.detach(), 1e-6)[0],
             "layernorm": lambda x: reference.layernorm(x, w.detach(), b.detach(), 1e-5)}[op]
    general = []
    launch = ops._launch
    monkeypatch.setattr(ops, "_launch", lambda *a, **k: (general.append(a[0]), launch(*a, **k)))

    def forward(x):
        y = function(x)
        torch.testing.assert_close(y.double(), truth(x.detach()).double(), rtol=1e-5, atol=1e-5)
        return y

    forward(torch.randn(5, n, requires_grad=True))
    assert general == [op], "the first call compiles through the general path"
    stats = op != "softmax"
    key = (op, torch.float32, n, None if op == "softmax" else torch.float32,
           torch.float32 if op == "layernorm" else None, stats)
    assert key in ops._FAST
    y = forward(torch.randn(7, n, requires_grad=True))
    assert general == [op], "the second call of the widest class skips the general path"
    assert torch_kernels.calls[-1].stats == stats and y.requires_grad

    def refusing(*args):  # the compiled function's own check of a narrower class's call
        raise ValueError("Mismatched alignment on argument #0")

    monkeypatch.setitem(ops._FAST, key, _plans(refusing))
    forward(torch.randn(3, n + 1, requires_grad=True)[:, 1:])  # a 4-byte base offset: a narrower class
    assert general == [op, op], "the cached function refused it: the general path launched"
    assert torch_kernels.calls[-1].vec == 1


def test_backward_launch_plan_is_kept_per_call_shape(torch_kernels, monkeypatch):
    """The variant and the grid of a backward call are worked out once per shape and alignment class: a second
    call of the same shape runs the kept plan (same results), another row count works out its own, and the
    kept plans are cleared once there are _GRAD_LAUNCHES_MOST of them."""
    w = torch.randn(40) + 1

    def backward(m):
        x, dy = torch.randn(m, 40), torch.randn(m, 40)
        return x, dy, ops._grad_launch("rmsnorm_backward", x, dy, weight=w, rstd=torch.rsqrt(x.pow(2).mean(-1)))

    monkeypatch.setattr(ops, "_GRAD_LAUNCHES_MOST", 2)
    x, dy, first = backward(9)
    assert len(ops._GRAD_LAUNCHES) == 1
    rule = ops.vector_gradient_launch

    def grid_rule_once(*args):
        raise AssertionError("the grid worked out again")

    monkeypatch.setattr(ops, "vector_gradient_launch", grid_rule_once)
    again = ops._grad_launch("rmsnorm_backward", x, dy, weight=w, rstd=torch.rsqrt(x.pow(2).mean(-1)))
    for a, b in zip(first[:2], again[:2], strict=True):
        assert torch.equal(a, b)
    with pytest.raises(AssertionError, match="worked out again"):  # 10 rows: a plan of its own
        backward(10)
    monkeypatch.setattr(ops, "vector_gradient_launch", rule)
    backward(10)
    assert len(ops._GRAD_LAUNCHES) == 2
    backward(11)  # past the limit: cleared, then this call's plan kept
    assert len(ops._GRAD_LAUNCHES) == 1


def test_grid_barrier_word_view_is_made_once_per_stream(monkeypatch):
    """The word of a (device, stream) pair is the same view on every call: indexing the table again costs host
    time; a second stream gets a word of its own slot."""
    table = torch.zeros(ops._SYNC_SLOTS, ops._SYNC_SECTOR, dtype=torch.int32)
    monkeypatch.setattr(ops, "_SYNC", {0: table})
    monkeypatch.setattr(ops, "_SYNC_WORD", {})
    streams = iter([11, 11, 22])
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: next(streams), raising=False)
    device = SimpleNamespace(index=0)
    first, second, other = (ops._grid_sync(device) for _ in range(3))
    assert first is second, "the same view, not a new one a call"
    assert first.storage_offset() == 0 and other.storage_offset() == ops._SYNC_SECTOR
    assert first.shape == (1,) and first.data_ptr() == table.data_ptr()
