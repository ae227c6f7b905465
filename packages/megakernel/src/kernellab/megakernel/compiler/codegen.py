"""From a planned program to launchable steps: each block's engine kernel instantiated (compiled
on first use) with the tile, shared memory and grid its plan chose, and its prologue kernel.

The block kernels come from ``engines.launcher``, exactly what the hand-written engines bind, so a
compiled block and its engine run the same kernel with the same parameters: bit-identical output.
A block the plan gave to the torch chain runs ``stack.torch_block`` (nothing is compiled for it).
A program the stack pass fused is one step instead (``generate_stack``): the persistent-stack kernel with
the stack's parameters packed as it reads them.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from .. import stack
from .ir import TORCH_CHAIN, Program
from .passes import PassError


@dataclasses.dataclass
class BlockStep:
    """One block: optionally make its fp16 operand, then run its engine. A torch-chain block has no
    prologue and ``block`` is run(stream, parameters, out)."""

    index: int
    engine: str
    prologue: Callable | None  # run(stream, norm_weight, operand) or None when the operand is the input
    block: Callable  # run(operand, stream, w1, b1, w2, b2, out)


def generate(program: Program) -> list[BlockStep]:
    if "owners" not in program.properties:
        raise PassError("codegen: needs a fully planned program (run passes.run_pipeline first)")
    steps = []
    for i, b in enumerate(program.blocks):
        if b.chosen == TORCH_CHAIN:
            steps.append(BlockStep(i, TORCH_CHAIN, None, functools.partial(_torch_chain_block, b)))
            continue
        from .. import engines
        from ..engines import prologue as prologue_kernels

        make_operand = None
        if b.prologue != "none":
            make_operand = prologue_kernels.launcher(norm=b.prologue == "rmsnorm", eps=b.norm.eps if b.norm else 0.0,
                                                     stream=b.residual, pdl=b.plan.tile.pdl)
        run = engines.launcher(b.plan.engine, b.plan, b.activation, residual=b.residual)
        steps.append(BlockStep(i, b.plan.engine, make_operand, run))
    return steps


def _torch_chain_block(block, stream, parameters, out):
    return stack.torch_block(stream, block, parameters, out)


def generate_stack(program: Program, parameters: list[dict], final_parameters: dict | None, device):
    """The fused stack's launcher ``run(x, y)`` (``engines.persistent_stack``), its parameters packed on ``device``."""
    if program.stack is None:
        raise PassError("codegen: the program has no fused plan (the stack pass refused it: "
                        f"{program.stack_refusal})")
    from ..engines import persistent_stack, stack_packing

    packed = stack_packing.pack(program.blocks, parameters, program.final_norm, final_parameters, program.stack,
                                   device)
    return persistent_stack.Launcher(program.stack, packed, program.device)
