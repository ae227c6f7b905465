"""Running a compiled model: ``compile_model(...)(x)``.

``compile_model`` is the compiler's driver: frontend (nn.Module or spec) -> IR -> passes ->
codegen. With ``engine="persistent-stack"`` (opt-in) the whole stack is one launch of the fused engine
where the stack pass planned it; otherwise (or where it refused, with the reason) the ``CompiledModel`` keeps
the buffers between blocks (the fp16 operand, two fp32 stream buffers), launches each block's steps in order
and applies the final norm; ``plan()`` says which form runs, and per block which engine, with what tile and why.

Where it runs: ``target="cuda"`` (the default) needs a CUDA device and says so when there is none;
``target="cpu"`` runs every block through the torch chain (the kernels' rounding points in torch),
a slow but exact-to-the-contract path for checking models on machines without a GPU.
"""

from __future__ import annotations

import dataclasses

from .. import stack
from ..planning.stack import STACK_ENGINE, planned_rows_most
from . import codegen, frontend, passes
from .ir import TORCH_CHAIN, Program


class NeedsGPUError(RuntimeError):
    """compile_model was asked for CUDA kernels on a machine without a CUDA device."""


@dataclasses.dataclass(frozen=True)
class BlockPlan:
    """One row of a model's plan: what serves a block and why."""

    index: int
    form: str
    engine: str
    tile: str
    why: str


@dataclasses.dataclass(frozen=True)
class ModelPlan:
    """A compiled model's plan, printable: the form the stack runs in, then one row per block."""

    rows: int
    target: str
    form: str
    form_reason: str
    blocks: tuple[BlockPlan, ...]
    final_norm: str | None
    beyond: str | None = None  # a fused plan: which calls run the per-block chain instead, and on what engines

    def describe(self) -> dict:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        lines = [f"{len(self.blocks)}-block stack, planned for {self.rows} rows on {self.target}",
                 f"form: {self.form} ({self.form_reason})"]
        header = ("block", "form", "engine", "tile", "why")
        rows = [header] + [(str(b.index), b.form, b.engine, b.tile, b.why) for b in self.blocks]
        widths = [max(len(r[k]) for r in rows) for k in range(4)]
        for r in rows:
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(r[:4], widths, strict=True)) + "  " + r[4])
        if self.final_norm is not None:
            where = "in the fused kernel" if self.form == STACK_ENGINE else "torch (no final-norm kernel)"
            lines.append(f"final norm: {self.final_norm}, {where}")
        if self.beyond is not None:
            lines.append(self.beyond)
        return "\n".join(lines)


def _form(b) -> str:
    norm = f"{b.norm.kind}, " if b.norm is not None else ""
    body = f"{b.activation} gated" if b.gated else b.activation
    return f"{norm}{b.channels}->{b.hidden} {body}"


def _tile(plan) -> str:
    if plan is None:
        return "-"
    t = plan.tile
    extra = "".join(f" {name}={value}" for name, value, default in (
        ("split", t.split, 1), ("multicast", t.multicast, 1), ("stages", t.stages, 1), ("pdl", t.pdl, False))
        if value != default)
    return f"{t.rows}x{t.channels_tile} rows x channels, grid {plan.owners.grid}{extra}"


def _why(b) -> str:
    if b.chosen == TORCH_CHAIN:
        return f"torch chain: {b.kernel_refusal}"
    if not b.skipped:
        return "first engine of the chain that fits"
    return "; ".join(f"{r.engine}: {r.reason}" for r in b.skipped)


def describe_plan(program: Program) -> ModelPlan:
    fused = program.stack
    if fused is not None:
        tile = f"{fused.tile_rows}x{fused.channels_tile} rows x channels, grid {fused.grid}"
        blocks = tuple(BlockPlan(i, _form(b), STACK_ENGINE, tile, f"fused: {chunks} hidden chunks of the one launch")
                       for i, (b, chunks) in enumerate(zip(program.blocks, fused.chunks, strict=True)))
        most = planned_rows_most(fused, program.device)
        beyond = None if most is None else (
            f"a call of more than {most} rows (or any rows no fused form takes) runs the per-block chain: "
            + ", ".join(f"block {i} {b.chosen}" for i, b in enumerate(program.blocks)))
        return ModelPlan(program.rows, program.target, STACK_ENGINE, f"{fused.summary()}; {fused.why}", blocks,
                         program.final_norm.describe() if program.final_norm else None, beyond)
    blocks = tuple(BlockPlan(i, _form(b), b.chosen, _tile(b.plan), _why(b)) for i, b in enumerate(program.blocks))
    if program.target == "cpu":
        form, reason = "torch chain", "target 'cpu': every block in torch, with the kernels' rounding points"
    else:
        form = "per-block chain"
        reason = f"one launch per block, a prologue per normed block; not fused: {program.stack_refusal}"
    return ModelPlan(program.rows, program.target, form, reason, blocks,
                     program.final_norm.describe() if program.final_norm else None)


