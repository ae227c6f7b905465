"""The forms of residual-MLP stack the compiler accepts, their float64 reference and the torch chain
that serves any block no kernel can.

A stack keeps a residual stream ``s`` (the input, then fp32 between blocks). Block i:

    u  = fp16(norm_i(s))            (or fp16(s) without a norm; RMSNorm or LayerNorm, LayerNorm bias optional)
    a  = u W1^T [+ b1]              (fp32 accumulation)
    h  = fp16(act(a))                            plain block
    h  = fp16(act(a) * (u W3^T [+ b3]))          gated block (SwiGLU / GeGLU: act on the W1 path)
    s' = s + h W2^T [+ b2]          (fp32)

and after the last block an optional final norm, ``y = norm(s)`` in fp32. Activations: ReLU, GELU
with the tanh approximation (``gelu``), exact GELU (``gelu_erf``), SiLU. A missing bias is a zero
bias (adding 0.0 is exact), a missing norm weight is ones and a missing LayerNorm bias zeros.

``reference_stack`` computes this in float64 with the rounding points above (``rounded=True``, the
truth for the engines) or with none (``rounded=False``: the module's own math in float64, the truth
for the frontend). ``torch_block`` / ``torch_norm`` are the recorded fallback for forms without a
kernel: the same rounding points, in torch.
"""

from __future__ import annotations

import dataclasses
import math

from . import model

STACK_ACTIVATIONS = (*model.ACTIVATIONS, "gelu_erf")
"""The kernels' activations (``model.ACTIVATIONS``: relu, gelu = tanh approximation, silu) plus exact GELU."""
NORMS = ("rmsnorm", "layernorm")


@dataclasses.dataclass(frozen=True)
class Norm:
    """A norm over the channels: ``kind`` rmsnorm or layernorm, ``eps``, and whether it has a bias
    (LayerNorm only). The weight, if any, travels with the parameters (absent: ones)."""

    kind: str
    eps: float = model.DEFAULT_NORM_EPS
    bias: bool = False

    def describe(self) -> str:
        return f"{self.kind}(eps={self.eps:g}{', bias' if self.bias else ''})"


def check_activation(name: str) -> str:
    if name not in STACK_ACTIVATIONS:
        raise ValueError(f"activation must be one of {STACK_ACTIVATIONS}, got {name!r}")
    return name


def activation_float64(name: str, v):
    """Any stack activation in float64."""
    import torch

    if check_activation(name) == "gelu_erf":
        return 0.5 * v * (1.0 + torch.erf(v / math.sqrt(2.0)))
    return model.activation_float64(name, v)


def torch_activation(name: str):
    """Any stack activation as torch applies it."""
    import torch.nn.functional as F

    if check_activation(name) == "gelu_erf":
        return F.gelu
    return model.torch_activation(name)


def norm_float64(s, norm: Norm, weight=None, bias=None):
    """``norm`` of the rows of ``s`` in float64 (weight None: ones; bias None: zeros)."""
    import torch

    s = s.to(torch.float64)
    if norm.kind == "rmsnorm":
        out = s * torch.rsqrt(s.pow(2).mean(dim=-1, keepdim=True) + norm.eps)
    elif norm.kind == "layernorm":
        centred = s - s.mean(dim=-1, keepdim=True)
        out = centred * torch.rsqrt(centred.pow(2).mean(dim=-1, keepdim=True) + norm.eps)
    else:
        raise ValueError(f"norm kind must be one of {NORMS}, got {norm.kind!r}")
    if weight is not None:
        out = out * weight.to(torch.float64)
    if bias is not None:
        out = out + bias.to(torch.float64)
    return out


def _linear64(v, weight, bias):
    import torch

    out = v @ weight.to(torch.float64).T
    return out if bias is None else out + bias.to(torch.float64)


def reference_stack(x, blocks, parameters: list[dict], final_norm: Norm | None = None, final_parameters=None, *,
                    rounded: bool = True):
    """The stack in float64. ``blocks`` are the compiler's IR blocks (``activation``, ``norm``,
    ``gated``), ``parameters`` per block the tensors ``w1 w2 [w3] [b1 b2 b3] [norm_weight norm_bias]``
    (absent keys: no bias, no norm weight). ``rounded``: the kernels' rounding points (stream fp32
    between blocks, operand and hidden fp16); otherwise none at all."""
    import torch

    f64 = torch.float64

    def fp16(t):
        return t.to(torch.float16).to(f64) if rounded else t

    s = x.to(f64)
    for index, (block, p) in enumerate(zip(blocks, parameters, strict=True)):
        if index > 0 and rounded:
            s = s.to(torch.float32).to(f64)
        u = s if block.norm is None else norm_float64(s, block.norm, p.get("norm_weight"), p.get("norm_bias"))
        u = fp16(u)
        hidden = activation_float64(block.activation, _linear64(u, p["w1"], p.get("b1")))
        if block.gated:
            hidden = hidden * _linear64(u, p["w3"], p.get("b3"))
        s = s + _linear64(fp16(hidden), p["w2"], p.get("b2"))
    if final_norm is not None:
        if rounded:
            s = s.to(torch.float32).to(f64)
        final_parameters = final_parameters or {}
        s = norm_float64(s, final_norm, final_parameters.get("norm_weight"), final_parameters.get("norm_bias"))
    return s


