"""Compilation of kernel variants, once per process each, and the ahead-of-time compile of all of them.

A variant is everything that is compile-time: the op, dtypes, N, the vector width (the alignment
class) and the flags. M and the row strides are symbolic (``cute.sym_int``), so one compiled
function serves every M and every stride of its alignment class. Functions are compiled for the
TVM-FFI calling convention: they take torch tensors directly and launch on the current torch
stream. Each compile keeps a copy of its cubin in ``artifact_dir()`` for provenance, a directory named
by the fingerprint of this subpackage's sources (``sources_fingerprint``), so that two source trees
compiling a variant of the same name never write the same file.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import struct
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from kernellab.harness.provenance import cubin_dir, source_fingerprint

if TYPE_CHECKING:  # CuTe DSL is imported only when compiling
    from .base import Tuning

DTYPES = {"float32": 32, "float16": 16, "bfloat16": 16}
OPS = ("softmax", "rmsnorm", "layernorm", "softmax_backward", "rmsnorm_backward", "layernorm_backward")


@dataclasses.dataclass(frozen=True)
class Variant:
    """One compiled kernel. Dtypes are torch dtype names ("float32", "float16", "bfloat16")."""

    op: str  # one of OPS
    dtype: str
    n: int
    vec: int  # elements per access: the largest power of two (<= 128 bits) all tensors are aligned to
    weight: str | None = None
    bias: str | None = None  # layernorm_backward: dbias is computed, in this dtype
    residual: bool = False  # rmsnorm: h = x + residual; rmsnorm_backward: the gradient of h is added to dx
    tuning: Tuning | None = None  # None: the kernel's heuristic plan
    stats: bool = False  # rmsnorm, layernorm: also store each row's rstd (and mean) for the backward
    spread_sum: bool = False  # rmsnorm_backward, layernorm_backward: the partials' sum by CTAs (many partial rows)

    def __post_init__(self):
        if self.op not in OPS:
            raise ValueError(f"unknown op {self.op!r}")
        for name in (self.dtype, self.weight, self.bias):
            if name is not None and name not in DTYPES:
                raise ValueError(f"unsupported dtype {name!r}")
        if self.n < 1 or self.vec < 1 or self.n % self.vec or self.vec * DTYPES[self.dtype] > 128:
            raise ValueError(f"vector width {self.vec} does not fit N={self.n} of {self.dtype}")
        if self.spread_sum and self.op not in ("rmsnorm_backward", "layernorm_backward"):
            raise ValueError(f"spread_sum is a norm backward's choice, not {self.op!r}'s")

    @property
    def name(self) -> str:
        flags = "".join(f"_{k}-{v}" for k, v in (("w", self.weight), ("b", self.bias)) if v)
        t = self.tuning
        knobs = (f"_t{t.accesses}-{t.register_values}-{t.min_threads}-{t.resident_threads}-{t.vectors}"
                 f"{f'-c{t.ctas_per_sm}' if t.ctas_per_sm else ''}"
                 f"{f'-s{t.tile_values}' if t.tile_values is not None else ''}"
                 f"{f'-p{t.max_threads_per_row}' if t.max_threads_per_row != type(t).max_threads_per_row else ''}"
                 f"{f'-r{t.ring_stages}' if t.ring_stages else ''}"
                 if t else "")
        stats = "_stats" if self.stats else ""
        spread = "_spread" if self.spread_sum else ""
        return (f"{self.op}_{self.dtype}_n{self.n}_v{self.vec}{flags}{'_res' if self.residual else ''}{stats}{spread}"
                f"{knobs}")

    @property
    def backward(self) -> bool:
        return self.op.endswith("_backward")

    def kernel(self):
        """The kernel object: its __init__ holds the launch plan for this N and dtype."""
        x, w, b = (_cute_dtype(name) for name in (self.dtype, self.weight, self.bias))
        if self.op == "softmax":
            from .softmax_kernel import Softmax

            return Softmax(x, self.n, self.vec, self.tuning)
        if self.op == "rmsnorm":
            from .rmsnorm_kernel import RMSNorm

            return RMSNorm(x, self.n, self.vec, weight_dtype=w, residual=self.residual, tuning=self.tuning)
        if self.op == "softmax_backward":
            from .softmax_backward_kernel import SoftmaxBackward

            return SoftmaxBackward(x, self.n, self.vec, self.tuning)
        if self.op == "rmsnorm_backward":
            from .rmsnorm_backward_kernel import RMSNormBackward

            return RMSNormBackward(x, self.n, self.vec, weight_dtype=w, residual=self.residual, tuning=self.tuning,
                                   spread_sum=self.spread_sum)
        if self.op == "layernorm_backward":
            from .layernorm_backward_kernel import LayerNormBackward

            return LayerNormBackward(x, self.n, self.vec, weight_dtype=w, bias=self.bias is not None,
                                     tuning=self.tuning, spread_sum=self.spread_sum)
        from .layernorm_kernel import LayerNorm

        return LayerNorm(x, self.n, self.vec, weight_dtype=w, bias_dtype=b, tuning=self.tuning)

    def compile(self, arch: str | None = None):
        """cute.compile with fake tensors: M symbolic, row strides symbolic and divisible by vec."""
        import cutlass.cute as cute
        from cutlass import Float32, Int32

        kernel = self.kernel()
        rows = cute.sym_int()

        def matrix():
            dt = _cute_dtype(self.dtype)
            stride = (cute.sym_int64(divisibility=self.vec), 1)
            return cute.runtime.make_fake_tensor(dt, (rows, self.n), stride=stride,
                                                 assumed_align=self.vec * dt.width // 8)

        def vector(name):
            if name is None:
                return None
            dt = _cute_dtype(name)
            return cute.runtime.make_fake_tensor(dt, (self.n,), stride=(1,),
                                                 assumed_align=min(16, self.vec * dt.width // 8))

        def per_row():  # rstd, mean: (M,) fp32
            return cute.runtime.make_fake_tensor(Float32, (rows,), stride=(1,), assumed_align=4)

        def partials(wanted):  # (grid * rows_per_cta, N) fp32, rows as aligned as x's
            if not wanted:
                return None
            return cute.runtime.make_fake_tensor(Float32, (cute.sym_int(), self.n),
                                                 stride=(cute.sym_int64(divisibility=self.vec), 1),
                                                 assumed_align=min(16, self.vec * 4))

        def sync(wanted):  # the grid barrier's word
            if not wanted:
                return None
            return cute.runtime.make_fake_tensor(Int32, (1,), stride=(1,), assumed_align=4)

        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        stats = per_row() if self.stats else None
        if self.op == "softmax":
            args = (matrix(), matrix())
        elif self.op == "rmsnorm":
            res = self.residual
            args = (matrix(), vector(self.weight), matrix() if res else None, matrix(), matrix() if res else None,
                    stats, Float32(1e-6))
        elif self.op == "layernorm":
            args = (matrix(), vector(self.weight), vector(self.bias), matrix(), stats,
                    per_row() if self.stats else None, Float32(1e-5))
        elif self.op == "softmax_backward":
            args = (matrix(), matrix(), matrix())
        elif self.op == "rmsnorm_backward":
            args = (matrix(), vector(self.weight), matrix(), per_row(), matrix() if self.residual else None, matrix(),
                    partials(self.weight), vector(self.weight), sync(self.weight), Int32(1))
        else:
            vectors = self.weight is not None or self.bias is not None
            args = (matrix(), vector(self.weight), matrix(), per_row(), per_row(), matrix(), partials(self.weight),
                    partials(self.bias), vector(self.weight), vector(self.bias), sync(vectors), Int32(1))
        options = "--enable-tvm-ffi" + (f" --gpu-arch {arch}" if arch else "")
        with tempfile.TemporaryDirectory() as dump:  # --keep-cubin wants a dump dir; we keep our own copy
            fn = cute.compile(kernel, *args, stream, options=f"{options} --keep-cubin --dump-dir={dump}")
            cubin = fn.__cubin__  # its bytes, or the path of the dumped file
            if isinstance(cubin, str):
                cubin = Path(cubin).read_bytes() if os.path.exists(cubin) else None
        if cubin:
            _RESOURCES[self] = cubin_resources(cubin)
            path = artifact_dir(arch) / f"{self.name}.cubin"
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(cubin)
                _ARTIFACTS[self] = str(path)
            except OSError:  # no writable cache: the kernel still runs, without a cubin for provenance
                pass
        return fn


@dataclasses.dataclass(frozen=True)
class Resources:
    """What a compiled kernel takes per thread, read from its cubin."""

    registers: int
    stack_bytes: int  # local memory frame: register spills where the launch bound is tight


def cubin_resources(cubin: bytes) -> Resources:
    """Registers and stack frame from the cubin's ELF ``.nv.info`` attributes (EIATTR_REGCOUNT and
    EIATTR_FRAME_SIZE, one (symbol, value) pair each per function; the largest over the functions)."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    entsize, count, names = struct.unpack_from("<HHH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * entsize) for i in range(count)]
    strtab = sections[names][4]
    found = {0x2F: 0, 0x11: 0}  # EIATTR_REGCOUNT, EIATTR_FRAME_SIZE
    for sec in sections:
        end = cubin.index(b"\0", strtab + sec[0])
        if cubin[strtab + sec[0]:end] != b".nv.info":
            continue
        data, i = cubin[sec[4]:sec[4] + sec[5]], 0
        while i + 4 <= len(data):
            fmt, attr, size = data[i], data[i + 1], struct.unpack_from("<H", data, i + 2)[0]
            if fmt != 4:  # EIFMT_SVAL carries a payload of `size` bytes; the others carry their value inline
                i += 4
                continue
            if attr in found and size == 8:
                found[attr] = max(found[attr], struct.unpack_from("<I", data, i + 8)[0])
            i += 4 + size
    return Resources(registers=found[0x2F], stack_bytes=found[0x11])


