"""The compiler's passes: a linear pipeline, each pass declaring what it requires and ensures.

    validate -> forms -> prologues -> tiles -> smem -> engine -> owners -> stack

Running a pass (``Pass.__call__``) validates the IR going in, checks the pass's requirements
against the program's properties (naming the pass that would provide a missing one), runs it,
adds what it ensures and validates the IR coming out. A pass that cannot accept a program raises
``PassError`` with the block and the reason. The numbers all come from ``planning``, the same
functions the hand-written engines bind with. A block whose form no kernel computes (``forms``) is
served by the torch chain (``stack.torch_block``): the planning passes leave it alone and ``engine``
records it as ``ir.TORCH_CHAIN`` with the reason.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from .. import model, planning
from ..planning.stack import plan_stack
from . import ir
from .ir import TORCH_CHAIN, Block, Candidate, Program

MAX_ELEMENTS = 2**31 - 1
"""Kernels index with 32-bit integers."""


class PassError(ValueError):
    """A pass refused its input; the message says which pass, which block and why."""


class Pass:
    name: ClassVar[str]
    requires: ClassVar[frozenset[str]] = frozenset()
    ensures: ClassVar[frozenset[str]] = frozenset()

    def __call__(self, program: Program) -> Program:
        ir.validate(program)
        missing = self.requires - program.properties
        if missing:
            providers = sorted({PROVIDERS[m] for m in missing})
            raise PassError(f"{self.name}: requires {sorted(missing)}, which the program lacks; run {providers} first")
        out = self.run(program)
        if not self.ensures <= out.properties:
            raise AssertionError(f"{self.name} did not add {sorted(self.ensures - out.properties)}")
        return ir.validate(out)

    def run(self, program: Program) -> Program:
        raise NotImplementedError

    def fail(self, where: str, message: str) -> PassError:
        return PassError(f"{self.name}: {where}: {message}")


class ValidateModel(Pass):
    """The model is one the engines can compute: a residual stream of constant width, row-wise
    blocks, and activations and weights addressable with 32-bit indices."""

    name = "validate"
    ensures = frozenset({"validated"})

    def run(self, program):
        width = program.blocks[0].channels
        for i, b in enumerate(program.blocks):
            if b.channels != width:
                raise self.fail(f"block {i}", f"has {b.channels} channels but the residual stream has {width}: "
                                              "every block of a stack must keep the width")
            for what, elements in ((f"{program.rows} rows x {max(b.channels, b.hidden)}",
                                    program.rows * max(b.channels, b.hidden)),
                                   (f"a {b.hidden} x {b.channels} weight", b.hidden * b.channels)):
                if elements > MAX_ELEMENTS:
                    raise self.fail(f"block {i}", f"{what} = {elements} elements exceed the kernels' 32-bit "
                                                  f"indexing ({MAX_ELEMENTS})")
        return program.with_blocks(program.blocks, *self.ensures)


def kernel_refusal(block: Block, target: str) -> str | None:
    """Why no kernel engine computes ``block``'s form on ``target`` (every reason), or None when the block
    kernels do."""
    if target != "cuda":
        return f"the kernels need a CUDA device; this program targets {target!r}"
    reasons = []
    if block.gated:
        reasons.append("gated blocks (act(W1 u) * (W3 u)) have no block kernel yet")
    if block.activation not in model.ACTIVATIONS:
        reasons.append(f"activation {block.activation!r} has no kernel (the kernels compute "
                       f"{', '.join(model.ACTIVATIONS)})")
    if block.norm is not None and block.norm.kind != "rmsnorm":
        reasons.append(f"{block.norm.kind} has no prologue kernel (the prologue kernel computes rmsnorm)")
    return "; ".join(reasons) or None


class ServableForms(Pass):
    """Which blocks a kernel engine can compute at all; the others are recorded, with the reason, for
    the torch chain (never run by a kernel that computes a different form)."""

    name = "forms"
    requires = frozenset({"validated"})
    ensures = frozenset({"forms"})

    def run(self, program):
        blocks = [dataclasses.replace(b, kernel_refusal=kernel_refusal(b, program.target)) for b in program.blocks]
        return program.with_blocks(blocks, *self.ensures)


class AssignPrologues(Pass):
    """How each block's fp16 operand is made, and the dtype of the stream it adds to: block 0 with
    an fp16 input and no norm uses the input itself; otherwise a prologue casts (or normalizes and
    casts) the stream; after block 0 the stream is fp32 (the torch chain keeps the same stream)."""

    name = "prologues"
    requires = frozenset({"forms"})
    ensures = frozenset({"prologues"})

    def run(self, program):
        blocks = []
        for i, b in enumerate(program.blocks):
            stream = program.input_dtype if i == 0 else "float32"
            if b.norm is not None:
                prologue = b.norm.kind
            else:
                prologue = "none" if stream == "float16" else "cast"
            blocks.append(dataclasses.replace(b, prologue=prologue, residual=stream))
        return program.with_blocks(blocks, *self.ensures)


class PlanTiles(Pass):
    """A tile for every engine of the requested engine's fallback chain, or why it has none. A
    forced ``tile_rows`` must suit the requested engine (it is an instruction, not a hint). With the program's
    ``pdl``, persistent-tc's tiles of the shared-memory form launch with programmatic dependent launch (the register
    form and the other engines have none): each starts while the kernel before it ends and waits for it ahead of
    its first global read, and the block's prologue does the same (``codegen``)."""

    name = "tiles"
    requires = frozenset({"prologues"})
    ensures = frozenset({"tiles"})

    def run(self, program):
        chain = planning.FALLBACK_CHAINS[program.engine]
        blocks = []
        for i, b in enumerate(program.blocks):
            if b.kernel_refusal is not None:
                blocks.append(b)
                continue
            candidates = []
            for engine in chain:
                tile = planning.plan_tile(engine, program.rows, b.channels, b.hidden, program.device, program.tile_rows)
                if isinstance(tile, planning.Refusal):
                    candidates.append(Candidate(engine, refusal=tile))
                else:
                    if program.pdl and engine == "persistent-tc" and not tile.registers:
                        tile = dataclasses.replace(tile, pdl=True)
                    candidates.append(Candidate(engine, tile=tile))
            if program.tile_rows is not None and candidates[0].refusal is not None:
                raise self.fail(f"block {i}", f"tile_rows={program.tile_rows} does not suit {program.engine}: "
                                              f"{candidates[0].refusal.reason}")
            blocks.append(dataclasses.replace(b, candidates=tuple(candidates)))
        return program.with_blocks(blocks, *self.ensures)


