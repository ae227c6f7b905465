"""The residual MLP: parameters, its float64 reference and its plain-torch formulation.

One block is ``y = s + W2 · act(W1 · u + b1) + b2`` applied to each row, where ``u`` is the fp16
operand of the first GEMM and ``s`` the residual stream. For the single-block model ``u = s = x``
(fp16). Deeper models stack blocks, optionally with an RMSNorm before each: then
``u = fp16(rmsnorm(s) * g)`` and the stream ``s`` stays fp32 between blocks.

Rounding points (the kernels round exactly here, the reference too):
- the GEMM operands ``u``, ``W1``, ``W2`` and the hidden ``h`` are fp16;
- ``h = fp16(act(u W1^T + b1))``: the pre-activation is accumulated in fp32, the activation
  applied in fp32, and only then rounded to fp16;
- biases, the second GEMM's accumulation and the output are fp32.
"""

from __future__ import annotations

import dataclasses
import math

ACTIVATIONS = ("relu", "gelu", "silu")
"""``gelu`` is the tanh approximation, 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)))."""

ACTIVATION_CODES = {name: code for code, name in enumerate(ACTIVATIONS)}
"""The runtime code the kernels take for each activation (one compiled kernel serves all three)."""

GELU_TANH_SCALE = math.sqrt(2.0 / math.pi)
GELU_TANH_CUBIC = 0.044715
DEFAULT_NORM_EPS = 1e-6


def check_activation(name: str) -> str:
    if name not in ACTIVATION_CODES:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {name!r}")
    return name


