"""The GPU backend's public functions and their torch custom ops.

Every argument is checked before any GPU work. The eager path calls the compiled TVM-FFI function
directly (a dict lookup and the call: host cost close to a bare launch); under torch.compile, or
when autograd needs a graph, calls go through the custom ops ``kernellab::*``, which torch.compile
treats as opaque (their fake implementations give the output shapes). Backward passes are plain
torch ops in fp32 (correct, not yet CuTe kernels).
"""

from __future__ import annotations

import torch

from .. import checks
from .compiler import Plans, Variant

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_NAME = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


# ---- argument checks (no GPU work) ---------------------------------------------------------------
def _check_x(x) -> None:
    checks.tensor("x", x)
    checks.device_is("x", x, "cuda")
    checks.dtype_in("x", x, FLOATS)
    checks.ndim_at_least("x", x, 1)
    checks.unit_last_stride("x", x)


def _check_vector(name: str, v, x) -> None:
    """weight / bias: (N,), fp32 or x's dtype, on x's device, unit stride."""
    checks.tensor(name, v)
    checks.same_device(name, v, "x", x)
    checks.dtype_in(name, v, (torch.float32,) if x.dtype == torch.float32 else (torch.float32, x.dtype))
    checks.shape_is(name, v, (x.shape[-1],))
    checks.unit_last_stride(name, v)


def _check_like_x(name: str, t, x) -> None:
    """residual: x's shape, dtype and device, unit last stride."""
    checks.tensor(name, t)
    checks.same_device(name, t, "x", x)
    checks.dtype_in(name, t, (x.dtype,))
    checks.shape_is(name, t, x.shape)
    checks.unit_last_stride(name, t)


def _check_out(name: str, out, x) -> None:
    checks.out_buffer(name, out, x.shape, x.dtype, x.device)
    checks.unit_last_stride(name, out)
    checks.rows_do_not_overlap(name, out)


def _needs_autograd(*tensors) -> bool:
    if torch.is_grad_enabled():
        for t in tensors:
            if t is not None and t.requires_grad:
                return True
    return False


def _no_autograd_with_out(op: str, *tensors) -> None:
    if _needs_autograd(*tensors):
        raise RuntimeError(f"{op}(): functions with out=... arguments don't support automatic differentiation, "
                           "but one of the arguments requires grad")


# ---- launches --------------------------------------------------------------------------------------
# The alignment class of a call is the largest power of two (<= 16 bytes) dividing N * element size,
# every row stride in bytes and every base pointer; an (N,) vector whose base is less aligned narrows it
# in proportion to its element size. It picks the vector width: vec = alignment / element size.
_FUNCTIONS: dict[tuple, Plans] = {}  # (op, dtypes, N, alignment, residual) -> its compiled plans
_FAST: dict[tuple, Plans] = {}  # (op, x dtype, N, weight dtype, bias dtype) -> plans of N's widest class
_SMS: dict[int, int] = {}  # device index -> SM count


def _matrix_bits(t, elem: int) -> int:
    return t.data_ptr() | t.stride(0) * elem


def _vector_bits(v, elem: int) -> int:
    low = v.data_ptr() & 15
    return low * elem // v.element_size() if low else 0


def _sms(x) -> int:
    """The SM count of x's GPU (0 off CUDA): the width of a wave of resident CTAs."""
    if not x.is_cuda:
        return 0
    index = x.get_device()
    if index not in _SMS:
        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SMS[index]


def _function(op: str, x, n: int, bits: int, weight, bias, residual: bool):
    wdt = None if weight is None else weight.dtype
    bdt = None if bias is None else bias.dtype
    key = (op, x.dtype, n, bits & -bits, wdt, bdt, residual)
    plans = _FUNCTIONS.get(key)
    if plans is None:
        vec = (bits & -bits) // x.element_size()
        variant = Variant(op, _NAME[x.dtype], n, vec, weight=_NAME.get(wdt), bias=_NAME.get(bdt), residual=residual)
        plans = _FUNCTIONS[key] = Plans(variant, _sms(x))
        widest = n * x.element_size() | 16
        if not residual and bits & -bits == widest & -widest:
            _FAST[(op, x.dtype, n, wdt, bdt)] = plans
    return plans.for_rows(x.shape[0])


