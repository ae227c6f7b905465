"""The CPU backend's custom ops (``kernellab_cpu::*``), what torch.compile sees, and its autograd.

The public functions in ``kernellab.kernels.cpu`` call the library directly when no tensor needs
autograd and nothing is being traced, these ops while torch.compile traces, and the autograd
Functions at the end of this module (the ops' bodies without their dispatch) in eager autograd. Each
forward op returns the row statistics its backward reads (softmax: its output; RMSNorm: rstd;
LayerNorm: mean and rstd), and each backward is a native kernel of its own op, so torch.compile
keeps both as opaque nodes (their fake implementations give the shapes) and autograd runs no Python
arithmetic. The ops take tensors the public layer has checked; rows that do not share one stride are
copied here.
"""

from __future__ import annotations

import torch

from ._build import library

_F32 = torch.float32


def rows_of(t):
    """t if its rows can be addressed with one stride and unit last stride, else a contiguous copy."""
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        return t.contiguous()
    if t.dim() > 2:
        try:
            t.view(-1, t.shape[-1])
        except RuntimeError:
            return t.contiguous()
    return t


def _custom_op(name: str, fn):
    """``kernellab_cpu::<name>`` over fn, which eager autograd also calls directly (see the Functions below)."""
    return torch.library.custom_op(f"kernellab_cpu::{name}", fn, mutates_args=(), device_types="cpu")


def _empty(shape):
    return torch.empty(shape, dtype=_F32)


def _stat(x):
    """One fp32 value per row of x: the shape of x without its last dimension."""
    return _empty(x.shape[:-1])


def _vector(t):
    return None if t is None else t.contiguous()


def _no_grad_vector(n: int, wanted: bool):
    """A per-feature gradient buffer of n floats, or a (0,) placeholder when it is not wanted."""
    return _empty((n,) if wanted else (0,))


# ---- softmax -----------------------------------------------------------------------------------------
def _softmax(x: torch.Tensor) -> torch.Tensor:
    x = rows_of(x)
    y = _empty(x.shape)
    library().softmax(x, y)
    return y


softmax = _custom_op("softmax", _softmax)


@softmax.register_fake
def _(x):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _softmax_backward(y: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """dx = y * (dy - sum(y * dy)) per row, from the forward's output."""
    y, grad = rows_of(y), rows_of(grad)
    dx = _empty(y.shape)
    library().softmax_backward(y, grad, dx)
    return dx


softmax_backward = _custom_op("softmax_backward", _softmax_backward)


@softmax_backward.register_fake
def _(y, grad):
    return torch.empty_like(y, memory_format=torch.contiguous_format)


def _softmax_setup(ctx, inputs, output):
    ctx.save_for_backward(output)


def _softmax_grad(ctx, grad):
    (y,) = ctx.saved_tensors
    return softmax_backward(y, grad)


softmax.register_autograd(_softmax_grad, setup_context=_softmax_setup)


# ---- RMSNorm -----------------------------------------------------------------------------------------
def _rmsnorm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, rstd): rstd = 1 / sqrt(mean(x^2) + eps) per row, kept for the backward."""
    x = rows_of(x)
    y, rstd = _empty(x.shape), _stat(x)
    library().rmsnorm(x, None, _vector(weight), eps, y, None, rstd)
    return y, rstd


rmsnorm = _custom_op("rmsnorm", _rmsnorm)


@rmsnorm.register_fake
def _(x, weight, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty(x.shape[:-1])


def _rmsnorm_residual(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, h, rstd) with h = x + residual normalized."""
    x, residual = rows_of(x), rows_of(residual)
    y, h, rstd = _empty(x.shape), _empty(x.shape), _stat(x)
    library().rmsnorm(x, residual, _vector(weight), eps, y, h, rstd)
    return y, h, rstd


rmsnorm_residual = _custom_op("rmsnorm_residual", _rmsnorm_residual)


@rmsnorm_residual.register_fake
def _(x, residual, weight, eps):
    like = torch.empty_like(x, memory_format=torch.contiguous_format)
    return like, torch.empty_like(like), x.new_empty(x.shape[:-1])


