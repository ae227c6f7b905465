"""The parameters of a stack packed as ``persistent-stack`` reads them (pure torch: CPU tests check the packing
without CuTe DSL).

W1 and W3 as (sum of padded hidden, channels_tile), W2 as (channels_tile, sum of padded hidden), each block's hidden
padded to whole ``STACK_TILE`` chunks and the channels to ``channels_tile``, padding zero: every weight tile the
kernel loads is whole, and a padded hidden unit adds exactly 0 (its W2 column is zero). b1, b3 along the packed
hidden; b2 a row per block; norm weights (ones where absent) and biases (zeros) a row per block and one for the
final norm; ``meta`` a row per block (first chunk, chunks, activation code, norm kind) and the final norm's
(norm kind only); ``eps`` per row of meta.
"""

from __future__ import annotations

from ..model import ACTIVATION_CODES
from ..planning.stack import STACK_TILE, StackPlan

ACT_CODES = {**ACTIVATION_CODES, "gelu_erf": len(ACTIVATION_CODES)}
"""The kernels' activation codes (relu, gelu = tanh approximation, silu) and exact GELU."""
NORM_CODES = {None: 0, "rmsnorm": 1, "layernorm": 2}
META_COLUMNS = 4  # first chunk, chunks, activation code, norm kind


def pack(blocks, parameters: list[dict], final_norm, final_parameters: dict | None, plan: StackPlan, device) -> dict:
    """The kernel's parameter tensors from the IR blocks and their parameters (absent biases: zeros)."""
    import torch

    f16, f32 = torch.float16, torch.float32
    cols, channels, tile = plan.channels_tile, plan.channels, STACK_TILE
    padded = [c * tile for c in plan.chunks]
    total = sum(padded)
    w1 = torch.zeros((total, cols), dtype=f16, device=device)
    w3 = torch.zeros_like(w1) if plan.gated else w1
    w2 = torch.zeros((cols, total), dtype=f16, device=device)
    b1, b3 = (torch.zeros((total,), dtype=f32, device=device) for _ in range(2))
    b2 = torch.zeros((len(blocks), cols), dtype=f32, device=device)
    norm_w = torch.ones((len(blocks) + 1, cols), dtype=f32, device=device)
    norm_b = torch.zeros((len(blocks) + 1, cols), dtype=f32, device=device)
    meta = torch.zeros((len(blocks) + 1, META_COLUMNS), dtype=torch.int32)
    eps = torch.ones((len(blocks) + 1,), dtype=f32)
    start = 0
    for i, (b, p) in enumerate(zip(blocks, parameters, strict=True)):
        h = b.hidden
        rows_of = slice(start, start + h)
        w1[rows_of, :channels] = p["w1"].to(device=device, dtype=f16)
        w2[:channels, rows_of] = p["w2"].to(device=device, dtype=f16)
        if "b1" in p:
            b1[rows_of] = p["b1"].to(device=device, dtype=f32)
        if "b2" in p:
            b2[i, :channels] = p["b2"].to(device=device, dtype=f32)
        if b.gated:
            w3[rows_of, :channels] = p["w3"].to(device=device, dtype=f16)
            if "b3" in p:
                b3[rows_of] = p["b3"].to(device=device, dtype=f32)
        _pack_norm(norm_w, norm_b, meta, eps, i, b.norm, p, channels, device)
        meta[i, 0], meta[i, 1], meta[i, 2] = start // tile, plan.chunks[i], ACT_CODES[b.activation]
        start += padded[i]
    _pack_norm(norm_w, norm_b, meta, eps, len(blocks), final_norm, final_parameters or {}, channels, device)
    return {"w1": w1, "w3": w3, "w2": w2, "b1": b1, "b3": b3, "b2": b2, "norm_w": norm_w, "norm_b": norm_b,
            "meta": meta.to(device), "eps": eps.to(device)}


def _pack_norm(norm_w, norm_b, meta, eps, i: int, norm, p: dict, channels: int, device) -> None:
    meta[i, 3] = NORM_CODES[norm.kind if norm is not None else None]
    if norm is None:
        return
    eps[i] = norm.eps
    if p.get("norm_weight") is not None:
        norm_w[i, :channels] = p["norm_weight"].to(device=device, dtype=norm_w.dtype)
    if p.get("norm_bias") is not None:
        norm_b[i, :channels] = p["norm_bias"].to(device=device, dtype=norm_b.dtype)
