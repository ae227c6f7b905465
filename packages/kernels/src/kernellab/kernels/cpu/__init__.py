"""Native C++ CPU backend: softmax, RMSNorm, LayerNorm and linear in fp32, forward and backward.

The library is compiled on first use and cached (see ``_build``). Norm ops run over the last
dimension of any leading shape; rows may be strided, the last dimension must have stride 1.
Outputs go into ``out`` buffers when given, else into fresh contiguous tensors. An output may not
share memory with an input or another output (torch's overlap rules decide), except that the row ops
run in place when an output is exactly a same-shape input (``softmax(x, out=x)``).

Every argument is checked before any work. Each op first hands its arguments to the library's
fast entry, which accepts the common case (contiguous fp32 CPU tensors of matching shapes, none
that autograd must track) after a few metadata reads in C++ and runs it, or declines. Only then do
the checks here run, with checks.py: they raise an error naming the argument, or accept it
(copying an input whose rows share no single stride) for the library's unchecked entry. At
128x512 a whole call takes some tens of microseconds, and Python-level tensor attribute reads,
cache misses each once the caller's data has evicted the tensor objects, cost several of them:
hence the C++ fast entry.

torch.compile goes through the custom ops of ``ops`` (``kernellab_cpu::*``), whose backward passes
are native kernels too; eager autograd (grad mode on and an input that requires grad) goes through
``ops``' autograd Functions, which call the same op bodies without the custom ops' dispatch. An
``out=`` buffer with autograd raises, as torch's out= functions do.
"""

from __future__ import annotations

import torch

from .. import checks
from . import ops
from ._build import library, library_path

__all__ = ["layernorm", "layernorm_backward", "library_path", "linear_backward", "linear_forward", "rmsnorm",
           "rmsnorm_backward", "softmax", "softmax_backward"]

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
    if all(out is None for out in outputs.values()):
        # nothing to check, and the library is not touched: a first call under torch.compile would trace its
        # loading (a lock dynamo cannot enter: a graph break, an error under fullgraph)
        return
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


_compiling = torch.compiler.is_compiling


def _write(out, result):
    """out.copy_(result), the traceable form of an out= call under torch.compile."""
    out.copy_(result)
    return out


def _write_all(results, outs):
    """Each result, copied into its out= buffer where one was given."""
    return tuple(r if o is None else _write(o, r) for r, o in zip(results, outs, strict=True))


def softmax(x, *, out=None):
    """softmax over the last dimension (max-subtracted; NaN/inf rows as torch)."""
    if isinstance(x, _TENSOR) and _tensors(out) and not _compiling():
        y = library().softmax_fast(x, out)
        if y is not None:
            return ops.SoftmaxFunction.apply(x) if y is False else y  # False: plain, autograd to record
    x = _rows_input("x", x)
    _check_output("out", out, x.shape)
    _check_apart({"out": out}, {"x": x}, in_place=("x",))
    if out is not None:
        checks.no_autograd_with_out("softmax", x, out)
        if _compiling():
            return _write(out, ops.softmax(x))
        library().softmax(x, out)
        return out
    if _compiling():
        return ops.softmax(x)
    if checks.needs_autograd(x):
        return ops.SoftmaxFunction.apply(x)
    y = _new(x.shape)
    library().softmax(x, y)
    return y


def rmsnorm(x, weight=None, eps: float = 1e-6, residual=None, *, out=None, residual_out=None):
    """y = h / sqrt(mean(h^2) + eps) * weight with h = x (+ residual); returns y, or (y, h) with a residual."""
    if (isinstance(x, _TENSOR) and type(eps) is float and _tensors(weight, residual, out, residual_out)
            and not _compiling()):
        yh = library().rmsnorm_fast(x, weight, eps, residual, out, residual_out)
        if yh is False:  # plain arguments, a call for autograd to record
            if residual is None:
                return ops.RMSNormFunction.apply(x, weight, eps)
            return ops.RMSNormResidualFunction.apply(x, residual, weight, eps)
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
    if out is not None or residual_out is not None:
        checks.no_autograd_with_out("rmsnorm", x, weight, residual, out, residual_out)
    if _compiling():
        if residual is None:
            y = ops.rmsnorm(x, weight, eps)[0]
            return y if out is None else _write(out, y)
        y, h, _ = ops.rmsnorm_residual(x, residual, weight, eps)
        return (y if out is None else _write(out, y)), (h if residual_out is None else _write(residual_out, h))
    if out is None and residual_out is None and checks.needs_autograd(x, weight, residual):
        if residual is None:
            return ops.RMSNormFunction.apply(x, weight, eps)
        return ops.RMSNormResidualFunction.apply(x, residual, weight, eps)
    y = _new(x.shape) if out is None else out
    if residual is None:
        library().rmsnorm(x, None, weight, eps, y, None, None)
        return y
    h = _new(x.shape) if residual_out is None else residual_out
    library().rmsnorm(x, residual, weight, eps, y, h, None)
    return y, h


