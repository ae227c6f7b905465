"""Plain-torch float64 truths of the ops the suites measure: one truth for tests and benchmarks.

Each function upcasts its (already rounded) inputs to float64 and follows torch's semantics for
NaN and infinity (a row containing NaN gives NaN; a row of -inf gives NaN in softmax). The
``*_backward`` truths are float64 autograd through the same forward formulas (``vjp``).
"""

from __future__ import annotations


def _f64(t):
    """t in float64, detached, except a float64 autograd leaf of ``_grads`` (kept, to differentiate)."""
    import torch

    if t is None or (t.requires_grad and t.dtype == torch.float64):
        return t
    return t.detach().to(torch.float64)


def softmax(x):
    return _softmax(_f64(x))


def _softmax(x64):
    import torch

    return torch.softmax(x64, dim=-1)


def rmsnorm(x, weight=None, eps: float = 1e-6, residual=None):
    """y = h / sqrt(mean(h^2) + eps) * weight with h = x (+ residual); returns (y, h)."""
    return _rmsnorm(_f64(x), _f64(weight), eps, _f64(residual))


def _rmsnorm(x64, w64, eps, r64):
    import torch

    h = x64 if r64 is None else x64 + r64
    y = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps)
    if w64 is not None:
        y = y * w64
    return y, h


def layernorm(x, weight=None, bias=None, eps: float = 1e-5):
    return _layernorm(_f64(x), _f64(weight), _f64(bias), eps)


def _layernorm(x64, w64, b64, eps):
    import torch

    mean = x64.mean(dim=-1, keepdim=True)
    var = (x64 - mean).pow(2).mean(dim=-1, keepdim=True)
    y = (x64 - mean) * torch.rsqrt(var + eps)
    if w64 is not None:
        y = y * w64
    if b64 is not None:
        y = y + b64
    return y


def vjp(forward, primals, cotangents):
    """The float64 gradients of ``forward`` (a function of float64 tensors) with respect to each primal
    (None stays None), given the cotangents of its outputs (None: that output's gradient is zero)."""
    import torch

    with torch.enable_grad():
        leaves = [None if p is None else _f64(p).requires_grad_() for p in primals]
        outputs = forward(*leaves)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [(o, _f64(c)) for o, c in zip(outputs, cotangents, strict=True) if c is not None]
        wrt = [leaf for leaf in leaves if leaf is not None]
        grads = iter(torch.autograd.grad([o for o, _ in pairs], wrt, [c for _, c in pairs], allow_unused=True,
                                         materialize_grads=True))
    return tuple(None if leaf is None else next(grads) for leaf in leaves)


def softmax_backward_of_x(x, grad_out):
    """dx of y = softmax(x) given x and dy (``softmax_backward`` takes the saved y instead)."""
    return vjp(_softmax, (x,), (grad_out,))[0]


def rmsnorm_backward(x, weight, eps: float, grad_out, residual=None, grad_h=None):
    """(dx, dweight, dresidual) of (y, h) = rmsnorm(x, weight, eps, residual) given dy (and dh)."""
    dx, dweight, dresidual = vjp(lambda x64, w64, r64: _rmsnorm(x64, w64, eps, r64), (x, weight, residual),
                                 (grad_out, grad_h))
    return dx, dweight, dresidual


def layernorm_backward(x, weight, bias, eps: float, grad_out):
    """(dx, dweight, dbias) of y = layernorm(x, weight, bias, eps) given dy."""
    return vjp(lambda x64, w64, b64: _layernorm(x64, w64, b64, eps), (x, weight, bias), (grad_out,))


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