class PlanSharedMemory(Pass):
    """Shared memory per CTA for every tiled candidate: where the weights and the hidden live, or a
    refusal when the on-chip tile does not fit (what sends a block down the fallback chain)."""

    name = "smem"
    requires = frozenset({"tiles"})
    ensures = frozenset({"smem"})

    def run(self, program):
        blocks = []
        for i, b in enumerate(program.blocks):
            candidates = []
            for c in b.candidates:
                if c.tile is None:
                    candidates.append(c)
                    continue
                smem = planning.plan_shared_memory(c.tile, b.channels, b.hidden, program.device)
                if isinstance(smem, planning.Refusal):
                    if program.tile_rows is not None and c.engine == program.engine:
                        raise self.fail(f"block {i}", f"the forced tile does not fit: {smem.reason}")
                    candidates.append(dataclasses.replace(c, refusal=smem))
                else:
                    candidates.append(dataclasses.replace(c, smem=smem))
            blocks.append(dataclasses.replace(b, candidates=tuple(candidates)))
        return program.with_blocks(blocks, *self.ensures)


class ChooseEngine(Pass):
    """The fallback: the first candidate of the chain that fits, with the reasons for the others."""

    name = "engine"
    requires = frozenset({"smem"})
    ensures = frozenset({"engine"})

    def run(self, program):
        blocks = []
        for i, b in enumerate(program.blocks):
            if b.kernel_refusal is not None:
                blocks.append(dataclasses.replace(b, chosen=TORCH_CHAIN))
                continue
            chosen = next((c for c in b.candidates if c.fits), None)
            if chosen is None:
                reasons = "; ".join(f"{c.engine}: {c.refusal.reason if c.refusal else 'no plan'}" for c in b.candidates)
                raise self.fail(f"block {i}", f"no engine of the chain can serve it ({reasons})")
            skipped = tuple(c.refusal for c in b.candidates[: b.candidates.index(chosen)])
            blocks.append(dataclasses.replace(b, chosen=chosen.engine, skipped=skipped))
        return program.with_blocks(blocks, *self.ensures)


