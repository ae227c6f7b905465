"""Planning the fused whole-stack engine ``persistent-stack``: which form, which tile, how many CTAs, and
why a stack cannot be fused (then the compiler keeps the per-block chain and records the reason).

The kernel (``engines/persistent_stack.py``) streams every weight through one ring of ``STACK_TILE`` x
``STACK_TILE`` fp16 tiles in shared memory: per hidden chunk of 64 units, the W1 tiles (and W3's for a gated
stack) along the channels, then the W2 tiles along the channels. The packed weights pad the channels to
``channels_tile`` and each block's hidden to a whole number of chunks, so every tile is whole.

Four forms:
- ``rows``: CTA b owns row tiles b, b + grid, ...; it carries a tile through every block with the fp32 stream
  of the tile in shared memory (tile_rows x channels_tile), so the stream never leaves the SM between blocks.
  Needs no grid-wide synchronization (rows are independent). Every CTA streams every weight through its one SM,
  which makes it slower than the per-block chain at every row count measured on the H200 (256 to 4096): it is
  forced only (tests, sweeps, a forced form's calls past its rows), and refused where the weights do not fit the L2.
  Unforced, past the mma form's rows (``mma_rows_most``) the per-block chain serves every stack.
- ``grid``: planned only at the mma form's rows where its tile does not fit (to ``MMA_PLANNED_ROWS`` for a gated
  stack); one CTA per row tile streaming every weight would leave most SMs idle: the fewest row tiles that fit
  (16, 32 or 64 rows), each block's
  hidden chunks spread over ``grid // row tiles`` CTAs per row tile,
  each adding its partial W2 product into the next stream buffer in global memory with fp32 atomic adds,
  and a grid-wide barrier between blocks (every CTA resident: grid <= SMs). The weights are still
  streamed once per row tile, now by all SMs together; the next block's first tiles load during the barrier.
- ``gemv``: planned at one or two rows (``GEMV_PLANNED_ROWS``), forced up to ``GEMV_ROWS``; each block as two
  matrix-vector phases spread over every SM, a grid barrier after each: the hidden units (W1 [and W3] rows, a warp
  each) into an fp32 workspace, then the output channels (a warp per channel and K slice of W2's row, fp32 atomic
  adds into the next stream buffer). CUDA cores, each warp's weights streamed through its own ring of cp.async
  stages in shared memory: each weight is read once a call by one warp, so at one row its floor is the weights'
  bytes over the SMs' load rate plus 2 barriers a block (measured well above it: ``reports/h100/stack-forms/``,
  ``reports/h100/grid-barrier/``).
- ``mma``: planned from 3 to 16 rows (``MMA_PLANNED_ROWS``; to 32 for a stack whose weights fit the L2,
  ``MMA_RESIDENT_ROWS``), forced up to ``MMA_ROWS``; the gemv form's phases with
  a warp's item an ``mma.sync`` tile (the rows x 16 hidden units, then x 16 output channels), so that each hidden
  value serves 16 channels where the gemv form reads every row's hidden values once a channel.
"""

from __future__ import annotations

import dataclasses

from .common import DeviceSpec, Refusal, ceil_div, round_up

