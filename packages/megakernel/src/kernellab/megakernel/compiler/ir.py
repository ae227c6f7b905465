"""The compiler's intermediate representation: a model as a list of row-wise blocks plus the
schedule the passes attach to it.

A ``Program`` is immutable; every pass returns a new one with more filled in and names what it
added in ``properties``. ``validate`` checks a program's structure and, for each property present,
that the fields it promises are there and consistent. It runs on the way into and out of every
pass (``passes.Pass.__call__``), so a pass can never hand the next one a half-built program.
Weights are not part of the IR: it describes shapes and schedules; the parameters travel beside it.
"""

from __future__ import annotations

import dataclasses

from ..planning import FALLBACK_CHAINS, H200, DeviceSpec, Plan, Refusal, SharedMemory, Tile, round_up
from ..planning.stack import STACK_FORMS, TILE_ROW_CHOICES, StackPlan
from ..stack import NORMS, STACK_ACTIVATIONS, Norm

INPUT_DTYPES = ("float16", "float32")
PROLOGUES = ("none", "cast", "rmsnorm", "layernorm")
TARGETS = ("cuda", "cpu")
TORCH_CHAIN = "torch-chain"
"""The engine of a block no kernel serves: ``stack.torch_block``, the same rounding points in torch."""
PROPERTIES = ("validated", "forms", "prologues", "tiles", "smem", "engine", "owners", "stack")
"""In pipeline order; ``passes`` maps each to the pass that ensures it."""


