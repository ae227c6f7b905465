"""Running a compiled model: ``compile_model(...)(x)``.

``compile_model`` is the compiler's driver: frontend (nn.Module or spec) -> IR -> passes ->
codegen. The ``CompiledModel`` it returns keeps the parameters on the GPU and the buffers between
blocks (the fp16 operand, two fp32 stream buffers), and launches each block's steps in order.
"""

from __future__ import annotations

from . import codegen, frontend, passes
from .ir import Program


class CompiledModel:
    def __init__(self, program: Program, parameters: list[dict]):
        self.program = program
        self.parameters = parameters
        self.steps = codegen.generate(program)
        self._buffers: dict = {}

    @property
    def engines(self) -> list[str]:
        return [step.engine for step in self.steps]

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
        stream = x
        for step, params in zip(self.steps, self.parameters, strict=True):
            operand = stream
            if step.prologue is not None:
                operand = self._buffer("operand", rows, torch.float16, device)
                step.prologue(stream, params.get("norm_weight"), operand)
            last = step.index == len(self.steps) - 1
            target = out if last else self._buffer(f"stream{step.index % 2}", rows, torch.float32, device)
            step.block(operand, stream, params["w1"], params["b1"], params["w2"], params["b2"], target)
            stream = target
        return out


def compile_model(source, *, rows: int, engine: str = "persistent-tc", tile_rows: int | None = None,
                  input_dtype: str = "float16", device=None, seed: int = 0) -> CompiledModel:
    """Compile an ``nn.Module`` or a spec dict for ``rows`` rows per call (any row count runs; the
    plan is tuned for this one). ``engine`` picks the fallback chain to walk; ``seed`` makes a
    spec's weights."""
    import torch

    from .. import planning

    if isinstance(source, dict):
        blocks, parameters = frontend.from_spec(source, seed=seed, device="cuda")
    elif isinstance(source, torch.nn.Module):
        blocks, parameters = frontend.from_module(source, device="cuda")
    else:
        raise frontend.FrontendError(f"compile_model takes an nn.Module or a spec dict, got {type(source).__name__}")
    program = passes.plan(blocks, rows, engine=engine, tile_rows=tile_rows, input_dtype=input_dtype,
                          device=device or planning.current_device())
    return CompiledModel(program, parameters)
