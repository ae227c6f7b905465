"""Whole models: a residual-MLP stack as a torch user writes it, the four models the report's
``models`` section measures, and that section's schema.

``StackModel`` is the ``nn.Module`` of any stack form (``stack``): ``nn.Linear``, ``nn.RMSNorm`` /
``nn.LayerNorm``, activation modules, traceable by torch.fx, so ``compile_model`` reads it back.
``build_module(spec, seed)`` makes one with the weights ``frontend.from_spec`` makes for the same
spec and seed: the compiled model, torch eager and torch.compile then run the same weights.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from .compiler import frontend

ACTIVATION_MODULES = {"relu": nn.ReLU, "gelu": lambda: nn.GELU(approximate="tanh"), "gelu_erf": nn.GELU,
                      "silu": nn.SiLU}


def _norm_module(norm, channels: int) -> nn.Module:
    if norm.kind == "rmsnorm":
        return nn.RMSNorm(channels, eps=norm.eps)
    return nn.LayerNorm(channels, eps=norm.eps, bias=norm.bias)


class StackBlock(nn.Module):
    """``x + W2 (act(W1 u) [* W3 u])`` with ``u = norm(x)`` or ``x``."""

    def __init__(self, block):
        super().__init__()
        c, h = block.channels, block.hidden
        self.norm = _norm_module(block.norm, c) if block.norm is not None else None
        self.w1 = nn.Linear(c, h, bias=block.bias1)
        self.w3 = nn.Linear(c, h, bias=block.bias3) if block.gated else None
        self.act = ACTIVATION_MODULES[block.activation]()
        self.w2 = nn.Linear(h, c, bias=block.bias2)

    def forward(self, x):
        u = self.norm(x) if self.norm is not None else x
        hidden = self.act(self.w1(u))
        if self.w3 is not None:
            hidden = hidden * self.w3(u)
        return x + self.w2(hidden)


class StackModel(nn.Module):
    """Blocks, then an optional final norm."""

    def __init__(self, blocks, final_norm=None):
        super().__init__()
        self.blocks = nn.ModuleList(StackBlock(b) for b in blocks)
        self.final_norm = _norm_module(final_norm, blocks[-1].channels) if final_norm is not None else None

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.final_norm(x) if self.final_norm is not None else x


def _load_norm(module, params: dict) -> None:
    if module.weight is not None:
        module.weight.copy_(params["norm_weight"])
    if getattr(module, "bias", None) is not None:
        module.bias.copy_(params["norm_bias"])


@torch.no_grad()
def build_module(spec: dict, *, seed: int = 0, dtype=torch.float32, device="cpu") -> StackModel:
    """The ``StackModel`` of ``spec`` with the weights ``frontend.from_spec(spec, seed=seed)`` gives."""
    source = frontend.from_spec(spec, seed=seed, device=device)
    module = StackModel(source.blocks, source.final_norm).to(device=device)
    for layer, params in zip(module.blocks, source.parameters, strict=True):
        for name in ("w1", "w2", "w3"):
            linear = getattr(layer, name)
            if linear is None:
                continue
            linear.weight.copy_(params[name])
            if linear.bias is not None:
                linear.bias.copy_(params["b" + name[1]])
        if layer.norm is not None:
            _load_norm(layer.norm, params)
    if module.final_norm is not None:
        _load_norm(module.final_norm, source.final_parameters)
    return module.to(dtype=dtype)


# ---- the report's models ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ModelCase:
    name: str
    spec: dict
    fits_l2: bool  # the weights fit in an H200's L2 (the latency targets differ for the one that does not)

    def weight_bytes(self) -> int:
        """Bytes of fp16 weights (biases and norm weights, fp32 and small, not counted)."""
        blocks, _ = frontend.read_spec(self.spec)
        return sum((3 if b.gated else 2) * 2 * b.channels * b.hidden for b in blocks)


def _uniform(channels: int, hidden: int, depth: int, **block) -> dict:
    return {"channels": channels, "blocks": [{"hidden": hidden, **block} for _ in range(depth)]}


REPORT_MODELS = (
    ModelCase("mlp4-c256-h1024-gelu", _uniform(256, 1024, 4, activation="gelu"), fits_l2=True),
    ModelCase("mlp8-c512-h2048-rms-silu", _uniform(512, 2048, 8, activation="silu", norm="rmsnorm"), fits_l2=True),
    ModelCase("swiglu2-c1024-h2816-final-norm",
              {**_uniform(1024, 2816, 2, activation="silu", norm="rmsnorm", gated=True, bias=False),
               "final_norm": "rmsnorm"}, fits_l2=True),
    ModelCase("swiglu4-c2048-h8192-1b-ffn",
              _uniform(2048, 8192, 4, activation="silu", norm="rmsnorm", gated=True, bias=False), fits_l2=False),
)
"""The issue's four models; the last is the FFN stack of a 1B-parameter decoder (about 400 MB of fp16)."""
REPORT_ROWS = (1, 16, 64, 1024, 4096)
CONTENDERS = ("persistent-stack", "persistent-stack-graph", "block-chain-graph", "torch-eager",
              "torch-compile-max-autotune-graph")
"""The fused engine and its graph, today's per-block chain in a graph, the nn.Module eagerly and
under torch.compile(mode="max-autotune") captured in a CUDA graph."""
SUMMARY_KEYS = ("count", "p50", "p95", "min", "max", "mean")
VALIDATION_KEYS = ("passed", "poisoned_output", "replay_changed_input", "max_abs_error")
FLOOR_KEYS = ("launch_floor_us", "weight_bytes", "copy_bandwidth_gbs", "weight_floor_us")


def check_models_section(section: dict) -> list[str]:
    """What is wrong with a report's ``models`` section (empty when nothing): every model and row
    count, every contender with stream and host summaries and a validation, and the floor."""
    problems = []
    entries = {(m.get("model"), m.get("rows")): m for m in section.get("entries", [])}
    for case in REPORT_MODELS:
        for rows in REPORT_ROWS:
            where = f"{case.name} rows={rows}"
            entry = entries.get((case.name, rows))
            if entry is None:
                problems.append(f"{where}: missing")
                continue
            floor = entry.get("floor", {})
            problems += [f"{where}: floor lacks {k}" for k in FLOOR_KEYS if k not in floor]
            if floor.get("weight_bytes") not in (None, case.weight_bytes()):
                problems.append(f"{where}: floor weight_bytes {floor['weight_bytes']} is not the model's "
                                f"{case.weight_bytes()}")
            for contender in CONTENDERS:
                got = entry.get("contenders", {}).get(contender)
                if got is None:
                    problems.append(f"{where}: {contender} missing")
                    continue
                for clock in ("stream", "host"):
                    summary = got.get(clock, {})
                    problems += [f"{where}: {contender} {clock} lacks {k}" for k in SUMMARY_KEYS if k not in summary]
                validation = got.get("validation", {})
                problems += [f"{where}: {contender} validation lacks {k}" for k in VALIDATION_KEYS
                             if k not in validation]
                if validation.get("passed") is not True:
                    problems.append(f"{where}: {contender} did not pass validation")
    return problems
