"""The engines, what each serves, and binding one to a problem.

Kernel engines (conventional, persistent, persistent-global, conventional-tc, persistent-tc) are
planned by ``planning.choose``: a shape an engine cannot serve goes down its fallback chain and the
engine that runs is recorded as ``served_by``. ``torch-cublas`` and ``torch-compile`` are the torch
baselines. Every engine also exists as ``<name>-graph``: the same call captured in a CUDA graph.

A bound call takes the harness's dicts: inputs ``x, w1, b1, w2, b2`` and output ``y``; it writes
``y`` in place and returns the outputs. Kernel modules are imported only when bound, so planning
and the compiler's CPU parts never need CuTe DSL.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable

from .. import planning
from ..model import Shape, check_activation

GRAPH_SUFFIX = "-graph"
_FIRST = ("conventional", "persistent", "persistent-global", "torch-cublas")
_SECOND = ("conventional-tc", "persistent-tc", "torch-compile")
ENGINES = (*_FIRST, *(e + GRAPH_SUFFIX for e in _FIRST), *_SECOND, *(e + GRAPH_SUFFIX for e in _SECOND))
"""Report order (the example report's, then the tensor-core and compiled engines): engines, then
their graph variants."""

STACK_ENGINES = ("persistent-stack", "persistent-stack-graph")
"""Whole-stack engines (the report's ``models`` section, ``compile_model``'s default): a model, not a block, so
they are bound by ``compile_model`` rather than ``bind``; the fused kernel is ``persistent_stack``."""

TORCH_ENGINES = ("torch-cublas", "torch-compile")
KERNEL_MODULES = {"conventional": "conventional", "persistent": "persistent", "persistent-global": "persistent",
                  "conventional-tc": "conventional_tc", "persistent-tc": "persistent_tc"}


def split_graph(name: str) -> tuple[str, bool]:
    """``persistent-tc-graph`` -> (``persistent-tc``, True)."""
    if name.endswith(GRAPH_SUFFIX):
        return name[: -len(GRAPH_SUFFIX)], True
    return name, False


def check_engine(name: str) -> str:
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; engines are {list(ENGINES)}")
    return name


def unavailable(name: str) -> str | None:
    """Why an engine cannot run in this process, or None."""
    base, _ = split_graph(check_engine(name))
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device"
    if base not in TORCH_ENGINES:
        try:
            import cutlass  # noqa: F401
            import tvm_ffi  # noqa: F401
        except ImportError as e:
            return f"CuTe DSL is not installed ({e}); pip install 'kernellab-megakernel[gpu]'"
    return None


def launcher(engine: str, plan: planning.Plan, activation: str, residual: str = "float16"):
    """``run(u, residual, w1, b1, w2, b2, y)`` for one kernel engine and its plan (the compiler's
    runner uses this too, which is what makes compiled and hand-bound blocks identical)."""
    module = importlib.import_module(f".{KERNEL_MODULES[engine]}", __name__)
    return module.launcher(plan, activation, residual)


@dataclasses.dataclass
class Bound:
    """An engine bound to one shape: the call and how it was served."""

    engine: str
    served_by: str
    call: Callable[[dict, dict], dict]
    plan: dict | None = None
    skipped: list[dict] = dataclasses.field(default_factory=list)
    formulation: str | None = None


def plan_call(plan: planning.Plan, activation: str) -> Callable[[dict, dict], dict]:
    """The harness call ``(inputs, outputs) -> outputs`` of one kernel plan (the single-block model: x is
    both the GEMM operand and the residual)."""
    run = launcher(plan.engine, plan, activation)

    def call(inputs, outputs):
        x = inputs["x"]
        run(x, x, inputs["w1"], inputs["b1"], inputs["w2"], inputs["b2"], outputs["y"])
        return outputs

    return call


def bind(name: str, shape: Shape, activation: str, device: planning.DeviceSpec | None = None) -> Bound:
    """Plan, compile (first use) and wrap one engine for ``shape``."""
    base, graph = split_graph(check_engine(name))
    check_activation(activation)
    suffix = GRAPH_SUFFIX if graph else ""
    if base in TORCH_ENGINES:
        from . import torch_baselines

        call = torch_baselines.cublas_call(activation) if base == "torch-cublas" else \
            torch_baselines.compile_call(activation)
        bound = Bound(name, name, call, formulation=torch_baselines.formulation(traced=base == "torch-compile"))
    else:
        choice = planning.choose(base, shape.rows, shape.channels, shape.hidden, device)
        bound = Bound(name, choice.served_by + suffix, plan_call(choice.plan, activation), plan=choice.plan.describe(),
                      skipped=[dataclasses.asdict(r) for r in choice.skipped])
    if graph:
        from .graph import GraphCall

        bound.call = GraphCall(bound.call)
    return bound
