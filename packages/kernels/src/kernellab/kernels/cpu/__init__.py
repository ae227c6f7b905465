"""Native C++ CPU backend: softmax, RMSNorm, LayerNorm forward and linear forward/backward in fp32.

The library is compiled on first use and cached (see ``_build``). Norm ops run over the last
dimension of any leading shape; rows may be strided, the last dimension must have stride 1.
Outputs go into ``out`` buffers when given, else into fresh contiguous tensors. An output may not
share memory with an input or another output (torch's overlap rules decide), except that the row ops
run in place when an output is exactly a same-shape input (``softmax(x, out=x)``).

Every argument is checked before any work. Each op first hands its arguments to the library's
fast entry, which accepts the common case (contiguous fp32 CPU tensors of matching shapes) after a
few metadata reads in C++ and runs it, or declines. Only then do the checks here run, with
checks.py: they raise an error naming the argument, or accept it (copying an input whose rows
share no single stride) for the library's unchecked entry. At 128x512 a whole call takes some
tens of microseconds, and Python-level tensor attribute reads, cache misses each once the
caller's data has evicted the tensor objects, cost several of them: hence the C++ fast entry.
"""

from __future__ import annotations

import torch

from .. import checks
from ._build import library, library_path

__all__ = ["layernorm", "library_path", "linear_backward", "linear_forward", "rmsnorm", "softmax"]

_TENSOR = torch.Tensor
_F32 = torch.float32
_CPU = torch.device("cpu")


def _tensors(*args) -> bool:
    """Whether every argument is a tensor or None: what the fast entries' signatures accept."""
    for a in args:
        if a is not None and not isinstance(a, _TENSOR):
            return False
    return True


def _check_input(name: str, t, ndim: int | None = None) -> None:
    checks.tensor(name, t)
    checks.dtype_in(name, t, (_F32,))
    checks.device_is(name, t, "cpu")
    if ndim is None:
        checks.ndim_at_least(name, t, 1)
    else:
        checks.ndim_is(name, t, ndim)
    checks.nonempty(name, t)
    checks.unit_last_stride(name, t)


def _rows_input(name: str, t):
    """A checked input whose rows share one stride: itself if they do, else a contiguous copy."""
    _check_input(name, t)
    if t.dim() <= 2:
        return t
    try:
        t.view(-1, t.shape[-1])
        return t
    except RuntimeError:
        return t.contiguous()


def _check_vector(name: str, t, n: int) -> None:
    """A per-feature parameter (weight, bias): fp32 on the CPU, shape (n,), contiguous."""
    _check_input(name, t, 1)
    checks.shape_is(name, t, (n,))


def _check_output(name: str, out, shape) -> None:
    """An out= buffer of the result's shape whose rows the kernel can address with one stride."""
    if out is None:
        return
    checks.out_buffer(name, out, shape, _F32, _CPU)
    checks.unit_last_stride(name, out)
    checks.rows_do_not_overlap(name, out)
    try:
        out.view(-1, shape[-1])
    except RuntimeError:
        raise ValueError(f"{name} must address its rows with one stride (leading dims that flatten without a "
                         f"copy), got strides {out.stride()} for shape {tuple(out.shape)}") from None


def _check_apart(outputs: dict, inputs: dict, in_place: tuple[str, ...] = ()) -> None:
    """No output may share memory with another output or with an input, as torch's own rules
    (at::get_overlap_status) judge it; the one exception is an output that is exactly one of the
    ``in_place`` inputs (same elements, same layout), which a row op reads before it writes."""
    overlap = library().overlap
    seen: dict = {}
    for name, out in outputs.items():
        if out is None:
            continue
        for other, t in [*seen.items(), *inputs.items()]:
            if t is None:
                continue
            how = overlap(out, t)
            if how == "no" or (how == "full" and other in in_place):
                continue
            if how == "full":
                raise ValueError(f"{name} is {other} itself (the same memory); {name} must be a buffer of its own")
            exact = f" or exactly {other} (in place)" if other in in_place else ""
            raise ValueError(f"{name} overlaps {other} (they share part of their memory); {name} must be a buffer "
                             f"of its own{exact}")
        seen[name] = out


def _new(shape):
    return torch.empty(shape, dtype=_F32)


def softmax(x, *, out=None):
    """softmax over the last dimension (max-subtracted; NaN/inf rows as torch)."""
    if isinstance(x, _TENSOR) and _tensors(out):
        y = library().softmax_fast(x, out)
        if y is not None:
            return y
    x = _rows_input("x", x)
    _check_output("out", out, x.shape)
    _check_apart({"out": out}, {"x": x}, in_place=("x",))
    y = _new(x.shape) if out is None else out
    library().softmax(x, y)
    return y


