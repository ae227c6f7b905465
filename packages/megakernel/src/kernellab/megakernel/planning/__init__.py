"""Shape planning: which engine serves which shape, with what tile, shared memory and grid.

Pure Python and deterministic, so the CPU tests pin every number here. The same functions serve the
hand-written engines (``engines.bind``) and the compiler's passes, which is what makes a compiled
block match its hand-written engine bit for bit.

Planning happens in three steps, each a function the compiler runs as its own pass:
1. ``plan_tile``: the tile shape an engine would use (rows per tile, channel padding, hidden
   chunk, load width), or a refusal (conventional-tc needs 16-byte rows; a tile that cannot fit);
2. ``plan_shared_memory``: bytes of shared memory per CTA and where the weights live, or a refusal
   when the on-chip tile does not fit (the trigger for the fallback);
3. ``plan_owners``: CTAs per SM from that shared memory, the grid, and the static round-robin
   ownership of row tiles (tile t belongs to CTA t mod grid).
``choose`` walks an engine's fallback chain through the three steps and keeps the first engine
that can serve the shape, with the reasons the others could not.

The numbers of each engine family live in their own module (``common``, ``scalar``, ``tensorcore``);
this module holds the three steps, the forced plans and ``choose``, and re-exports every name, so
``planning.X`` reads the same whichever module defines X.
"""

from __future__ import annotations

import dataclasses

