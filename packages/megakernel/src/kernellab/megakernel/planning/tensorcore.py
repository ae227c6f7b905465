"""Planning numbers of the tensor-core engines (persistent-tc in its shared-memory and register forms,
conventional-tc): tiles, layouts, instructions, weight loads, chunk schedules and their shared memory."""

from __future__ import annotations

import dataclasses

from .common import H200, DeviceSpec, Tile, ceil_div, occupancy, round_up, usable_smem

TC_THREADS = 256
TC_HIDDEN_CHUNK = 64
TC_MAX_STAGES = 4  # W1 / W2 chunk buffers each at most: 7 cp.async groups in flight behind the one awaited
TC_CHANNEL_TILES = (64, 128, 256, 512)
"""persistent-tc keeps the fp32 output tile (tile rows x channel tile) in registers: 64 x 512 over
256 threads is 128 registers each, the most that leaves room for the rest (with mma.sync the sm_90a
cubin of CuTe DSL 4.8.1 has 255 registers and a 56-byte stack frame: a few spills)."""
TC_ROW_TILES = (32, 64)
TC_MMAS = ("mma.sync", "wgmma")
TC_SPLITS = (1, 2, 4, 8)
"""persistent-tc's hidden split: with S, a cluster of S CTAs owns each row tile, CTA r runs hidden chunks
r, r + S, ... and the S partial output tiles are summed through distributed shared memory, so each CTA
streams 1/S of the weights of a tile. It puts SMs to work that whole tiles would leave idle, or lets a 64-row
tile (half the weight traffic per row) run on as many SMs as 32-row tiles would; ``tc_layout`` decides (8 is
the largest portable cluster)."""
TC_WIDE_SPLIT_SHARE = 3 / 4
"""Where the device's count of clusters at once is unknown (``DeviceSpec.clusters_at_once``: planning without a
GPU), the share of the SMs a split of 4 or 8 may fill (its tiles times its CTAs). On the H100's sweeps
(``reports/h100/tc-split/``) the wide splits were fastest at 1-13 tiles of 32 rows (the CTAs stream a tile's
weights side by side), a split of 4 at 20 and 24 tiles of 32 rows (80 and 96 CTAs) and at 16 and 24 tiles of 64
rows (64 and 96 CTAs, where a 64-row tile halves the weight traffic of two 32-row ones); at 128 CTAs a split of 4
lost to a split of 2 at channel tiles of 256, and 8 lost wherever its CTAs outnumbered the SMs. The clusters the
H100 runs at once (``cluster-occupancy-f531dd4.json`` there: 30 of 4, 15 of 8) explain those losses as a second
wave of clusters, and the two wins past the share (896 rows: 14 clusters of 8, 28 of 4), so where the device's
count is known it is the rule (``wide_split_fits``)."""
TC_MULTICASTS = (1, 2, 4)
"""persistent-tc's weight multicast (wgmma form only): with m, a cluster of m CTAs owning different row
tiles loads each weight chunk once by TMA, each CTA 1/m of it sent to all, so L2 serves every chunk once
per cluster instead of once per CTA. Measured on the H200 (``reports/h200/sweeps/megakernel-sweep-tma.json``) it
lost to plain TMA loads at every swept shape (2: 0-12% slower; 4: up to twice as slow), since a cluster's
CTAs wait for each other's share of every chunk: only ``forced(..., multicast=m)`` takes it."""
TC_LOADS = ("cp.async", "tma")
"""How persistent-tc's weight chunks reach shared memory: cp.async, 16 bytes a thread with every thread
issuing, or TMA, one thread issuing a chunk and mbarrier pipelines tracking it (the wgmma form with
16-byte rows only; a multicast needs it). ``tc_loads`` gives 64-row wgmma tiles TMA: on the H200 it beat
cp.async by 4-12% at every unsplit swept shape and tied with a split
(``reports/h200/sweeps/megakernel-sweep-tma.json``)."""
TC_WEIGHT_ROWS = 16
"""``tc_cost``'s price of a tile's weight traffic, in rows of MMA work per chunk: a 32-row tile costs
(32 + 16) per chunk, a 64-row tile (64 + 16), so at equal work per SM the 64-row tile wins by 1.2x, as
mma.sync's 64-row tiles did over its 32-row ones at 8448x512x512 on the H200 (60.6 against 72.5 us)."""
WGMMA_ROW_TILES = (64, 128)
"""persistent-tc's wgmma form (sm_90a): 64 rows split across the two warpgroups by columns, or 128 by
rows (64 each; an instruction is at most 256 columns wide, so up to 256 channels). Planning takes the
64-row form where ``tc_mma`` says; the 128-row one only through ``forced``."""

