"""The GPU backend's public functions and their torch custom ops.

Every argument is checked before any GPU work. The eager path calls the compiled TVM-FFI function
directly (a dict lookup and the call: host cost close to a bare launch); under torch.compile, or
when autograd needs a graph, calls go through the custom ops ``kernellab::*``, which torch.compile
treats as opaque (their fake implementations give the output shapes). The forwards behind autograd
also store each row's rstd (and mean), and the backward passes are CuTe kernels too, behind custom ops
of their own (``kernellab::*_backward``), so that torch.compile traces fwd+bwd without a graph break.
"""

from __future__ import annotations

import torch

from .. import checks
from . import compiler
from .compiler import Plans, Variant, call_of, vector_gradient_launch, wave

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_NAME = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


# ---- argument checks (no GPU work) ---------------------------------------------------------------
def _check_x(x, name: str = "x") -> None:
    checks.tensor(name, x)
    checks.device_is(name, x, "cuda")
    checks.dtype_in(name, x, FLOATS)
    checks.ndim_at_least(name, x, 1)
    checks.unit_last_stride(name, x)


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


# ---- launches --------------------------------------------------------------------------------------
# The alignment class of a call is the largest power of two (<= 16 bytes) dividing N * element size,
# every row stride in bytes and every base pointer; an (N,) vector whose base is less aligned narrows it
# in proportion to its element size. It picks the vector width: vec = alignment / element size.
_FUNCTIONS: dict[tuple, Plans] = {}  # (op, dtypes, N, alignment, residual) -> its compiled plans
_FAST: dict[tuple, Plans] = {}  # (op, x dtype, N, weight dtype, bias dtype, stats) -> plans of N's widest class
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


def _function(op: str, x, n: int, bits: int, weight, bias, residual: bool, stats: bool = False):
    wdt = None if weight is None else weight.dtype
    bdt = None if bias is None else bias.dtype
    key = (op, x.dtype, n, bits & -bits, wdt, bdt, residual, stats)
    plans = _FUNCTIONS.get(key)
    if plans is None:
        vec = (bits & -bits) // x.element_size()
        variant = Variant(op, _NAME[x.dtype], n, vec, weight=_NAME.get(wdt), bias=_NAME.get(bdt), residual=residual,
                          stats=stats)
        plans = _FUNCTIONS[key] = Plans(variant, _sms(x))
        widest = n * x.element_size() | 16
        if not residual and bits & -bits == widest & -widest:
            _FAST[(op, x.dtype, n, wdt, bdt, stats)] = plans
    return plans.for_rows(x.shape[0])


def _run(op: str, x, y, weight=None, bias=None, residual=None, h=None, eps=None, rstd=None, mean=None) -> None:
    """One kernel over 2-D rows: y = op(x [+ residual]) (and h = x + residual for rmsnorm; each row's rstd
    and mean into the (M,) fp32 ``rstd`` and ``mean`` where given)."""
    m, n = x.shape
    if m == 0 or n == 0:
        return
    if n == 1:  # a size-1 last dimension may carry any stride; the kernels are compiled for stride 1
        x, y, residual, h = (t if t is None else t.as_strided(t.shape, (t.stride(0), 1)) for t in (x, y, residual, h))
    e = x.element_size()
    bits = n * e | 16 | _matrix_bits(x, e) | _matrix_bits(y, e)
    if residual is not None:
        bits |= _matrix_bits(residual, e) | _matrix_bits(h, e)
    _call(op, x, y, weight, bias, residual, h, eps, bits, rstd, mean)


def _call(op: str, x, y, weight, bias, residual, h, eps, bits: int, rstd=None, mean=None) -> None:
    """The compiled function of the call's alignment class (``bits`` of the rows, narrowed here by the
    vectors), called."""
    e = x.element_size()
    if weight is not None:
        bits |= _vector_bits(weight, e)
    if bias is not None:
        bits |= _vector_bits(bias, e)
    _invoke(_function(op, x, x.shape[1], bits, weight, bias, residual is not None, rstd is not None), op, x, y,
            weight, bias, residual, h, eps, rstd, mean)


