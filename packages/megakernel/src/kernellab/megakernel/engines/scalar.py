"""Device code shared by the CUDA-core engines (conventional, persistent, persistent-global).

Both GEMMs of a block are the same row-wise product, ``out[r, n] = sum_k a[r, k] w[n, k] + b[n]``,
followed by a different epilogue (activation and fp16 rounding after the first, the residual after
the second). ``linear_rows`` computes it for any sizes. Each output's K loop is summed as
K_CLASSES interleaved partial sums (class c holds k = c, c + K_CLASSES, ... in increasing k) that a
fixed tree then adds: classes c and c ^ 1 first, then c ^ 2, then c ^ 4. Who computes the classes
depends on how many outputs a full tile has to fill the CTA's threads with: one thread all of them (a thread
owns ROW_BLOCK rows of one output column, 4 x K_CLASSES independent chains), or a group of 2, 4 or
8 neighbouring lanes, lane l the P = K_CLASSES / lanes contiguous classes l * P ... l * P + P - 1 (so
that its operands of a K step are one run of P elements). The tree's first levels then run inside the
lane and its last as butterfly shuffles across the group, pairing the same classes. Floating-point
addition is commutative, so every split gives the same bits: the order of every sum depends on K
alone, which keeps every engine built on it deterministic and a row's result independent of how the
rows are tiled.

The sizes (K, N and the rows of a tile) are compile-time constants of each kernel (the engines compile one per
layer size): the lanes an item takes, the K loops' trip counts and unrolling, and every division by a size are then
settled by the compiler instead of being computed by every thread at run time, and only the code path a size takes
is in the kernel.

An epilogue is an object with ``store(r, n, v, pre)`` and, where it reads an input besides the sum (the
residual: ``reads`` True), ``read(r, n)``. Where every thread has one item, ``linear_rows`` issues the
item's bias and reads before its sum, or takes them from ``read_early``, which the persistent kernels
call at a tile's start, so that their memory latency hides under the work that comes first.

Operand rows that a persistent kernel stages in shared memory (fp32, ``smem_rows``) are stored by row block,
rows innermost, and padded to a whole number of K steps (``planning.scalar_row_stride``); they are passed with
``a_staged``. A lane then reads its item's ROW_BLOCK rows at its run of a K step as one contiguous run of
ROW_BLOCK x P elements, in 16-byte vectors, where it would issue ROW_BLOCK x P element loads, each with its own
address; it reads its weights of a step as one vector too where they are staged (``w_staged``).

Weights staged in shared memory (``smem_weight``) are stored by K step: step s of output n is one 16-byte chunk
of K_CLASSES halves, at chunk s * G + n (G = ``planning.weight_group_stride``, odd). A lane's classes of a step are
then one vector read, the chunks the threads of a warp read at a step are consecutive, and the staging copy
(``stage_weight``: 16-byte cp.async where K is whole steps and the weight 16-byte aligned, else ``stage_rows``),
whose neighbouring threads take neighbouring steps of one output, writes chunks an odd stride apart in each bank
phase: both free of bank conflicts.

Where a lane's share of a weight is small (``planning.register_weights_fit``: at most WEIGHT_REGISTERS elements,
one row block per tile, so the lane's output column and classes are the same in every tile), ``register_weights``
loads it into registers once, all loads in flight together, and ``linear_rows`` takes it as ``held``: the sum
then runs fully unrolled from registers, in the same order, with no memory latency on its K steps.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float16, Float32, Int32, Uint8
from cutlass.cute.nvgpu import cpasync

from ..planning import (
    ROW_BLOCK,
    SCALAR_K_CLASSES,
    SCALAR_THREADS,
    SCALAR_WEIGHT_REGISTERS,
    ceil_div,
    scalar_group_lanes,
    scalar_row_stride,
    weight_group_stride,
)
from .common import activate, round_to_fp16

K_CLASSES = SCALAR_K_CLASSES
"""Interleaved partial sums of every K loop (a power of two): also the most lanes that share an output."""
LEVELS = K_CLASSES.bit_length() - 1
STAGE_BATCH = 8
"""Elements a thread loads into registers before it stores any, when staging into shared memory."""
STAGE_UNROLL = 4
"""Batches of a staging copy unrolled together (all of a small tile's, so that its loads are in flight at once)."""
WEIGHT_REGISTERS = SCALAR_WEIGHT_REGISTERS  # elements of one GEMM's weight a lane holds (``register_weights``)
K_UNROLL = 32
"""Terms of a lane's sum unrolled together (K steps times the lane's classes): the whole loop at the small sizes, so
that the reads of later steps are issued ahead of the earlier steps' products, without running out of registers
where a lane has many classes."""


@cute.jit
def linear_rows(a: cute.Tensor, a_row0: Int32, rows_valid: Int32, k_dim: cutlass.Constexpr, weight: cute.Tensor,
                bias: cute.Tensor, n_dim: cutlass.Constexpr, epilogue: cutlass.Constexpr, tid: Int32,
                tile_rows: cutlass.Constexpr, early=None, held=None, a_staged: cutlass.Constexpr = False,
                w_staged: cutlass.Constexpr = False):
    """For r < rows_valid (at most ``tile_rows``) and n < n_dim: ``epilogue.store(r, n, sum_k a[a_row0 + r, k]
    weight[n, k] + bias[n], epilogue.read(r, n))``.

    Output item i is row block i // n_dim of column i % n_dim. The sizes are compile-time, so that the lanes an
    item takes (from a full tile's items), the K loop's trip count and every index division are constants. Rows
    past ``rows_valid`` in a block read the last valid row (always in bounds) and are never handed to the
    epilogue. Where every thread has one item, its bias and epilogue reads are issued before its sum, so that
    their latency hides under it, or come in ``early`` where the caller read them sooner still (``read_early``),
    and its weights in ``held`` where the caller holds them in registers (``register_weights``, one row block a
    tile). ``a_staged``: ``a`` is a ``smem_rows`` tensor, whose runs of a K step are read as vectors;
    ``w_staged``: ``weight`` is a ``smem_weight`` tensor, likewise."""
    outputs = _outputs(rows_valid, n_dim)
    lanes = _item_lanes(tile_rows, n_dim)
    acc = cute.make_rmem_tensor((ROW_BLOCK,), Float32)
    if cutlass.const_expr(_tile_items(tile_rows, n_dim) * lanes <= SCALAR_THREADS):  # one item a thread (group)
        item = _one_pass_item(outputs, lanes, tid)
        if cutlass.const_expr(early is None):
            b, pre = _read_item(rows_valid, bias, n_dim, epilogue, item)
        else:
            b, pre = early
        if cutlass.const_expr(lanes == 1):
            if tid < outputs:  # no shuffles at one lane: the threads past the outputs skip the sum
                _sum_item(a, a_row0, rows_valid, k_dim, weight, n_dim, item, Int32(0), 1, acc, held, a_staged, w_staged)
        else:
            _sum_item(a, a_row0, rows_valid, k_dim, weight, n_dim, item, tid % lanes, lanes, acc, held, a_staged,
                      w_staged)
        if tid % lanes == 0 and tid // lanes < outputs:
            _store_item(rows_valid, n_dim, epilogue, item, acc, b, pre)
    else:  # one lane an item, several items a thread: long sums, whose registers the reads wait beside
        for item in range(tid, outputs, SCALAR_THREADS):
            _sum_item(a, a_row0, rows_valid, k_dim, weight, n_dim, item, Int32(0), 1, acc, None, a_staged, w_staged)
            b, pre = _read_item(rows_valid, bias, n_dim, epilogue, item)
            _store_item(rows_valid, n_dim, epilogue, item, acc, b, pre)


@cute.jit
def read_early(rows_valid: Int32, bias: cute.Tensor, n_dim: cutlass.Constexpr, epilogue: cutlass.Constexpr,
               tid: Int32, tile_rows: cutlass.Constexpr):
    """The bias and epilogue reads of this thread's item in ``linear_rows`` (where every thread has one),
    issued before the stages that come first (the input rows' staging, the first GEMM) so that their
    latency hides under those."""
    lanes = _item_lanes(tile_rows, n_dim)
    return _read_item(rows_valid, bias, n_dim, epilogue, _one_pass_item(_outputs(rows_valid, n_dim), lanes, tid))


@cute.jit
def register_weights(weight: cute.Tensor, k_dim: cutlass.Constexpr, n_dim: cutlass.Constexpr,
                     tid: Int32) -> cute.Tensor:
    """This thread's share of ``weight`` in ``linear_rows`` at one row block a tile, in registers: element
    s * P + j (P = K_CLASSES / lanes) is weight[n, s * K_CLASSES + lane * P + j], the j-th class of the
    lane's K step s, and zero past k_dim. All WEIGHT_REGISTERS loads are issued before any is used."""
    lanes = _item_lanes(ROW_BLOCK, n_dim)
    per_lane = K_CLASSES // lanes
    n = cutlass.min(tid // lanes, n_dim - 1)
    lane = tid % lanes
    held = cute.make_rmem_tensor((WEIGHT_REGISTERS,), weight.element_type)
    for i in cutlass.range_constexpr(WEIGHT_REGISTERS):
        k = i // per_lane * K_CLASSES + lane * per_lane + i % per_lane
        held[i] = weight.element_type(0.0)
        if k < k_dim:
            held[i] = weight[n, k]
    return held


def _tile_items(tile_rows: int, n_dim: int) -> int:
    """Items of a ``linear_rows`` call on a full tile: what the lanes an item takes are chosen for."""
    return ceil_div(tile_rows, ROW_BLOCK) * n_dim


def _item_lanes(tile_rows: int, n_dim: int) -> int:
    """Lanes an item of a ``linear_rows`` call takes: the one choice that ``linear_rows``, ``read_early`` (which
    must find the same item a thread) and ``register_weights`` (the same lane's classes) share."""
    return scalar_group_lanes(_tile_items(tile_rows, n_dim))


@cute.jit
def _outputs(rows_valid: Int32, n_dim: cutlass.Constexpr) -> Int32:
    """Items of a ``linear_rows`` call: row blocks times columns."""
    return (rows_valid + ROW_BLOCK - 1) // ROW_BLOCK * n_dim


@cute.jit
def _one_pass_item(outputs: Int32, lanes: cutlass.Constexpr, tid: Int32) -> Int32:
    """The item of thread ``tid`` where every group of ``lanes`` has one (groups past the outputs repeat the
    last item: their lanes still take part in the group's shuffles)."""
    return cutlass.min(tid // lanes, outputs - 1)


@cute.jit
def _read_item(rows_valid: Int32, bias: cute.Tensor, n_dim: cutlass.Constexpr, epilogue: cutlass.Constexpr,
               item: Int32):
    block = item // n_dim
    n = item - block * n_dim
    pre = None
    if cutlass.const_expr(epilogue.reads):
        pre = cute.make_rmem_tensor((ROW_BLOCK,), Float32)
        for rr in cutlass.range_constexpr(ROW_BLOCK):
            pre[rr] = epilogue.read(cutlass.min(block * ROW_BLOCK + rr, rows_valid - 1), n)
    return bias[n], pre


@cute.jit
def _store_item(rows_valid: Int32, n_dim: cutlass.Constexpr, epilogue: cutlass.Constexpr, item: Int32, acc: cute.Tensor,
                b: Float32, pre):
    block = item // n_dim
    n = item - block * n_dim
    store = epilogue.store  # a function, not the object: nothing the dynamic `if` below carries
    for rr in cutlass.range_constexpr(ROW_BLOCK):
        if block * ROW_BLOCK + rr < rows_valid:
            if cutlass.const_expr(epilogue.reads):
                store(block * ROW_BLOCK + rr, n, acc[rr] + b, pre[rr])
            else:
                store(block * ROW_BLOCK + rr, n, acc[rr] + b, None)


@cute.jit
def _sum_item(a: cute.Tensor, a_row0: Int32, rows_valid: Int32, k_dim: cutlass.Constexpr, weight: cute.Tensor,
              n_dim: cutlass.Constexpr,
              item: Int32, lane: Int32, lanes: cutlass.Constexpr, out: cute.Tensor, held=None,
              a_staged: cutlass.Constexpr = False, w_staged: cutlass.Constexpr = False):
    """out[rr] = sum_k a[row rr of the item's block, k] weight[n, k], lane ``lane`` of ``lanes`` summing the
    classes lane * P + j (j < P = K_CLASSES / lanes), and the fixed tree adding them (its levels below P in the
    lane, the rest by shuffles, which every lane of the group must reach). Every lane ends with the same sums.
    With ``held`` (``register_weights``) the weights come from registers, the K steps unrolled, each term in
    the same order."""
    per_lane = K_CLASSES // lanes
    block = item // n_dim
    n = item - block * n_dim
    rows = [a_row0 + cutlass.min(block * ROW_BLOCK + rr, rows_valid - 1) for rr in range(ROW_BLOCK)]
    acc = cute.make_rmem_tensor((per_lane, ROW_BLOCK), Float32)
    acc.fill(0.0)
    if cutlass.const_expr(held is not None):
        for s in cutlass.range_constexpr(min(WEIGHT_REGISTERS // per_lane, ceil_div(k_dim, K_CLASSES))):
            k = s * K_CLASSES + lane * per_lane
            if cutlass.const_expr(a_staged):  # the run stays inside the padded row; terms past K are skipped
                _add_run(acc, a, block, k, per_lane, k_dim, [held[s * per_lane + j] for j in range(per_lane)],
                         (s + 1) * K_CLASSES > k_dim)
            else:
                for j in cutlass.range_constexpr(per_lane):
                    if k + j < k_dim:
                        _add_term(acc, j, a, rows, k + j, held[s * per_lane + j])
    else:
        steps = k_dim // K_CLASSES  # below step ``steps`` every class is present: no bounds checks
        if cutlass.const_expr(steps > 0):
            for s in cutlass.range(steps, unroll=min(steps, K_UNROLL // per_lane)):
                k0 = s * K_CLASSES + lane * per_lane
                if cutlass.const_expr(w_staged):
                    w_run = _run(weight[n, (None, s)], per_lane, lane)
                    w = [w_run[j] for j in range(per_lane)]
                else:
                    w = [weight[n, k0 + j] for j in range(per_lane)]
                if cutlass.const_expr(a_staged):
                    _add_run(acc, a, block, k0, per_lane, k_dim, w, False)
                else:
                    for j in cutlass.range_constexpr(per_lane):
                        _add_term(acc, j, a, rows, k0 + j, w[j])
        if cutlass.const_expr(k_dim % K_CLASSES):  # the last, partial step
            for j in cutlass.range_constexpr(per_lane):
                k = steps * K_CLASSES + lane * per_lane + j
                if k < k_dim:
                    _add_term(acc, j, a, rows, k, weight[n, k])
    for level in cutlass.range_constexpr(LEVELS):  # the fixed tree: partners c ^ 1, then c ^ 2, then c ^ 4
        if cutlass.const_expr((1 << level) < per_lane):  # both classes in the lane: j and j + 2^level
            for j in cutlass.range_constexpr(per_lane):
                if cutlass.const_expr((j & (1 << level)) == 0 and j % (1 << level) == 0):
                    for rr in cutlass.range_constexpr(ROW_BLOCK):
                        acc[j, rr] = acc[j, rr] + acc[j + (1 << level), rr]
        else:  # the lane's sum (in class lane * P) and lane ^ (2^level / P)'s
            for rr in cutlass.range_constexpr(ROW_BLOCK):
                acc[0, rr] = acc[0, rr] + cute.arch.shuffle_sync_bfly(acc[0, rr], offset=(1 << level) // per_lane)
    for rr in cutlass.range_constexpr(ROW_BLOCK):
        out[rr] = acc[0, rr]


@cute.jit
def _add_term(acc: cute.Tensor, j: cutlass.Constexpr, a: cute.Tensor, rows: list, k: Int32, w):
    """Class j's partial sums of the item's rows take term k: acc[j, rr] += a[rows[rr], k] w, in fp32."""
    w32 = w.to(Float32)
    for rr in cutlass.range_constexpr(ROW_BLOCK):
        acc[j, rr] = acc[j, rr] + a[rows[rr], k].to(Float32) * w32


@cute.jit
def _add_run(acc: cute.Tensor, a: cute.Tensor, block: Int32, k: Int32, per_lane: cutlass.Constexpr,
             k_dim: cutlass.Constexpr, w: list, checked: cutlass.Constexpr):
    """Classes j < per_lane take term k + j (k a multiple of per_lane) of the rows of row block ``block`` of a
    ``smem_rows`` tensor, all read at once: one run of ROW_BLOCK x per_lane elements, rows innermost, in vectors.
    Rows past the tile's valid ones are read too; their sums are never stored. With ``checked``, terms at or past
    k_dim are skipped (their elements are the rows' padding)."""
    w32 = [v.to(Float32) for v in w]
    run = cute.make_rmem_tensor((ROW_BLOCK, per_lane), Float32)  # column-major: rows innermost, as in ``a``
    cute.autovec_copy(cute.local_tile(a[(None, block), None], (ROW_BLOCK, per_lane), (0, k // per_lane)), run)
    for j in cutlass.range_constexpr(per_lane):
        for rr in cutlass.range_constexpr(ROW_BLOCK):
            if cutlass.const_expr(checked):
                if k + j < k_dim:
                    acc[j, rr] = acc[j, rr] + run[rr, j] * w32[j]
            else:
                acc[j, rr] = acc[j, rr] + run[rr, j] * w32[j]


@cute.jit
def _run(view: cute.Tensor, length: cutlass.Constexpr, index: Int32) -> cute.Tensor:
    """Elements index * length ... index * length + length - 1 of a contiguous 1-D view, in registers: one vector
    read where the view's alignment allows it."""
    run = cute.make_rmem_tensor((length,), view.element_type)
    cute.autovec_copy(cute.local_tile(view, (length,), (index,)), run)
    return run


@cute.jit
def stage_rows(src: cute.Tensor, row0: Int32, rows_valid: Int32, dst: cute.Tensor, tid: Int32,
               rows_max: cutlass.Constexpr):
    """dst[r, c] = src[row0 + r, c], converted to dst's type, for r < rows_valid (at most ``rows_max``) and every
    column: a tile's input rows (fp16 -> fp32 is exact), or a whole (N, K) weight (row0 0, rows_valid N) into its
    ``smem_weight`` view. The rows are contiguous in global memory, so thread t loads their flat elements t, t + T,
    ... (coalesced; STAGE_BATCH of them, each at a fixed offset from the first), then stores them, each element's
    (r, c) found on its own (a division by the compile-time column count: no chain of dependent steps)."""
    cols = src.shape[1]
    total = rows_valid * cols
    flat = cute.make_tensor(src.iterator + row0 * cols, cute.make_layout(total))
    batches = ceil_div(rows_max * cols, SCALAR_THREADS * STAGE_BATCH)
    for batch in cutlass.range(batches, unroll=min(batches, STAGE_UNROLL)):
        f0 = tid + batch * SCALAR_THREADS * STAGE_BATCH
        staged = cute.make_rmem_tensor((STAGE_BATCH,), src.element_type)
        for u in cutlass.range_constexpr(STAGE_BATCH):
            staged[u] = src.element_type(0.0)
            if f0 + u * SCALAR_THREADS < total:
                staged[u] = flat[f0 + u * SCALAR_THREADS]
        for u in cutlass.range_constexpr(STAGE_BATCH):
            f = f0 + u * SCALAR_THREADS
            if f < total:
                r = f // cols
                dst[r, f - r * cols] = staged[u].to(dst.element_type)


def dynamic_smem():
    return cute.arch.get_dyn_smem(Uint8, alignment=16)


def _smem_at(base, byte_offset, dtype):
    """A ``dtype`` pointer at ``byte_offset`` of the dynamic shared memory, the offset known to the compiler as a
    multiple of 16 (every region planning lays out is whole 16-byte units), so that vector reads of it are allowed."""
    if not isinstance(byte_offset, int):
        byte_offset = cute.assume(byte_offset, divby=16)
    return cute.recast_ptr(base + byte_offset, dtype=dtype)


def smem_rows(base, byte_offset, rows, cols) -> cute.Tensor:
    """fp32 rows of ``cols`` elements at ``byte_offset`` (a multiple of 16) of the dynamic shared memory, stored by
    row block: element (r, k) at ((r // ROW_BLOCK) * S + k) * ROW_BLOCK + r % ROW_BLOCK, S =
    ``planning.scalar_row_stride(cols)``, so that a block's rows at a run of K are one contiguous run (``_add_run``).
    Shape ((ROW_BLOCK, rows / ROW_BLOCK), S) (rows a multiple of ROW_BLOCK): ``t[r, k]`` indexes it by row, and
    ``t[(None, b), None]`` is block b. Columns past ``cols`` are never written."""
    stride = scalar_row_stride(cols)
    layout = cute.make_layout(((ROW_BLOCK, rows // ROW_BLOCK), stride), stride=((1, ROW_BLOCK * stride), ROW_BLOCK))
    return cute.make_tensor(_smem_at(base, byte_offset, Float32), layout)


def smem_weight(base, byte_offset, n, k) -> cute.Tensor:
    """An fp16 (N, K) weight staged by K step at ``byte_offset`` (a multiple of 16): element (n, k) at half
    (k // K_CLASSES * G + n) * K_CLASSES + k % K_CLASSES, G = ``planning.weight_group_stride(n)``. Its mode 1 is
    (class, step): ``w[n, k]`` indexes it by k, ``w[n, (None, s)]`` is output n's chunk of step s."""
    chunk = weight_group_stride(n) * K_CLASSES
    return cute.make_tensor(_smem_at(base, byte_offset, Float16),
                            cute.make_layout((n, (K_CLASSES, ceil_div(k, K_CLASSES))), stride=(K_CLASSES, (1, chunk))))


@cute.jit
def stage_weight(src: cute.Tensor, dst: cute.Tensor, tid: Int32):
    """dst = src for a whole (N, K) weight, into a ``smem_weight`` view. Where K is whole steps and src 16-byte
    aligned, thread t issues 16-byte cp.async copies of chunks t, t + T, ... (chunk c: step c % steps of output
    c // steps, src's halves 8c ... 8c + 7), all in flight at once, and commits them without waiting: the caller
    waits (``cp_async_wait_group(0)``) once it has issued its other loads, and its barrier publishes them. Else
    ``stage_rows`` copies the elements (a warp's 32 consecutive elements of a row fall in four chunks an odd number
    of chunks apart: no bank conflicts either); the half-empty last step's padding is never read."""
    n_dim, k_dim = src.shape
    if cutlass.const_expr(k_dim % K_CLASSES == 0):
        if src.iterator.toint() % 16 == 0:
            steps = k_dim // K_CLASSES
            atom = cute.make_copy_atom(cpasync.CopyG2SOp(), Float16, num_bits_per_copy=16 * 8)
            copies = ceil_div(n_dim * steps, SCALAR_THREADS)
            for i in cutlass.range(copies, unroll=min(copies, 4 * STAGE_UNROLL)):
                c = tid + i * SCALAR_THREADS
                if c < n_dim * steps:
                    n = c // steps
                    whole = cute.make_ptr(Float16, (src.iterator + c * K_CLASSES).toint(), cute.AddressSpace.gmem,
                                          assumed_align=16)
                    cute.copy(atom, cute.make_tensor(whole, cute.make_layout(K_CLASSES)), dst[n, (None, c - n * steps)])
            cute.arch.cp_async_commit_group()
        else:
            stage_rows(src, Int32(0), n_dim, dst, tid, n_dim)
    else:
        stage_rows(src, Int32(0), n_dim, dst, tid, n_dim)


class HiddenToSmem:
    """First-GEMM epilogue with the hidden on chip: fp32 holding the fp16-rounded value."""

    reads = False

    def __init__(self, h_s: cute.Tensor, act: Int32):
        self.h_s, self.act = h_s, act

    def store(self, r, n, v, pre):
        self.h_s[r, n] = round_to_fp16(activate(v, self.act))


class HiddenToGlobal:
    """First-GEMM epilogue with the hidden in global memory (fp16)."""

    reads = False

    def __init__(self, hidden: cute.Tensor, row0: Int32, act: Int32):
        self.hidden, self.row0, self.act = hidden, row0, act

    def store(self, r, n, v, pre):
        self.hidden[self.row0 + r, n] = activate(v, self.act).to(Float16)


class OutputWithResidual:
    """Second-GEMM epilogue: y = (h W2^T + b2) + residual, in fp32; the residual is its read."""

    reads = True

    def __init__(self, y: cute.Tensor, residual: cute.Tensor, row0: Int32):
        self.y, self.residual, self.row0 = y, residual, row0

    def read(self, r, n):
        return self.residual[self.row0 + r, n].to(Float32)

    def store(self, r, n, v, pre):
        self.y[self.row0 + r, n] = v + pre
