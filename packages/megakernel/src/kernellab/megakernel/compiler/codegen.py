"""From a planned program to launchable steps: each block's engine kernel instantiated (compiled
on first use) with the tile, shared memory and grid its plan chose, and its prologue kernel.

The block kernels come from ``engines.launcher``, exactly what the hand-written engines bind, so a
compiled block and its engine run the same kernel with the same parameters: bit-identical output.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from .ir import Program
from .passes import PassError


@dataclasses.dataclass
class BlockStep:
    """One block: optionally make its fp16 operand, then run its engine."""

    index: int
    engine: str
    prologue: Callable | None  # run(stream, norm_weight, operand) or None when the operand is the input
    block: Callable  # run(operand, stream, w1, b1, w2, b2, out)


def generate(program: Program) -> list[BlockStep]:
    if "owners" not in program.properties:
        raise PassError("codegen: needs a fully planned program (run passes.run_pipeline first)")
    from .. import engines
    from ..engines import prologue as prologue_kernels

    steps = []
    for i, b in enumerate(program.blocks):
        make_operand = None
        if b.prologue != "none":
            make_operand = prologue_kernels.launcher(norm=b.prologue == "rmsnorm", eps=b.eps, stream=b.residual)
        run = engines.launcher(b.plan.engine, b.plan, b.activation, residual=b.residual)
        steps.append(BlockStep(i, b.plan.engine, make_operand, run))
    return steps