# Hopper's (sm_90) per-SM limits, as the occupancy calculator applies them.
SM_THREADS, SM_CTAS, SM_REGISTERS, REGISTER_UNIT = 2048, 32, 65536, 256
SM_SHARED, CTA_SHARED_RESERVED, WARP_SHARED = 228 << 10, 1 << 10, 1 << 10


def resident_ctas(threads: int, registers: int, ring_bytes: int = 0) -> int:
    """CTAs of ``threads`` threads at ``registers`` per thread that fit on one SM at once. Shared memory
    limits only a backward with a ring of row blocks (``ring_bytes``, ``base.GradKernel.row_source``): besides
    it the row kernels keep one fp32 per warp and row there, a few mbarriers, and the partials' sum's staging of
    at most 1 KB a warp (``base.GradKernel.reduce_partials``), counted here as ``WARP_SHARED`` a warp."""
    warps = -(-threads // 32)
    per_warp = -(-registers * 32 // REGISTER_UNIT) * REGISTER_UNIT
    by_shared = SM_SHARED // (ring_bytes + warps * WARP_SHARED + CTA_SHARED_RESERVED) if ring_bytes else SM_CTAS
    return min(SM_CTAS, SM_THREADS // (warps * 32), by_shared,
               SM_REGISTERS // (per_warp * warps) if registers else SM_CTAS)


class Plans:
    """The compiled functions of one variant, chosen per call by M.

    A launch runs in waves of resident CTAs. When M rows take a little more than one wave of the
    heuristic plan (``ctas`` CTAs per SM), the tail wave runs with most SMs idle; the same plan under a
    launch bound of ``k > ctas`` CTAs per SM (fewer registers per thread) can hold all M rows at once.
    The smallest such ``k`` runs instead, unless its bound makes the compiler spill. Only for rows that
    fit in one CTA's registers (no cluster, no streaming), and only to make one wave: on the H200, a
    bound that turned 2 waves into 1 gained 4-10 % at every shape measured, one that turned 3 into 2
    or 4 into 3 lost 1-3 % (tools/device/norm_sweep.py --by-rows): with several waves, CTAs of the
    next wave start as others finish and the tail is short.
    """

    __slots__ = ("variant", "fn", "threads", "ctas", "rows_per_sm", "limit", "bounded", "by_rows")

    def __init__(self, variant: Variant, sms: int = 0):
        self.variant, self.fn = variant, call_of(compiled(variant))
        self.limit = 0  # the largest M that may run a bounded plan; 0: the heuristic plan always
        self.bounded: dict[int, object] = {}  # k -> the function under a bound of k CTAs per SM (None: spills)
        self.by_rows: dict[int, object] = {}  # M -> the function chosen for it
        res = _RESOURCES.get(variant)
        if not (sms and res and variant.tuning is None):
            return
        plan = variant.kernel().describe()
        self.threads = threads = plan["num_threads"]  # a bound changes the registers, not the threads
        self.ctas, most = resident_ctas(threads, res.registers), resident_ctas(threads, 0)
        self.rows_per_sm = sms * plan["rows_per_cta"]  # rows one resident CTA per SM holds in a wave
        if plan["cluster"] == 1 and plan["tiles"] == 1 and 0 < self.ctas < most:
            self.limit = most * self.rows_per_sm

    def for_rows(self, m: int):
        """The function for M rows (a bounded plan compiles on first use)."""
        if m > self.limit:
            return self.fn
        fn = self.by_rows.get(m)
        if fn is None:
            k = -(-m // self.rows_per_sm)  # CTAs per SM that hold M rows in one wave
            fn = self._bounded(k) if k > self.ctas else None
            fn = self.by_rows[m] = self.fn if fn is None else fn
        return fn

    def _bounded(self, k: int):
        if k not in self.bounded:
            from .base import Tuning

            variant = dataclasses.replace(self.variant, tuning=Tuning(ctas_per_sm=k))
            fn = compiled(variant)
            res = _RESOURCES.get(variant)
            ok = res is not None and not res.stack_bytes and resident_ctas(self.threads, res.registers) >= k
            self.bounded[k] = call_of(fn) if ok else None  # spills (or unknown): the bound costs more than the tail
        return self.bounded[k]


def wave(variant: Variant, sms: int) -> tuple[int, int]:
    """(rows per CTA, CTAs, or clusters of the plan's CTAs, resident at once on ``sms`` SMs) of a compiled
    variant: the grid of a persistent kernel. One CTA per SM where the registers are unknown (no cubin)."""
    plan = variant.kernel().describe()
    res = _RESOURCES.get(variant)
    per_sm = 1
    if res and res.registers:
        per_sm = resident_ctas(plan["num_threads"], res.registers, plan.get("ring_bytes", 0))
    return plan["rows_per_cta"], max(1, sms * per_sm // plan["cluster"])


PARTIALS_SHARE = 0.05
"""Past this share of a backward's row bytes (x, dy and dx) in fp32 partials (written, then read by the sum), its
grid keeps one CTA an SM instead of the wave's several. Set from the H100 grid probe
(reports/h100/norm-backward/backward-phases-grids.json): one CTA an SM won where the wave's partials were a large
share (RMSNorm 256x3072 and 1024x4096 bf16), the wave won where they were a small one (65536x1024)."""


def wave_grid(m: int, rows_per_cta: int, per_wave: int) -> int:
    """The largest grid a backward over ``m`` rows takes: a CTA (or cluster) per row block, at most a wave."""
    return min(-(-m // rows_per_cta), per_wave)


PARTIAL_ROWS_PER_LANE = 8
"""Rows of the partials a lane of a warp's sum walks at most: past 32 times this, the backward launches its variant
that spreads the sum over every warp of a CTA (``base.GradKernel.sum_partials_by_ctas``). With one warp a column
group, at 65536x1024 bf16 (396 CTAs of 2 rows: 792 partial rows) a lane walked about 25 rows and the sum took 7-10
us on an H100; spreading the rows over the CTA's warps at every size made the few-row cases slower instead (few
CTAs with work: reports/h100/norm-backward/)."""


def spread_sum_of(partial_rows: int) -> bool:
    """Whether a backward's partials of this many rows are summed by CTAs (``Variant.spread_sum``)."""
    return partial_rows > 32 * PARTIAL_ROWS_PER_LANE


FP32_BACKWARD_CTAS_PER_SM = 2
"""CTAs an SM a backward over fp32 rows takes at most. On an H100 a wave of 3 CTAs an SM made the rows phase and the
partials' sum slower than 2 at every fp32 shape probed, both norms (66000x1000, 40000x2048, 120000x512:
reports/h100/norm-backward/backward-phases-fp32-ctas-17a02f0.json); for 16-bit rows the full wave was faster."""


def backward_grid(m: int, rows_per_cta: int, per_wave: int, sms: int, element_size: int) -> int:
    """The grid of a backward launch with vector gradients over ``m`` rows: the wave (``wave``), or one CTA an SM
    where the wave's partials would be more than ``PARTIALS_SHARE`` of the rows' bytes, and for fp32 rows at most
    ``FP32_BACKWARD_CTAS_PER_SM`` CTAs an SM (``sms`` 0, off the GPU: the wave). Any grid up to the wave is correct
    (the kernel's rows loop strides by the grid); this picks the faster."""
    grid = wave_grid(m, rows_per_cta, per_wave)
    if 0 < sms < grid and 8 * grid * rows_per_cta > PARTIALS_SHARE * 3 * m * element_size:
        grid = sms
    if sms > 0 and element_size == 4:
        grid = min(grid, FP32_BACKWARD_CTAS_PER_SM * sms)
    return grid


def vector_gradient_launch(m: int, sms: int, element_size: int, rows_per_cta: int, per_wave: int,
                           spread_wave) -> tuple[bool, int, int, int]:
    """(spread, rows per CTA, CTAs per wave, grid) of a backward launch with vector gradients over ``m`` rows, from
    the warp-sum variant's wave: its grid (``backward_grid``), or where that grid's partials have many rows
    (``spread_sum_of``) the spread variant on its own wave (``spread_wave()``: its rows per CTA and CTAs per wave;
    its registers may hold fewer CTAs). The ops and the device tools launch by this one rule."""
    grid = backward_grid(m, rows_per_cta, per_wave, sms, element_size)
    if not spread_sum_of(grid * rows_per_cta):
        return False, rows_per_cta, per_wave, grid
    rows_per_cta, per_wave = spread_wave()
    return True, rows_per_cta, per_wave, backward_grid(m, rows_per_cta, per_wave, sms, element_size)


def call_of(fn):
    """The tvm_ffi.Function under the DSL's kwargs wrapper where there is one: the same positional
    arguments (the wrapper only fills defaults we always pass), a shorter host path per call."""
    raw = getattr(fn, "__tvm_ffi_object__", None)
    inner = raw() if raw is not None else None
    return fn if inner is None else inner


def _cute_dtype(name: str | None):
    """torch dtype name -> CuTe numeric type (CuTe DSL is imported only when compiling)."""
    if name is None:
        return None
    import cutlass

    return {"float32": cutlass.Float32, "float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}[name]


_COMPILED: dict[Variant, object] = {}
_ARTIFACTS: dict[Variant, str] = {}
_RESOURCES: dict[Variant, Resources] = {}
_LOCK = threading.Lock()


@functools.cache
def sources_fingerprint() -> str:
    """The fingerprint of this ``gpu`` subpackage's ``.py`` files, once per process. The kernel modules,
    their shared tiling (``base``) and this compiler (the fake tensors and compile options) determine the
    cubin a variant's name stands for; ``ops`` is host code, but in the subpackage too (a change to it
    only moves the directory). Nothing outside ``gpu`` goes into a cubin: the argument ``checks`` that
    ``ops`` imports run on the host."""
    here = Path(__file__).resolve().parent
    return source_fingerprint(here.parent, (here.name,))


def artifact_dir(arch: str | None = None) -> Path:
    """Where compiled cubins are kept (``provenance.cubin_dir``): the root $KERNELLAB_CUTE_CACHE or
    ~/.cache/kernellab/cute, then the arch and ``sources_fingerprint()``."""
    return cubin_dir("KERNELLAB_CUTE_CACHE", "cute", arch, sources_fingerprint())


def compiled(variant: Variant):
    """The variant's compiled function, compiled on first use in this process."""
    fn = _COMPILED.get(variant)
    if fn is None:
        with _LOCK:
            fn = _COMPILED.get(variant)
            if fn is None:
                fn = _COMPILED[variant] = variant.compile()
    return fn


def artifacts() -> list[str]:
    """Paths of the cubins of every variant compiled in this process (for provenance hashes)."""
    return sorted(set(_ARTIFACTS.values()))


# ---- ahead-of-time compile ---------------------------------------------------------------------
SUITE_ROWS = (1537, 3072, 6144, 4096, 8192, 16384, 1024)  # N of the gpu-norm suite's shapes
SUITE_DTYPES = ("float32", "bfloat16")
BACKWARD_ROWS = SUITE_ROWS + (2560, 12289)  # N of the gpu-norm-backward suite's shapes


def widest_vector(n: int, dtype: str) -> int:
    """The vector width of contiguous, freshly allocated rows of N elements (their alignment class)."""
    vec = 128 // DTYPES[dtype]
    while n % vec:
        vec //= 2
    return vec


def suite_variants() -> list[Variant]:
    """What the gpu-norm suite runs: its N and dtypes, weights and bias in the input dtype."""
    out = []
    for dtype in SUITE_DTYPES:
        for n in SUITE_ROWS:
            v = widest_vector(n, dtype)
            out += [Variant("softmax", dtype, n, v), Variant("rmsnorm", dtype, n, v, weight=dtype),
                    Variant("layernorm", dtype, n, v, weight=dtype, bias=dtype)]
    for dtype in SUITE_DTYPES:  # gpu-norm-backward: the backward alone, and the forwards behind autograd
        for n in BACKWARD_ROWS:
            v = widest_vector(n, dtype)
            out += [Variant("softmax_backward", dtype, n, v), Variant("rmsnorm_backward", dtype, n, v, weight=dtype),
                    Variant("layernorm_backward", dtype, n, v, weight=dtype, bias=dtype)]
            if n in SUITE_ROWS[:4]:
                out += [Variant("rmsnorm", dtype, n, v, weight=dtype, stats=True),
                        Variant("layernorm", dtype, n, v, weight=dtype, bias=dtype, stats=True)]
    return out


def representative_variants() -> list[Variant]:
    """One of each code path the suites do not reach: fp16, fp32 weights of a 16-bit input, no weight,
    the residual add, tiny and odd N, a narrower alignment class, cluster rows and streamed rows; forwards
    that store their statistics and backwards with and without vector gradients."""
    return [
        Variant("softmax", "float16", 1, 1),
        Variant("softmax", "float16", 1000, 4),
        Variant("softmax", "bfloat16", 65536, 8),  # cluster of CTAs
        Variant("softmax", "float32", 300000, 4),  # streamed
        Variant("rmsnorm", "float16", 2048, 8, weight="float32"),
        Variant("rmsnorm", "bfloat16", 4096, 8, weight="bfloat16", residual=True),
        Variant("rmsnorm", "float32", 4097, 1, residual=True),
        Variant("rmsnorm", "float32", 65536, 4, weight="float32", residual=True),
        Variant("rmsnorm", "bfloat16", 300000, 8, weight="bfloat16", residual=True),
        Variant("layernorm", "float16", 768, 8, weight="float16"),
        Variant("layernorm", "bfloat16", 8192, 8, weight="float32", bias="float32"),
        Variant("layernorm", "float32", 20, 2, bias="float32"),
        Variant("layernorm", "float32", 65536, 4, weight="float32", bias="float32"),
        Variant("layernorm", "bfloat16", 300000, 8, weight="bfloat16", bias="bfloat16"),
        Variant("rmsnorm", "float16", 4096, 8, weight="float16", residual=True, stats=True),
        Variant("rmsnorm", "float32", 65536, 4, stats=True),  # cluster
        Variant("layernorm", "bfloat16", 300000, 8, stats=True),  # streamed
        Variant("softmax_backward", "float16", 1, 1),
        Variant("softmax_backward", "bfloat16", 300000, 8),  # streamed
        Variant("rmsnorm_backward", "float16", 2048, 8, weight="float32"),
        Variant("rmsnorm_backward", "bfloat16", 4096, 8, weight="bfloat16", residual=True),
        Variant("rmsnorm_backward", "float32", 4097, 1),
        Variant("rmsnorm_backward", "bfloat16", 300000, 8, weight="float32", residual=True),  # streamed
        Variant("layernorm_backward", "float16", 768, 8, bias="float16"),
        Variant("layernorm_backward", "float32", 20, 2, weight="float32"),
        Variant("layernorm_backward", "bfloat16", 300000, 8, weight="bfloat16", bias="bfloat16"),  # streamed
        # the partials summed by CTAs (many partial rows): the bandwidth shape's N, a batch of single-column
        # groups (odd N), dbias alone, a cluster (the sum a launch of its own), streamed rows
        Variant("rmsnorm_backward", "bfloat16", 1024, 8, weight="bfloat16", spread_sum=True),
        Variant("layernorm_backward", "bfloat16", 1024, 8, weight="bfloat16", bias="bfloat16", spread_sum=True),
        Variant("rmsnorm_backward", "float32", 4097, 1, weight="float32", spread_sum=True),
        Variant("layernorm_backward", "float16", 768, 8, bias="float16", spread_sum=True),
        Variant("layernorm_backward", "float32", 12289, 1, weight="float32", bias="float32", spread_sum=True),
        Variant("rmsnorm_backward", "bfloat16", 300000, 8, weight="float32", residual=True, spread_sum=True),
    ]


def compile_all(arch: str = "sm_90a", variants: list[Variant] | None = None, log=None) -> list[str]:
    """Compile every variant (default: the suites' and the representative ones) for ``arch`` without a
    GPU; raises on the first compile error. Returns the names of the variants compiled."""
    done = []
    for variant in variants if variants is not None else suite_variants() + representative_variants():
        start = time.perf_counter()
        variant.compile(arch)
        done.append(variant.name)
        if log:
            log(f"{variant.name}: {time.perf_counter() - start:.1f} s")
    return done