class IRError(ValueError):
    """A malformed program; the message names the block and the field."""


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One engine of the fallback chain considered for a block, and how far planning got with it."""

    engine: str
    tile: Tile | None = None
    smem: SharedMemory | None = None
    refusal: Refusal | None = None

    @property
    def fits(self) -> bool:
        return self.refusal is None and self.tile is not None and self.smem is not None


@dataclasses.dataclass(frozen=True)
class Block:
    """``s' = s + W2 h + b2`` with ``h = act(W1 u + b1)``, or ``act(W1 u + b1) * (W3 u + b3)`` when
    ``gated``, and ``u`` the fp16 operand of ``s`` (normalized if ``norm``); ``stack`` has the math."""

    channels: int
    hidden: int
    activation: str
    norm: Norm | None = None
    gated: bool = False
    bias1: bool = True  # whether the model has each Linear's bias (absent ones are zeros in the parameters)
    bias2: bool = True
    bias3: bool = False  # the gate's Linear (gated blocks only)
    # filled in by the passes
    kernel_refusal: str | None = None  # why no kernel engine serves this block's form (then: the torch chain)
    prologue: str | None = None  # how u is made from the stream: none (u = x), cast, rmsnorm
    residual: str | None = None  # dtype of the stream s entering the block
    candidates: tuple[Candidate, ...] = ()
    chosen: str | None = None  # the first candidate that fits, or TORCH_CHAIN
    skipped: tuple[Refusal, ...] = ()  # why the candidates before it could not serve
    plan: Plan | None = None  # the chosen candidate with its grid


@dataclasses.dataclass(frozen=True)
class Program:
    blocks: tuple[Block, ...]
    rows: int
    input_dtype: str = "float16"
    engine: str = "persistent-tc"  # the engine asked for; its fallback chain is what the passes walk
    tile_rows: int | None = None  # force rows per tile (tests, tuning); None lets planning choose
    device: DeviceSpec = H200
    final_norm: Norm | None = None  # a norm after the last block (its output is the model's, fp32)
    target: str = "cuda"  # where the compiled model runs; on "cpu" every block takes the torch chain
    fuse: bool = False  # try the fused whole-stack engine (persistent-stack) before the per-block chain
    stack_form: str | None = None  # force the fused engine's form (``STACK_FORMS``; tests, sweeps)
    stack_tile_rows: int | None = None  # force the fused engine's row tile
    pdl: bool = False  # the per-block chain's persistent-tc blocks and prologues with programmatic dependent launch
    # filled in by the stack pass: the fused plan, or why the stack runs as the per-block chain
    stack: StackPlan | None = None
    stack_refusal: str | None = None
    properties: frozenset[str] = frozenset()

    def with_blocks(self, blocks, *added: str) -> Program:
        return dataclasses.replace(self, blocks=tuple(blocks), properties=self.properties | set(added))

    def describe(self) -> dict:
        """A JSON-friendly dump (the report's compiler block, debugging)."""
        out = {"rows": self.rows, "input_dtype": self.input_dtype, "engine": self.engine, "target": self.target,
               "final_norm": self.final_norm.describe() if self.final_norm else None, "fuse": self.fuse,
               "pdl": self.pdl, "stack": self.stack.describe() if self.stack else None,
               "stack_refusal": self.stack_refusal,
               "properties": sorted(self.properties, key=PROPERTIES.index), "blocks": []}
        for b in self.blocks:
            entry = {"channels": b.channels, "hidden": b.hidden, "activation": b.activation, "gated": b.gated,
                     "norm": b.norm.describe() if b.norm else None, "biases": [b.bias1, b.bias2, b.bias3],
                     "prologue": b.prologue, "residual": b.residual, "engine": b.chosen}
            if b.kernel_refusal is not None:
                entry["kernel_refusal"] = b.kernel_refusal
            if b.plan is not None:
                entry["plan"] = b.plan.describe()
                entry["skipped"] = [dataclasses.asdict(r) for r in b.skipped]
            out["blocks"].append(entry)
        return out


def _require(cond: bool, where: str, message: str) -> None:
    if not cond:
        raise IRError(f"{where}: {message}")


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _check_norm(norm, where: str) -> None:
    if norm is None:
        return
    _require(isinstance(norm, Norm), where, f"a norm must be a stack.Norm or None, got {type(norm).__name__}")
    _require(norm.kind in NORMS, where, f"norm kind must be one of {NORMS}, got {norm.kind!r}")
    _require(isinstance(norm.eps, float) and norm.eps > 0, where, f"norm eps must be a float > 0, got {norm.eps!r}")
    _require(norm.kind == "layernorm" or not norm.bias, where, "only a LayerNorm has a bias")


def _check_torch_block(b: Block, where: str, props) -> None:
    """A block no kernel serves: no candidates, no plan, the torch chain chosen once engines are."""
    if "prologues" in props:
        _require(b.prologue in PROLOGUES and b.residual in INPUT_DTYPES, where, "has no prologue or residual dtype")
    _require(b.candidates == () and b.plan is None and b.skipped == (), where,
             "a torch-chain block has no kernel candidates, skipped engines or plan")
    if "engine" in props:
        _require(b.chosen == TORCH_CHAIN, where,
                 f"a block no kernel serves must choose {TORCH_CHAIN!r}, got {b.chosen!r}")


def validate(program: Program) -> Program:
    """Structure always; then the fields each property in ``program.properties`` promises."""
    _require(isinstance(program, Program), "program", f"expected a Program, got {type(program).__name__}")
    _require(_positive_int(program.rows), "program", f"rows must be an integer >= 1, got {program.rows!r}")
    _require(isinstance(program.blocks, tuple) and len(program.blocks) >= 1, "program",
             "needs a non-empty tuple of blocks")
    _require(program.input_dtype in INPUT_DTYPES, "program",
             f"input_dtype must be one of {INPUT_DTYPES}, got {program.input_dtype!r}")
    _require(program.engine in FALLBACK_CHAINS, "program",
             f"engine must be one of {sorted(FALLBACK_CHAINS)}, got {program.engine!r}")
    _require(program.tile_rows is None or _positive_int(program.tile_rows), "program",
             f"tile_rows must be None or an integer >= 1, got {program.tile_rows!r}")
    _require(isinstance(program.device, DeviceSpec), "program", "device must be a planning.DeviceSpec")
    _require(program.target in TARGETS, "program", f"target must be one of {TARGETS}, got {program.target!r}")
    _check_norm(program.final_norm, "program: final_norm")
    _require(isinstance(program.fuse, bool), "program", f"fuse must be a bool, got {program.fuse!r}")
    _require(isinstance(program.pdl, bool), "program", f"pdl must be a bool, got {program.pdl!r}")
    _require(program.stack_form is None or program.stack_form in STACK_FORMS, "program",
             f"stack_form must be None or one of {STACK_FORMS}, got {program.stack_form!r}")
    _require(program.stack_tile_rows is None or program.stack_tile_rows in TILE_ROW_CHOICES, "program",
             f"stack_tile_rows must be None or one of {TILE_ROW_CHOICES}, got {program.stack_tile_rows!r}")
    if "stack" in program.properties:
        _require((program.stack is None) != (program.stack_refusal is None), "program",
                 "the stack pass records exactly one of a fused plan and the reason there is none")
        _require(program.stack is None or program.fuse, "program", "a fused plan needs fuse=True")
    else:
        _require(program.stack is None and program.stack_refusal is None, "program",
                 "a fused plan or refusal before the stack pass ran")
    unknown = set(program.properties) - set(PROPERTIES)
    _require(not unknown, "program", f"unknown properties {sorted(unknown)}")
    chain = FALLBACK_CHAINS[program.engine]
    props = program.properties
    for i, b in enumerate(program.blocks):
        where = f"block {i}"
        _require(isinstance(b, Block), where, f"expected a Block, got {type(b).__name__}")
        _require(_positive_int(b.channels) and _positive_int(b.hidden), where,
                 f"channels and hidden must be integers >= 1, got {b.channels!r} and {b.hidden!r}")
        _require(b.activation in STACK_ACTIVATIONS, where,
                 f"activation must be one of {STACK_ACTIVATIONS}, got {b.activation!r}")
        _check_norm(b.norm, where)
        _require(all(isinstance(f, bool) for f in (b.gated, b.bias1, b.bias2, b.bias3)), where,
                 "gated, bias1, bias2 and bias3 must be bools")
        _require(b.gated or not b.bias3, where, "bias3 (the gate's bias) needs a gated block")
        if "forms" in props:
            _require(b.kernel_refusal is None or isinstance(b.kernel_refusal, str) and b.kernel_refusal, where,
                     f"kernel_refusal must be None or a reason, got {b.kernel_refusal!r}")
        if b.kernel_refusal is not None:
            _check_torch_block(b, where, props)
            continue
        if "prologues" in props:
            _require(b.prologue in PROLOGUES, where, f"prologue must be one of {PROLOGUES}, got {b.prologue!r}")
            _require(b.residual in INPUT_DTYPES, where, f"residual must be one of {INPUT_DTYPES}, got {b.residual!r}")
        if "tiles" in props:
            _require(tuple(c.engine for c in b.candidates) == chain, where,
                     f"candidates must follow the chain {chain}, got {[c.engine for c in b.candidates]}")
            for c in b.candidates:
                _require(c.tile is not None or c.refusal is not None, where,
                         f"candidate {c.engine} has neither a tile nor a refusal")
                _require(c.tile is None or c.tile.pdl == (program.pdl and c.engine == "persistent-tc"
                                                          and not c.tile.registers), where,
                         f"candidate {c.engine}'s tile has pdl={c.tile.pdl if c.tile else None}: programmatic "
                         f"launch is the program's (pdl={program.pdl}), on persistent-tc's shared-memory form only")
        if "smem" in props:
            for c in b.candidates:
                _require(c.tile is None or c.smem is not None or c.refusal is not None, where,
                         f"candidate {c.engine} has a tile but no shared-memory plan or refusal")
        if "engine" in props:
            first = next((c for c in b.candidates if c.fits), None)
            _require(first is not None and b.chosen == first.engine, where,
                     f"chosen engine {b.chosen!r} is not the first candidate that fits")
            _require(tuple(r.engine for r in b.skipped) == chain[: chain.index(b.chosen)], where,
                     "skipped engines must be exactly the chain before the chosen one")
        if "owners" in props:
            _require(b.plan is not None and b.plan.engine == b.chosen, where, "has no plan for its chosen engine")
            owners = b.plan.owners
            _require(owners.grid >= 1 and owners.occupancy >= 1, where, f"grid and occupancy must be >= 1: {owners}")
            tile = b.plan.tile  # a hidden split runs each row tile on `split` CTAs; a multicast cluster runs
            cluster = tile.split * tile.multicast  # whole clusters, some CTA's last tile maybe an empty one
            _require(owners.grid % cluster == 0, where, f"grid {owners.grid} is not whole clusters of {cluster} CTAs")
            most = round_up(tile.num_tiles, tile.multicast) * tile.split
            _require(owners.grid <= most, where,
                     f"grid {owners.grid} exceeds the {tile.num_tiles} row tiles' {most} CTAs (idle CTAs)")
    return program