REGISTER_FORM_ROWS = 16  # rows of one m16n8k16 MMA: a register-form CTA's row tile
REGISTER_FORM_THREADS = 32  # one warp per CTA
REGISTER_FORM_PAD = 16  # channels and hidden padded to the MMA's K
REGISTER_FORM_MAX = (64, 128, 2048)
"""persistent-tc's register form (``engines/persistent_tc_registers.py``): channels and hidden, padded to 16, of
at most 64 and 128 and at most 2048 elements per weight, so that a one-warp CTA holds W1 and W2 as MMA fragments
(2 x 2048 / 32 fp16: 64 registers a thread) beside the accumulators, biases and x fragments, and the hidden
never leaves registers."""
REGISTER_FORM_OCCUPANCY = 8  # CTAs per SM: up to 255 registers x 32 threads each in an SM's 64K

CONVENTIONAL_TC_TILE = (128, 64, 32)  # (rows, columns, K) per CTA
CONVENTIONAL_TC_THREADS = 128
CONVENTIONAL_TC_STAGES = 3

VECTOR_ELEMENTS = 8
"""fp16 elements in one 16-byte cp.async: conventional-tc needs channels and hidden multiples of it;
persistent-tc loads other shapes element by element."""


def channel_tile(channels: int) -> int | None:
    """persistent-tc's padded channel count, or None above the largest tile."""
    for size in TC_CHANNEL_TILES:
        if channels <= size:
            return size
    return None


def tc_chunks_per_cta(hidden: int, split: int = 1) -> int:
    """The most hidden chunks one persistent-tc CTA runs per tile (a hidden split's CTA r runs r, r + split, ...)."""
    return ceil_div(ceil_div(hidden, TC_HIDDEN_CHUNK), split)


def tc_cost(rows_per_tile: int, num_tiles: int, hidden: int, split: int, device: DeviceSpec) -> int:
    """The work of a persistent-tc layout on its busiest SM: its share of the CTAs (ceil(CTAs / SMs), every
    tile's CTAs spread evenly) times each CTA's hidden chunks times the rows of MMA work and weight traffic
    one chunk of a tile costs (``TC_WEIGHT_ROWS``)."""
    ctas_per_sm = ceil_div(num_tiles * split, device.sm_count)
    return ctas_per_sm * tc_chunks_per_cta(hidden, split) * (rows_per_tile + TC_WEIGHT_ROWS)


def tc_split_fits(tile_rows: int, channels_tile: int, split: int) -> bool:
    """Whether a thread's output fragment (tile rows x channel tile over ``TC_THREADS``) deals out whole pairs
    of neighbouring columns evenly to ``split`` CTAs (``tensorcore.split_owner``)."""
    return tile_rows * channels_tile // TC_THREADS % (2 * split) == 0


def wide_split_fits(num_tiles: int, split: int, device: DeviceSpec) -> bool:
    """Whether planning may split each of ``num_tiles`` tiles over 4 or 8 CTAs (a cluster a tile): where the GPU runs
    every cluster at once (``DeviceSpec.clusters_held``; past it the last clusters wait for a second wave), or,
    where that count is unknown, where the clusters fill at most ``TC_WIDE_SPLIT_SHARE`` of the SMs."""
    held = device.clusters_held(split)
    if held is not None:
        return num_tiles <= held
    return num_tiles * split <= TC_WIDE_SPLIT_SHARE * device.sm_count


def tc_layout(rows: int, channels_tile: int, hidden: int, may_split: bool, device: DeviceSpec) -> tuple[int, int]:
    """persistent-tc's (rows per tile, hidden split): the cheapest by ``tc_cost``; on ties the larger tile
    (less weight traffic), then the smaller split (less exchange). A split needs ``may_split`` (16-byte rows,
    and no choice forced), at least two hidden chunks per CTA, fragments it deals out evenly
    (``tc_split_fits``) and the peers' partial output tiles in shared memory; one of 4 or 8 CTAs also
    ``wide_split_fits``."""
    chunks = ceil_div(hidden, TC_HIDDEN_CHUNK)
    candidates = []
    for rows_per_tile in TC_ROW_TILES:
        num_tiles = ceil_div(rows, rows_per_tile)
        for split in TC_SPLITS:
            if split > 1 and not (may_split and chunks >= 2 * split
                                  and (split <= 2 or wide_split_fits(num_tiles, split, device))
                                  and tc_split_fits(rows_per_tile, channels_tile, split)
                                  and persistent_tc_smem_bytes(rows_per_tile, channels_tile, 1, split)
                                  <= usable_smem(device)):
                continue
            cost = tc_cost(rows_per_tile, num_tiles, hidden, split, device)
            candidates.append((cost, -rows_per_tile, split))
    _, neg_rows, split = min(candidates)
    return -neg_rows, split