from ..model import check_positive_int
from .common import (
    CLUSTER_SIZES as CLUSTER_SIZES,
)
from .common import (
    FALLBACK_CHAINS as FALLBACK_CHAINS,
)
from .common import (
    H200 as H200,
)
from .common import (
    KERNEL_ENGINES as KERNEL_ENGINES,
)
from .common import (
    DeviceSpec as DeviceSpec,
)
from .common import (
    Owners as Owners,
)
from .common import (
    Plan as Plan,
)
from .common import (
    Refusal as Refusal,
)
from .common import (
    SharedMemory as SharedMemory,
)
from .common import (
    Tile as Tile,
)
from .common import (
    ceil_div as ceil_div,
)
from .common import (
    current_device as current_device,
)
from .common import (
    flops as flops,
)
from .common import (
    max_active_clusters as max_active_clusters,
)
from .common import (
    minimum_bytes as minimum_bytes,
)
from .common import (
    occupancy as occupancy,
)
from .common import (
    round_up as round_up,
)
from .common import (
    usable_smem as usable_smem,
)
from .scalar import (
    ROW_BLOCK as ROW_BLOCK,
)
from .scalar import (
    SCALAR_GLOBAL_WEIGHTS_MAX as SCALAR_GLOBAL_WEIGHTS_MAX,
)
from .scalar import (
    SCALAR_K_CLASSES as SCALAR_K_CLASSES,
)
from .scalar import (
    SCALAR_OCCUPANCY as SCALAR_OCCUPANCY,
)
from .scalar import (
    SCALAR_REGISTER_WEIGHTS_MIN_STEPS as SCALAR_REGISTER_WEIGHTS_MIN_STEPS,
)
from .scalar import (
    SCALAR_REGISTER_WEIGHTS_OCCUPANCY as SCALAR_REGISTER_WEIGHTS_OCCUPANCY,
)
from .scalar import (
    SCALAR_THREADS as SCALAR_THREADS,
)
from .scalar import (
    SCALAR_WEIGHT_REGISTERS as SCALAR_WEIGHT_REGISTERS,
)
from .scalar import (
    SCALAR_WEIGHTS as SCALAR_WEIGHTS,
)
from .scalar import (
    register_weights_fit as register_weights_fit,
)
from .scalar import (
    scalar_group_lanes as scalar_group_lanes,
)
from .scalar import (
    scalar_lane_weights as scalar_lane_weights,
)
from .scalar import (
    scalar_occupancy as scalar_occupancy,
)
from .scalar import (
    scalar_row_bytes as scalar_row_bytes,
)
from .scalar import (
    scalar_row_stride as scalar_row_stride,
)
from .scalar import (
    scalar_weight_bytes as scalar_weight_bytes,
)
from .scalar import (
    scalar_weights_whole_steps as scalar_weights_whole_steps,
)
from .scalar import (
    staged_weight_bytes as staged_weight_bytes,
)
from .scalar import (
    weight_group_stride as weight_group_stride,
)
from .tensorcore import (
    CONVENTIONAL_TC_STAGES as CONVENTIONAL_TC_STAGES,
)
from .tensorcore import (
    CONVENTIONAL_TC_THREADS as CONVENTIONAL_TC_THREADS,
)
from .tensorcore import (
    CONVENTIONAL_TC_TILE as CONVENTIONAL_TC_TILE,
)
from .tensorcore import (
    REGISTER_FORM_MAX as REGISTER_FORM_MAX,
)
from .tensorcore import (
    REGISTER_FORM_OCCUPANCY as REGISTER_FORM_OCCUPANCY,
)
from .tensorcore import (
    REGISTER_FORM_PAD as REGISTER_FORM_PAD,
)
from .tensorcore import (
    REGISTER_FORM_ROWS as REGISTER_FORM_ROWS,
)
from .tensorcore import (
    REGISTER_FORM_THREADS as REGISTER_FORM_THREADS,
)
from .tensorcore import (
    REGISTER_FORM_UNALIGNED as REGISTER_FORM_UNALIGNED,
)
from .tensorcore import (
    SPLIT_BARRIER_BYTES as SPLIT_BARRIER_BYTES,
)
from .tensorcore import (
    TC_CHANNEL_TILES as TC_CHANNEL_TILES,
)
from .tensorcore import (
    TC_HIDDEN_CHUNK as TC_HIDDEN_CHUNK,
)
from .tensorcore import (
    TC_LOADS as TC_LOADS,
)
from .tensorcore import (
    TC_MAX_STAGES as TC_MAX_STAGES,
)
from .tensorcore import (
    TC_MMAS as TC_MMAS,
)
from .tensorcore import (
    TC_MULTICASTS as TC_MULTICASTS,
)
from .tensorcore import (
    TC_OVERLAP_CHANNELS as TC_OVERLAP_CHANNELS,
)
from .tensorcore import (
    TC_ROW_TILES as TC_ROW_TILES,
)
from .tensorcore import (
    TC_SPLITS as TC_SPLITS,
)
from .tensorcore import (
    TC_THREADS as TC_THREADS,
)
from .tensorcore import (
    TC_WEIGHT_ROWS as TC_WEIGHT_ROWS,
)
from .tensorcore import (
    TMA_BARRIER_BYTES as TMA_BARRIER_BYTES,
)
from .tensorcore import (
    VECTOR_ELEMENTS as VECTOR_ELEMENTS,
)
from .tensorcore import (
    WGMMA_ROW_TILES as WGMMA_ROW_TILES,
)
from .tensorcore import (
    channel_tile as channel_tile,
)
from .tensorcore import (
    persistent_tc_smem_bytes as persistent_tc_smem_bytes,
)
from .tensorcore import (
    register_form_fits as register_form_fits,
)
from .tensorcore import (
    register_groups as register_groups,
)
from .tensorcore import (
    register_run_start as register_run_start,
)
from .tensorcore import (
    register_slot as register_slot,
)
from .tensorcore import (
    tc_chunks_per_cta as tc_chunks_per_cta,
)
from .tensorcore import (
    tc_cost as tc_cost,
)
from .tensorcore import (
    tc_layout as tc_layout,
)
from .tensorcore import (
    tc_loads as tc_loads,
)
from .tensorcore import (
    tc_mma as tc_mma,
)
from .tensorcore import (
    tc_occupancy_limit as tc_occupancy_limit,
)
from .tensorcore import (
    tc_overlap as tc_overlap,
)
from .tensorcore import (
    tc_registers as tc_registers,
)
from .tensorcore import (
    tc_split_fits as tc_split_fits,
)
from .tensorcore import (
    tc_stages as tc_stages,
)
from .tensorcore import (
    tc_tile_smem_bytes as tc_tile_smem_bytes,
)
from .tensorcore import (
    tensor_core_alignment as tensor_core_alignment,
)
from .tensorcore import (
    with_schedule as with_schedule,
)


