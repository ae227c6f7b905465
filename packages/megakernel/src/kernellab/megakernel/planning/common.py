"""What every engine's planning shares: the engines and their fallback chains, the device's numbers,
the plan's parts (tile, shared memory, owners), occupancy and the problem's minimum work."""

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


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """What planning needs to know of a GPU."""

    name: str
    sm_count: int
    smem_per_block: int
    smem_per_sm: int
    reserved_smem_per_block: int = 1024
    max_threads_per_sm: int = 2048
    l2_bytes: int = 50 * 2**20  # the fused stack's rows form refuses weights that do not fit (planning.stack)

    def __post_init__(self):
        for field in ("sm_count", "smem_per_block", "smem_per_sm", "max_threads_per_sm", "l2_bytes"):
            if getattr(self, field) < 1:
                raise ValueError(f"DeviceSpec.{field} must be >= 1, got {getattr(self, field)}")


H200 = DeviceSpec(name="NVIDIA H200", sm_count=132, smem_per_block=232448, smem_per_sm=233472, l2_bytes=60 * 2**20)
"""The planning default (also H100 SXM's numbers but the L2: 227 KB opt-in per block, 228 KB per SM; 60 MB of L2,
H100's 50)."""


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
        l2_bytes=int(getattr(props, "L2_cache_size", H200.l2_bytes)),
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
    pdl: bool = False  # persistent-tc: launched with programmatic dependent launch (``forced(..., pdl=True)`` only)


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


def occupancy(threads: int, smem_bytes: int, device: DeviceSpec, limit: int | None = None) -> int:
    """CTAs per SM: limited by threads, by shared memory, and by the kernel's register budget."""
    by_threads = device.max_threads_per_sm // threads
    by_smem = device.smem_per_sm // (smem_bytes + device.reserved_smem_per_block)
    return max(1, min(by_threads, by_smem, limit or by_threads))


def flops(rows: int, channels: int, hidden: int) -> int:
    return 4 * rows * channels * hidden


def minimum_bytes(rows: int, channels: int, hidden: int) -> int:
    """x (fp16) read, y (fp32) written, weights (fp16) and biases (fp32) read once."""
    return rows * channels * (2 + 4) + 2 * 2 * channels * hidden + 4 * (channels + hidden)
