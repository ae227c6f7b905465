"""Argument checks shared by both backends: every bad input fails here, before any kernel runs,
with an error that names the argument and says what was expected."""

from __future__ import annotations

import numbers
from collections.abc import Sequence


def tensor(name: str, value):
    import torch

    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def dtype_in(name: str, t, allowed: Sequence) -> None:
    if t.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise TypeError(f"{name} must have dtype in ({names}), got {str(t.dtype).replace('torch.', '')}")


def device_is(name: str, t, kind: str) -> None:
    if t.device.type != kind:
        where = "a CUDA tensor" if kind == "cuda" else "a CPU tensor"
        raise ValueError(f"{name} must be {where}, got a tensor on {t.device}")


def same_device(name: str, t, ref_name: str, ref) -> None:
    if t.device != ref.device:
        raise ValueError(f"{name} is on {t.device} but {ref_name} is on {ref.device}; both must be on one device")


def shape_is(name: str, t, shape: Sequence[int]) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")


def ndim_at_least(name: str, t, n: int) -> None:
    if t.dim() < n:
        raise ValueError(f"{name} must have at least {n} dimension(s), got shape {tuple(t.shape)}")


def ndim_is(name: str, t, n: int) -> None:
    if t.dim() != n:
        raise ValueError(f"{name} must have {n} dimension(s), got shape {tuple(t.shape)}")


def nonempty(name: str, t) -> None:
    if t.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(t.shape)}")


def unit_last_stride(name: str, t) -> None:
    if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension (stride 1), got strides {t.stride()}")


def positive_float(name: str, value) -> float:
    """A real number > 0. A bool or a string is refused, not converted: ``eps=True`` or ``eps="1e-6"`` is
    a mistake that float() would hide."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number (a float or an int), got {type(value).__name__} {value!r}")
    v = float(value)
    if not v > 0.0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return v


def out_buffer(name: str, out, like_shape: Sequence[int], dtype, device) -> None:
    """An ``out=`` buffer must match the result exactly: shape, dtype and device."""
    tensor(name, out)
    shape_is(name, out, like_shape)
    if out.dtype != dtype:
        raise TypeError(f"{name} must have dtype {str(dtype).replace('torch.', '')}, got "
                        f"{str(out.dtype).replace('torch.', '')}")
    if out.device != device:
        raise ValueError(f"{name} must be on {device}, got {out.device}")


def rows_do_not_overlap(name: str, t) -> None:
    """A written tensor's rows (the slices along its last dimension) must not share memory: sorted by
    stride, each leading dimension of size > 1 must step past everything the smaller ones span."""
    span = t.shape[-1] if t.dim() else 1
    dims = sorted((st, s) for s, st in zip(t.shape[:-1], t.stride()[:-1], strict=True) if s > 1)
    for stride, size in dims:
        if stride < span:
            raise ValueError(f"{name} must not overlap itself (its rows share memory), got shape "
                             f"{tuple(t.shape)} and strides {t.stride()}")
        span = stride * size


def needs_autograd(*tensors) -> bool:
    """Whether autograd must record a call on these tensors (grad mode on and one requires grad)."""
    import torch

    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def no_autograd_with_out(op: str, *tensors) -> None:
    """torch's rule for out= functions: no argument, the out= buffers included, may require grad."""
    if needs_autograd(*tensors):
        raise RuntimeError(f"{op}(): functions with out=... arguments don't support automatic differentiation, "
                           "but one of the arguments requires grad")