def register_groups(padded: int) -> list[tuple[int, int]]:
    """The register form's groups of a dimension padded to 16, as (first 16-block, blocks): pairs of blocks, the
    last block alone where their number is odd (device code shares this function, as the next two)."""
    blocks = padded // 16
    return [(b, min(2, blocks - b)) for b in range(0, blocks, 2)]


def register_run_start(first_block: int, blocks: int, t):
    """The first memory index of the run of ``4 * blocks`` neighbouring indices that thread t (lane % 4) holds of
    the group starting at ``first_block``."""
    return 16 * first_block + 4 * blocks * t


def register_slot(n_tile: int, s, padded: int):
    """The memory index behind slot s (0..7) of n-tile ``n_tile`` of the register form's N order (the K order too:
    slot 2t + e of k-block b is register_slot(2b + e // 8, 2t + e % 8)): element s % 2 + 2 (n_tile % 2) +
    4 (block % 2) of the run of thread s // 2 of the block's group."""
    block = n_tile // 2
    first = block - block % 2
    blocks = min(2, padded // 16 - first)
    return register_run_start(first, blocks, s // 2) + s % 2 + 2 * (n_tile % 2) + 4 * (block % 2)


REGISTER_FORM_UNALIGNED = 512
"""Padded elements per weight up to which planning takes the register form for rows that are not 16-byte aligned,
whose fragments load element by element. On the H200 (CUDA-graph throughput against the shared-memory form,
``reports/h200/sweeps/megakernel-sweep-tc-registers.json`` and ``megakernel-sweep-tc-registers-unaligned.json``) the
form took 0.42-0.90x the time at every swept shape with 16-byte rows; with unaligned rows 0.81-0.83x at 16 x 16
padded weights and 0.93-0.96x at 16 x 32, but 1.26x at 64 x 32 and 1.64x at 32 x 48 (about 150 element loads a
thread)."""


def tc_registers(channels: int, hidden: int) -> bool:
    """persistent-tc's register form where it fits (``register_form_fits``), with 16-byte rows or small weights
    (``REGISTER_FORM_UNALIGNED``)."""
    if not register_form_fits(channels, hidden):
        return False
    padded = round_up(channels, REGISTER_FORM_PAD) * round_up(hidden, REGISTER_FORM_PAD)
    return tensor_core_alignment(channels, hidden) is None or padded <= REGISTER_FORM_UNALIGNED


def tc_mma(rows_per_tile: int, channels_tile: int, misaligned: bool) -> str:
    """persistent-tc's instruction: wgmma for 64-row tiles, mma.sync for 32-row ones (wgmma's smallest
    instruction has 64 rows). At 64 x 512 mma.sync's 128 fp32 accumulators a thread spill (the wgmma form
    compiles to 242 registers and no stack), and at 64 rows wgmma measured faster at every channel tile,
    64 to 512, split or not (``tools/device/megakernel_sweep.py``, its H200 runs in ``reports/h200/``).
    Unaligned rows load element by element: mma.sync."""
    if not misaligned and rows_per_tile == WGMMA_ROW_TILES[0]:
        return "wgmma"
    return "mma.sync"


def tc_loads(rows_per_tile: int, mma: str) -> str:
    """persistent-tc's weight loads: TMA for the 64-row wgmma form (measured: ``TC_LOADS``), else cp.async
    (mma.sync's buffers are swizzled in elements, which TMA fills only an 8-row atom a copy)."""
    return "tma" if mma == "wgmma" and rows_per_tile == WGMMA_ROW_TILES[0] else "cp.async"


TC_OVERLAP_CHANNELS = 512
"""Channel tile at which planning takes the overlapped chunk schedule (``Tile.overlap``). On the H200
(``reports/h200/sweeps/megakernel-sweep-overlap.json``) it gained 1-2% at the 512-channel tile (16384x512x2048,
8448x512x512, 16384x384x1536), where one buffer of each weight is all that fits; at 256 channels it tied
or lost (up to 7% at 8192x256x1024, where two buffers fit), since the serial schedule loads the next W2
chunk under GEMM1 and the activation, which the overlapped one runs beside GEMM2."""


def tc_overlap(tile: Tile) -> bool:
    """persistent-tc's chunk schedule: overlapped for the unsplit TMA tiles (no multicast) of
    ``TC_OVERLAP_CHANNELS`` channels; a choice forced later (``forced(..., overlap=...)``) overrides it."""
    return (tile.loads == "tma" and tile.split == 1 and tile.multicast == 1
            and tile.channels_tile == TC_OVERLAP_CHANNELS)


SPLIT_BARRIER_BYTES = 16  # one 8-byte mbarrier, 16-byte aligned
TMA_BARRIER_BYTES = 32  # per stage: a full and an empty 8-byte mbarrier for W1 and for W2


def persistent_tc_smem_bytes(tile_rows: int, channels_tile: int, stages: int = 1, split: int = 1,
                             loads: str = "cp.async", overlap: bool = False) -> int:
    """x tile + ``stages`` W1 chunks + ``stages`` W2 chunks + the hidden chunk (two with ``overlap``), all
    fp16; with a hidden split of S CTAs also the fp32 partials its S - 1 peers send of the 1/S of the output tile
    a CTA finishes, and its transaction barrier; with TMA loads the full and empty barriers of both weight
    pipelines."""
    chunk, hidden_buffers = TC_HIDDEN_CHUNK, 2 if overlap else 1
    size = 2 * (tile_rows * channels_tile + 2 * stages * chunk * channels_tile + hidden_buffers * tile_rows * chunk)
    if split > 1:
        size += 4 * tile_rows * channels_tile * (split - 1) // split + SPLIT_BARRIER_BYTES
    if loads == "tma":
        size += TMA_BARRIER_BYTES * stages
    return size


def tc_tile_smem_bytes(tile: Tile) -> int:
    """``persistent_tc_smem_bytes`` of a persistent-tc tile."""
    return persistent_tc_smem_bytes(tile.rows, tile.channels_tile, tile.stages, tile.split, tile.loads,
                                    tile.overlap)


def tc_stages(tile_rows: int, channels_tile: int, num_tiles: int, hidden: int, device: DeviceSpec,
              split: int = 1, loads: str = "cp.async", overlap: bool = False) -> int:
    """persistent-tc's chunk buffers: as many as there are hidden chunks, up to TC_MAX_STAGES, so that
    chunks' weights load while the GEMMs of the chunks before run (with as many buffers as chunks, every
    load of a tile is issued at its start: short tiles are latency chains), where that shared memory
    still lets every CTA the grid needs be resident at once (the grid asks for ceil(tiles / SMs) CTAs
    per SM, at most what one buffer allows); else fewer, down to one."""
    one = Tile("persistent-tc", tile_rows, channels_tile, TC_HIDDEN_CHUNK, TC_THREADS, num_tiles, split=split,
               loads=loads, overlap=overlap)
    needed = min(ceil_div(split * num_tiles, device.sm_count), tc_occupancy_limit(one))
    for stages in range(min(TC_MAX_STAGES, tc_chunks_per_cta(hidden, split)), 1, -1):
        size = persistent_tc_smem_bytes(tile_rows, channels_tile, stages, split, loads, overlap)
        limit = tc_occupancy_limit(dataclasses.replace(one, stages=stages))
        if size <= usable_smem(device) and occupancy(TC_THREADS, size, device, limit) >= needed:
            return stages
    return 1


def tensor_core_alignment(channels: int, hidden: int) -> str | None:
    if channels % VECTOR_ELEMENTS or hidden % VECTOR_ELEMENTS:
        return (f"conventional-tc needs channels and hidden to be multiples of {VECTOR_ELEMENTS} (16-byte rows "
                f"for cp.async); got channels={channels}, hidden={hidden}")
    return None


def register_form_fits(channels: int, hidden: int) -> bool:
    """Whether persistent-tc's register form holds these weights (``REGISTER_FORM_MAX``)."""
    c, h = round_up(channels, REGISTER_FORM_PAD), round_up(hidden, REGISTER_FORM_PAD)
    return c <= REGISTER_FORM_MAX[0] and h <= REGISTER_FORM_MAX[1] and c * h <= REGISTER_FORM_MAX[2]


def tc_occupancy_limit(tile: Tile) -> int:
    """CTAs per SM persistent-tc compiles for (``min_blocks_per_mp``): 2 when the accumulators leave
    room (at most 64 per thread keeps the kernel within 128 registers) and two CTAs' shared memory
    fits an SM of the planning default (H200); else 1 (up to 255 registers)."""
    accumulators = tile.rows * tile.channels_tile // TC_THREADS
    smem = tc_tile_smem_bytes(tile) + H200.reserved_smem_per_block
    return 2 if accumulators <= 64 and 2 * smem <= H200.smem_per_sm else 1


def with_schedule(tile: Tile, hidden: int, device: DeviceSpec, stages: int | None = None) -> Tile:
    """``tile`` with planning's chunk schedule (``tc_overlap``) for its other choices, and its chunk buffers
    planned again (``stages`` None) or kept."""
    tile = dataclasses.replace(tile, overlap=tc_overlap(tile))
    if stages is None:
        stages = tc_stages(tile.rows, tile.channels_tile, tile.num_tiles, hidden, device, tile.split, tile.loads,
                           tile.overlap)
    return dataclasses.replace(tile, stages=stages)