def check_positive_int(name: str, value) -> int:
    """``value`` itself when it is an integer >= 1 (not a bool, not a float), else a ValueError naming ``name``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class Shape:
    """One residual-MLP problem: ``rows`` independent rows of ``channels``, a ``hidden`` layer."""

    rows: int
    channels: int
    hidden: int

    def __post_init__(self):
        for field in ("rows", "channels", "hidden"):
            check_positive_int(field, getattr(self, field))

    def as_dict(self) -> dict[str, int]:
        return {"rows": self.rows, "channels": self.channels, "hidden": self.hidden}

    def __str__(self) -> str:
        return f"{self.rows}x{self.channels}x{self.hidden}"


def seeded_generator(seed: int, device):
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(int(seed) & 0x7FFF_FFFF_FFFF_FFFF)
    return g


def scaled_randn(shape, gen, device, scale: float, shift: float = 0.0):
    import torch

    t = torch.randn(tuple(shape), generator=gen, device=device, dtype=torch.float32)
    return t.mul_(scale).add_(shift)


def make_block_parameters(channels: int, hidden: int, *, seed: int, device="cpu", norm: bool = False) -> dict:
    """Random weights scaled so that every stage is O(1): W1 ~ N(0, 1/C), W2 ~ N(0, 1/H), biases
    ~ N(0, 0.1^2), the norm weight ~ 1 + N(0, 0.1^2). Never zeros (a zero weight hides bugs)."""
    import torch

    g = seeded_generator(seed, device)
    params = {
        "w1": scaled_randn((hidden, channels), g, device, 1.0 / math.sqrt(channels)).to(torch.float16),
        "b1": scaled_randn((hidden,), g, device, 0.1),
        "w2": scaled_randn((channels, hidden), g, device, 1.0 / math.sqrt(hidden)).to(torch.float16),
        "b2": scaled_randn((channels,), g, device, 0.1),
    }
    if norm:
        params["norm_weight"] = scaled_randn((channels,), g, device, 0.1, 1.0)
    return params


def make_input(rows: int, channels: int, *, seed: int, device="cpu"):
    """x ~ N(0, 1) rounded to fp16."""
    import torch

    return scaled_randn((rows, channels), seeded_generator(seed, device), device, 1.0).to(torch.float16)


def make_problem_tensors(shape: Shape, *, seed: int, device="cpu") -> dict:
    """Input and parameters of the single-block model, all from one seed."""
    params = make_block_parameters(shape.channels, shape.hidden, seed=seed + 1, device=device)
    return {"x": make_input(shape.rows, shape.channels, seed=seed, device=device), **params}


def make_dyadic_problem_tensors(shape: Shape, *, seed: int, device="cpu") -> dict:
    """Inputs and weights on coarse dyadic grids (x = a/8, W1 = b/256, W2 = c/256, biases d/2048
    with small nonzero integers a, b, c) so that every product and partial sum of both GEMMs is
    exact in fp32 for channels up to 1024 and outputs below 32, whatever the summation order. A
    correct kernel then matches the float64 reference up to the last fp32 rounding of y (in
    practice exactly), which makes tight checks meaningful (the compiler's fallback check)."""
    import torch

    g = seeded_generator(seed, device)

    def grid(shape_, low, high, scale, dtype, nonzero=False):
        t = torch.randint(low, high + 1, shape_, generator=g, device=device)
        if nonzero:
            sign = torch.randint(0, 2, shape_, generator=g, device=device) * 2 - 1
            t = t.abs().clamp_min(1) * sign
        return (t.to(torch.float32) / scale).to(dtype)

    c, h = shape.channels, shape.hidden
    f16, f32 = torch.float16, torch.float32
    return {"x": grid((shape.rows, c), -16, 16, 8, f16), "w1": grid((h, c), 1, 8, 256, f16, nonzero=True),
            "b1": grid((h,), -64, 64, 2048, f32), "w2": grid((c, h), 1, 2, 256, f16, nonzero=True),
            "b2": grid((c,), -64, 64, 2048, f32)}


# ---- float64 reference --------------------------------------------------------------------------

def activation_float64(name: str, v):
    """The activation in float64 (the same formula the kernels evaluate in fp32)."""
    import torch

    check_activation(name)
    if name == "relu":
        return torch.clamp_min(v, 0.0)
    if name == "gelu":
        return 0.5 * v * (1.0 + torch.tanh(GELU_TANH_SCALE * (v + GELU_TANH_CUBIC * v * v * v)))
    return v / (1.0 + torch.exp(-v))


def _round_fp16(t):
    import torch

    return t.to(torch.float16).to(torch.float64)


def reference_block(u, s, w1, b1, w2, b2, activation: str):
    """One block in float64 from the (already rounded) fp16 operand ``u`` and stream ``s``."""
    import torch

    f64 = torch.float64
    pre = u.to(f64) @ w1.to(f64).T + b1.to(f64)
    h = _round_fp16(activation_float64(activation, pre))
    return s.to(f64) + h @ w2.to(f64).T + b2.to(f64)


def reference(x, w1, b1, w2, b2, activation: str):
    """The single-block model in float64: ``x + W2 · fp16(act(W1 · x + b1)) + b2``."""
    return reference_block(x, x, w1, b1, w2, b2, activation)


ACCUMULATION_SPREAD = 2.0 ** -24
"""How far an fp32 sum of n terms may sit from the exact sum, as a multiple of min(n, 2 sqrt(n)) times
the sum of the terms' magnitudes. Each addition errs by at most 2^-24 of its partial sum, and over a
long sum those errors add like a random walk (sqrt(n), not n). Sequential fp32 sums, the longest chain
a kernel uses, stay under 0.4 of this bound (``tests/test_model_reference.py`` checks under 0.5)."""
ACTIVATION_UNIT = 2.0 ** -20
"""Error bound of the fp32 GELU and SiLU, relative to |v| + |act(v)|: the kernels compute both as v sigmoid(z)
with the hardware's exp2 and reciprocal approximations (``engines.common.sigmoid``: within half of this),
and torch's fp32 forms a few ulp of tanh and exp and the cancellation in 1 + tanh for large negative v. ReLU
is exact."""


FLIP_SIGMAS = 4.0
"""Flips of many hidden values move an output by a sum whose signs are W2's, which are independent of
where flips happen; the slack takes the smaller of the aligned sum and this many standard deviations
of that random sum (with one flip the two agree)."""


def hidden_rounding_slack(u, w1, b1, w2, activation: str):
    """Per output of one block, how far a correct kernel may be from ``reference_block`` because
    the fp16 rounding of a hidden value is not fixed by the float64 reference.

    The kernel's fp32 pre-activation is within ``ACCUMULATION_SPREAD`` min(n, 2 sqrt(n))
    (|u| |W1| + |b1|) of the float64 one (n = channels + 1 terms), and its activation adds
    ``ACTIVATION_UNIT``. Where that interval holds an fp16 rounding midpoint, the hidden value may
    round to either neighbour, and every output of the row may move by that gap times |W2| (summed
    over such values as ``FLIP_SIGMAS`` says). Few values are that close (a few per cent), but when
    hidden is small one of them moves an output by 2^-10 |h| |W2| with |W2| of order 1: beyond the
    1e-3 tolerance."""
    import torch

    f64 = torch.float64
    u64, w64, b64 = u.to(f64), w1.to(f64), b1.to(f64)
    pre = u64 @ w64.T + b64
    terms = u.shape[-1] + 1
    spread = ACCUMULATION_SPREAD * min(terms, 2 * math.sqrt(terms)) * (u64.abs() @ w64.abs().T + b64.abs())
    values = torch.stack([activation_float64(activation, pre + k * spread) for k in (-1, 0, 1)])
    margin = 0.0 if activation == "relu" else ACTIVATION_UNIT * (pre.abs() + spread + values.abs().amax(0))
    gap = _round_fp16(values.amax(0) + margin) - _round_fp16(values.amin(0) - margin)
    w2_64 = w2.to(f64)
    every_flip_aligned = gap @ w2_64.abs().T
    random_signs = FLIP_SIGMAS * torch.sqrt(gap.square() @ w2_64.square().T)
    return torch.minimum(every_flip_aligned, random_signs)


# ---- plain torch ------------------------------------------------------------------------------

def torch_activation(name: str):
    """The activation as torch applies it in fp32 (GELU with the tanh approximation)."""
    import torch.nn.functional as F

    check_activation(name)
    if name == "relu":
        return F.relu
    if name == "gelu":
        return lambda v: F.gelu(v, approximate="tanh")
    return F.silu


TORCH_FORMULATIONS = ("addmm-out-dtype", "mm-out-dtype", "upcast-fp32")
"""How the torch engines honour the rounding points, fastest first:
- ``addmm-out-dtype``: cuBLAS fp16 GEMMs with fp32 output (``torch.addmm(..., out_dtype=float32)``),
  bias added in the GEMM, activation in fp32, one cast to fp16;
- ``mm-out-dtype``: the same with the bias added by a separate op;
- ``upcast-fp32``: operands upcast to fp32 and fp32 GEMMs (slow; only where out_dtype is missing)."""


def torch_forward(x, w1, b1, w2, b2, y, activation: str, formulation: str = "addmm-out-dtype"):
    """The model as a torch user would write it, writing into ``y`` (fp32) with the same rounding
    points as the kernels (the hidden is rounded to fp16 after the fp32 activation). The same
    function runs eagerly (torch-cublas: five kernels) and under torch.compile (torch-compile)."""
    import torch

    act = torch_activation(activation)
    f32, f16 = torch.float32, torch.float16
    if formulation == "addmm-out-dtype":
        h = act(torch.addmm(b1, x, w1.t(), out_dtype=f32)).to(f16)
        out = torch.addmm(b2, h, w2.t(), out_dtype=f32)
    elif formulation == "mm-out-dtype":
        h = act(torch.mm(x, w1.t(), out_dtype=f32) + b1).to(f16)
        out = torch.mm(h, w2.t(), out_dtype=f32) + b2
    elif formulation == "upcast-fp32":
        h = act(torch.addmm(b1, x.to(f32), w1.to(f32).t())).to(f16)
        out = torch.addmm(b2, h.to(f32), w2.to(f32).t())
    else:
        raise ValueError(f"formulation must be one of {TORCH_FORMULATIONS}, got {formulation!r}")
    return torch.add(out, x, out=y)


def tolerance_for(shape: Shape) -> tuple[float, float]:
    """(rtol, atol) for the fp32 output against the float64 reference.

    Two effects separate a correct kernel from the reference: fp32 accumulation over K terms
    (relative error about 2^-24 sqrt(K), below 1e-5 here) and, where the fp32 and float64
    pre-activations straddle an fp16 rounding midpoint, a hidden value one fp16 ulp apart. The
    first is what rtol = atol = 1e-3 covers, with a wide margin; the second is bounded per output
    by ``hidden_rounding_slack`` and added where it occurs (it reaches 1e-3 only when hidden is
    small). Any indexing, predication or rounding-point bug moves outputs by O(0.1) and fails."""
    del shape  # the bound above holds for every shape we serve
    return 1e-3, 1e-3