def _run(op: str, x, y, weight=None, bias=None, residual=None, h=None, eps=None) -> None:
    """One kernel over 2-D rows: y = op(x [+ residual]) (and h = x + residual for rmsnorm)."""
    m, n = x.shape
    if m == 0 or n == 0:
        return
    if n == 1:  # a size-1 last dimension may carry any stride; the kernels are compiled for stride 1
        x, y, residual, h = (t if t is None else t.as_strided(t.shape, (t.stride(0), 1)) for t in (x, y, residual, h))
    e = x.element_size()
    bits = n * e | 16 | _matrix_bits(x, e) | _matrix_bits(y, e)
    if residual is not None:
        bits |= _matrix_bits(residual, e) | _matrix_bits(h, e)
    _call(op, x, y, weight, bias, residual, h, eps, bits)


def _call(op: str, x, y, weight, bias, residual, h, eps, bits: int) -> None:
    """The compiled function of the call's alignment class (``bits`` of the rows, narrowed here by the
    vectors), called."""
    e = x.element_size()
    if weight is not None:
        bits |= _vector_bits(weight, e)
    if bias is not None:
        bits |= _vector_bits(bias, e)
    fn = _function(op, x, x.shape[1], bits, weight, bias, residual is not None)
    if op == "softmax":
        fn(x, y)
    elif op == "rmsnorm":
        fn(x, weight, residual, y, h, eps)
    else:
        fn(x, weight, bias, y, eps)