STACK_ENGINE = "persistent-stack"
STACK_FORMS = ("rows", "grid", "gemv", "mma")
MATRIX_VECTOR_FORMS = ("gemv", "mma")  # two phases a block over every SM, a warp an item (``persistent_stack_gemv``)
STACK_TILE = 64
"""Rows and columns of a weight tile in the ring (and the hidden chunk: hidden units per GEMM1 -> GEMM2 step)."""
STACK_ROW_TILES = (16, 32, 64)
"""Rows of a tile: 16 per warp row of the (warps_m x 4) mma.sync layout; 128 threads per 16 rows."""
STACK_STAGES = (2, 3, 4, 6, 8)
"""Weight tiles in the ring: one is computed on while the others load (cp.async, one commit group each)."""
DECODE_ROWS = 64
"""Decode row counts: with a forced tile and no forced form, rows up to this take the grid form and past it the
rows form."""
THREADS_PER_16_ROWS = 128
GEMV_ROW_TILES = (1, 2, 4, 8, 16)
"""Rows the gemv form computes at once (compile-time: a lane's accumulators, one per row and output)."""
GEMV_ROWS = 16
"""Row counts up to this run the gemv form when it is forced."""
GEMV_PLANNED_ROWS = 2
"""Row counts up to this take the gemv form unforced: on an H100 with the one-word grid barrier
(``reports/h100/grid-barrier/``) it beat the grid form at 1 and 2 rows on every report model, at 4 on all but the
1B-sized stack, and tied or lost from 8 rows (at 16 on every one)."""
GEMV_THREADS = 256
MMA_ROW_TILES = (16, 32, 64)
"""Rows the mma form computes at once: the M of a warp's ``mma.sync`` tile."""
MMA_TILE_UNITS = 16
"""Hidden units (phase A) or output channels (phase B) of an mma form item: the N of a warp's tile."""
MMA_ROWS = 64
"""Row counts up to this run the mma form when it is forced (a tile after another past its tile)."""
MMA_PLANNED_ROWS = 16
"""Row counts past ``GEMV_PLANNED_ROWS`` and up to this take the mma form unforced: on an H100
(``reports/h100/stack-mma/``) it beat the grid form at 4, 8 and 16 rows on every report model and the gemv form
from 8 rows; at 64 rows the grid form beat it where both ran, and 17-63 rows are not measured."""
MMA_RESIDENT_ROWS = 32
"""Row counts past ``MMA_PLANNED_ROWS`` and up to this take the mma form unforced for a stack whose packed weights
fit the L2 (``packed_weight_bytes``). On an H100 (``reports/h100/phase-b-split/``, with 0.26.0's phase B) at 24 and
32 rows it beat the grid form on both plain report models and the per-block chain on the 2-block SwiGLU model (35 MB
of weights), and lost to the grid form at 64 rows on the 4-block model and to the chain from 40 rows on the SwiGLU
one; on the 1B-sized stack (400 MB) it lost to the chain from 24 rows. Past the mma form's rows every stack runs
the per-block chain (``mma_rows_most``): on the H200, with 0.27.0's hidden split over up to 8 CTAs in the chain, the
chain beat the grid form by 1.4-1.8x at 48 and 64 rows on both plain report models and the mma form there by
1.2-2.5x (``reports/h200/models/``, the forms at decode rows); the grid form had lost to it on both gated report
models at 32 and 64 rows before (``reports/h100/large-rows/``), and the rows form, forced, was 3-23x slower than
the chain at 256-4096 rows on every report model."""
MMA_SPLIT_MOST = 8
"""Warps of a CTA that may share one phase A unit tile of the mma form, each taking every split-th 64-column chunk
(all 8: their sums meet in the CTA's shared memory)."""
GEMV_STAGE_VECTORS = 8
"""16-byte weight vectors a lane copies into one stage of its warp's ring (a stage: 4 KB a warp)."""
GEMV_RING_STAGES = 4
"""Stages of each warp's cp.async ring in the gemv form, at most (fewer, down to 2, where a wide operand tile leaves
too little shared memory): while a warp computes on one stage the next three are in flight, 12 KB a warp and 96 KB
an SM, several times what the memory's latency times its bandwidth asks of an SM (the loads straight into
registers before it kept at most one batch, 4 KB a warp, in flight, none during the products)."""
GEMV_STAGE_BYTES = GEMV_THREADS * GEMV_STAGE_VECTORS * 16
"""One ring stage of every warp of a CTA."""
TILE_ROW_CHOICES = tuple(sorted({*STACK_ROW_TILES, *GEMV_ROW_TILES}))
ALIGN = 1024  # each shared-memory buffer starts on a 1 KB boundary (the swizzle atom's period)


def stack_threads(form: str, tile_rows: int) -> int:
    """A CTA's threads: 8 warps in the gemv and mma forms, else 4 warps per 16 rows of the mma layout."""
    return GEMV_THREADS if form in MATRIX_VECTOR_FORMS else tile_rows // 16 * THREADS_PER_16_ROWS