def _check_engine(engine: str) -> None:
    if engine not in KERNEL_ENGINES:
        raise ValueError(f"unknown engine {engine!r}; kernel engines are {KERNEL_ENGINES}")


def plan_tile(engine: str, rows: int, channels: int, hidden: int, device: DeviceSpec,
              tile_rows: int | None = None, mma: str | None = None, registers: bool | None = None) -> Tile | Refusal:
    """Step 1: the tile an engine would use for this shape. ``tile_rows`` forces the rows per tile
    (the compiler's override); it must be a multiple of the engine's row granularity. ``mma`` forces
    persistent-tc's instruction (None: ``tc_mma``'s choice), ``registers`` its register form (None: planning's
    choice, ``tc_registers``)."""
    _check_engine(engine)
    if engine == "persistent-tc" and registers is None:
        registers = tile_rows is None and mma is None and tc_registers(channels, hidden)
    if registers and (tile_rows not in (None, REGISTER_FORM_ROWS) or mma not in (None, "mma.sync")):
        return Refusal(engine, f"the register form has {REGISTER_FORM_ROWS}-row tiles and mma.sync")
    misaligned = tensor_core_alignment(channels, hidden)
    if engine == "conventional-tc" and misaligned:
        return Refusal(engine, misaligned)
    if engine == "persistent-tc" and registers:
        if not register_form_fits(channels, hidden):
            return Refusal(engine, f"the register form holds channels and hidden, padded to {REGISTER_FORM_PAD}, of "
                                   f"at most {REGISTER_FORM_MAX[0]} and {REGISTER_FORM_MAX[1]} and at most "
                                   f"{REGISTER_FORM_MAX[2]} elements per weight; got {channels} x {hidden}")
        padded = (round_up(channels, REGISTER_FORM_PAD), round_up(hidden, REGISTER_FORM_PAD))
        return Tile(engine, REGISTER_FORM_ROWS, *padded, REGISTER_FORM_THREADS, ceil_div(rows, REGISTER_FORM_ROWS),
                    vector=1 if misaligned else VECTOR_ELEMENTS, registers=True)
    if engine == "persistent-tc":
        channels_tile = channel_tile(channels)
        if channels_tile is None:
            return Refusal(engine, f"channels={channels} > {TC_CHANNEL_TILES[-1]}: the fp32 output tile does not "
                                   "fit in registers")
        split = 1
        if tile_rows is None and mma is None:
            tile_rows, split = tc_layout(rows, channels_tile, hidden, misaligned is None, device)
        if mma is None:
            mma = tc_mma(tile_rows, channels_tile, misaligned is not None)
        if mma not in TC_MMAS:
            raise ValueError(f"unknown mma {mma!r}; persistent-tc has {TC_MMAS}")
        allowed = WGMMA_ROW_TILES if mma == "wgmma" else TC_ROW_TILES
        rows_per_tile = tile_rows or (tc_layout(rows, channels_tile, hidden, False, device)[0]  # mma forced
                                      if mma == "mma.sync" else WGMMA_ROW_TILES[0])
        if rows_per_tile not in allowed:
            return Refusal(engine, f"tile_rows must be one of {allowed} for persistent-tc with {mma}, "
                                   f"got {rows_per_tile}")
        if mma == "wgmma" and (misaligned or (rows_per_tile == WGMMA_ROW_TILES[1] and channels_tile > 256)):
            return Refusal(engine, "wgmma needs channels and hidden multiples of 8, and at most 256 channels "
                                   "with 128-row tiles")
        num_tiles, loads = ceil_div(rows, rows_per_tile), tc_loads(rows_per_tile, mma)
        tile = Tile(engine, rows_per_tile, channels_tile, TC_HIDDEN_CHUNK, TC_THREADS, num_tiles,
                    vector=1 if misaligned else VECTOR_ELEMENTS, mma=mma, split=split, loads=loads)  # unaligned
        return with_schedule(tile, hidden, device)  # rows: element loads
    if engine == "conventional-tc":
        block_rows = CONVENTIONAL_TC_TILE[0]
        return Tile(engine, block_rows, channels, hidden, CONVENTIONAL_TC_THREADS, ceil_div(rows, block_rows),
                    vector=VECTOR_ELEMENTS)
    if engine == "conventional":
        rows_per_tile = tile_rows or ROW_BLOCK
        if rows_per_tile % ROW_BLOCK:
            return Refusal(engine, f"tile_rows must be a multiple of {ROW_BLOCK}, got {rows_per_tile}")
        return Tile(engine, rows_per_tile, channels, hidden, SCALAR_THREADS, ceil_div(rows, rows_per_tile))
    # persistent / persistent-global: about one tile per SM, at most as many rows as fit on chip
    # (whether even ROW_BLOCK rows fit is plan_shared_memory's call)
    if tile_rows is not None:
        if tile_rows % ROW_BLOCK:
            return Refusal(engine, f"tile_rows must be a multiple of {ROW_BLOCK}, got {tile_rows}")
        rows_per_tile = tile_rows
    else:
        fit_rows = usable_smem(device) // scalar_row_bytes(engine, channels, hidden) // ROW_BLOCK * ROW_BLOCK
        rows_per_tile = max(ROW_BLOCK, min(round_up(ceil_div(rows, device.sm_count), ROW_BLOCK), fit_rows))
    return Tile(engine, rows_per_tile, channels, hidden, SCALAR_THREADS, ceil_div(rows, rows_per_tile))


