"""Device dispatch of the public functions; each backend checks its own arguments."""

from __future__ import annotations

from . import checks


def _backend(x, name: str = "x"):
    checks.tensor(name, x)
    if x.device.type == "cuda":
        from . import gpu

        return gpu
    if x.device.type == "cpu":
        from . import cpu

        return cpu
    raise ValueError(f"{name} must be a CPU or CUDA tensor, got a tensor on {x.device}")


def softmax(x, *, out=None):
    """softmax over the last dimension."""
    return _backend(x).softmax(x, out=out)


def rmsnorm(x, weight=None, eps: float = 1e-6, residual=None, *, out=None, residual_out=None):
    """RMSNorm over the last dimension; with ``residual``, normalizes x + residual and returns (y, x + residual)."""
    return _backend(x).rmsnorm(x, weight, eps, residual, out=out, residual_out=residual_out)


def layernorm(x, weight=None, bias=None, eps: float = 1e-5, *, out=None):
    """LayerNorm over the last dimension."""
    return _backend(x).layernorm(x, weight, bias, eps, out=out)


def linear_forward(x, weight, bias=None, *, out=None):
    """y = x W^T + b with x (M, K), W (N, K), b (N). CPU backend."""
    return _cpu_only(x, "linear_forward").linear_forward(x, weight, bias, out=out)


def linear_backward(x, weight, grad_out, *, dx=None, dweight=None, dbias=None):
    """(dx, dW, db) of y = x W^T + b; the output buffers are cleared as part of the call. CPU backend."""
    return _cpu_only(x, "linear_backward").linear_backward(x, weight, grad_out, dx=dx, dweight=dweight, dbias=dbias)


def _cpu_only(x, what: str):
    backend = _backend(x)
    if backend.__name__.endswith(".gpu"):
        raise NotImplementedError(f"{what} has a CPU backend only; x is on {x.device} (use torch.nn.functional.linear)")
    return backend