@dataclasses.dataclass(frozen=True)
class StackPlan:
    """What the fused stack runs: the form, the tile, the CTAs, the shared memory, and why this plan."""

    form: str
    rows: int
    channels: int
    channels_tile: int
    tile_rows: int
    stages: int
    gated: bool
    grid: int
    chunks: tuple[int, ...]  # hidden chunks of each block (hidden padded to STACK_TILE)
    smem_bytes: int
    why: str
    forced: bool = False  # form or tile asked for (``plan_stack(form=..., tile_rows=...)``): ``call_plan`` keeps it
    split: int = 1  # the mma form: warps of a CTA that share a phase A unit tile's chunks (``mma_split``)

    @property
    def threads(self) -> int:
        return stack_threads(self.form, self.tile_rows)

    @property
    def num_tiles(self) -> int:
        return ceil_div(self.rows, self.tile_rows)

    @property
    def ctas_per_tile(self) -> int:
        """CTAs sharing one row tile's hidden chunks (grid form; 1 in the rows form)."""
        return self.grid // self.num_tiles if self.form == "grid" else 1

    def describe(self) -> dict:
        out = dataclasses.asdict(self)
        out.update(engine=STACK_ENGINE, threads=self.threads, num_tiles=self.num_tiles,
                   ctas_per_tile=self.ctas_per_tile)
        return out

    def summary(self) -> str:
        """One line for ``print(model.plan())``."""
        split = f", {self.ctas_per_tile} CTAs per row tile" if self.form == "grid" else ""
        if self.split > 1:
            split = f", {self.split} warps per phase A unit tile"
        return (f"{STACK_ENGINE} {self.form} form: {self.tile_rows}-row tiles x {self.channels_tile} channels, "
                f"grid {self.grid}{split}, {self.stages} weight tiles in flight, {self.smem_bytes} B shared memory")


