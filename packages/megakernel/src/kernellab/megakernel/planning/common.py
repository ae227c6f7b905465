"""What every engine's planning shares: the engines and their fallback chains, the device's numbers,
the plan's parts (tile, shared memory, owners), occupancy and the problem's minimum work."""

from __future__ import annotations

import dataclasses
import functools
import warnings

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
    clusters_at_once: tuple[tuple[int, int], ...] = ()
    """(cluster size, the most clusters of that size the GPU runs at once at one CTA an SM): a cluster's CTAs share
    a GPC, and GPCs of different SM counts leave SMs no whole cluster fits (an H100: 30 of 4, 15 of 8, on 132 SMs).
    Empty where not known (no GPU, or the driver's answer failed): planning falls back on a share of the SMs. At
    one CTA an SM even for plans that run two: counted at two, planning would split 1024 x 128 x 1024 over 8 CTAs a
    tile, which the H100's sweeps measured slower (``reports/h100/tc-split/``)."""

    def __post_init__(self):
        for field in ("sm_count", "smem_per_block", "smem_per_sm", "max_threads_per_sm", "l2_bytes"):
            if getattr(self, field) < 1:
                raise ValueError(f"DeviceSpec.{field} must be >= 1, got {getattr(self, field)}")
        for size, count in self.clusters_at_once:
            if size < 1 or count < 0:
                raise ValueError(f"DeviceSpec.clusters_at_once must hold (size >= 1, count >= 0) pairs, got "
                                 f"{(size, count)}")

    def clusters_held(self, size: int) -> int | None:
        """The most clusters of ``size`` CTAs the GPU runs at once (``clusters_at_once``), or None where unknown."""
        return dict(self.clusters_at_once).get(size)


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
        clusters_at_once=resident_clusters(torch.cuda.current_device()) if props.major >= 9 else (),
    )


CLUSTER_SIZES = (2, 4, 8)
"""The cluster sizes planning launches (persistent-tc's hidden splits; 8 is the largest portable one)."""
_PROBE_PTX = b""".version 7.8
.target sm_90
.address_size 64
.visible .entry cluster_probe() { ret; }
\0"""


def max_active_clusters(image: bytes | str, grid: int, threads: int, cluster: int, smem: int) -> int:
    """The driver's ``cuOccupancyMaxActiveClusters`` for the one kernel of a module ``image`` (cubin or PTX bytes, or
    a cubin's file) launched with this grid, threads, cluster size and dynamic shared memory (the kernel's limit
    raised to it first). Needs a current CUDA context."""
    from cuda.bindings import driver

    load = driver.cuModuleLoadData(image) if isinstance(image, bytes) else driver.cuModuleLoad(image.encode())
    module = driver_result(load)
    try:
        functions = driver_result(driver.cuModuleEnumerateFunctions(
            driver_result(driver.cuModuleGetFunctionCount(module)), module))
        if len(functions) != 1:
            raise RuntimeError(f"a module of {len(functions)} kernels, expected one")
        function = functions[0]
        attr = driver.CUfunction_attribute
        driver_result(driver.cuFuncSetAttribute(function, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem))
        driver_result(driver.cuFuncSetAttribute(function, attr.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100))
        config = driver.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid, 1, 1
        config.blockDimX, config.blockDimY, config.blockDimZ = threads, 1, 1
        config.sharedMemBytes = smem
        launch = driver.CUlaunchAttribute()
        launch.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        launch.value.clusterDim.x, launch.value.clusterDim.y, launch.value.clusterDim.z = cluster, 1, 1
        config.attrs, config.numAttrs = [launch], 1
        return driver_result(driver.cuOccupancyMaxActiveClusters(function, config))
    finally:
        driver.cuModuleUnload(module)


def driver_result(result):
    """The value of a cuda-python driver call's (error, value...) tuple (None for none); RuntimeError naming the
    error."""
    from cuda.bindings import driver

    err, *rest = result
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA driver error {err}")
    return rest[0] if len(rest) == 1 else (rest or None)


def probe_clusters(device_index: int) -> tuple[tuple[int, int], ...]:
    """``DeviceSpec.clusters_at_once`` of a CUDA device (sm_90 or later) as the driver gives it for an empty kernel
    (PTX, compiled by the driver) holding a block's whole opt-in shared memory: one CTA an SM, as persistent-tc's
    plans are."""
    import torch

    torch.zeros(1, device=f"cuda:{device_index}")  # the primary context, current for the driver calls
    props = torch.cuda.get_device_properties(device_index)
    smem = int(getattr(props, "shared_memory_per_block_optin", H200.smem_per_block))
    return tuple((size, max_active_clusters(_PROBE_PTX, props.multi_processor_count // size * size, 128, size, smem))
                 for size in CLUSTER_SIZES)


@functools.cache
def resident_clusters(device_index: int) -> tuple[tuple[int, int], ...]:
    """``probe_clusters`` once a process; () with a warning where the driver refuses (planning then limits the wide
    splits by a share of the SMs)."""
    try:
        return probe_clusters(device_index)
    except (RuntimeError, ImportError) as e:
        warnings.warn(f"the driver did not say how many clusters device {device_index} runs at once ({e}); "
                      "planning limits wide splits by a share of the SMs instead", RuntimeWarning, stacklevel=2)
        return ()


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
