"""From a model to the IR: a torch ``nn.Module`` (traced with torch.fx) or a small spec.

Both give ``(blocks, parameters)``: the IR blocks (``ir.Block``) and per block the tensors
``w1, b1, w2, b2`` (and ``norm_weight``), in the dtypes the kernels take (fp16 weights, fp32 biases).

An nn.Module is accepted when its traced graph is a chain of residual blocks, each

    s -> [RMSNorm] -> Linear(C -> H) -> act -> Linear(H -> C) -> add(s, .)

with act one of ReLU, GELU(approximate="tanh"), SiLU (modules or their torch.nn.functional forms).
Anything else is rejected with the node that does not fit.

A spec is ``{"channels": C, "blocks": [{"hidden": H, "activation": "gelu", "norm": False}, ...]}``
(a block may repeat ``channels``; weights come from ``model.make_block_parameters`` and a seed).
"""

from __future__ import annotations

import operator
from typing import Any

from .. import model
from .ir import Block


class FrontendError(ValueError):
    """The model is not one the compiler understands; the message names the part that is not."""


# ---- spec -------------------------------------------------------------------------------------------

SPEC_BLOCK_KEYS = {"channels", "hidden", "activation", "norm", "eps"}


def from_spec(spec: dict, *, seed: int = 0, device="cpu") -> tuple[list[Block], list[dict]]:
    if not isinstance(spec, dict) or "blocks" not in spec:
        raise FrontendError(f"a spec is a dict with 'channels' and 'blocks', got {spec!r}")
    channels = spec.get("channels")
    blocks, params = [], []
    for i, entry in enumerate(spec["blocks"]):
        if not isinstance(entry, dict):
            raise FrontendError(f"spec block {i} must be a dict, got {entry!r}")
        unknown = set(entry) - SPEC_BLOCK_KEYS
        if unknown:
            raise FrontendError(f"spec block {i} has unknown keys {sorted(unknown)}; known: {sorted(SPEC_BLOCK_KEYS)}")
        c = entry.get("channels", channels)
        if "hidden" not in entry or c is None:
            raise FrontendError(f"spec block {i} needs 'hidden' and 'channels' (its own or the spec's)")
        activation = entry.get("activation", "gelu")
        if activation not in model.ACTIVATIONS:
            raise FrontendError(f"spec block {i}: activation must be one of {model.ACTIVATIONS}, got {activation!r}")
        norm = bool(entry.get("norm", False))
        eps = float(entry.get("eps", model.DEFAULT_NORM_EPS))
        blocks.append(Block(channels=c, hidden=entry["hidden"], activation=activation, norm=norm, eps=eps))
        params.append(model.make_block_parameters(c, entry["hidden"], seed=seed + 1000 * i, device=device, norm=norm))
    if not blocks:
        raise FrontendError("a spec needs at least one block")
    return blocks, params


# ---- nn.Module ----------------------------------------------------------------------------------------

def _activation_of(node, modules) -> str | None:
    """The activation a node applies, or None if it is not one; raises for unsupported variants."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    if node.op == "call_module":
        mod = modules[node.target]
        if isinstance(mod, nn.ReLU):
            return "relu"
        if isinstance(mod, nn.SiLU):
            return "silu"
        if isinstance(mod, nn.GELU):
            if mod.approximate != "tanh":
                raise FrontendError(f"node {node.name}: GELU(approximate={mod.approximate!r}) is not supported; "
                                    "the kernels compute the tanh approximation (approximate='tanh')")
            return "gelu"
        return None
    if node.op in ("call_function", "call_method"):
        target = node.target
        if target in (F.relu, torch.relu, "relu"):
            return "relu"
        if target in (F.silu, "silu"):
            return "silu"
        if target in (F.gelu, "gelu"):
            if node.kwargs.get("approximate", "none") != "tanh":
                raise FrontendError(f"node {node.name}: gelu without approximate='tanh' is not supported")
            return "gelu"
    return None


def _linear_of(node, modules):
    from torch import nn

    if node.op == "call_module" and isinstance(modules[node.target], nn.Linear):
        return modules[node.target]
    return None


def _norm_of(node, modules):
    """(weight or None, eps) of an RMSNorm node, or None."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    if node.op == "call_module" and isinstance(modules[node.target], nn.RMSNorm):
        mod = modules[node.target]
        eps = mod.eps if mod.eps is not None else torch.finfo(torch.float32).eps
        return mod.weight, eps
    if node.op == "call_function" and node.target is F.rms_norm:
        raise FrontendError(f"node {node.name}: use nn.RMSNorm (a module) so its weight can be read")
    return None