def stack_smem_bytes(form: str, tile_rows: int, channels_tile: int, stages: int, split: int = 1) -> int:
    """Shared memory of one CTA: the fp16 operand tile, the weight ring, the fp16 hidden chunk and, in the rows
    form, the fp32 stream tile; each buffer aligned to ``ALIGN`` (the gemv form: the operand tile and each warp's
    ring of ``stages`` stages, and a float a warp for a row's sums over its warps; the mma form with ``split`` > 1:
    each warp's fp32 partial sums of a unit tile, for W1 and W3)."""
    if form == "gemv":
        stats = 4 * (GEMV_THREADS // 32)
        return round_up(tile_rows * channels_tile * 2, ALIGN) + stages * GEMV_STAGE_BYTES + stats
    if form == "mma":  # the operand tile (or, in phase B, each warp's staged hidden chunk), and the ring
        operand = max(tile_rows * channels_tile, mma_staging_elements(tile_rows)) * 2
        partials = GEMV_THREADS // 32 * tile_rows * MMA_TILE_UNITS * 2 * 4 if split > 1 else 0
        return round_up(operand, ALIGN) + stages * GEMV_STAGE_BYTES + partials
    buffers = [tile_rows * channels_tile * 2, stages * STACK_TILE * STACK_TILE * 2, tile_rows * STACK_TILE * 2]
    if form == "rows":
        buffers.append(tile_rows * channels_tile * 4)
    return sum(round_up(b, ALIGN) for b in buffers)


def mma_staging_elements(tile_rows: int) -> int:
    """fp16 elements of the mma form's phase B staging: a slice's two (tile_rows x 64) hidden chunks for each
    warp."""
    return GEMV_THREADS // 32 * tile_rows * 2 * STACK_TILE


def mma_split(chunks, channels_tile: int, device: DeviceSpec) -> int:
    """Warps of a CTA that share each phase A unit tile of the mma form: the most (a power of two up to
    ``MMA_SPLIT_MOST`` and the tile's 64-column chunks) that leave every unit tile of the widest block its own
    warps in one round. A warp had taken a whole unit tile, so at 16 rows most warps idled through phase A (16
    hidden units a tile: 64 tiles a block of 1024 units against 1056 warps on 132 SMs; the trace's median CTA had
    no phase A work at all)."""
    tiles = max(chunks) * STACK_TILE // MMA_TILE_UNITS
    most = min(MMA_SPLIT_MOST, channels_tile // STACK_TILE)
    warps = device.sm_count * (GEMV_THREADS // 32)
    split = 1
    while split * 2 <= most and tiles * split * 2 <= warps:
        split *= 2
    return split


def _fits(form: str, tile_rows: int, channels_tile: int, stages: int, device: DeviceSpec, split: int = 1) -> bool:
    need = stack_smem_bytes(form, tile_rows, channels_tile, stages, split)
    return need <= device.smem_per_block and need + device.reserved_smem_per_block <= device.smem_per_sm


def _most_stages(form: str, tile_rows: int, channels_tile: int, device: DeviceSpec, limit: int) -> int | None:
    fitting = [s for s in STACK_STAGES if s <= limit and _fits(form, tile_rows, channels_tile, s, device)]
    return max(fitting) if fitting else None


def stack_refusal(blocks, rows: int, *, target: str = "cuda", input_dtype: str = "float16") -> str | None:
    """Why the stack's form cannot be fused at all (independent of the tile), or None."""
    reasons = []
    if target != "cuda":
        reasons.append(f"the fused kernel needs a CUDA device; this program targets {target!r}")
    if input_dtype != "float16":
        reasons.append(f"the fused kernel reads an fp16 input, not {input_dtype}")
    if len({b.gated for b in blocks}) > 1:
        reasons.append("gated and plain blocks are mixed (the fused kernel compiles one tile sequence: "
                       "W1[, W3], W2 per chunk, the same for every block)")
    if len({b.channels for b in blocks}) > 1:
        reasons.append("the stream changes width between blocks")
    return "; ".join(reasons) or None


def plan_stack(blocks, rows: int, device: DeviceSpec, *, target: str = "cuda", input_dtype: str = "float16",
               form: str | None = None, tile_rows: int | None = None) -> StackPlan | Refusal:
    """The fused plan of a stack (``blocks``: the IR blocks) for ``rows`` rows, or why there is none. ``form`` and
    ``tile_rows`` force a choice (tests, sweeps); a forced choice that cannot run is refused, not replaced."""
    if form is not None and form not in STACK_FORMS:
        raise ValueError(f"form must be one of {STACK_FORMS} or None, got {form!r}")
    if tile_rows is not None and tile_rows not in TILE_ROW_CHOICES:
        raise ValueError(f"tile_rows must be one of {TILE_ROW_CHOICES} or None, got {tile_rows!r}")
    reason = stack_refusal(blocks, rows, target=target, input_dtype=input_dtype)
    if reason is not None:
        return Refusal(STACK_ENGINE, reason)
    got = _choose(blocks, rows, device, form, tile_rows)
    forced = form is not None or tile_rows is not None
    return dataclasses.replace(got, forced=True) if forced and isinstance(got, StackPlan) else got


def _choose(blocks, rows: int, device: DeviceSpec, form: str | None, tile_rows: int | None) -> StackPlan | Refusal:
    channels = blocks[0].channels
    cols = round_up(channels, STACK_TILE)
    chunks = tuple(ceil_div(b.hidden, STACK_TILE) for b in blocks)
    gated = blocks[0].gated
    weight_bytes = sum((3 if b.gated else 2) * 2 * b.channels * b.hidden for b in blocks)
    if form == "gemv":
        return _gemv_plan(rows, channels, cols, chunks, gated, device, tile_rows)
    if form == "mma":
        return _mma_plan(rows, channels, cols, chunks, gated, device, tile_rows)
    if form is None and tile_rows is None:
        return _planned(rows, channels, cols, chunks, gated, device)
    if form == "grid" or form is None and rows <= DECODE_ROWS:
        got = _grid_plan(rows, channels, cols, chunks, gated, device, tile_rows)
        if form == "grid" or isinstance(got, StackPlan):
            return got
        rows_form = _rows_plan(rows, channels, cols, chunks, gated, device, tile_rows, weight_bytes)
        if isinstance(rows_form, StackPlan):  # the grid form's reason, then the rows form's own
            return dataclasses.replace(rows_form, why=f"{got.reason}; {rows_form.why}")
        return Refusal(STACK_ENGINE, f"{got.reason}; {rows_form.reason}")
    return _rows_plan(rows, channels, cols, chunks, gated, device, tile_rows, weight_bytes)


def _planned(rows, channels, cols, chunks, gated, device) -> StackPlan | Refusal:
    """The unforced choice: the gemv or mma form at their planned rows (``mma_rows_most``); at those rows where
    neither fits, the grid form (for a gated stack up to ``MMA_PLANNED_ROWS``); else the refusal that leaves the
    per-block chain to serve (the rows form is never planned: it is forced for tests and sweeps only)."""
    weight_bytes = packed_weight_bytes(cols, chunks, gated)
    got = _matrix_vector_plan(rows, channels, cols, chunks, gated, device, weight_bytes)
    if got is not None:
        return got
    most = mma_rows_most(weight_bytes, device)
    if rows > most:
        return Refusal(STACK_ENGINE, f"{rows} rows{' of a gated stack' if gated else ''}, past the {most} a fused "
                                     "form takes unforced: the per-block chain was faster there")
    if gated and rows > MMA_PLANNED_ROWS:  # the mma form's rows, where its tile does not fit: the grid form lost
        return Refusal(STACK_ENGINE, f"{rows} rows of a gated stack: the mma form does not fit, and the grid form "
                                     "was slower than the per-block chain there")
    return _grid_plan(rows, channels, cols, chunks, gated, device, None)


def packed_weight_bytes(channels_tile: int, chunks, gated: bool) -> int:
    """fp16 bytes of a stack's packed weights (W1, W3 where gated, W2; channels and hidden padded to tiles)."""
    return sum((3 if gated else 2) * 2 * channels_tile * c * STACK_TILE for c in chunks)


def mma_rows_most(weight_bytes: int, device: DeviceSpec) -> int:
    """The most rows the mma form takes unforced, and so the most planning fuses a stack at (past them the per-block
    chain serves): ``MMA_RESIDENT_ROWS`` where the packed weights fit the L2, else ``MMA_PLANNED_ROWS``."""
    return MMA_RESIDENT_ROWS if weight_bytes <= device.l2_bytes else MMA_PLANNED_ROWS


STREAM_BALANCE_ROWS = 48
"""Row-tile height at which one 64 x 64 weight tile's mma.sync products take about as long as streaming the tile
from L2 into one SM (an estimate from the H200's L2 and tensor-core rates per SM, not measured: the first GPU
session's sweep of forced tiles should set it)."""


def rows_cost(rows: int, tile_rows: int, device: DeviceSpec) -> float:
    """The rows form's time in units of one stream of the stack's weights into one SM: waves of row tiles over
    the SMs, each tile streaming every weight, a tile over ``STREAM_BALANCE_ROWS`` rows bound by its products."""
    waves = ceil_div(ceil_div(rows, tile_rows), device.sm_count)
    return waves * max(1.0, tile_rows / STREAM_BALANCE_ROWS)


def _rows_plan(rows, channels, cols, chunks, gated, device, tile_rows, weight_bytes=0) -> StackPlan | Refusal:
    """The cheapest row tile by ``rows_cost`` (the largest on ties: less weight traffic through L2), then the
    deepest ring that fits (up to 4 tiles)."""
    if weight_bytes > device.l2_bytes:
        return Refusal(STACK_ENGINE, f"rows form: every row tile streams all {weight_bytes / 2**20:.0f} MiB of "
                                     f"weights, which do not fit the {device.l2_bytes / 2**20:.0f} MiB L2: each tile "
                                     "would read them from memory again")
    options = [t for t in STACK_ROW_TILES if (tile_rows is None or t == tile_rows)
               and _most_stages("rows", t, cols, device, 4) is not None]
    if not options:
        need = stack_smem_bytes("rows", tile_rows or STACK_ROW_TILES[0], cols, STACK_STAGES[0])
        return Refusal(STACK_ENGINE, f"rows form: the fp32 stream tile, the operand and two weight tiles need "
                                     f"{need} B of shared memory at {cols} channels; a CTA has {device.smem_per_block}")
    tile = min(options, key=lambda t: (rows_cost(rows, t, device), -t))
    waves = ceil_div(ceil_div(rows, tile), device.sm_count)
    why = "forced tile" if tile_rows is not None else f"{waves} wave(s) of {tile}-row tiles, the cheapest by rows_cost"
    stages = _most_stages("rows", tile, cols, device, 4)
    grid = min(ceil_div(rows, tile), device.sm_count)
    return StackPlan("rows", rows, channels, cols, tile, stages, gated, grid, chunks,
                     stack_smem_bytes("rows", tile, cols, stages), f"rows form ({why}): the stream stays in shared "
                     "memory through every block, no grid barrier")


def _grid_plan(rows, channels, cols, chunks, gated, device, tile_rows) -> StackPlan | Refusal:
    """The fewest row tiles whose operand tile and a ring of two weight tiles fit (each row tile's CTAs stream
    every weight once, and a decode tile's products cost little), the smallest such tile; as many CTAs per row
    tile as fit on the SMs (one CTA an SM, all resident for the grid barrier) and have a chunk of the widest
    block; and the deepest ring that fits (up to 8 tiles). Any rows whose tiles leave 2 CTAs a tile or more
    (planning caps the rows it plans the form at: ``_planned``; forced, it times the form anywhere)."""
    options = [t for t in STACK_ROW_TILES if (tile_rows is None or t == tile_rows)
               and _most_stages("grid", t, cols, device, 8) is not None]
    if not options:
        return Refusal(STACK_ENGINE, f"grid form: the operand tile and two weight tiles need "
                                     f"{stack_smem_bytes('grid', tile_rows or 16, cols, 2)} B of shared memory at "
                                     f"{cols} channels")
    tile = min(options, key=lambda t: (ceil_div(rows, t), t))
    stages = _most_stages("grid", tile, cols, device, 8)
    tiles = ceil_div(rows, tile)
    per_tile = min(device.sm_count // tiles, max(chunks))
    if per_tile < 2:
        return Refusal(STACK_ENGINE, f"grid form: {tiles} row tiles leave fewer than 2 CTAs a tile on "
                                     f"{device.sm_count} SMs")
    return StackPlan("grid", rows, channels, cols, tile, stages, gated, tiles * per_tile, chunks,
                     stack_smem_bytes("grid", tile, cols, stages),
                     f"grid form (planned where the mma form does not fit at its rows): {per_tile} CTAs share each row "
                     "tile's hidden chunks, so every SM streams weights; partial sums by fp32 atomics, a grid "
                     "barrier between blocks")


def _gemv_plan(rows, channels, cols, chunks, gated, device, tile_rows) -> StackPlan | Refusal:
    """The gemv form's plan (``_warp_item_plan``); past ``GEMV_ROWS`` rows a call of the plan runs the rows form."""
    return _warp_item_plan(
        "gemv", GEMV_ROW_TILES, GEMV_ROWS, rows, channels, cols, chunks, gated, device, tile_rows,
        lambda tile: f"gemv form (planned at rows <= {GEMV_PLANNED_ROWS}, forced up to {GEMV_ROWS}): each block as "
                     f"two matrix-vector phases over all {device.sm_count} SMs, a warp per hidden unit then per "
                     "output channel slice, 2 grid barriers a block")


def _warp_item_plan(form, tiles, most, rows, channels, cols, chunks, gated, device, tile_rows,
                    why) -> StackPlan | Refusal:
    """A form of 8-warp CTAs on every SM (``MATRIX_VECTOR_FORMS``): the smallest of its row ``tiles`` that holds
    the rows (a forced one must be one of them; past the largest, a tile after another) with a ring of two stages or
    more, as many as fit up to ``GEMV_RING_STAGES``; refused past ``most`` rows. ``why(tile)``: the plan's reason."""
    if rows > most:
        return Refusal(STACK_ENGINE, f"{form} form: {rows} rows is past the {most} it takes")
    options = [t for t in tiles if (tile_rows is None and t >= min(rows, max(tiles)) or t == tile_rows)
               and _most_stages(form, t, cols, device, GEMV_RING_STAGES) is not None]
    if not options:
        return Refusal(STACK_ENGINE, f"{form} form: no row tile of {tiles} fits "
                                     f"{'the forced ' + str(tile_rows) if tile_rows else str(rows) + ' rows'} at "
                                     f"{cols} channels with a ring of two stages")
    tile = min(options)
    stages = _most_stages(form, tile, cols, device, GEMV_RING_STAGES)
    split = mma_split(chunks, cols, device) if form == "mma" else 1
    if not _fits(form, tile, cols, stages, device, split):  # the partial sums would cost a ring stage: none
        split = 1
    return StackPlan(form, rows, channels, cols, tile, stages, gated, device.sm_count, chunks,
                     stack_smem_bytes(form, tile, cols, stages, split), why(tile), split=split)


def _matrix_vector_plan(rows, channels, cols, chunks, gated, device, weight_bytes: int) -> StackPlan | None:
    """The form planned unforced at decode rows, where it fits: the gemv form up to ``GEMV_PLANNED_ROWS``, the mma
    form up to ``mma_rows_most``; None past them."""
    if rows <= GEMV_PLANNED_ROWS:
        got = _gemv_plan(rows, channels, cols, chunks, gated, device, None)
        if isinstance(got, StackPlan):
            return got
    if rows <= mma_rows_most(weight_bytes, device):
        got = _mma_plan(rows, channels, cols, chunks, gated, device, None)
        if isinstance(got, StackPlan):
            return got
    return None


def _mma_plan(rows, channels, cols, chunks, gated, device, tile_rows) -> StackPlan | Refusal:
    """The mma form's plan (``_warp_item_plan``); a call past ``MMA_ROWS`` rows runs what ``call_plan`` says."""
    return _warp_item_plan(
        "mma", MMA_ROW_TILES, MMA_ROWS, rows, channels, cols, chunks, gated, device, tile_rows,
        lambda tile: f"mma form (planned at {GEMV_PLANNED_ROWS + 1}-{MMA_PLANNED_ROWS} rows, to {MMA_RESIDENT_ROWS} "
                     f"where the weights fit the L2, forced up to {MMA_ROWS}): the gemv form's two phases a block "
                     f"over all {device.sm_count} SMs, a warp an mma.sync tile of {tile} rows x {MMA_TILE_UNITS} "
                     f"hidden units, then of {MMA_TILE_UNITS} output channels, 2 grid barriers a block")


def call_plan(plan: StackPlan, rows: int, device: DeviceSpec) -> StackPlan | None:
    """The plan a call of ``rows`` rows runs with ``plan``'s packing (the forms share it), or None where no fused
    form takes the rows (the caller runs the per-block chain). A planned (unforced) plan: what planning chooses
    at the call's rows (``_planned``), the plan itself where that is its own form and its tile holds the rows (a
    planned form keeps its tile for the rows it holds; past them the tile that holds them), None where planning
    refuses. A forced plan: itself while its form serves the rows; a forced gemv or mma form past ``GEMV_ROWS`` or
    ``MMA_ROWS``, or a grid form with more row tiles than SMs (its barrier needs every CTA resident), the rows
    form (itself where none fits, for the gemv and mma forms)."""
    if not plan.forced:
        got = _planned(rows, plan.channels, plan.channels_tile, plan.chunks, plan.gated, device)
        if not isinstance(got, StackPlan):
            return None
        keep = plan.form in MATRIX_VECTOR_FORMS and got.form == plan.form and rows <= plan.tile_rows
        return plan if keep else got
    if plan.form in MATRIX_VECTOR_FORMS and rows > (GEMV_ROWS if plan.form == "gemv" else MMA_ROWS):
        return rows_form_of(plan, rows, device) or plan
    if plan.form == "grid" and ceil_div(rows, plan.tile_rows) > device.sm_count:
        return rows_form_of(plan, rows, device)
    return plan


def planned_rows_most(plan: StackPlan, device: DeviceSpec) -> int | None:
    """The most rows a call of a planned (unforced) ``plan`` can run fused on ``device`` (``call_plan``: past them,
    the per-block chain); None for a forced plan, whose calls stay fused."""
    if plan.forced:
        return None
    return mma_rows_most(packed_weight_bytes(plan.channels_tile, plan.chunks, plan.gated), device)


def rows_form_of(plan: StackPlan, rows: int, device: DeviceSpec) -> StackPlan | None:
    """The rows-form plan with ``plan``'s packing (channels tile, chunks, gating) for a call of ``rows`` rows that
    the grid form cannot take (more row tiles than SMs: the grid barrier needs every CTA resident), or None where
    no rows form fits."""
    got = _rows_plan(rows, plan.channels, plan.channels_tile, plan.chunks, plan.gated, device, None)
    return got if isinstance(got, StackPlan) else None