def rmsnorm(x, weight=None, eps: float = 1e-6, residual=None, *, out=None, residual_out=None):
    """y = h / sqrt(mean(h^2) + eps) * weight with h = x (+ residual); returns y, or (y, h) with a residual."""
    if isinstance(x, _TENSOR) and type(eps) is float and _tensors(weight, residual, out, residual_out):
        yh = library().rmsnorm_fast(x, weight, eps, residual, out, residual_out)
        if yh is not None:
            return yh[0] if residual is None else yh
    x = _rows_input("x", x)
    if weight is not None:
        _check_vector("weight", weight, x.shape[-1])
    eps = checks.positive_float("eps", eps)
    if residual is not None:
        residual = _rows_input("residual", residual)
        checks.shape_is("residual", residual, x.shape)
    elif residual_out is not None:
        raise ValueError("residual_out is only written when residual is given, but residual is None")
    _check_output("out", out, x.shape)
    _check_output("residual_out", residual_out, x.shape)
    _check_apart({"out": out, "residual_out": residual_out}, {"x": x, "residual": residual, "weight": weight},
                 in_place=("x", "residual"))
    y = _new(x.shape) if out is None else out
    if residual is None:
        library().rmsnorm(x, None, weight, eps, y, None)
        return y
    h = _new(x.shape) if residual_out is None else residual_out
    library().rmsnorm(x, residual, weight, eps, y, h)
    return y, h


def layernorm(x, weight=None, bias=None, eps: float = 1e-5, *, out=None):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dimension (two-pass variance)."""
    if isinstance(x, _TENSOR) and type(eps) is float and _tensors(weight, bias, out):
        y = library().layernorm_fast(x, weight, bias, eps, out)
        if y is not None:
            return y
    x = _rows_input("x", x)
    if weight is not None:
        _check_vector("weight", weight, x.shape[-1])
    if bias is not None:
        _check_vector("bias", bias, x.shape[-1])
    eps = checks.positive_float("eps", eps)
    _check_output("out", out, x.shape)
    _check_apart({"out": out}, {"x": x, "weight": weight, "bias": bias}, in_place=("x",))
    y = _new(x.shape) if out is None else out
    library().layernorm(x, weight, bias, eps, y)
    return y


def _check_linear(x, weight) -> None:
    _check_input("x", x, 2)
    _check_input("weight", weight, 2)
    checks.shape_is("weight", weight, (weight.shape[0], x.shape[1]))


def linear_forward(x, weight, bias=None, *, out=None):
    """y = x W^T + b with x (M, K), W (N, K), b (N)."""
    if isinstance(x, _TENSOR) and isinstance(weight, _TENSOR) and _tensors(bias, out):
        y = library().linear_forward_fast(x, weight, bias, out)
        if y is not None:
            return y
    _check_linear(x, weight)
    if bias is not None:
        _check_vector("bias", bias, weight.shape[0])
    _check_output("out", out, (x.shape[0], weight.shape[0]))
    _check_apart({"out": out}, {"x": x, "weight": weight, "bias": bias})
    y = _new((x.shape[0], weight.shape[0])) if out is None else out
    library().linear_forward(x, weight, bias, y)
    return y


def linear_backward(x, weight, grad_out, *, dx=None, dweight=None, dbias=None):
    """(dx, dW, db) = (dy W, dy^T x, sum_rows dy) for y = x W^T + b; outputs are overwritten, never accumulated."""
    if (isinstance(x, _TENSOR) and isinstance(weight, _TENSOR) and isinstance(grad_out, _TENSOR)
            and _tensors(dx, dweight, dbias)):
        grads = library().linear_backward_fast(x, weight, grad_out, dx, dweight, dbias)
        if grads is not None:
            return grads
    _check_linear(x, weight)
    _check_input("grad_out", grad_out, 2)
    checks.shape_is("grad_out", grad_out, (x.shape[0], weight.shape[0]))
    _check_output("dx", dx, x.shape)
    _check_output("dweight", dweight, weight.shape)
    _check_output("dbias", dbias, weight.shape[:1])
    _check_apart({"dx": dx, "dweight": dweight, "dbias": dbias}, {"x": x, "weight": weight, "grad_out": grad_out})
    dx = _new(x.shape) if dx is None else dx
    dweight = _new(weight.shape) if dweight is None else dweight
    dbias = _new(weight.shape[:1]) if dbias is None else dbias
    library().linear_backward(x, weight, grad_out, dx, dweight, dbias)
    return dx, dweight, dbias