def plan_shared_memory(tile: Tile, channels: int, hidden: int, device: DeviceSpec) -> SharedMemory | Refusal:
    """Step 2: shared memory per CTA and where the weights and the hidden tile live."""
    engine, capacity = tile.engine, usable_smem(device)
    if engine == "persistent-tc" and tile.registers:
        placement = SharedMemory(0, weights="registers", hidden="registers")
    elif engine == "persistent-tc":
        size = tc_tile_smem_bytes(tile)
        placement = SharedMemory(size, weights="streamed", hidden="registers+smem")
    elif engine == "conventional-tc":
        block_rows, block_cols, block_k = CONVENTIONAL_TC_TILE
        size = CONVENTIONAL_TC_STAGES * (block_rows + block_cols) * block_k * 2
        placement = SharedMemory(size, weights="streamed", hidden="global")
    elif engine == "conventional":
        placement = SharedMemory(0, weights="global", hidden="global")
    else:
        size = tile.rows * scalar_row_bytes(engine, channels, hidden)
        hidden_at = "smem" if engine == "persistent" else "global"
        with_weights = size + scalar_weight_bytes(channels, hidden)
        once = tile.rows == ROW_BLOCK and tile.num_tiles <= device.sm_count  # a CTA reads each weight once
        if register_weights_fit(tile.rows, channels, hidden):
            placement = SharedMemory(size, weights="registers", hidden=hidden_at)
        elif with_weights <= capacity and (scalar_weights_whole_steps(channels, hidden)
                                           or not (once and 2 * channels * hidden <= SCALAR_GLOBAL_WEIGHTS_MAX)):
            placement = SharedMemory(with_weights, weights="smem", hidden=hidden_at)
        else:
            placement = SharedMemory(size, weights="global", hidden=hidden_at)
    if placement.bytes > capacity:
        return Refusal(engine, f"a {tile.rows}-row tile needs {placement.bytes} bytes of shared memory "
                               f"(> {capacity}): the hidden tile does not fit on chip")
    return placement