class CompiledModel:
    def __init__(self, program: Program, parameters: list[dict], final_parameters: dict | None = None):
        self.program = program
        self.parameters = parameters
        self.final_parameters = final_parameters or {}
        self.fused = None
        if program.stack is not None:
            device = next(iter(parameters[0].values())).device
            self.fused = codegen.generate_stack(program, parameters, self.final_parameters, device)
        self.steps = codegen.generate(program)  # also a fused model's: it runs the calls no fused form takes
        self._buffers: dict = {}

    @property
    def engines(self) -> list[str]:
        """Per block, the engine that serves it (``persistent-stack`` for every block of a fused stack; a call of
        rows that no fused form takes, ``planning.stack.call_plan``, runs the chain's)."""
        if self.fused is not None:
            return [STACK_ENGINE] * len(self.program.blocks)
        return [step.engine for step in self.steps]

    def plan(self) -> ModelPlan:
        """Per block: the engine that serves it, its tile and why (``print(model.plan())``)."""
        return describe_plan(self.program)

    def _buffer(self, name: str, rows: int, dtype, device):
        import torch

        key = (name, rows, dtype, device)
        if key not in self._buffers:
            self._buffers[key] = torch.empty((rows, self.program.blocks[0].channels), dtype=dtype, device=device)
        return self._buffers[key]

    def __call__(self, x, out=None):
        """y (fp32) for rows ``x`` (the program's input dtype), written into ``out`` if given."""
        import torch

        expected = getattr(torch, self.program.input_dtype)
        if x.dtype != expected or x.dim() != 2 or x.shape[1] != self.program.blocks[0].channels:
            raise ValueError(f"x must be (rows, {self.program.blocks[0].channels}) {expected}, "
                             f"got {tuple(x.shape)} {x.dtype}")
        x = x.contiguous()
        rows, device = x.shape[0], x.device
        if out is None:
            out = torch.empty((rows, x.shape[1]), dtype=torch.float32, device=device)
        elif (out.shape != x.shape or out.dtype != torch.float32 or out.device != device
              or not out.is_contiguous()):
            raise ValueError(f"out must be a contiguous {tuple(x.shape)} float32 tensor on {device}, got "
                             f"{tuple(out.shape)} {out.dtype} on {out.device}"
                             f"{'' if out.is_contiguous() else ' (not contiguous)'}")
        if self.fused is not None and self.fused.plan_for(rows) is not None:
            return self.fused(x, out)
        final_norm = self.program.final_norm
        stream = x
        for step, params in zip(self.steps, self.parameters, strict=True):
            last = step.index == len(self.steps) - 1 and final_norm is None
            target = out if last else self._buffer(f"stream{step.index % 2}", rows, torch.float32, device)
            if step.engine == TORCH_CHAIN:
                step.block(stream, params, target)
            else:
                operand = stream
                if step.prologue is not None:
                    operand = self._buffer("operand", rows, torch.float16, device)
                    step.prologue(stream, params.get("norm_weight"), operand)
                step.block(operand, stream, params["w1"], params["b1"], params["w2"], params["b2"], target)
            stream = target
        if final_norm is not None:
            stack.torch_final_norm(stream, final_norm, self.final_parameters, out)
        return out


def compile_model(source, *, rows: int, engine: str = "persistent-tc", tile_rows: int | None = None,
                  input_dtype: str = "float16", device=None, seed: int = 0, target: str = "cuda",
                  chain: str = "persistent-tc", stack_form: str | None = None,
                  stack_tile_rows: int | None = None, pdl: bool = False) -> CompiledModel:
    """Compile an ``nn.Module`` or a spec dict for ``rows`` rows per call (any row count runs; the
    plan is tuned for this one). ``engine`` is a block engine, whose fallback chain serves each block (the
    default: one launch per block), or ``persistent-stack``: the whole stack in one launch where it can, else
    the per-block chain of ``chain``, the reason recorded (opt-in: it beats the chain on some models only);
    ``stack_form`` / ``stack_tile_rows`` force the fused plan; ``pdl`` launches the per-block chain's persistent-tc
    blocks and their prologues with programmatic dependent launch, each starting while the kernel before it ends
    (opt-in until measured in the chain); ``device`` is the ``planning.DeviceSpec`` to plan
    for (default: the current GPU's); ``seed`` makes a spec's weights; ``target`` is "cuda" (needs a CUDA
    device) or "cpu" (the torch chain for every block)."""
    import torch

    from .. import planning

    fuse = engine == STACK_ENGINE
    if not fuse and (stack_form is not None or stack_tile_rows is not None):
        raise ValueError(f"stack_form and stack_tile_rows force the fused engine; engine is {engine!r}")
    if target not in ("cuda", "cpu"):
        raise ValueError(f"target must be 'cuda' or 'cpu', got {target!r}")
    if target == "cuda" and not torch.cuda.is_available():
        raise NeedsGPUError("compile_model(target='cuda') needs a CUDA device and none is available; "
                            "target='cpu' runs the model through the torch chain instead (slow, for checking)")
    if isinstance(source, dict):
        read = frontend.from_spec(source, seed=seed, device=target)
    elif isinstance(source, torch.nn.Module):
        read = frontend.from_module(source, device=target)
    else:
        raise frontend.FrontendError(f"compile_model takes an nn.Module or a spec dict, got {type(source).__name__}")
    if device is None:
        device = planning.current_device() if target == "cuda" else planning.H200
    program = passes.plan(read.blocks, rows, engine=chain if fuse else engine, tile_rows=tile_rows,
                          input_dtype=input_dtype, device=device, final_norm=read.final_norm, target=target, fuse=fuse,
                          stack_form=stack_form, stack_tile_rows=stack_tile_rows, pdl=pdl)
    return CompiledModel(program, read.parameters, read.final_parameters)