def _rmsnorm_backward(h: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor | None, grad_y: torch.Tensor,
                     grad_h: torch.Tensor | None, weight_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(dh, dweight) of y = h * rstd * weight; grad_h, the gradient reaching h directly, is added to dh.
    dweight (that of a unit weight when weight is None) has shape (0,) unless weight_grad."""
    h, grad_y = rows_of(h), rows_of(grad_y)
    grad_h = None if grad_h is None else rows_of(grad_h)
    dh = _empty(h.shape)
    dweight = _no_grad_vector(h.shape[-1], weight_grad)
    library().rmsnorm_backward(h, rstd.contiguous(), _vector(weight), grad_y, grad_h, dh,
                               dweight if dweight.numel() else None)
    return dh, dweight


rmsnorm_backward = _custom_op("rmsnorm_backward", _rmsnorm_backward)


@rmsnorm_backward.register_fake
def _(h, rstd, weight, grad_y, grad_h, weight_grad):
    n = h.shape[-1] if weight_grad else 0
    return torch.empty_like(h, memory_format=torch.contiguous_format), h.new_empty((n,))


def _rmsnorm_setup(ctx, inputs, output):
    x, weight, eps = inputs
    y, rstd = output
    ctx.mark_non_differentiable(rstd)
    ctx.save_for_backward(x, rstd, weight)


def _rmsnorm_grad(ctx, grad_y, _grad_rstd):
    x, rstd, weight = ctx.saved_tensors
    dx, dweight = rmsnorm_backward(x, rstd, weight, grad_y, None, ctx.needs_input_grad[1])
    return dx, dweight if ctx.needs_input_grad[1] else None, None


def _rmsnorm_residual_setup(ctx, inputs, output):
    x, residual, weight, eps = inputs
    y, h, rstd = output
    ctx.mark_non_differentiable(rstd)
    ctx.save_for_backward(h, rstd, weight)


def _rmsnorm_residual_grad(ctx, grad_y, grad_h, _grad_rstd):
    h, rstd, weight = ctx.saved_tensors
    dh, dweight = rmsnorm_backward(h, rstd, weight, grad_y, grad_h, ctx.needs_input_grad[2])
    # h = x + residual: both receive dh.
    return dh, dh, dweight if ctx.needs_input_grad[2] else None, None


rmsnorm.register_autograd(_rmsnorm_grad, setup_context=_rmsnorm_setup)
rmsnorm_residual.register_autograd(_rmsnorm_residual_grad, setup_context=_rmsnorm_residual_setup)


# ---- LayerNorm ---------------------------------------------------------------------------------------
def _layernorm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
              eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, mean, rstd), the statistics per row kept for the backward."""
    x = rows_of(x)
    y, mean, rstd = _empty(x.shape), _stat(x), _stat(x)
    library().layernorm(x, _vector(weight), _vector(bias), eps, y, mean, rstd)
    return y, mean, rstd


layernorm = _custom_op("layernorm", _layernorm)


@layernorm.register_fake
def _(x, weight, bias, eps):
    return (torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty(x.shape[:-1]),
            x.new_empty(x.shape[:-1]))


def _layernorm_backward(x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor | None,
                       grad: torch.Tensor, weight_grad: bool,
                       bias_grad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight, dbias); dweight and dbias have shape (0,) unless asked for."""
    x, grad = rows_of(x), rows_of(grad)
    n = x.shape[-1]
    dx = _empty(x.shape)
    dweight, dbias = _no_grad_vector(n, weight_grad), _no_grad_vector(n, bias_grad)
    library().layernorm_backward(x, mean.contiguous(), rstd.contiguous(), _vector(weight), grad, dx,
                                 dweight if weight_grad else None, dbias if bias_grad else None)
    return dx, dweight, dbias


layernorm_backward = _custom_op("layernorm_backward", _layernorm_backward)


@layernorm_backward.register_fake
def _(x, mean, rstd, weight, grad, weight_grad, bias_grad):
    n = x.shape[-1]
    return (torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty((n if weight_grad else 0,)),
            x.new_empty((n if bias_grad else 0,)))


def _layernorm_setup(ctx, inputs, output):
    x, weight, bias, eps = inputs
    y, mean, rstd = output
    ctx.mark_non_differentiable(mean, rstd)
    ctx.save_for_backward(x, mean, rstd, weight)


def _layernorm_grad(ctx, grad, _grad_mean, _grad_rstd):
    x, mean, rstd, weight = ctx.saved_tensors
    weight_grad, bias_grad = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
    dx, dweight, dbias = layernorm_backward(x, mean, rstd, weight, grad, weight_grad, bias_grad)
    return dx, dweight if weight_grad else None, dbias if bias_grad else None, None


layernorm.register_autograd(_layernorm_grad, setup_context=_layernorm_setup)


# ---- linear ------------------------------------------------------------------------------------------
def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """y = x W^T + b with x (M, K), W (N, K)."""
    x, weight = rows_of(x), rows_of(weight)
    y = _empty((x.shape[0], weight.shape[0]))
    library().linear_forward(x, weight, _vector(bias), y)
    return y


linear = _custom_op("linear", _linear)


@linear.register_fake
def _(x, weight, bias):
    return x.new_empty((x.shape[0], weight.shape[0]))


def _linear_backward(x: torch.Tensor, weight: torch.Tensor,
                    grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dW, db) = (dy W, dy^T x, column sums of dy)."""
    x, weight, grad = rows_of(x), rows_of(weight), rows_of(grad)
    dx, dweight, dbias = _empty(x.shape), _empty(weight.shape), _empty(weight.shape[:1])
    library().linear_backward(x, weight, grad, dx, dweight, dbias)
    return dx, dweight, dbias


linear_backward = _custom_op("linear_backward", _linear_backward)


@linear_backward.register_fake
def _(x, weight, grad):
    return x.new_empty(x.shape), weight.new_empty(weight.shape), weight.new_empty(weight.shape[:1])


def _linear_setup(ctx, inputs, output):
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight)


