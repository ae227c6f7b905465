"""The contract between the harness and whatever it measures.

A *suite* is a problem family (softmax, RMSNorm, ... at some shapes and dtypes). A *problem* is one
operation at one shape and dtype: it makes fresh random inputs from a seed, empty output buffers,
and the float64 truth, and it knows the bytes and flops one call moves. An *impl* is a contender
that can run problems ("torch", "native", "cute", ...). A *case* is one (problem, impl) pair.

Impls write into the output buffers they are given where they can (so that poisoned outputs catch
unwritten elements) and return a dict of result tensors either way.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

Tensors = dict[str, Any]  # name -> torch.Tensor
Call = Callable[[Tensors, Tensors], Tensors]

DTYPES = ("fp32", "fp16", "bf16", "fp64")


class Inputs(dict):
    """A problem's inputs that also answer to the names an earlier suite gave them (``former``: old name -> name).
    Both sides of a revision A/B bind their impls against the suites of the driver's harness, so a baseline whose
    impls predate a rename still finds its inputs; the names listed, hashed and checked stay today's."""

    def __init__(self, tensors: Tensors, former: Mapping[str, str]):
        super().__init__(tensors)
        self.former = dict(former)

    def __missing__(self, key: str):
        if key in self.former:
            return self[self.former[key]]
        raise KeyError(key)


def torch_dtype(name: str):
    """The torch dtype for one of our short dtype names."""
    import torch

    table = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64}
    if name not in table:
        raise ValueError(f"dtype must be one of {sorted(table)}, got {name!r}")
    return table[name]


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """|out - ref| <= atol + rtol * |ref| elementwise; NaN never passes unless the truth is NaN."""

    rtol: float
    atol: float


DEFAULT_TOLERANCE = {
    "fp64": Tolerance(1e-12, 1e-12),
    "fp32": Tolerance(1e-5, 1e-5),
    "fp16": Tolerance(1e-2, 1e-2),
    "bf16": Tolerance(2e-2, 2e-2),
}


class Problem:
    """One operation at one shape and dtype. Subclasses fill in inputs, outputs and the truth."""

    op: str = ""

    def __init__(self, shape: tuple[int, ...], dtype: str, device: str, **params: Any):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
        if not shape or any(int(s) < 1 for s in shape):
            raise ValueError(f"shape must be a non-empty tuple of sizes >= 1, got {shape!r}")
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self.device = device
        self.params = dict(params)

    # ---- identity -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """e.g. ``softmax_128x512_fp32``: op, shape, dtype (flags appended by subclasses)."""
        return f"{self.op}_{'x'.join(map(str, self.shape))}_{self.dtype}{self.name_suffix()}"

    def name_suffix(self) -> str:
        return ""

    @property
    def operation(self) -> str:
        """The before/after record's operation name, e.g. ``softmax_128_512``."""
        return f"{self.op}_{'_'.join(map(str, self.shape))}"

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "op": self.op,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "device": self.device,
            "params": {k: v for k, v in sorted(self.params.items())},
            "bytes": self.bytes_moved(),
            "flops": self.flops(),
        }

    # ---- what subclasses provide --------------------------------------------------------------
    def make_inputs(self, seed: int) -> Tensors:
        raise NotImplementedError

    def make_outputs(self, inputs: Tensors) -> Tensors:
        raise NotImplementedError

    def reference(self, inputs: Tensors) -> Tensors:
        """float64 truth computed from the same (rounded) inputs."""
        raise NotImplementedError

    def control(self, inputs: Tensors, outputs: Tensors) -> Tensors:
        """torch's own implementation: the control probe timed in every round."""
        raise NotImplementedError

    def bytes_moved(self) -> int:
        """The fewest bytes one call must move: each input read once, each output written once."""
        raise NotImplementedError

    def flops(self) -> int:
        return 0

    def tolerance(self) -> Tolerance:
        return DEFAULT_TOLERANCE[self.dtype]

    def slack(self, inputs: Tensors) -> Tensors:
        """Elementwise allowance added to the tolerance, per output, where the truth itself is not
        unique: an intermediate rounding point whose float64 value lies so near a rounding boundary
        that a correct kernel may round it either way. Empty (the default): none."""
        del inputs
        return {}

    # ---- helpers shared by subclasses -----------------------------------------------------------
    def generator(self, seed: int):
        import torch

        g = torch.Generator(device=self.device)
        g.manual_seed(int(seed) & 0x7FFF_FFFF_FFFF_FFFF)
        return g

    def randn(self, shape, seed_gen, dtype: str | None = None, scale: float = 1.0, shift: float = 0.0):
        """Random normal data made on the problem's device, rounded to the dtype. Never zeros."""
        import torch

        t = torch.randn(tuple(shape), generator=seed_gen, device=self.device, dtype=torch.float32)
        if scale != 1.0:
            t.mul_(scale)
        if shift != 0.0:
            t.add_(shift)
        return t.to(torch_dtype(dtype or self.dtype))

    def element_size(self, dtype: str | None = None) -> int:
        return {"fp32": 4, "fp16": 2, "bf16": 2, "fp64": 8}[dtype or self.dtype]


@dataclasses.dataclass
class Impl:
    """A contender. ``bind`` turns a problem into a call, or raises ``Unsupported`` with the reason.

    ``artifacts`` lists built files (shared objects, cubins) whose sha256 goes into provenance.
    ``graphable`` says whether the call can be captured in a CUDA graph. Where it came from (``origin``)
    and every source file of its package go into provenance (``provenance.impl_sources``).
    """

    name: str
    bind: Callable[[Problem], Call]
    available: Callable[[], str | None] = lambda: None
    artifacts: Callable[[], list[str]] = lambda: []
    graphable: bool = True
    description: str = ""
    origin: dict = dataclasses.field(default_factory=dict)  # entry point and distribution (the registry's)


class Unsupported(Exception):
    """An impl cannot run this problem (shape, dtype, device); the reason is reported, not hidden."""


@dataclasses.dataclass
class Suite:
    """A problem family with its control impl; more impls arrive through entry points."""

    name: str
    device: str  # "cpu" or "cuda"
    description: str
    make_problems: Callable[[], list[Problem]]
    impls: list[Impl] = dataclasses.field(default_factory=list)
    control: str = "torch"
    ceiling_op: str | None = None  # the problem op that measures the bandwidth ceiling ("copy")
    defaults: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def impl(self, name: str) -> Impl:
        for impl in self.impls:
            if impl.name == name:
                return impl
        raise KeyError(f"suite {self.name!r} has no impl {name!r}; impls: {[i.name for i in self.impls]}")


def control_impl() -> Impl:
    """The control probe as an impl: each problem's own torch implementation."""
    return Impl(name="torch", bind=lambda problem: problem.control, description="torch eager")


def seed_for(*parts: Any) -> int:
    """A stable 63-bit seed from any parts (case name, round, validation index)."""
    import hashlib

    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def prod(shape) -> int:
    return math.prod(int(s) for s in shape)