def _invoke(fn, op: str, x, y, weight, bias, residual, h, eps, rstd, mean) -> None:
    """fn (a compiled forward of op) called with its arguments in its order."""
    if op == "softmax":
        fn(x, y)
    elif op == "rmsnorm":
        fn(x, weight, residual, y, h, rstd, eps)
    else:
        fn(x, weight, bias, y, mean, rstd, eps)


def _launch(op: str, x, y, weight=None, bias=None, residual=None, h=None, eps=None, rstd=None, mean=None) -> None:
    """_run on any leading shape: x and residual viewed (or copied) as (M, N) rows; an output that
    cannot be viewed as rows is computed into a fresh buffer and copied back. rstd and mean are fresh
    contiguous tensors of x's leading shape."""
    rstd, mean = (None if t is None else t.view(-1) for t in (rstd, mean))
    if x.dim() == 2 and y.dim() == 2 and (h is None or h.dim() == 2):
        return _run(op, x, y, weight, bias, residual, h, eps, rstd, mean)
    n = x.shape[-1]
    rows = [None if t is None else _rows(t, n) for t in (y, h)]
    y2, h2 = (torch.empty(x.numel() // max(n, 1), n, dtype=x.dtype, device=x.device) if r is None and t is not None
              else r for t, r in zip((y, h), rows, strict=True))
    r2 = None if residual is None else residual.reshape(-1, n)
    _run(op, x.reshape(-1, n), y2, weight, bias, r2, h2, eps, rstd, mean)
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


def _row_stats(x):
    """A fresh (leading shape) fp32 tensor: one value per row (rstd, mean)."""
    return x.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("kernellab::rmsnorm", mutates_args=(), device_types="cuda")
def _rmsnorm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, rstd): the forward behind autograd and torch.compile keeps each row's rstd for the backward."""
    y, rstd = _empty(x), _row_stats(x)
    _launch("rmsnorm", x, y, weight=weight, eps=eps, rstd=rstd)
    return y, rstd


@torch.library.custom_op("kernellab::rmsnorm_residual", mutates_args=(), device_types="cuda")
def _rmsnorm_residual(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, h, rstd) with h = x + residual."""
    y, h, rstd = _empty(x), _empty(x), _row_stats(x)
    _launch("rmsnorm", x, y, weight=weight, residual=residual, h=h, eps=eps, rstd=rstd)
    return y, h, rstd


@torch.library.custom_op(
    "kernellab::rmsnorm_out", mutates_args=("out", "residual_out"), device_types="cuda",
    schema="(Tensor x, Tensor? weight, Tensor? residual, float eps, Tensor(a!) out, Tensor(b!)? residual_out) -> ()")
def _rmsnorm_out(x, weight, residual, eps, out, residual_out) -> None:
    _launch("rmsnorm", x, out, weight=weight, residual=residual, h=residual_out, eps=eps)


@torch.library.custom_op("kernellab::layernorm", mutates_args=(), device_types="cuda")
def _layernorm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
               eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, mean, rstd): the forward behind autograd and torch.compile keeps each row's statistics."""
    y, mean, rstd = _empty(x), _row_stats(x), _row_stats(x)
    _launch("layernorm", x, y, weight=weight, bias=bias, eps=eps, rstd=rstd, mean=mean)
    return y, mean, rstd


@torch.library.custom_op("kernellab::layernorm_out", mutates_args=("out",), device_types="cuda")
def _layernorm_out(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
                   out: torch.Tensor) -> None:
    _launch("layernorm", x, out, weight=weight, bias=bias, eps=eps)


@_softmax.register_fake
def _(x):
    return _empty(x)


@_rmsnorm.register_fake
def _(x, weight, eps):
    return _empty(x), _row_stats(x)


@_rmsnorm_residual.register_fake
def _(x, residual, weight, eps):
    return _empty(x), _empty(x), _row_stats(x)


