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
"""

from __future__ import annotations

import dataclasses

# ---- engines and their fallback chains ----------------------------------------------------------

KERNEL_ENGINES = ("persistent-tc", "persistent", "persistent-global", "conventional-tc", "conventional")
FALLBACK_CHAINS = {
    "persistent-tc": ("persistent-tc", "persistent", "persistent-global", "conventional"),
    "persistent": ("persistent", "persistent-global", "conventional"),
    "persistent-global": ("persistent-global", "conventional"),
    "conventional-tc": ("conventional-tc", "conventional"),
    "conventional": ("conventional",),
}

# ---- fixed kernel geometry (the kernels import these) ---------------------------------------------

SCALAR_THREADS = 256
ROW_BLOCK = 4
"""Scalar kernels: a thread (or a group of lanes) computes ROW_BLOCK rows of one output column
(``engines/scalar.py``); tiles are multiples of it."""
SCALAR_OCCUPANCY = 2
"""CTAs per SM the scalar kernels compile for (``min_blocks_per_mp``: at most 128 registers a thread, room
for a thread's 4 x 8 partial sums and the loads of a K step in flight)."""

SCALAR_REGISTER_WEIGHTS_OCCUPANCY = 1
"""CTAs per SM the persistent kernels that hold their weights in registers compile for (up to 255 registers a
thread). Planning gives them 4-row tiles only up to one tile an SM, so one CTA an SM is all their grid uses. The
form compiled for two (128 registers, with the fill's slots past K skipped as well) measured slower
(``reports/h200/sweeps/megakernel-sweep-register-weights-8-occupancy2.json``)."""
SCALAR_WEIGHTS = ("smem", "global", "registers")
"""Where the persistent CUDA-core kernels read their weights from (``SharedMemory.weights``)."""
SCALAR_K_CLASSES = 8
"""Interleaved partial sums of a scalar K loop, and the most lanes that share an output (``engines/scalar.py``)."""
SCALAR_WEIGHT_REGISTERS = 8
"""Weight elements of one GEMM a lane of the persistent CUDA-core kernels holds in registers at most
(``register_weights_fit``): the sums run unrolled from registers, and unrolled code for more elements cost more
than the loads' latency it saved (H200 sweeps of forced placements: 32 lost at 8 of 10 shapes,
``reports/h200/sweeps/megakernel-sweep-register-weights-32.json``; 8 gained at 33x32x64 and 129x31x47,
``sweeps/megakernel-sweep-register-weights-8.json``)."""
SCALAR_REGISTER_WEIGHTS_MIN_STEPS = 4
"""K steps both sums need at least for the weights to be held in registers: with fewer there are few dependent
loads to take off the sums' path, and the unrolled code costs more than it saves (1x7x13, one and two steps, lost
to global memory in ``sweeps/megakernel-sweep-register-weights-8.json``; 33x32x64, four and eight steps, gained)."""

SCALAR_GLOBAL_WEIGHTS_MAX = 14 * 1024
"""Weight elements (W1 and W2) up to which a persistent CTA that reads each weight once (one tile of one row
block: up to 4 x SMs rows) reads them from global memory (through L1) instead of staging them in shared
memory first: staging costs a barrier and memory round trips that only reuse would amortize, and reading
from L1 costs more per element than from shared memory. H200 sweep of both placements at such shapes
(``reports/h200/sweeps/megakernel-sweep-weights.json``): global memory faster up to 201x61x109 (13.3K elements),
slower from 257x64x128 (16.4K) on. It holds where the weights are staged element by element (K not whole steps
of SCALAR_K_CLASSES: ``scalar_weights_whole_steps``); where they are staged by 16-byte cp.async copies, all in
flight with the first tile's row loads, staging was faster at every such shape of the sweep
(``sweeps/megakernel-sweep-staged-overlap.json``: 61x48x96, 97x40x80, 520x64x64), and a CTA stages them whatever
their count. After the row-block change the two are about even at 61x48x96 (``sweeps/megakernel-sweep-row-blocks.json``:
5.13 us staged, 5.03 from global memory): the rule is worth measuring again."""

TC_THREADS = 256
TC_HIDDEN_CHUNK = 64
TC_MAX_STAGES = 4  # W1 / W2 chunk buffers each at most: 7 cp.async groups in flight behind the one awaited
TC_CHANNEL_TILES = (64, 128, 256, 512)
"""persistent-tc keeps the fp32 output tile (tile rows x channel tile) in registers: 64 x 512 over
256 threads is 128 registers each, the most that leaves room for the rest (with mma.sync the sm_90a
cubin of CuTe DSL 4.8.1 has 255 registers and a 56-byte stack frame: a few spills)."""
TC_ROW_TILES = (32, 64)
TC_MMAS = ("mma.sync", "wgmma")
TC_SPLITS = (1, 2)
"""persistent-tc's hidden split: with 2, a cluster of two CTAs owns each row tile, CTA r runs hidden chunks
r, r + 2, ... and the two partial output tiles are summed through distributed shared memory, so each CTA
streams half the weights of a tile. It puts SMs to work that whole tiles would leave idle, or lets a 64-row
tile (half the weight traffic per row) run on as many SMs as 32-row tiles would; ``tc_layout`` decides."""
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


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """What planning needs to know of a GPU."""

    name: str
    sm_count: int
    smem_per_block: int
    smem_per_sm: int
    reserved_smem_per_block: int = 1024
    max_threads_per_sm: int = 2048

    def __post_init__(self):
        for field in ("sm_count", "smem_per_block", "smem_per_sm", "max_threads_per_sm"):
            if getattr(self, field) < 1:
                raise ValueError(f"DeviceSpec.{field} must be >= 1, got {getattr(self, field)}")


H200 = DeviceSpec(name="NVIDIA H200", sm_count=132, smem_per_block=232448, smem_per_sm=233472)
"""The planning default (also H100 SXM's numbers): 227 KB opt-in per block, 228 KB per SM."""


def current_device() -> DeviceSpec:
    """The current CUDA device's numbers, or H200 where there is no GPU (CPU planning, AOT)."""
    import torch

    if not torch.cuda.is_available():
        return H200
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return DeviceSpec(
        name=props.name,
        sm_count=props.multi_processor_count,
        smem_per_block=int(getattr(props, "shared_memory_per_block_optin", H200.smem_per_block)),
        smem_per_sm=int(getattr(props, "shared_memory_per_multiprocessor", H200.smem_per_sm)),
        max_threads_per_sm=int(getattr(props, "max_threads_per_multi_processor", H200.max_threads_per_sm)),
    )


# ---- the three planning steps -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Refusal:
    """An engine cannot serve a shape, and why (recorded in plans and reports)."""

    engine: str
    reason: str


@dataclasses.dataclass(frozen=True)
class Tile:
    engine: str
    rows: int  # rows per tile (what one CTA owns at a time)
    channels_tile: int  # channels padded to the kernel's tile (tensor cores) or the channels
    hidden_chunk: int  # hidden units per chunk through shared memory (tensor cores; the register form: all, padded)
    threads: int
    num_tiles: int
    stages: int = 1  # persistent-tc: W1 / W2 chunk buffers each (a chunk's loads overlap 2 * stages - 1 steps)
    vector: int = 1  # fp16 elements per global load of a tile: 8 (16-byte cp.async) for tensor cores on aligned rows
    mma: str = "mma.sync"  # persistent-tc's instruction: "mma.sync" or "wgmma"
    split: int = 1  # persistent-tc: CTAs of a cluster that share a row tile, each running 1/split of the hidden
    multicast: int = 1  # persistent-tc: CTAs of a cluster, on their own row tiles, sharing weight loads (TMA)
    loads: str = "cp.async"  # persistent-tc's weight chunks: "cp.async" (every thread) or "tma" (one, mbarriers)
    overlap: bool = False  # persistent-tc: GEMM1 of chunk j + 1 runs beside GEMM2 of chunk j (two hidden buffers)
    registers: bool = False  # persistent-tc's register form: one-warp CTAs, weights and hidden in registers


@dataclasses.dataclass(frozen=True)
class SharedMemory:
    bytes: int  # dynamic shared memory per CTA
    weights: str  # "smem" or "registers" (loaded once per CTA), "streamed" (chunks per tile), "global" (from L2)
    hidden: str  # where the hidden tile lives: "registers", "registers+smem", "smem" or "global"


@dataclasses.dataclass(frozen=True)
class Owners:
    occupancy: int  # CTAs per SM this plan assumes resident
    grid: int  # CTAs launched (persistent engines), or the first kernel's grid (conventional)
    tiles_per_cta: int  # the most row tiles one CTA owns


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything a kernel launch needs besides the tensors."""

    engine: str
    rows: int
    channels: int
    hidden: int
    tile: Tile
    smem: SharedMemory
    owners: Owners

    def describe(self) -> dict:
        """Flat JSON-friendly view (reports, the compiler's IR dump)."""
        tile = {f"tile_{k}": v for k, v in dataclasses.asdict(self.tile).items() if k != "engine"}
        return {"engine": self.engine, **tile, "smem_bytes": self.smem.bytes, "weights": self.smem.weights,
                "hidden_at": self.smem.hidden, **dataclasses.asdict(self.owners)}


def ceil_div(a, b):
    """For a >= 0; written so that device code (CuTe DSL Int32, truncating division) can share it."""
    return (a + b - 1) // b


def round_up(a, b):
    return ceil_div(a, b) * b


def usable_smem(device: DeviceSpec) -> int:
    return device.smem_per_block


def _check_engine(engine: str) -> None:
    if engine not in KERNEL_ENGINES:
        raise ValueError(f"unknown engine {engine!r}; kernel engines are {KERNEL_ENGINES}")


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


def tc_layout(rows: int, channels_tile: int, hidden: int, may_split: bool, device: DeviceSpec) -> tuple[int, int]:
    """persistent-tc's (rows per tile, hidden split): the cheapest by ``tc_cost``; on ties the larger tile
    (less weight traffic), then no split (no exchange). A split needs ``may_split`` (16-byte rows, and no
    choice forced), at least two hidden chunks per CTA and the peer's half output tile in shared memory."""
    chunks = ceil_div(hidden, TC_HIDDEN_CHUNK)
    candidates = []
    for rows_per_tile in TC_ROW_TILES:
        num_tiles = ceil_div(rows, rows_per_tile)
        for split in TC_SPLITS:
            if split > 1 and not (may_split and chunks >= 2 * split and
                                  persistent_tc_smem_bytes(rows_per_tile, channels_tile, 1, split)
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
``reports/h200/sweeps/megakernel-sweep-tc-registers.json`` and
``sweeps/megakernel-sweep-tc-registers-unaligned.json``) the form took 0.42-0.90x the time at every swept shape
with 16-byte rows; with unaligned rows 0.81-0.83x at 16 x 16 padded weights and 0.93-0.96x at 16 x 32, but 1.26x
at 64 x 32 and 1.64x at 32 x 48 (about 150 element loads a thread)."""


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
    fp16; with a hidden split also the fp32 half of the output tile the peer CTA sends, and its transaction
    barrier; with TMA loads the full and empty barriers of both weight pipelines."""
    chunk, hidden_buffers = TC_HIDDEN_CHUNK, 2 if overlap else 1
    size = 2 * (tile_rows * channels_tile + 2 * stages * chunk * channels_tile + hidden_buffers * tile_rows * chunk)
    if split > 1:
        size += 4 * tile_rows * channels_tile // 2 + SPLIT_BARRIER_BYTES
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


def scalar_row_stride(cols):
    """Elements per row of a scalar tile's fp32 rows in shared memory: a whole number of K steps, so that every
    lane's run of classes is one aligned vector inside its row (device code shares this function)."""
    return round_up(cols, SCALAR_K_CLASSES)


def scalar_row_bytes(engine: str, channels: int, hidden: int) -> int:
    """Shared memory per row of a scalar tile: the fp32 operand row, plus the fp32 hidden row when
    the hidden stays on chip."""
    if engine == "persistent":
        return 4 * (scalar_row_stride(channels) + scalar_row_stride(hidden))
    return 4 * scalar_row_stride(channels)


def weight_group_stride(n):
    """16-byte chunks per K step of a scalar weight staged in shared memory (``scalar.smem_weight``): N rounded
    up to odd, so that eight chunks a stride apart fall in distinct banks (device code shares this function)."""
    return n // 2 * 2 + 1


def staged_weight_bytes(n, k):
    """An (N, K) fp16 weight staged in shared memory: per K step of SCALAR_K_CLASSES halves, one chunk of each
    output, ``weight_group_stride(n)`` chunks apart."""
    return ceil_div(k, SCALAR_K_CLASSES) * weight_group_stride(n) * 2 * SCALAR_K_CLASSES


def scalar_weight_bytes(channels: int, hidden: int) -> int:
    """W1 (hidden x channels) and W2 (channels x hidden) in shared memory (biases go through L1)."""
    return staged_weight_bytes(hidden, channels) + staged_weight_bytes(channels, hidden)


def scalar_weights_whole_steps(channels: int, hidden: int) -> bool:
    """Whether both weights' rows are whole K steps (16 bytes each), so that ``scalar.stage_weight`` copies them
    to shared memory by 16-byte cp.async (where the tensors are 16-byte aligned too, as torch allocates them)."""
    return channels % SCALAR_K_CLASSES == 0 and hidden % SCALAR_K_CLASSES == 0


def scalar_occupancy(weights: str) -> int:
    """CTAs per SM a persistent CUDA-core kernel compiles for (``min_blocks_per_mp``), by weight placement."""
    return SCALAR_REGISTER_WEIGHTS_OCCUPANCY if weights == "registers" else SCALAR_OCCUPANCY


def scalar_group_lanes(outputs: int) -> int:
    """Lanes that share one output in ``scalar.linear_rows``, for the items of a full tile (the kernels call it with
    their compile-time sizes)."""
    lanes = 1
    while lanes < SCALAR_K_CLASSES and outputs * lanes * 2 <= SCALAR_THREADS:
        lanes *= 2
    return lanes


def scalar_lane_weights(k_dim: int, n_dim: int) -> int:
    """Weight elements one lane reads in a ``linear_rows`` call of one row block: its classes of every K step."""
    return ceil_div(k_dim, SCALAR_K_CLASSES) * (SCALAR_K_CLASSES // scalar_group_lanes(n_dim))


def register_weights_fit(tile_rows: int, channels: int, hidden: int) -> bool:
    """Whether a persistent CTA can hold its lanes' weights in registers: tiles of one row block (a lane's output
    column and classes the same in every tile), a lane's share of W1 and of W2 at most SCALAR_WEIGHT_REGISTERS
    each (and every output of both GEMMs its own lanes: at most SCALAR_THREADS outputs), and both sums at least
    SCALAR_REGISTER_WEIGHTS_MIN_STEPS K steps long."""
    return (tile_rows == ROW_BLOCK and max(channels, hidden) <= SCALAR_THREADS
            and min(channels, hidden) > (SCALAR_REGISTER_WEIGHTS_MIN_STEPS - 1) * SCALAR_K_CLASSES
            and scalar_lane_weights(channels, hidden) <= SCALAR_WEIGHT_REGISTERS
            and scalar_lane_weights(hidden, channels) <= SCALAR_WEIGHT_REGISTERS)


def tensor_core_alignment(channels: int, hidden: int) -> str | None:
    if channels % VECTOR_ELEMENTS or hidden % VECTOR_ELEMENTS:
        return (f"conventional-tc needs channels and hidden to be multiples of {VECTOR_ELEMENTS} (16-byte rows "
                f"for cp.async); got channels={channels}, hidden={hidden}")
    return None


def register_form_fits(channels: int, hidden: int) -> bool:
    """Whether persistent-tc's register form holds these weights (``REGISTER_FORM_MAX``)."""
    c, h = round_up(channels, REGISTER_FORM_PAD), round_up(hidden, REGISTER_FORM_PAD)
    return c <= REGISTER_FORM_MAX[0] and h <= REGISTER_FORM_MAX[1] and c * h <= REGISTER_FORM_MAX[2]


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
        return _with_schedule(tile, hidden, device)  # rows: element loads
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


def occupancy(threads: int, smem_bytes: int, device: DeviceSpec, limit: int | None = None) -> int:
    """CTAs per SM: limited by threads, by shared memory, and by the kernel's register budget."""
    by_threads = device.max_threads_per_sm // threads
    by_smem = device.smem_per_sm // (smem_bytes + device.reserved_smem_per_block)
    return max(1, min(by_threads, by_smem, limit or by_threads))


def tc_occupancy_limit(tile: Tile) -> int:
    """CTAs per SM persistent-tc compiles for (``min_blocks_per_mp``): 2 when the accumulators leave
    room (at most 64 per thread keeps the kernel within 128 registers) and two CTAs' shared memory
    fits an SM of the planning default (H200); else 1 (up to 255 registers)."""
    accumulators = tile.rows * tile.channels_tile // TC_THREADS
    smem = tc_tile_smem_bytes(tile) + H200.reserved_smem_per_block
    return 2 if accumulators <= 64 and 2 * smem <= H200.smem_per_sm else 1


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
           loads: str | None = None, overlap: bool | None = None, registers: bool | None = None) -> Plan:
    """A plan with some choices forced, so that tests, the sanitizer and sweeps reach every code path at
    small shapes: several tiles per CTA (``grid``: with a hidden split, the number of clusters times the
    split), weights read from global memory (``weights``), persistent-tc's number of chunk buffers
    (``stages``), instruction (``mma``), hidden split (``split``), weight loads (``loads``), weight
    multicast (``multicast``, which loads by TMA), chunk schedule (``overlap``) and register form (``registers``;
    none of the other persistent-tc choices applies to it)."""
    if any(v is not None for v in (mma, split, multicast, loads, overlap, registers)) and engine != "persistent-tc":
        raise ValueError(f"{engine} has no mma, split, loads, multicast, overlap or registers choice")
    shared_form_choice = any(v is not None for v in (split, multicast, loads, overlap, stages))
    if registers and shared_form_choice:
        raise ValueError("the register form has no split, multicast, loads, overlap or stages choice")
    if (multicast or 1) > 1 and loads == "cp.async":
        raise ValueError("a weight multicast loads by TMA, not cp.async")
    if engine == "persistent-tc" and registers is None and shared_form_choice:
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
    memory and grid planned again. It needs 16-byte rows (cp.async tiles) and the peer's half output tile
    in shared memory."""
    tile = plan.tile
    if split not in TC_SPLITS:
        raise ValueError(f"split must be one of {TC_SPLITS}, got {split}")
    if tile.vector != VECTOR_ELEMENTS:
        raise ValueError(f"a hidden split needs channels and hidden multiples of {VECTOR_ELEMENTS}")
    return _replanned(plan, _with_schedule(dataclasses.replace(tile, split=split), plan.hidden, device), device)


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
    return _replanned(plan, _with_schedule(dataclasses.replace(plan.tile, loads=loads), plan.hidden, device,
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
    return _replanned(plan, _with_schedule(dataclasses.replace(tile, multicast=multicast, loads=loads), plan.hidden,
                                           device, tile.stages), device)


def _with_schedule(tile: Tile, hidden: int, device: DeviceSpec, stages: int | None = None) -> Tile:
    """``tile`` with planning's chunk schedule (``tc_overlap``) for its other choices, and its chunk buffers
    planned again (``stages`` None) or kept."""
    tile = dataclasses.replace(tile, overlap=tc_overlap(tile))
    if stages is None:
        stages = tc_stages(tile.rows, tile.channels_tile, tile.num_tiles, hidden, device, tile.split, tile.loads,
                           tile.overlap)
    return dataclasses.replace(tile, stages=stages)


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


def choose(requested: str, rows: int, channels: int, hidden: int, device: DeviceSpec | None = None) -> Choice:
    """Walk ``requested``'s fallback chain; the last engine (conventional) serves every shape."""
    if requested not in FALLBACK_CHAINS:
        raise ValueError(f"unknown engine {requested!r}; engines with kernels are {sorted(FALLBACK_CHAINS)}")
    device = device or current_device()
    skipped: list[Refusal] = []
    for engine in FALLBACK_CHAINS[requested]:
        plan = plan_engine(engine, rows, channels, hidden, device)
        if isinstance(plan, Plan):
            return Choice(requested, plan, tuple(skipped))
        skipped.append(plan)
    raise AssertionError(f"conventional refused {rows}x{channels}x{hidden}: {skipped[-1].reason}")


def flops(rows: int, channels: int, hidden: int) -> int:
    return 4 * rows * channels * hidden


def minimum_bytes(rows: int, channels: int, hidden: int) -> int:
    """x (fp16) read, y (fp32) written, weights (fp16) and biases (fp32) read once."""
    return rows * channels * (2 + 4) + 2 * 2 * channels * hidden + 4 * (channels + hidden)

