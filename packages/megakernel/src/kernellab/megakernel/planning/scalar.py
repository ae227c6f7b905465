"""Planning numbers of the CUDA-core engines (conventional, persistent, persistent-global): their fixed
geometry, shared-memory rows, staged weights, and where a persistent CTA holds its weights."""

from __future__ import annotations

from .common import ceil_div, round_up

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
``megakernel-sweep-register-weights-8.json``)."""
SCALAR_REGISTER_WEIGHTS_MIN_STEPS = 4
"""K steps both sums need at least for the weights to be held in registers: with fewer there are few dependent
loads to take off the sums' path, and the unrolled code costs more than it saves (1x7x13, one and two steps, lost
to global memory in ``megakernel-sweep-register-weights-8.json``; 33x32x64, four and eight steps, gained)."""

SCALAR_GLOBAL_WEIGHTS_MAX = 14 * 1024
"""Weight elements (W1 and W2) up to which a persistent CTA that reads each weight once (one tile of one row
block: up to 4 x SMs rows) reads them from global memory (through L1) instead of staging them in shared
memory first: staging costs a barrier and memory round trips that only reuse would amortize, and reading
from L1 costs more per element than from shared memory. H200 sweep of both placements at such shapes
(``reports/h200/sweeps/megakernel-sweep-weights.json``): global memory faster up to 201x61x109 (13.3K elements),
slower from 257x64x128 (16.4K) on. It holds where the weights are staged element by element (K not whole steps
of SCALAR_K_CLASSES: ``scalar_weights_whole_steps``); where they are staged by 16-byte cp.async copies, all in
flight with the first tile's row loads, staging was faster at every such shape of the sweep
(``megakernel-sweep-staged-overlap.json``: 61x48x96, 97x40x80, 520x64x64), and a CTA stages them whatever
their count. After the row-block change the two are about even at 61x48x96 (``megakernel-sweep-row-blocks.json``:
5.13 us staged, 5.03 from global memory): the rule is worth measuring again."""


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