def _linear_grad(ctx, grad):
    x, weight = ctx.saved_tensors
    dx, dweight, dbias = linear_backward(x, weight, grad)
    wanted = ctx.needs_input_grad
    return dx if wanted[0] else None, dweight if wanted[1] else None, dbias if wanted[2] else None


linear.register_autograd(_linear_grad, setup_context=_linear_setup)


# ---- eager autograd: the same kernels without the custom ops' dispatch ------------------------------------
# Outside torch.compile these Functions call the ops' bodies directly, as the GPU backend's do: a custom op's
# Python dispatch costs some tens of microseconds per call, as much as a 128x512 kernel takes, and a step
# through autograd makes two of them per op. The backward passes are the same native kernels.
class SoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = _softmax(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        return _softmax_backward(ctx.saved_tensors[0], grad)


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        y, rstd = _rmsnorm(x, weight, eps)
        ctx.save_for_backward(x, rstd, weight)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, rstd, weight = ctx.saved_tensors
        dx, dweight = _rmsnorm_backward(x, rstd, weight, grad_y, None, ctx.needs_input_grad[1])
        return dx, dweight if ctx.needs_input_grad[1] else None, None


class RMSNormResidualFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, eps):
        y, h, rstd = _rmsnorm_residual(x, residual, weight, eps)
        ctx.save_for_backward(h, rstd, weight)
        return y, h

    @staticmethod
    def backward(ctx, grad_y, grad_h):
        h, rstd, weight = ctx.saved_tensors
        dh, dweight = _rmsnorm_backward(h, rstd, weight, grad_y, grad_h, ctx.needs_input_grad[2])
        return dh, dh, dweight if ctx.needs_input_grad[2] else None, None


class LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        y, mean, rstd = _layernorm(x, weight, bias, eps)
        ctx.save_for_backward(x, mean, rstd, weight)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, mean, rstd, weight = ctx.saved_tensors
        weight_grad, bias_grad = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        dx, dweight, dbias = _layernorm_backward(x, mean, rstd, weight, grad, weight_grad, bias_grad)
        return dx, dweight if weight_grad else None, dbias if bias_grad else None, None


class LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return _linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        dx, dweight, dbias = _linear_backward(x, weight, grad)
        wanted = ctx.needs_input_grad
        return dx if wanted[0] else None, dweight if wanted[1] else None, dbias if wanted[2] else None
