"""Plain-torch float64 truths of the ops the suites measure: one truth for tests and benchmarks.

Each function upcasts its (already rounded) inputs to float64 and follows torch's semantics for
NaN and infinity (a row containing NaN gives NaN; a row of -inf gives NaN in softmax).
"""

from __future__ import annotations


def _f64(t):
    """t in float64, detached, except a float64 autograd leaf of ``_grads`` (kept, to differentiate)."""
    import torch

    if t is None or (t.requires_grad and t.dtype == torch.float64):
        return t
    return t.detach().to(torch.float64)


def softmax(x):
    import torch

    return torch.softmax(_f64(x), dim=-1)


def rmsnorm(x, weight=None, eps: float = 1e-6, residual=None):
    """y = h / sqrt(mean(h^2) + eps) * weight with h = x (+ residual); returns (y, h)."""
    import torch

    h = _f64(x) if residual is None else _f64(x) + _f64(residual)
    y = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps)
    if weight is not None:
        y = y * _f64(weight)
    return y, h


def layernorm(x, weight=None, bias=None, eps: float = 1e-5):
    import torch

    x64 = _f64(x)
    mean = x64.mean(dim=-1, keepdim=True)
    var = (x64 - mean).pow(2).mean(dim=-1, keepdim=True)
    y = (x64 - mean) * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * _f64(weight)
    if bias is not None:
        y = y + _f64(bias)
    return y


def linear_forward(x, weight, bias=None):
    """y = x W^T + b with x (M, K), W (N, K), b (N)."""
    y = _f64(x) @ _f64(weight).T
    return y if bias is None else y + _f64(bias)


def linear_backward(x, weight, grad_out):
    """(dx, dW, db) of y = x W^T + b given dy."""
    x64, w64, dy = _f64(x), _f64(weight), _f64(grad_out)
    return dy @ w64, dy.T @ x64, dy.sum(dim=0)


def _grads(forward, inputs, grad_out):
    """float64 gradients of ``forward(*inputs)`` (one output) given grad_out, by autograd on the truths
    above; None for an input that is None."""
    import torch

    leaves = [None if t is None else _f64(t).requires_grad_(True) for t in inputs]
    y = forward(*leaves)
    wanted = [t for t in leaves if t is not None]
    found = iter(torch.autograd.grad(y, wanted, _f64(grad_out)))
    return y.detach(), [None if t is None else next(found) for t in leaves]


def softmax_backward(y, grad_out):
    """dx of y = softmax(x) given y and dy: y * (dy - sum(dy * y))."""
    y64, dy = _f64(y), _f64(grad_out)
    return y64 * (dy - (dy * y64).sum(dim=-1, keepdim=True))


def softmax_train(x, grad_out):
    """(y, dx) of softmax through float64 autograd."""
    y, (dx,) = _grads(softmax, (x,), grad_out)
    return y, dx


def rmsnorm_train(x, weight, grad_out, eps: float = 1e-6):
    """(y, dx, dweight) of RMSNorm through float64 autograd."""
    y, (dx, dw) = _grads(lambda a, w: rmsnorm(a, w, eps)[0], (x, weight), grad_out)
    return y, dx, dw


def layernorm_train(x, weight, bias, grad_out, eps: float = 1e-5):
    """(y, dx, dweight, dbias) of LayerNorm through float64 autograd."""
    y, (dx, dw, db) = _grads(lambda a, w, b: layernorm(a, w, b, eps), (x, weight, bias), grad_out)
    return y, dx, dw, db
