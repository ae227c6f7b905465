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

from ..model import ACTIVATIONS
from ..planning import FALLBACK_CHAINS, H200, DeviceSpec, Plan, Refusal, SharedMemory, Tile, round_up

INPUT_DTYPES = ("float16", "float32")
PROLOGUES = ("none", "cast", "rmsnorm")
PROPERTIES = ("validated", "prologues", "tiles", "smem", "engine", "owners")
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
    """``s' = s + W2 act(W1 u + b1) + b2`` with ``u`` the fp16 operand of ``s`` (normalized if ``norm``)."""

    channels: int
    hidden: int
    activation: str
    norm: bool = False
    eps: float = 1e-6
    # filled in by the passes
    prologue: str | None = None  # how u is made from the stream: none (u = x), cast, rmsnorm
    residual: str | None = None  # dtype of the stream s entering the block
    candidates: tuple[Candidate, ...] = ()
    chosen: str | None = None  # the first candidate that fits
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
    properties: frozenset[str] = frozenset()

    def with_blocks(self, blocks, *added: str) -> Program:
        return dataclasses.replace(self, blocks=tuple(blocks), properties=self.properties | set(added))

    def describe(self) -> dict:
        """A JSON-friendly dump (the report's compiler block, debugging)."""
        out = {"rows": self.rows, "input_dtype": self.input_dtype, "engine": self.engine,
               "properties": sorted(self.properties, key=PROPERTIES.index), "blocks": []}
        for b in self.blocks:
            entry = {"channels": b.channels, "hidden": b.hidden, "activation": b.activation, "norm": b.norm,
                     "prologue": b.prologue, "residual": b.residual}
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
    unknown = set(program.properties) - set(PROPERTIES)
    _require(not unknown, "program", f"unknown properties {sorted(unknown)}")
    chain = FALLBACK_CHAINS[program.engine]
    props = program.properties
    for i, b in enumerate(program.blocks):
        where = f"block {i}"
        _require(isinstance(b, Block), where, f"expected a Block, got {type(b).__name__}")
        _require(_positive_int(b.channels) and _positive_int(b.hidden), where,
                 f"channels and hidden must be integers >= 1, got {b.channels!r} and {b.hidden!r}")
        _require(b.activation in ACTIVATIONS, where, f"activation must be one of {ACTIVATIONS}, got {b.activation!r}")
        if "prologues" in props:
            _require(b.prologue in PROLOGUES, where, f"prologue must be one of {PROLOGUES}, got {b.prologue!r}")
            _require(b.residual in INPUT_DTYPES, where, f"residual must be one of {INPUT_DTYPES}, got {b.residual!r}")
        if "tiles" in props:
            _require(tuple(c.engine for c in b.candidates) == chain, where,
                     f"candidates must follow the chain {chain}, got {[c.engine for c in b.candidates]}")
            for c in b.candidates:
                _require(c.tile is not None or c.refusal is not None, where,
                         f"candidate {c.engine} has neither a tile nor a refusal")
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