class PlanOwners(Pass):
    """CTAs per SM, the grid and the static ownership of row tiles for the chosen engine."""

    name = "owners"
    requires = frozenset({"engine"})
    ensures = frozenset({"owners"})

    def run(self, program):
        device = program.device
        blocks = []
        for i, b in enumerate(program.blocks):
            if b.chosen == TORCH_CHAIN:
                blocks.append(b)
                continue
            chosen = next(c for c in b.candidates if c.engine == b.chosen)
            needed = chosen.smem.bytes + device.reserved_smem_per_block
            if needed > device.smem_per_sm:
                raise self.fail(f"block {i}", f"one CTA of {b.chosen} needs {needed} bytes of shared memory but an "
                                              f"SM of {device.name} has {device.smem_per_sm}: no CTA could be resident")
            owners = planning.plan_owners(chosen.tile, chosen.smem, device)
            plan = planning.Plan(b.chosen, program.rows, b.channels, b.hidden, chosen.tile, chosen.smem, owners)
            blocks.append(dataclasses.replace(b, plan=plan))
        return program.with_blocks(blocks, *self.ensures)


class FuseStack(Pass):
    """The whole stack as one launch of ``persistent-stack`` (``planning.stack``) where the program asks for it
    (``fuse``) and the stack fits; otherwise the reason, and the per-block chain planned above serves it."""

    name = "stack"
    requires = frozenset({"owners"})
    ensures = frozenset({"stack"})

    def run(self, program):
        if not program.fuse:
            return dataclasses.replace(program, stack_refusal=f"per-block chain asked for (engine={program.engine!r})",
                                       properties=program.properties | self.ensures)
        got = plan_stack(program.blocks, program.rows, program.device, target=program.target,
                         input_dtype=program.input_dtype, form=program.stack_form, tile_rows=program.stack_tile_rows)
        if isinstance(got, planning.Refusal):
            if program.stack_form is not None or program.stack_tile_rows is not None:
                raise self.fail("program", f"the forced fused plan cannot run: {got.reason}")
            return dataclasses.replace(program, stack_refusal=got.reason, properties=program.properties | self.ensures)
        return dataclasses.replace(program, stack=got, properties=program.properties | self.ensures)


PIPELINE: tuple[Pass, ...] = (ValidateModel(), ServableForms(), AssignPrologues(), PlanTiles(), PlanSharedMemory(),
                              ChooseEngine(), PlanOwners(), FuseStack())
PROVIDERS = {prop: p.name for p in PIPELINE for prop in p.ensures}


def run_pipeline(program: Program, passes: tuple[Pass, ...] = PIPELINE) -> Program:
    for p in passes:
        program = p(program)
    return program


def plan(blocks: list[Block], rows: int, **options) -> Program:
    """A fresh program through the whole pipeline (``options``: input_dtype, engine, tile_rows, device,
    final_norm, target, fuse, stack_form, stack_tile_rows, pdl)."""
    return run_pipeline(Program(blocks=tuple(blocks), rows=rows, **options))