# ---- the torch chain (the fallback for forms no kernel serves) -------------------------------------------

def _matmul_fp32(a, weight):
    """fp16 x fp16^T with fp32 accumulation and output: cuBLAS with out_dtype on the GPU; on the CPU
    through fp32 operands (fp16 products are exact in fp32, so only the accumulation rounds)."""
    import torch

    if a.is_cuda:
        return torch.mm(a, weight.t(), out_dtype=torch.float32)
    return a.float() @ weight.float().t()


def torch_norm(s, norm: Norm, weight=None, bias=None):
    """``norm`` of the rows of ``s`` in fp32 (weight None: ones; bias None: zeros)."""
    import torch.nn.functional as F

    s = s.float()
    shape = (s.shape[-1],)
    if norm.kind == "rmsnorm":
        return F.rms_norm(s, shape, weight, norm.eps)
    return F.layer_norm(s, shape, weight, bias, norm.eps)


def torch_block(stream, block, p: dict, out):
    """One block with the kernels' rounding points, in torch, written into ``out`` (fp32). A bias the block lacks
    is zeros in ``p`` and not added: as the models suite's control this is the torch a user would run."""
    import torch

    f16 = torch.float16
    u = stream if block.norm is None else torch_norm(stream, block.norm, p.get("norm_weight"), p.get("norm_bias"))
    u = u.to(f16)
    pre = _matmul_fp32(u, p["w1"])
    if block.bias1:
        pre = pre + p["b1"]
    hidden = torch_activation(block.activation)(pre)
    if block.gated:
        gate = _matmul_fp32(u, p["w3"])
        hidden = hidden * (gate + p["b3"] if block.bias3 else gate)
    y = _matmul_fp32(hidden.to(f16), p["w2"])
    if block.bias2:
        y = y + p["b2"]
    return torch.add(y, stream.float(), out=out)


def torch_stack(x, blocks, parameters: list[dict], final_norm: Norm | None, final_parameters, out):
    """The whole stack in torch with the kernels' rounding points (``torch_block`` per block, then the final
    norm in fp32), written into ``out`` (fp32): the torch control of the models suite."""
    import torch

    stream = x
    for index, (block, p) in enumerate(zip(blocks, parameters, strict=True)):
        last = index == len(blocks) - 1 and final_norm is None
        stream = torch_block(stream, block, p, out if last else torch.empty_like(out))
    if final_norm is not None:
        torch_final_norm(stream, final_norm, final_parameters, out)
    return out


def torch_final_norm(stream, final_norm: Norm, final_parameters: dict | None, out):
    """``out = final_norm(stream)`` in fp32 (``final_parameters``: its weight and bias, absent keys: none)."""
    final_parameters = final_parameters or {}
    return out.copy_(torch_norm(stream, final_norm, final_parameters.get("norm_weight"),
                                final_parameters.get("norm_bias")))


# ---- parameters from a seed (specs, tests) ------------------------------------------------------------

def make_norm_parameters(norm: Norm, channels: int, *, seed: int, device="cpu") -> dict:
    """A norm's weight ~ 1 + N(0, 0.1^2) and, for a LayerNorm with a bias, bias ~ N(0, 0.1^2)."""
    g = model.seeded_generator(seed, device)
    params = {"norm_weight": model.scaled_randn((channels,), g, device, 0.1, 1.0)}
    if norm.bias:
        params["norm_bias"] = model.scaled_randn((channels,), g, device, 0.1)
    return params


def make_parameters(block, *, seed: int, device="cpu") -> dict:
    """A block's parameters as the kernels take them (``model.make_block_parameters``' scales; a gate
    W3 ~ N(0, 1/C)); biases the block lacks are zeros, so every form has the same keys."""
    import torch

    params = model.make_block_parameters(block.channels, block.hidden, seed=seed, device=device)
    g = model.seeded_generator(seed + 1, device)
    if block.gated:
        params["w3"] = model.scaled_randn((block.hidden, block.channels), g, device,
                                    1.0 / math.sqrt(block.channels)).to(torch.float16)
        params["b3"] = model.scaled_randn((block.hidden,), g, device, 0.1)
    for key, present in (("b1", block.bias1), ("b2", block.bias2), ("b3", block.bias3)):
        if key in params and not present:
            params[key] = torch.zeros_like(params[key])
    if block.norm is not None:
        params.update(make_norm_parameters(block.norm, block.channels, seed=seed + 2, device=device))
    return params