def _launch(op: str, x, y, weight=None, bias=None, residual=None, h=None, eps=None) -> None:
    """_run on any leading shape: x and residual viewed (or copied) as (M, N) rows; an output that
    cannot be viewed as rows is computed into a fresh buffer and copied back."""
    if x.dim() == 2 and y.dim() == 2 and (h is None or h.dim() == 2):
        return _run(op, x, y, weight, bias, residual, h, eps)
    n = x.shape[-1]
    rows = [None if t is None else _rows(t, n) for t in (y, h)]
    y2, h2 = (torch.empty(x.numel() // max(n, 1), n, dtype=x.dtype, device=x.device) if r is None and t is not None
              else r for t, r in zip((y, h), rows, strict=True))
    r2 = None if residual is None else residual.reshape(-1, n)
    _run(op, x.reshape(-1, n), y2, weight, bias, r2, h2, eps)
    for t, row_view, fresh in zip((y, h), rows, (y2, h2), strict=True):
        if t is not None and row_view is None:
            t.copy_(fresh.view(t.shape))


def _rows(t, n: int):
    """t as an (M, N) view; None where its leading dimensions cannot be merged without a copy."""
    try:
        return t.view(-1, n)
    except RuntimeError:
        return None


def _empty(x):
    """A fresh contiguous tensor of x's shape, dtype and device (empty_like: the cheapest allocation call)."""
    return torch.empty_like(x, memory_format=torch.contiguous_format)


# ---- custom ops -------------------------------------------------------------------------------------
@torch.library.custom_op("kernellab::softmax", mutates_args=(), device_types="cuda")
def _softmax(x: torch.Tensor) -> torch.Tensor:
    y = _empty(x)
    _launch("softmax", x, y)
    return y


@torch.library.custom_op("kernellab::softmax_out", mutates_args=("out",), device_types="cuda")
def _softmax_out(x: torch.Tensor, out: torch.Tensor) -> None:
    _launch("softmax", x, out)


@torch.library.custom_op("kernellab::rmsnorm", mutates_args=(), device_types="cuda")
def _rmsnorm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    y = _empty(x)
    _launch("rmsnorm", x, y, weight=weight, eps=eps)
    return y


@torch.library.custom_op("kernellab::rmsnorm_residual", mutates_args=(), device_types="cuda")
def _rmsnorm_residual(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    y, h = _empty(x), _empty(x)
    _launch("rmsnorm", x, y, weight=weight, residual=residual, h=h, eps=eps)
    return y, h


@torch.library.custom_op(
    "kernellab::rmsnorm_out", mutates_args=("out", "residual_out"), device_types="cuda",
    schema="(Tensor x, Tensor? weight, Tensor? residual, float eps, Tensor(a!) out, Tensor(b!)? residual_out) -> ()")
def _rmsnorm_out(x, weight, residual, eps, out, residual_out) -> None:
    _launch("rmsnorm", x, out, weight=weight, residual=residual, h=residual_out, eps=eps)


@torch.library.custom_op("kernellab::layernorm", mutates_args=(), device_types="cuda")
def _layernorm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
               eps: float) -> torch.Tensor:
    y = _empty(x)
    _launch("layernorm", x, y, weight=weight, bias=bias, eps=eps)
    return y


@torch.library.custom_op("kernellab::layernorm_out", mutates_args=("out",), device_types="cuda")
def _layernorm_out(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
                   out: torch.Tensor) -> None:
    _launch("layernorm", x, out, weight=weight, bias=bias, eps=eps)


@_softmax.register_fake
def _(x):
    return _empty(x)


@_rmsnorm.register_fake
def _(x, weight, eps):
    return _empty(x)


@_rmsnorm_residual.register_fake
def _(x, residual, weight, eps):
    return _empty(x), _empty(x)


@_layernorm.register_fake
def _(x, weight, bias, eps):
    return _empty(x)


for _op in (_softmax_out, _rmsnorm_out, _layernorm_out):
    _op.register_fake(lambda *args: None)


# ---- backward: plain torch in fp32 ------------------------------------------------------------------
def _sum_rows(t, n: int):
    return t.reshape(-1, n).sum(0)


def softmax_backward(y, dy):
    """dx of y = softmax(x) given y and dy, in fp32: y * (dy - sum(dy * y))."""
    yf, g = y.float(), dy.float()
    return (yf * (g - (g * yf).sum(-1, keepdim=True))).to(y.dtype)


def rmsnorm_backward(x, weight, dy, rstd):
    """(dx, dweight) of y = x * rstd * weight given the forward's rstd (fp32, one per row)."""
    n = x.shape[-1]
    xhat = x.float() * rstd.reshape(*x.shape[:-1], 1)
    g = dy.float()
    gw = g if weight is None else g * weight.float()
    dx = rstd.reshape(*x.shape[:-1], 1) * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
    dweight = None if weight is None else _sum_rows(g * xhat, n).to(weight.dtype)
    return dx.to(x.dtype), dweight


def layernorm_backward(x, weight, dy, mean, rstd, bias=True):
    """(dx, dweight, dbias) of y = (x - mean) * rstd * weight + bias given the forward's mean and rstd
    (fp32, one per row); dbias is None when ``bias`` is false."""
    n = x.shape[-1]
    rows = (*x.shape[:-1], 1)
    xhat = (x.float() - mean.reshape(rows)) * rstd.reshape(rows)
    g = dy.float()
    gw = g if weight is None else g * weight.float()
    dx = rstd.reshape(rows) * (gw - gw.mean(-1, keepdim=True) - xhat * (gw * xhat).mean(-1, keepdim=True))
    dweight = None if weight is None else _sum_rows(g * xhat, n).to(weight.dtype)
    dbias = _sum_rows(g, n).to(x.dtype if weight is None else weight.dtype) if bias else None
    return dx.to(x.dtype), dweight, dbias


def _rms_rstd(h, eps):
    return torch.rsqrt(h.float().pow(2).mean(-1) + eps)


def _ln_stats(x, eps):
    xf = x.float()
    mean = xf.mean(-1)
    return mean, torch.rsqrt((xf - mean[..., None]).pow(2).mean(-1) + eps)


def _setup(ctx, inputs, output):
    """Save the tensor inputs (x first); the trailing float input, where there is one, is eps."""
    ctx.save_for_backward(*(t for t in inputs if not isinstance(t, float)))
    ctx.eps = inputs[-1] if isinstance(inputs[-1], float) else None


def _softmax_grad(ctx, grad):
    x = ctx.saved_tensors[0]
    return softmax_backward(torch.softmax(x.float(), dim=-1).to(x.dtype), grad)


def _rmsnorm_grad(ctx, grad):
    x, weight = ctx.saved_tensors
    return (*rmsnorm_backward(x, weight, grad, _rms_rstd(x, ctx.eps)), None)


def _rmsnorm_residual_grad(ctx, grad_y, grad_h):
    x, residual, weight = ctx.saved_tensors
    h = x.float() + residual.float()
    dh, dweight = rmsnorm_backward(h, weight, grad_y, _rms_rstd(h, ctx.eps))
    if grad_h is not None:
        dh = dh + grad_h.float()
    return dh.to(x.dtype), dh.to(residual.dtype), dweight, None


def _layernorm_grad(ctx, grad):
    x, weight, bias = ctx.saved_tensors
    dx, dweight, dbias = layernorm_backward(x, weight, grad, *_ln_stats(x, ctx.eps), bias=bias is not None)
    return dx, dweight, None if bias is None else dbias.to(bias.dtype), None


_softmax.register_autograd(_softmax_grad, setup_context=_setup)
_rmsnorm.register_autograd(_rmsnorm_grad, setup_context=_setup)
_rmsnorm_residual.register_autograd(_rmsnorm_residual_grad, setup_context=_setup)
_layernorm.register_autograd(_layernorm_grad, setup_context=_setup)


# ---- public functions ---------------------------------------------------------------------------------
# Each first tries the fast path: the compiled function of N's widest alignment class, called directly once
# _fast has tested the few conditions that function cannot test itself. The function checks everything else
# before it launches (dtypes, N, rows, device, alignment, row strides) and raises TypeError or ValueError;
# the call then takes the general path, whose checks raise with the argument's name or accept it (leading
# dims, a narrower alignment class, strided rows, fake tensors under torch.compile). On a slow host the
# general path's layers cost more than the launch.
_FLOAT_SET = frozenset(FLOATS)


def _fast(op: str, x, out, weight=None, bias=None):
    """The fast path's function, or None: plain (not subclassed) tensors, a non-empty 2-D x, an output whose
    rows cannot overlap (contiguous, or fresh when ``out`` is None), no autograd, not traced, and a function
    compiled for (op, dtypes, N)."""
    if type(x) is not torch.Tensor or x.requires_grad:
        return None
    shape = x.shape
    if len(shape) != 2 or not shape[0] or not shape[1]:
        return None
    if out is not None and (type(out) is not torch.Tensor or not out.is_contiguous()):
        return None
    for v in (weight, bias):
        if v is not None and (type(v) is not torch.Tensor or v.requires_grad):
            return None
    if torch.compiler.is_compiling():
        return None
    plans = _FAST.get((op, x.dtype, shape[1], None if weight is None else weight.dtype,
                       None if bias is None else bias.dtype))
    return None if plans is None else plans.for_rows(shape[0])


def _plain_x(x) -> bool:
    return type(x) is torch.Tensor and x.is_cuda and x.dtype in _FLOAT_SET and x.dim() > 0 and x.is_contiguous()


def _plain_like(t, x) -> bool:
    return (type(t) is torch.Tensor and t.dtype is x.dtype and t.shape == x.shape and t.is_contiguous()
            and t.get_device() == x.get_device())


def _plain_vector(v, x) -> bool:
    return (type(v) is torch.Tensor and (v.dtype is torch.float32 or v.dtype is x.dtype) and v.dim() == 1
            and v.shape[0] == x.shape[-1] and v.is_contiguous() and v.get_device() == x.get_device())


def _checked_eps(eps) -> float:
    return eps if type(eps) is float and eps > 0.0 else checks.positive_float("eps", eps)


def softmax(x, *, out=None):
    """softmax over the last dimension of a CUDA tensor (fp32, fp16, bf16; fp32 inside)."""
    fn = _fast("softmax", x, out)
    if fn is not None:
        y = _empty(x) if out is None else out
        try:
            fn(x, y)
            return y
        except (TypeError, ValueError):  # not the widest class's call: the general path decides
            pass
    if not _plain_x(x):
        _check_x(x)
    if out is not None:
        if not _plain_like(out, x):
            _check_out("out", out, x)
        _no_autograd_with_out("softmax", x)
        if torch.compiler.is_compiling():
            _softmax_out(x, out)
        else:
            _launch("softmax", x, out)
        return out
    if torch.compiler.is_compiling() or _needs_autograd(x):
        return _softmax(x)
    y = _empty(x)
    _launch("softmax", x, y)
    return y


def rmsnorm(x, weight=None, eps: float = 1e-6, residual=None, *, out=None, residual_out=None):
    """RMSNorm over the last dimension; with ``residual``, normalizes h = x + residual and returns
    (y, h), h in x's dtype. ``weight`` is fp32 or x's dtype."""
    if residual is None and residual_out is None and type(eps) is float and eps > 0.0:
        fn = _fast("rmsnorm", x, out, weight)
        if fn is not None:
            y = _empty(x) if out is None else out
            try:
                fn(x, weight, None, y, None, eps)
                return y
            except (TypeError, ValueError):  # not the widest class's call: the general path decides
                pass
    if not _plain_x(x):
        _check_x(x)
    if weight is not None and not _plain_vector(weight, x):
        _check_vector("weight", weight, x)
    eps = _checked_eps(eps)
    if residual is not None:
        if not _plain_like(residual, x):
            _check_like_x("residual", residual, x)
    elif residual_out is not None:
        raise ValueError("residual_out is given but residual is None; residual_out receives x + residual")
    if out is not None or residual_out is not None:
        for name, o in (("out", out), ("residual_out", residual_out)):
            if o is not None and not _plain_like(o, x):
                _check_out(name, o, x)
        _no_autograd_with_out("rmsnorm", x, weight, residual)
        y = _empty(x) if out is None else out
        h = None if residual is None else _empty(x) if residual_out is None else residual_out
        if torch.compiler.is_compiling():
            _rmsnorm_out(x, weight, residual, eps, y, h)
        else:
            _launch("rmsnorm", x, y, weight=weight, residual=residual, h=h, eps=eps)
        return y if h is None else (y, h)
    if torch.compiler.is_compiling() or _needs_autograd(x, weight, residual):
        return _rmsnorm(x, weight, eps) if residual is None else _rmsnorm_residual(x, residual, weight, eps)
    y = _empty(x)
    if residual is None:
        _launch("rmsnorm", x, y, weight=weight, eps=eps)
        return y
    h = _empty(x)
    _launch("rmsnorm", x, y, weight=weight, residual=residual, h=h, eps=eps)
    return y, h


def layernorm(x, weight=None, bias=None, eps: float = 1e-5, *, out=None):
    """LayerNorm over the last dimension (exact two-pass statistics in fp32); weight and bias are fp32
    or x's dtype."""
    if type(eps) is float and eps > 0.0:
        fn = _fast("layernorm", x, out, weight, bias)
        if fn is not None:
            y = _empty(x) if out is None else out
            try:
                fn(x, weight, bias, y, eps)
                return y
            except (TypeError, ValueError):  # not the widest class's call: the general path decides
                pass
    if not _plain_x(x):
        _check_x(x)
    if weight is not None and not _plain_vector(weight, x):
        _check_vector("weight", weight, x)
    if bias is not None and not _plain_vector(bias, x):
        _check_vector("bias", bias, x)
    eps = _checked_eps(eps)
    if out is not None:
        if not _plain_like(out, x):
            _check_out("out", out, x)
        _no_autograd_with_out("layernorm", x, weight, bias)
        if torch.compiler.is_compiling():
            _layernorm_out(x, weight, bias, eps, out)
        else:
            _launch("layernorm", x, out, weight=weight, bias=bias, eps=eps)
        return out
    if torch.compiler.is_compiling() or _needs_autograd(x, weight, bias):
        return _layernorm(x, weight, bias, eps)
    y = _empty(x)
    _launch("layernorm", x, y, weight=weight, bias=bias, eps=eps)
    return y