def _is_add(node) -> bool:
    import torch

    return node.op == "call_function" and node.target in (operator.add, torch.add) and not node.kwargs


def from_module(module, *, device="cpu") -> tuple[list[Block], list[dict]]:
    """Trace ``module`` with torch.fx and read its residual blocks."""
    import torch
    import torch.fx

    try:
        graph_module = torch.fx.symbolic_trace(module)
    except Exception as e:  # noqa: BLE001 - tracing errors come in many types; report them as one
        raise FrontendError(f"torch.fx could not trace {type(module).__name__}: {e}") from e
    modules = dict(graph_module.named_modules())
    nodes = list(graph_module.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise FrontendError(f"the model must take one input (the rows), it takes {len(placeholders)}")
    stream = placeholders[0]
    roles: dict[Any, tuple] = {}  # node -> (role, data)
    blocks, params = [], []
    for node in nodes:
        if node.op == "placeholder":
            continue
        if node.op == "output":
            if node.args[0] is not stream:
                raise FrontendError(f"the model must return the residual stream; it returns {node.args[0]}")
            break
        first = node.args[0] if node.args else None
        norm = _norm_of(node, modules)
        linear = _linear_of(node, modules)
        activation = _activation_of(node, modules)
        if norm is not None and first is stream:
            roles[node] = ("normed", norm)
        elif linear is not None and (first is stream or roles.get(first, ("",))[0] == "normed"):
            roles[node] = ("pre", (linear, roles.get(first, (None, None))[1]))
        elif activation is not None and roles.get(first, ("",))[0] == "pre":
            roles[node] = ("hidden", (activation, roles[first][1]))
        elif linear is not None and roles.get(first, ("",))[0] == "hidden":
            roles[node] = ("post", (linear, *roles[first][1]))
        elif _is_add(node) and len(node.args) == 2 and stream in node.args:
            other = node.args[1] if node.args[0] is stream else node.args[0]
            if roles.get(other, ("",))[0] != "post":
                raise FrontendError(f"node {node.name}: the residual add must add the block's second Linear to the "
                                    "stream")
            second, activation, (first_linear, norm_params) = roles[other][1]
            block, block_params = _block(len(blocks), first_linear, activation, second, norm_params, device)
            blocks.append(block)
            params.append(block_params)
            stream = node
        else:
            raise FrontendError(f"node {node.name} ({node.op} {node.target}) does not fit the pattern "
                                "[RMSNorm] -> Linear -> ReLU/GELU(tanh)/SiLU -> Linear -> residual add")
    if not blocks:
        raise FrontendError("no residual block found: expected x + Linear(act(Linear([RMSNorm](x))))")
    return blocks, params


def _block(index: int, first, activation: str, second, norm_params, device) -> tuple[Block, dict]:
    import torch

    channels, hidden = first.in_features, first.out_features
    if (second.in_features, second.out_features) != (hidden, channels):
        raise FrontendError(f"block {index}: the second Linear is {second.in_features} -> {second.out_features}, "
                            f"expected {hidden} -> {channels}")

    def f16(t):
        return t.detach().to(device=device, dtype=torch.float16).contiguous()

    def f32(t, n):
        if t is None:
            return torch.zeros(n, dtype=torch.float32, device=device)
        return t.detach().to(device=device, dtype=torch.float32).contiguous()

    params = {"w1": f16(first.weight), "b1": f32(first.bias, hidden), "w2": f16(second.weight),
              "b2": f32(second.bias, channels)}
    norm, eps = norm_params is not None, model.DEFAULT_NORM_EPS
    if norm:
        weight, eps = norm_params
        params["norm_weight"] = f32(weight, channels) if weight is not None else torch.ones(channels, device=device)
    return Block(channels=channels, hidden=hidden, activation=activation, norm=norm, eps=float(eps)), params