def plan_owners(tile: Tile, smem: SharedMemory, device: DeviceSpec) -> Owners:
    """Step 3: the grid. Persistent engines launch min(row tiles, resident CTAs) and CTA b owns
    tiles b, b + grid, ...; the conventional engines launch one CTA per tile."""
    limit = None  # conventional-tc: threads and shared memory alone
    if tile.engine == "persistent-tc":
        limit = tc_occupancy_limit(tile)
    elif tile.engine in ("conventional", "persistent", "persistent-global"):
        limit = scalar_occupancy(smem.weights)
    if tile.registers:
        limit = REGISTER_FORM_OCCUPANCY
    resident = occupancy(tile.threads, smem.bytes, device, limit)
    if tile.engine.startswith("persistent") and tile.multicast > 1:  # whole clusters, each on its own tiles
        m = tile.multicast
        grid = min(round_up(tile.num_tiles, m), device.sm_count * resident // m * m)
        return Owners(occupancy=resident, grid=grid, tiles_per_cta=ceil_div(tile.num_tiles, grid))
    if tile.engine.startswith("persistent"):  # a hidden split launches clusters of tile.split CTAs per tile
        groups = min(tile.num_tiles, device.sm_count * resident // tile.split)
        return Owners(occupancy=resident, grid=groups * tile.split, tiles_per_cta=ceil_div(tile.num_tiles, groups))
    return Owners(occupancy=resident, grid=tile.num_tiles, tiles_per_cta=1)


def plan_engine(engine: str, rows: int, channels: int, hidden: int, device: DeviceSpec,
                tile_rows: int | None = None, mma: str | None = None, registers: bool | None = None) -> Plan | Refusal:
    """All three steps for one engine."""
    tile = plan_tile(engine, rows, channels, hidden, device, tile_rows, mma, registers)
    if isinstance(tile, Refusal):
        return tile
    smem = plan_shared_memory(tile, channels, hidden, device)
    if isinstance(smem, Refusal):
        return smem
    return Plan(engine, rows, channels, hidden, tile, smem, plan_owners(tile, smem, device))


def forced(engine: str, rows: int, channels: int, hidden: int, device: DeviceSpec, *, tile_rows: int | None = None,
           grid: int | None = None, weights: str | None = None, stages: int | None = None,
           mma: str | None = None, split: int | None = None, multicast: int | None = None,
           loads: str | None = None, overlap: bool | None = None, registers: bool | None = None,
           pdl: bool | None = None) -> Plan:
    """A plan with some choices forced, so that tests, the sanitizer and sweeps reach every code path at
    small shapes: several tiles per CTA (``grid``: with a hidden split, the number of clusters times the
    split), weights read from global memory (``weights``), persistent-tc's number of chunk buffers
    (``stages``), instruction (``mma``), hidden split (``split``), weight loads (``loads``), weight
    multicast (``multicast``, which loads by TMA), chunk schedule (``overlap``), register form (``registers``;
    none of the other persistent-tc choices applies to it) and programmatic dependent launch (``pdl``: the
    kernel's launch lets the next kernel of the stream launch at its start, and waits for the kernel before it
    ahead of its first tile, so that a chain of launches overlaps each launch with the end of the one before)."""
    _check_sizes(rows=rows, channels=channels, hidden=hidden)
    for name, value in (("tile_rows", tile_rows), ("grid", grid), ("stages", stages), ("split", split),
                        ("multicast", multicast)):
        if value is not None:
            check_positive_int(name, value)
    tc_choices = (mma, split, multicast, loads, overlap, registers, pdl)
    if any(v is not None for v in tc_choices) and engine != "persistent-tc":
        raise ValueError(f"{engine} has no mma, split, loads, multicast, overlap, registers or pdl choice")
    shared_form_choice = any(v is not None for v in (split, multicast, loads, overlap, stages))
    if registers and (shared_form_choice or pdl):
        raise ValueError("the register form has no split, multicast, loads, overlap, stages or pdl choice")
    if (multicast or 1) > 1 and loads == "cp.async":
        raise ValueError("a weight multicast loads by TMA, not cp.async")
    if engine == "persistent-tc" and registers is None and (shared_form_choice or pdl):
        registers = False
    plan = plan_engine(engine, rows, channels, hidden, device, tile_rows, mma, registers)
    if isinstance(plan, Refusal):
        raise ValueError(plan.reason)
    if split is not None and split != plan.tile.split:
        plan = split_plan(plan, split, device)
    if loads is not None and loads != plan.tile.loads:
        plan = loads_plan(plan, loads, device)
    if multicast is not None and multicast != plan.tile.multicast:
        plan = multicast_plan(plan, multicast, device)
    if overlap is not None and overlap != plan.tile.overlap:
        plan = overlap_plan(plan, overlap, device)
    if pdl is not None and pdl != plan.tile.pdl:
        plan = dataclasses.replace(plan, tile=dataclasses.replace(plan.tile, pdl=pdl))
    if stages is not None and stages != plan.tile.stages:
        size = tc_tile_smem_bytes(dataclasses.replace(plan.tile, stages=stages))
        if engine != "persistent-tc" or not 1 <= stages <= TC_MAX_STAGES or size > usable_smem(device):
            raise ValueError(f"{engine} has no {stages}-stage variant at this shape")
        plan = dataclasses.replace(plan, tile=dataclasses.replace(plan.tile, stages=stages),
                                   smem=dataclasses.replace(plan.smem, bytes=size))
    if weights is not None and weights != plan.smem.weights:
        if engine not in ("persistent", "persistent-global") or weights not in SCALAR_WEIGHTS:
            raise ValueError(f"{engine} has no weights={weights!r} variant")
        if weights == "registers" and not register_weights_fit(plan.tile.rows, channels, hidden):
            raise ValueError(f"weights='registers' needs {ROW_BLOCK}-row tiles and at most "
                             f"{SCALAR_WEIGHT_REGISTERS} elements of each weight a lane "
                             f"(planning.register_weights_fit); got {plan.tile.rows}-row tiles at "
                             f"{channels} x {hidden}")
        size = plan.tile.rows * scalar_row_bytes(engine, channels, hidden)
        size += scalar_weight_bytes(channels, hidden) if weights == "smem" else 0
        if size > usable_smem(device):
            raise ValueError(f"weights={weights!r} needs {size} bytes of shared memory")
        smem = dataclasses.replace(plan.smem, bytes=size, weights=weights)
        plan = dataclasses.replace(plan, smem=smem, owners=plan_owners(plan.tile, smem, device))
    if grid is not None:
        cluster = plan.tile.split * plan.tile.multicast
        if grid % cluster:
            raise ValueError(f"grid must be a multiple of the cluster size {cluster}, got {grid}")
        groups = grid // plan.tile.split
        owners = dataclasses.replace(plan.owners, grid=grid, tiles_per_cta=ceil_div(plan.tile.num_tiles, groups))
        plan = dataclasses.replace(plan, owners=owners)
    return plan


def split_plan(plan: Plan, split: int, device: DeviceSpec) -> Plan:
    """persistent-tc's plan with the hidden split across ``split`` CTAs of a cluster: chunk buffers, shared
    memory and grid planned again. It needs 16-byte rows (cp.async tiles), a thread's output fragment dealt out
    evenly (``tc_split_fits``) and the peers' partial output tiles in shared memory."""
    tile = plan.tile
    if split not in TC_SPLITS:
        raise ValueError(f"split must be one of {TC_SPLITS}, got {split}")
    if tile.vector != VECTOR_ELEMENTS:
        raise ValueError(f"a hidden split needs channels and hidden multiples of {VECTOR_ELEMENTS}")
    if not tc_split_fits(tile.rows, tile.channels_tile, split):
        raise ValueError(f"split={split} does not deal a {tile.rows} x {tile.channels_tile} tile's output "
                         f"fragment of {tile.rows * tile.channels_tile // TC_THREADS} elements a thread into "
                         f"whole column pairs for each CTA")
    return _replanned(plan, with_schedule(dataclasses.replace(tile, split=split), plan.hidden, device), device)


def overlap_plan(plan: Plan, overlap: bool, device: DeviceSpec) -> Plan:
    """persistent-tc's plan with (or without) the overlapped chunk schedule: GEMM1 of chunk j + 1 and GEMM2
    of chunk j issued together, the activation of j + 1 written to a second hidden buffer while GEMM2 of j
    runs. It needs wgmma (asynchronous products) with TMA weight loads (mbarrier pipelines); chunk buffers,
    shared memory and grid are planned again."""
    tile = plan.tile
    if overlap and (tile.mma != "wgmma" or tile.loads != "tma"):
        raise ValueError("the overlapped chunk schedule needs the wgmma form with TMA weight loads")
    if overlap and ceil_div(plan.hidden, TC_HIDDEN_CHUNK) < tile.split:
        raise ValueError("the overlapped chunk schedule needs a hidden chunk for every CTA of a split")
    stages = tc_stages(tile.rows, tile.channels_tile, tile.num_tiles, plan.hidden, device, tile.split, tile.loads,
                       overlap)
    return _replanned(plan, dataclasses.replace(tile, overlap=overlap, stages=stages), device)


def loads_plan(plan: Plan, loads: str, device: DeviceSpec) -> Plan:
    """persistent-tc's plan with its weight chunks loaded by ``loads``: shared memory and grid planned again.
    TMA needs 16-byte rows and the wgmma form, whose 128-byte-swizzled chunk buffers a few TMA boxes fill
    (mma.sync's buffers, swizzled in elements, compile to a TMA copy per 8-row atom: thousands a chunk)."""
    if loads not in TC_LOADS:
        raise ValueError(f"loads must be one of {TC_LOADS}, got {loads!r}")
    if loads == "tma" and (plan.tile.vector != VECTOR_ELEMENTS or plan.tile.mma != "wgmma"):
        raise ValueError(f"TMA loads need the wgmma form and channels and hidden multiples of {VECTOR_ELEMENTS} "
                         "(16-byte rows)")
    if loads == "cp.async" and plan.tile.multicast > 1:
        raise ValueError("a weight multicast loads by TMA")
    return _replanned(plan, with_schedule(dataclasses.replace(plan.tile, loads=loads), plan.hidden, device,
                                           plan.tile.stages), device)


def multicast_plan(plan: Plan, multicast: int, device: DeviceSpec) -> Plan:
    """persistent-tc's wgmma plan with each weight chunk loaded once per cluster of ``multicast`` CTAs (TMA
    multicast): shared memory and grid planned again (the grid whole clusters; a CTA whose clustermates
    still have tiles runs an empty tile beside them, since the cluster loads every chunk together)."""
    tile = plan.tile
    if multicast not in TC_MULTICASTS:
        raise ValueError(f"multicast must be one of {TC_MULTICASTS}, got {multicast}")
    if multicast > 1 and (tile.mma != "wgmma" or tile.split != 1 or tile.vector != VECTOR_ELEMENTS):
        raise ValueError("a weight multicast needs the wgmma form, no hidden split, and channels and hidden "
                         f"multiples of {VECTOR_ELEMENTS} (TMA rows are 16-byte aligned)")
    loads = "tma" if multicast > 1 else tile.loads
    return _replanned(plan, with_schedule(dataclasses.replace(tile, multicast=multicast, loads=loads), plan.hidden,
                                           device, tile.stages), device)


def _replanned(plan: Plan, tile: Tile, device: DeviceSpec) -> Plan:
    """``plan`` with ``tile``: shared memory and owners planned again, or the refusal raised."""
    smem = plan_shared_memory(tile, plan.channels, plan.hidden, device)
    if isinstance(smem, Refusal):
        raise ValueError(smem.reason)
    return dataclasses.replace(plan, tile=tile, smem=smem, owners=plan_owners(tile, smem, device))


@dataclasses.dataclass(frozen=True)
class Choice:
    """The engine that serves a shape for a requested engine, and why the ones before it could not."""

    requested: str
    plan: Plan
    skipped: tuple[Refusal, ...]

    @property
    def served_by(self) -> str:
        return self.plan.engine


def _check_sizes(**sizes) -> None:
    """Planning's entry points take problem sizes from users: each must be an integer >= 1."""
    for name, value in sizes.items():
        check_positive_int(name, value)


def choose(requested: str, rows: int, channels: int, hidden: int, device: DeviceSpec | None = None) -> Choice:
    """Walk ``requested``'s fallback chain; the last engine (conventional) serves every shape."""
    if requested not in FALLBACK_CHAINS:
        raise ValueError(f"unknown engine {requested!r}; engines with kernels are {sorted(FALLBACK_CHAINS)}")
    _check_sizes(rows=rows, channels=channels, hidden=hidden)
    device = device or current_device()
    skipped: list[Refusal] = []
    for engine in FALLBACK_CHAINS[requested]:
        plan = plan_engine(engine, rows, channels, hidden, device)
        if isinstance(plan, Plan):
            return Choice(requested, plan, tuple(skipped))
        skipped.append(plan)
    raise AssertionError(f"conventional refused {rows}x{channels}x{hidden}: {skipped[-1].reason}")