@_layernorm.register_fake
def _(x, weight, bias, eps):
    return _empty(x), _row_stats(x), _row_stats(x)


for _op in (_softmax_out, _rmsnorm_out, _layernorm_out):
    _op.register_fake(lambda *args: None)


# ---- backward -----------------------------------------------------------------------------------------------
_GRADS: dict[tuple, tuple] = {}  # (op, dtypes, N, alignment, flags) -> (function, rows per CTA, CTAs per wave)


def _grad_function(op: str, x, bits: int, weight, dh: bool, dbias, spread_sum: bool = False):
    """The compiled backward of the call's alignment class, its rows per CTA, and how many of its CTAs (clusters) one
    wave holds on x's GPU (the persistent grid of the kernels with vector gradients). ``dbias``: dbias's
    dtype, or None where it is not wanted; ``spread_sum``: the variant that sums many partial rows by CTAs (its
    plan is the same; its registers may hold fewer CTAs a wave)."""
    n = x.shape[1]
    wdt = None if weight is None else weight.dtype
    key = (op, x.dtype, n, bits & -bits, wdt, dh, dbias, spread_sum)
    found = _GRADS.get(key)
    if found is None:
        vec = (bits & -bits) // x.element_size()
        variant = Variant(op, _NAME[x.dtype], n, vec, weight=_NAME.get(wdt), bias=_NAME.get(dbias), residual=dh,
                          spread_sum=spread_sum)
        found = _GRADS[key] = (call_of(compiler.compiled(variant)), *wave(variant, _sms(x)))
    return found


# The grid barrier's word per device (base.GradKernel.grid_barrier): one per stream, each in a 32-byte sector of
# its own, so that backward kernels running at once on different streams never share a barrier. Zeroed once; each
# barrier leaves its low 31 bits zero. Past _SYNC_SLOTS streams in one process the slots are dealt out again: two
# of those streams then share a word, and their backward launches must not run at the same time.
_SYNC_SLOTS = 1024
_SYNC_SECTOR = 8  # int32 words
_SYNC: dict[int, torch.Tensor] = {}
_SYNC_WORD: dict[tuple[int, int], torch.Tensor] = {}  # (device index, stream handle) -> its word (a view of _SYNC's)


def _grid_sync(device) -> torch.Tensor:
    """This stream's barrier word on ``device`` (a 1-element int32 tensor). Under CUDA graph capture before any
    eager call on the device, a fresh zeroed word instead: the graph zeroes it on every replay."""
    index = device.index
    table = _SYNC.get(index)
    if table is None:
        if torch.cuda.is_current_stream_capturing():
            return torch.zeros(1, dtype=torch.int32, device=device)
        table = _SYNC[index] = torch.zeros(_SYNC_SLOTS, _SYNC_SECTOR, dtype=torch.int32, device=device)
    key = (index, torch._C._cuda_getCurrentRawStream(index))  # the stream's handle, without a Stream object
    word = _SYNC_WORD.get(key)
    if word is None:  # the view made once: indexing the table costs more host time than the rest of the call
        word = _SYNC_WORD[key] = table[len(_SYNC_WORD) % _SYNC_SLOTS, :1]
    return word


def _as_rows(t, n: int):
    """t as (M, N) rows with unit column stride (a view where one exists; a copy otherwise: autograd may
    hand over expanded or transposed gradients). A size-1 last dimension may carry any stride."""
    rows = t.reshape(-1, n)
    if n == 1:
        return rows.as_strided(rows.shape, (rows.stride(0), 1))
    return rows if rows.stride(1) == 1 else rows.contiguous()


_GRAD_LAUNCHES: dict[tuple, tuple] = {}  # (op, dtypes, M, N, alignment, flags, device) -> (function, rows, grid)
_GRAD_LAUNCHES_MOST = 4096  # distinct calls kept (a server's changing M would grow it without end): then cleared