def layernorm(x, weight=None, bias=None, eps: float = 1e-5, *, out=None):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dimension (two-pass variance)."""
    if isinstance(x, _TENSOR) and type(eps) is float and _tensors(weight, bias, out) and not _compiling():
        y = library().layernorm_fast(x, weight, bias, eps, out)
        if y is not None:
            return ops.LayerNormFunction.apply(x, weight, bias, eps) if y is False else y  # False: as softmax's
    x = _rows_input("x", x)
    if weight is not None:
        _check_vector("weight", weight, x.shape[-1])
    if bias is not None:
        _check_vector("bias", bias, x.shape[-1])
    eps = checks.positive_float("eps", eps)
    _check_output("out", out, x.shape)
    _check_apart({"out": out}, {"x": x, "weight": weight, "bias": bias}, in_place=("x",))
    if out is not None:
        checks.no_autograd_with_out("layernorm", x, weight, bias, out)
    if _compiling():
        y = ops.layernorm(x, weight, bias, eps)[0]
        return y if out is None else _write(out, y)
    if out is None and checks.needs_autograd(x, weight, bias):
        return ops.LayerNormFunction.apply(x, weight, bias, eps)
    y = _new(x.shape) if out is None else out
    library().layernorm(x, weight, bias, eps, y, None, None)
    return y


def _check_stat(name: str, t, x) -> None:
    """A saved row statistic: fp32 on the CPU, one value per row of x (shape x.shape[:-1]), contiguous."""
    checks.tensor(name, t)
    checks.dtype_in(name, t, (_F32,))
    checks.device_is(name, t, "cpu")
    checks.shape_is(name, t, x.shape[:-1])
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")


def _check_grad_like(name: str, t, x):
    """A gradient of x's shape: checked like x, rows copied if they share no single stride."""
    t = _rows_input(name, t)
    checks.shape_is(name, t, x.shape)
    return t


def _not_differentiable(op: str, *tensors) -> None:
    if checks.needs_autograd(*tensors):
        raise RuntimeError(f"{op}() is not differentiable (no double backward), but one of the arguments requires "
                           "grad: call it under torch.no_grad() or on detached tensors")


def softmax_backward(y, grad_out, *, out=None):
    """dx = y * (dy - sum(y * dy)) per row: the gradient of softmax from its output y and dy."""
    if isinstance(y, _TENSOR) and isinstance(grad_out, _TENSOR) and _tensors(out) and not _compiling():
        dx = library().softmax_backward_fast(y, grad_out, out)
        if dx is not None:
            return dx
    y = _rows_input("y", y)
    grad_out = _check_grad_like("grad_out", grad_out, y)
    _check_output("out", out, y.shape)
    _not_differentiable("softmax_backward", y, grad_out, out)
    if _compiling():
        dx = ops.softmax_backward(y, grad_out)
        return dx if out is None else _write(out, dx)
    dx = _new(y.shape) if out is None else out
    library().softmax_backward(y, grad_out, dx)
    return dx


def rmsnorm_backward(h, rstd, grad_out, weight=None, grad_h=None, *, dx=None, dweight=None):
    """(dh, dweight) of y = h * rstd * weight, from the forward's normalized input h (x, or x + residual) and
    its rstd; grad_h (the gradient reaching h directly, as the residual output's) is added to dh, which is
    the gradient of x and of the residual. dweight is that of a unit weight when weight is None."""
    if (isinstance(h, _TENSOR) and isinstance(rstd, _TENSOR) and isinstance(grad_out, _TENSOR)
            and _tensors(weight, grad_h, dx, dweight) and not _compiling()):
        grads = library().rmsnorm_backward_fast(h, rstd, grad_out, weight, grad_h, dx, dweight)
        if grads is not None:
            return grads
    h = _rows_input("h", h)
    _check_stat("rstd", rstd, h)
    grad_out = _check_grad_like("grad_out", grad_out, h)
    if weight is not None:
        _check_vector("weight", weight, h.shape[-1])
    if grad_h is not None:
        grad_h = _check_grad_like("grad_h", grad_h, h)
    _check_output("dx", dx, h.shape)
    _check_output("dweight", dweight, h.shape[-1:])
    _not_differentiable("rmsnorm_backward", h, rstd, grad_out, weight, grad_h, dx, dweight)
    if _compiling():
        grads = ops.rmsnorm_backward(h, rstd, weight, grad_out, grad_h, True)
        return _write_all(grads, (dx, dweight))
    dx = _new(h.shape) if dx is None else dx
    dweight = _new(h.shape[-1:]) if dweight is None else dweight
    library().rmsnorm_backward(h, rstd, weight, grad_out, grad_h, dx, dweight)
    return dx, dweight


