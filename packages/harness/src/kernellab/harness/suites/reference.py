"""Plain-torch float64 truths of the ops the suites measure: one truth for tests and benchmarks.

Each function upcasts its (already rounded) inputs to float64 and follows torch's semantics for
NaN and infinity (a row containing NaN gives NaN; a row of -inf gives NaN in softmax).
"""

from __future__ import annotations


def _f64(t):
    import torch

    return None if t is None else t.detach().to(torch.float64)


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