def _grad_plan(op: str, x2, bits: int, weight, dh: bool, dbias) -> tuple:
    """(function, rows per CTA, grid) of a backward launch over x2's rows, kept per call shape: the variant's
    lookup and the grid rule (``vector_gradient_launch``) are Python a training step would pay on every call."""
    m, n = x2.shape
    key = (op, x2.dtype, m, n, bits & -bits, None if weight is None else weight.dtype, dh, dbias, x2.get_device())
    found = _GRAD_LAUNCHES.get(key)
    if found is not None:
        return found
    fn, rows_per_cta, per_wave = _grad_function(op, x2, bits, weight, dh, dbias)
    if weight is not None or dbias is not None:
        spread, rows_per_cta, _, grid = vector_gradient_launch(
            m, _sms(x2), x2.element_size(), rows_per_cta, per_wave,
            lambda: _grad_function(op, x2, bits, weight, dh, dbias, spread_sum=True)[1:])
        if spread:
            fn = _grad_function(op, x2, bits, weight, dh, dbias, spread_sum=True)[0]
    else:
        grid = -(-m // rows_per_cta)
    if len(_GRAD_LAUNCHES) >= _GRAD_LAUNCHES_MOST:
        _GRAD_LAUNCHES.clear()
    found = _GRAD_LAUNCHES[key] = (fn, rows_per_cta, grid)
    return found


def _grad_launch(op: str, x, dy, weight=None, dh=None, rstd=None, mean=None, dbias=None):
    """dx (x's shape, dtype) and the vector gradients of one backward kernel: dweight in weight's dtype and
    dbias in the dtype ``dbias`` names (None where not asked for), each summed in fp32. x is y for softmax."""
    n = x.shape[-1]
    dx = _empty(x)
    m = x.numel() // n if n else 0
    if m == 0 or n == 0:  # no rows: the vector gradients are zero
        return (dx, None if weight is None else x.new_zeros(n, dtype=weight.dtype),
                None if dbias is None else x.new_zeros(n, dtype=dbias))
    x2, dy2, dx2 = _as_rows(x, n), _as_rows(dy, n), dx.view(-1, n)
    dh2 = None if dh is None else _as_rows(dh, n)
    e = x.element_size()
    bits = n * e | 16 | _matrix_bits(x2, e) | _matrix_bits(dy2, e) | _matrix_bits(dx2, e)
    if dh2 is not None:
        bits |= _matrix_bits(dh2, e)
    if weight is not None:
        bits |= _vector_bits(weight, e)
    fn, rows_per_cta, grid = _grad_plan(op, x2, bits, weight, dh is not None, dbias)
    if op == "softmax_backward":
        fn(x2, dy2, dx2)
        return dx, None, None
    vectors = weight is not None or dbias is not None
    pw = dw = pb = db = sync = None
    if weight is not None:
        pw, dw = x.new_empty((grid * rows_per_cta, n), dtype=torch.float32), torch.empty_like(weight)
    if dbias is not None:
        pb, db = x.new_empty((grid * rows_per_cta, n), dtype=torch.float32), x.new_empty(n, dtype=dbias)
    if vectors:
        sync = _grid_sync(x.device)
    if op == "rmsnorm_backward":
        fn(x2, weight, dy2, rstd.reshape(-1), dh2, dx2, pw, dw, sync, grid)
    else:
        fn(x2, weight, dy2, mean.reshape(-1), rstd.reshape(-1), dx2, pw, pb, dw, db, sync, grid)
    return dx, dw, db


def _no_vector(x):
    """The schema's stand-in for an absent vector gradient: an empty fp32 tensor."""
    return x.new_empty(0, dtype=torch.float32)


@torch.library.custom_op("kernellab::softmax_backward", mutates_args=(), device_types="cuda")
def _softmax_backward(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    return _grad_launch("softmax_backward", y, dy)[0]


@torch.library.custom_op("kernellab::rmsnorm_backward", mutates_args=(), device_types="cuda")
def _rmsnorm_backward(x: torch.Tensor, weight: torch.Tensor | None, dy: torch.Tensor, rstd: torch.Tensor,
                      dh: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx [+ dh], dweight; an empty tensor without a weight)."""
    dx, dw, _ = _grad_launch("rmsnorm_backward", x, dy, weight=weight, dh=dh, rstd=rstd)
    return dx, _no_vector(x) if dw is None else dw


@torch.library.custom_op("kernellab::layernorm_backward", mutates_args=(), device_types="cuda")
def _layernorm_backward(x: torch.Tensor, weight: torch.Tensor | None, dy: torch.Tensor, mean: torch.Tensor,
                        rstd: torch.Tensor, bias: torch.Tensor | None,
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight, dbias; empty tensors for an absent weight or bias). ``bias`` only gives dbias's dtype."""
    dx, dw, db = _grad_launch("layernorm_backward", x, dy, weight=weight, rstd=rstd, mean=mean,
                              dbias=None if bias is None else bias.dtype)
    return dx, _no_vector(x) if dw is None else dw, _no_vector(x) if db is None else db


@_softmax_backward.register_fake
def _(y, dy):
    return _empty(y)


@_rmsnorm_backward.register_fake
def _(x, weight, dy, rstd, dh):
    return _empty(x), _no_vector(x) if weight is None else torch.empty_like(weight)


@_layernorm_backward.register_fake
def _(x, weight, dy, mean, rstd, bias):
    return tuple([_empty(x)] + [_no_vector(x) if v is None else torch.empty_like(v) for v in (weight, bias)])


def _check_grad(name: str, t, x, x_name: str = "x") -> None:
    """dy / dh: x's shape, dtype and device (any strides)."""
    checks.tensor(name, t)
    checks.same_device(name, t, x_name, x)
    checks.dtype_in(name, t, (x.dtype,))
    checks.shape_is(name, t, x.shape)


def _check_stats(name: str, t, x) -> None:
    """rstd / mean: fp32, x's leading shape, on x's device."""
    checks.tensor(name, t)
    checks.same_device(name, t, "x", x)
    checks.dtype_in(name, t, (torch.float32,))
    checks.shape_is(name, t, x.shape[:-1])


def softmax_backward(y, dy):
    """dx of y = softmax(x) given the forward's output y and dy: y * (dy - sum(dy * y)), fp32 inside."""
    _check_x(y, "y")
    _check_grad("dy", dy, y, "y")
    if torch.compiler.is_compiling():
        return _softmax_backward(y, dy)
    return _grad_launch("softmax_backward", y, dy)[0]


def rmsnorm_backward(x, weight, dy, rstd, *, dh=None):
    """(dx, dweight) of y = x * rstd * weight given the forward's rstd (fp32, x's leading shape); dweight
    is None without a weight, reduced in fp32 from per-CTA partials. ``dh``, the gradient of a residual
    output h (x is then h), is added to dx."""
    _check_x(x)
    if weight is not None:
        _check_vector("weight", weight, x)
    _check_grad("dy", dy, x)
    _check_stats("rstd", rstd, x)
    if dh is not None:
        _check_grad("dh", dh, x)
    if torch.compiler.is_compiling():
        dx, dw = _rmsnorm_backward(x, weight, dy, rstd, dh)
        return dx, None if weight is None else dw
    return _grad_launch("rmsnorm_backward", x, dy, weight=weight, dh=dh, rstd=rstd)[:2]


def layernorm_backward(x, weight, dy, mean, rstd, bias=True):
    """(dx, dweight, dbias) of y = (x - mean) * rstd * weight + bias given the forward's mean and rstd (fp32,
    x's leading shape). ``bias``: whether dbias is wanted (True: in weight's dtype, else x's; a tensor: in
    its dtype); None where not wanted, as dweight is without a weight."""
    _check_x(x)
    if weight is not None:
        _check_vector("weight", weight, x)
    _check_grad("dy", dy, x)
    _check_stats("mean", mean, x)
    _check_stats("rstd", rstd, x)
    like = bias if isinstance(bias, torch.Tensor) else (weight if weight is not None else x) if bias else None
    if torch.compiler.is_compiling():
        dx, dw, db = _layernorm_backward(x, weight, dy, mean, rstd, like)
        return dx, None if weight is None else dw, None if like is None else db
    return _grad_launch("layernorm_backward", x, dy, weight=weight, rstd=rstd, mean=mean,
                        dbias=None if like is None else like.dtype)


# ---- autograd of the forward custom ops -------------------------------------------------------------------
def _setup_softmax(ctx, inputs, output):
    ctx.save_for_backward(output)


def _softmax_grad(ctx, grad):
    return _softmax_backward(ctx.saved_tensors[0], grad)


def _setup_rmsnorm(ctx, inputs, output):
    x, weight, eps = inputs
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(x, weight, output[1])


def _rmsnorm_grad(ctx, grad, _grad_rstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = _rmsnorm_backward(x, weight, _zeros_if_none(grad, x), rstd, None)
    return dx, None if weight is None else dw, None


def _setup_rmsnorm_residual(ctx, inputs, output):
    x, residual, weight, eps = inputs
    y, h, rstd = output
    ctx.mark_non_differentiable(rstd)
    ctx.save_for_backward(h, weight, rstd)


def _rmsnorm_residual_grad(ctx, grad_y, grad_h, _grad_rstd):
    h, weight, rstd = ctx.saved_tensors
    dh, dw = _rmsnorm_backward(h, weight, _zeros_if_none(grad_y, h), rstd, grad_h)
    return dh, dh, None if weight is None else dw, None


def _setup_layernorm(ctx, inputs, output):
    x, weight, bias, eps = inputs
    y, mean, rstd = output
    ctx.mark_non_differentiable(mean, rstd)
    ctx.save_for_backward(x, weight, bias, mean, rstd)


def _layernorm_grad(ctx, grad, _grad_mean, _grad_rstd):
    x, weight, bias, mean, rstd = ctx.saved_tensors
    dx, dw, db = _layernorm_backward(x, weight, _zeros_if_none(grad, x), mean, rstd, bias)
    return dx, None if weight is None else dw, None if bias is None else db, None


def _zeros_if_none(grad, x):
    return torch.zeros_like(x) if grad is None else grad


_softmax.register_autograd(_softmax_grad, setup_context=_setup_softmax)
_rmsnorm.register_autograd(_rmsnorm_grad, setup_context=_setup_rmsnorm)
_rmsnorm_residual.register_autograd(_rmsnorm_residual_grad, setup_context=_setup_rmsnorm_residual)
_layernorm.register_autograd(_layernorm_grad, setup_context=_setup_layernorm)


# ---- eager autograd: the same kernels without the custom ops' dispatch -----------------------------------
# Outside torch.compile a torch.autograd.Function calls the launches directly: a custom op's Python dispatch
# costs more host time per call than the small shapes' kernels take.
class _SoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = _empty(x)
        _forward_launch("softmax", x, y)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        return _grad_launch("softmax_backward", ctx.saved_tensors[0], dy)[0]


class _RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        y, rstd = _empty(x), _row_stats(x)
        _forward_launch("rmsnorm", x, y, weight, eps=eps, rstd=rstd)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        dx, dw, _ = _grad_launch("rmsnorm_backward", x, dy, weight=weight, rstd=rstd)
        return dx, dw, None


class _RMSNormResidualFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, eps):
        y, h, rstd = _empty(x), _empty(x), _row_stats(x)
        _launch("rmsnorm", x, y, weight=weight, residual=residual, h=h, eps=eps, rstd=rstd)
        ctx.save_for_backward(h, weight, rstd)
        return y, h

    @staticmethod
    def backward(ctx, dy, dh):
        h, weight, rstd = ctx.saved_tensors
        dx, dw, _ = _grad_launch("rmsnorm_backward", h, _zeros_if_none(dy, h), weight=weight, dh=dh, rstd=rstd)
        return dx, dx, dw, None


class _LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        y, mean, rstd = _empty(x), _row_stats(x), _row_stats(x)
        _forward_launch("layernorm", x, y, weight, bias, eps, rstd, mean)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        dx, dw, db = _grad_launch("layernorm_backward", x, dy, weight=weight, rstd=rstd, mean=mean,
                                  dbias=None if bias is None else bias.dtype)
        return dx, dw, db, None


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
    return _widest(op, x, weight, bias, False)


def _widest(op: str, x, weight, bias, stats: bool):
    """The cached function of N's widest alignment class for 2-D x's rows (with row statistics or not), or None
    until a call of that class has compiled it."""
    plans = _FAST.get((op, x.dtype, x.shape[1], None if weight is None else weight.dtype,
                       None if bias is None else bias.dtype, stats))
    return None if plans is None else plans.for_rows(x.shape[0])


_PARAMETER_TYPES = (torch.Tensor, torch.nn.Parameter)


def _forward_launch(op: str, x, y, weight=None, bias=None, eps=None, rstd=None, mean=None) -> None:
    """An autograd Function's forward launch (with each row's statistics where given): the widest class's
    function called directly where it is cached and x is non-empty 2-D rows, as the no-grad call's fast path
    does; the general path where the function refuses the call (TypeError, ValueError: it checks the rest
    itself) or none is cached yet. Here the tensors may require grad (grad mode is off inside a Function's
    forward) and the vectors may be parameters."""
    if type(x) in _PARAMETER_TYPES and x.dim() == 2 and x.shape[0] and x.shape[1]:
        if all(v is None or type(v) in _PARAMETER_TYPES for v in (weight, bias)):
            fn = _widest(op, x, weight, bias, rstd is not None)
            if fn is not None:
                try:
                    _invoke(fn, op, x, y, weight, bias, None, None, eps, rstd, mean)
                    return
                except (TypeError, ValueError):  # not the widest class's call: the general path decides
                    pass
    _launch(op, x, y, weight=weight, bias=bias, eps=eps, rstd=rstd, mean=mean)


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
        checks.no_autograd_with_out("softmax", x)
        if torch.compiler.is_compiling():
            _softmax_out(x, out)
        else:
            _launch("softmax", x, out)
        return out
    if torch.compiler.is_compiling():
        return _softmax(x)
    if checks.needs_autograd(x):
        return _SoftmaxFunction.apply(x)
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
                fn(x, weight, None, y, None, None, eps)
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
        checks.no_autograd_with_out("rmsnorm", x, weight, residual)
        y = _empty(x) if out is None else out
        h = None if residual is None else _empty(x) if residual_out is None else residual_out
        if torch.compiler.is_compiling():
            _rmsnorm_out(x, weight, residual, eps, y, h)
        else:
            _launch("rmsnorm", x, y, weight=weight, residual=residual, h=h, eps=eps)
        return y if h is None else (y, h)
    if torch.compiler.is_compiling():
        return _rmsnorm(x, weight, eps)[0] if residual is None else _rmsnorm_residual(x, residual, weight, eps)[:2]
    if checks.needs_autograd(x, weight, residual):
        if residual is None:
            return _RMSNormFunction.apply(x, weight, eps)
        return _RMSNormResidualFunction.apply(x, residual, weight, eps)
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
                fn(x, weight, bias, y, None, None, eps)
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
        checks.no_autograd_with_out("layernorm", x, weight, bias)
        if torch.compiler.is_compiling():
            _layernorm_out(x, weight, bias, eps, out)
        else:
            _launch("layernorm", x, out, weight=weight, bias=bias, eps=eps)
        return out
    if torch.compiler.is_compiling():
        return _layernorm(x, weight, bias, eps)[0]
    if checks.needs_autograd(x, weight, bias):
        return _LayerNormFunction.apply(x, weight, bias, eps)
    y = _empty(x)
    _launch("layernorm", x, y, weight=weight, bias=bias, eps=eps)
    return y