def layernorm_backward(x, mean, rstd, grad_out, weight=None, *, dx=None, dweight=None, dbias=None):
    """(dx, dweight, dbias) of y = (x - mean) * rstd * weight + bias, from the forward's mean and rstd;
    dweight and dbias are those of a unit weight and a zero bias when the forward had none."""
    if (isinstance(x, _TENSOR) and isinstance(mean, _TENSOR) and isinstance(rstd, _TENSOR)
            and isinstance(grad_out, _TENSOR) and _tensors(weight, dx, dweight, dbias) and not _compiling()):
        grads = library().layernorm_backward_fast(x, mean, rstd, grad_out, weight, dx, dweight, dbias)
        if grads is not None:
            return grads
    x = _rows_input("x", x)
    _check_stat("mean", mean, x)
    _check_stat("rstd", rstd, x)
    grad_out = _check_grad_like("grad_out", grad_out, x)
    if weight is not None:
        _check_vector("weight", weight, x.shape[-1])
    _check_output("dx", dx, x.shape)
    _check_output("dweight", dweight, x.shape[-1:])
    _check_output("dbias", dbias, x.shape[-1:])
    _not_differentiable("layernorm_backward", x, mean, rstd, grad_out, weight, dx, dweight, dbias)
    if _compiling():
        grads = ops.layernorm_backward(x, mean, rstd, weight, grad_out, True, True)
        return _write_all(grads, (dx, dweight, dbias))
    dx = _new(x.shape) if dx is None else dx
    dweight = _new(x.shape[-1:]) if dweight is None else dweight
    dbias = _new(x.shape[-1:]) if dbias is None else dbias
    library().layernorm_backward(x, mean, rstd, weight, grad_out, dx, dweight, dbias)
    return dx, dweight, dbias


def _check_linear(x, weight) -> None:
    _check_input("x", x, 2)
    _check_input("weight", weight, 2)
    checks.shape_is("weight", weight, (weight.shape[0], x.shape[1]))


def linear_forward(x, weight, bias=None, *, out=None):
    """y = x W^T + b with x (M, K), W (N, K), b (N); differentiable (its backward is linear_backward)."""
    if isinstance(x, _TENSOR) and isinstance(weight, _TENSOR) and _tensors(bias, out) and not _compiling():
        y = library().linear_forward_fast(x, weight, bias, out)
        if y is not None:
            return ops.LinearFunction.apply(x, weight, bias) if y is False else y  # False: as softmax's
    _check_linear(x, weight)
    if bias is not None:
        _check_vector("bias", bias, weight.shape[0])
    _check_output("out", out, (x.shape[0], weight.shape[0]))
    _check_apart({"out": out}, {"x": x, "weight": weight, "bias": bias})
    if out is not None:
        checks.no_autograd_with_out("linear_forward", x, weight, bias, out)
    if _compiling():
        y = ops.linear(x, weight, bias)
        return y if out is None else _write(out, y)
    if out is None and checks.needs_autograd(x, weight, bias):
        return ops.LinearFunction.apply(x, weight, bias)
    y = _new((x.shape[0], weight.shape[0])) if out is None else out
    library().linear_forward(x, weight, bias, y)
    return y


def linear_backward(x, weight, grad_out, *, dx=None, dweight=None, dbias=None):
    """(dx, dW, db) = (dy W, dy^T x, sum_rows dy) for y = x W^T + b; outputs are overwritten, never accumulated.

    Not itself differentiable: with grad mode on, no argument may require grad."""
    if (isinstance(x, _TENSOR) and isinstance(weight, _TENSOR) and isinstance(grad_out, _TENSOR)
            and _tensors(dx, dweight, dbias) and not _compiling()):
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
    if checks.needs_autograd(x, weight, grad_out, dx, dweight, dbias):
        raise RuntimeError("linear_backward() is not differentiable (no double backward), but one of the arguments "
                           "requires grad: call it under torch.no_grad() or on detached tensors")
    if _compiling():
        return _write_all(ops.linear_backward(x, weight, grad_out), (dx, dweight, dbias))
    dx = _new(x.shape) if dx is None else dx
    dweight = _new(weight.shape) if dweight is None else dweight
    dbias = _new(weight.shape[:1]) if dbias is None else dbias
    library().linear_backward(x, weight, grad_out, dx, dweight, dbias)
    return dx, dweight, dbias
