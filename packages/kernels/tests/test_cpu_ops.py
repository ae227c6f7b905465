"""The native CPU kernels against the float64 references, as the correctness protocol asks.

Every call writes into NaN-poisoned buffers (an unwritten element fails), inputs are cloned and
compared bit for bit afterwards (a kernel must not write them), and shapes, strides, scales and
NaN/inf rows are drawn by hypothesis.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernellab.harness.suites import reference
from kernellab.kernels import cpu

RTOL, ATOL = 1e-5, 1e-5
NAN, INF = float("nan"), float("inf")

# Odd, prime and SIMD-edge sizes, plus anything in range.
SIZES = st.one_of(st.sampled_from([1, 2, 3, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 511, 512, 513, 1537]),
                  st.integers(1, 700))
ROWS = st.one_of(st.sampled_from([1, 2, 7, 8, 9, 128]), st.integers(1, 64))
SCALES = st.sampled_from([1e-3, 0.1, 1.0, 3.0, 100.0, 1e3])
SEEDS = st.integers(0, 2**31 - 1)


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def strided(shape, g, *, scale=1.0, shift=0.0, pad=0):
    """randn data of ``shape`` whose rows are ``pad`` elements longer than the row (stride != n)."""
    *lead, n = shape
    return (torch.randn(*lead, n + pad, generator=g) * scale + shift)[..., :n]


def poisoned(shape, pad=0):
    """A NaN-filled output; with pad > 0 its rows are strided and the gaps must stay NaN."""
    *lead, n = shape
    return torch.full((*lead, n + pad), NAN)[..., :n]


def assert_gaps_untouched(out) -> None:
    """The padding between the rows of a strided output (a slice of a wider buffer) is never written."""
    if out._base is not None:
        assert out._base[..., out.shape[-1]:].isnan().all(), "kernel wrote between the rows of its output"


def assert_close(actual, expected, rtol=RTOL, atol=ATOL) -> None:
    """Within tolerance of the float64 truth; NaN exactly where the truth is NaN, inf exactly equal. atol may
    be a tensor broadcast against the values (a bound per row)."""
    actual, expected = actual.to(torch.float64), expected.to(torch.float64)
    if not isinstance(atol, torch.Tensor):
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
        return
    assert torch.equal(actual.isnan(), expected.isnan()), "NaN where the truth has none, or none where it has"
    finite = expected.isfinite()
    assert torch.equal(actual[~finite & ~expected.isnan()], expected[~finite & ~expected.isnan()]), "infs differ"
    allowed = (atol + rtol * expected.abs()).expand_as(actual)
    bad = (finite & ~((actual - expected).abs() <= allowed)).nonzero()
    assert not len(bad), (f"{len(bad)} elements off, first at {tuple(bad[0].tolist())}: {actual[tuple(bad[0])]} vs "
                          f"{expected[tuple(bad[0])]} (allowed {allowed[tuple(bad[0])]})")


def snapshot(*tensors):
    return [None if t is None else t.clone() for t in tensors]


def assert_unchanged(before, after) -> None:
    for b, a in zip(before, after, strict=True):
        if b is not None:
            assert torch.equal(b.view(torch.int32), a.contiguous().view(torch.int32)), "kernel wrote an input"


def inject(x, kind: str, g) -> None:
    """Put NaN/inf into some rows of x in place (rows are the last dim)."""
    if kind == "none":
        return
    rows = x.view(-1, x.shape[-1])
    r = int(torch.randint(rows.shape[0], (1,), generator=g))
    c = int(torch.randint(rows.shape[1], (1,), generator=g))
    if kind == "nan":
        rows[r, c] = NAN
    elif kind == "+inf":
        rows[r, c] = INF
    elif kind == "-inf":
        rows[r, c] = -INF
    elif kind == "-inf row":
        rows[r, :] = -INF


SPECIALS = st.sampled_from(["none", "none", "nan", "+inf", "-inf", "-inf row"])


@st.composite
def row_shapes(draw):
    n = draw(SIZES)
    if draw(st.booleans()):
        return (draw(ROWS), n)
    return (draw(st.integers(1, 5)), draw(st.integers(1, 9)), n)  # leading dims to flatten


@settings(deadline=None)
@given(shape=row_shapes(), pad=st.sampled_from([0, 0, 1, 5]), out_pad=st.sampled_from([0, 0, 3]), scale=SCALES,
       special=SPECIALS, seed=SEEDS)
def test_softmax_matches_reference(shape, pad, out_pad, scale, special, seed):
    g = generator(seed)
    x = strided(shape, g, scale=scale, pad=pad)
    inject(x, special, g)
    out = poisoned(shape, out_pad)
    before = snapshot(x)
    y = cpu.softmax(x, out=out)
    assert y is out
    assert_unchanged(before, [x])
    assert_close(y, reference.softmax(x))
    assert_close(y, torch.softmax(x, dim=-1))  # NaN/inf semantics as torch's own fp32 kernel
    assert_gaps_untouched(out)


@settings(deadline=None)
@given(shape=row_shapes(), pad=st.sampled_from([0, 0, 2]), out_pad=st.sampled_from([0, 0, 3]), scale=SCALES,
       use_weight=st.booleans(), use_residual=st.booleans(), eps=st.sampled_from([1e-6, 1e-5, 0.1]),
       special=SPECIALS, seed=SEEDS)
def test_rmsnorm_matches_reference(shape, pad, out_pad, scale, use_weight, use_residual, eps, special, seed):
    g = generator(seed)
    x = strided(shape, g, scale=scale, pad=pad)
    inject(x, special, g)
    n = shape[-1]
    weight = torch.randn(n, generator=g) * 0.5 + 1.0 if use_weight else None
    residual = strided(shape, g, scale=scale, pad=pad) if use_residual else None
    out, h_out = poisoned(shape, out_pad), poisoned(shape, out_pad)
    before = snapshot(x, weight, residual)
    if use_residual:
        y, h = cpu.rmsnorm(x, weight, eps, residual, out=out, residual_out=h_out)
        assert h is h_out
    else:
        y = cpu.rmsnorm(x, weight, eps, out=out)
    assert y is out
    assert_unchanged(before, [x, weight, residual])
    y_ref, h_ref = reference.rmsnorm(x, weight, eps, residual)
    assert_close(y, y_ref)
    if use_residual:
        assert_close(h, h_ref)
        assert_gaps_untouched(h_out)
    assert_gaps_untouched(out)


@settings(deadline=None)
@given(shape=row_shapes(), pad=st.sampled_from([0, 0, 2]), out_pad=st.sampled_from([0, 0, 3]), scale=SCALES,
       offset=st.sampled_from([0.0, 0.0, 1.0, 30.0, 1e3]), use_weight=st.booleans(), use_bias=st.booleans(),
       eps=st.sampled_from([1e-5, 1e-3]), special=SPECIALS, seed=SEEDS)
def test_layernorm_matches_reference(shape, pad, out_pad, scale, offset, use_weight, use_bias, eps, special, seed):
    g = generator(seed)
    # offset is relative to the spread: large offsets defeat a naive fp32 mean/variance
    x = strided(shape, g, scale=scale, shift=offset * scale, pad=pad)
    inject(x, special, g)
    n = shape[-1]
    weight = torch.randn(n, generator=g) * 0.5 + 1.0 if use_weight else None
    bias = torch.randn(n, generator=g) * 0.5 if use_bias else None
    out = poisoned(shape, out_pad)
    before = snapshot(x, weight, bias)
    y = cpu.layernorm(x, weight, bias, eps, out=out)
    assert y is out
    assert_unchanged(before, [x, weight, bias])
    assert_close(y, reference.layernorm(x, weight, bias, eps))
    assert_gaps_untouched(out)


GEMM_SIZES = st.one_of(st.sampled_from([1, 2, 7, 8, 9, 31, 32, 33, 97, 128, 513]), st.integers(1, 160))
LINEAR_SPECIALS = st.sampled_from(["none", "none", "nan", "+inf", "-inf"])


def linear_atol(reduction: int, *scales: float) -> float:
    """atol 1e-5 * sqrt(K) for unit-scale operands, scaled with them."""
    return ATOL * math.sqrt(reduction) * math.prod(scales)


@settings(deadline=None)
@given(m=GEMM_SIZES, k=GEMM_SIZES, n=GEMM_SIZES, pad=st.sampled_from([0, 0, 3]), use_bias=st.booleans(),
       sx=SCALES, sw=st.sampled_from([0.1, 1.0, 10.0]), special=LINEAR_SPECIALS, seed=SEEDS)
def test_linear_forward_matches_reference(m, k, n, pad, use_bias, sx, sw, special, seed):
    g = generator(seed)
    x = strided((m, k), g, scale=sx, pad=pad)
    inject(x, special, g)
    weight = strided((n, k), g, scale=sw / math.sqrt(k), pad=pad)
    bias = torch.randn(n, generator=g) if use_bias else None
    out = poisoned((m, n), pad)
    before = snapshot(x, weight, bias)
    y = cpu.linear_forward(x, weight, bias, out=out)
    assert y is out
    assert_unchanged(before, [x, weight, bias])
    assert_close(y, reference.linear_forward(x, weight, bias), atol=linear_atol(k, sx, sw / math.sqrt(k)) + ATOL)
    assert_gaps_untouched(out)


@settings(deadline=None)
@given(m=GEMM_SIZES, k=GEMM_SIZES, n=GEMM_SIZES, pad=st.sampled_from([0, 0, 3]), sx=SCALES,
       sdy=st.sampled_from([0.1, 1.0, 10.0]), special=LINEAR_SPECIALS, seed=SEEDS)
def test_linear_backward_matches_reference_and_overwrites(m, k, n, pad, sx, sdy, special, seed):
    g = generator(seed)
    x = strided((m, k), g, scale=sx, pad=pad)
    weight = strided((n, k), g, scale=1.0 / math.sqrt(k), pad=pad)
    dy = strided((m, n), g, scale=sdy, pad=pad)
    inject(dy, special, g)
    dx, dw, db = poisoned((m, k), pad), poisoned((n, k), pad), poisoned((n,))
    before = snapshot(x, weight, dy)
    dx_ref, dw_ref, db_ref = reference.linear_backward(x, weight, dy)
    for _ in range(2):  # the second call into the same buffers must overwrite, not accumulate
        got = cpu.linear_backward(x, weight, dy, dx=dx, dweight=dw, dbias=db)
        assert got[0] is dx and got[1] is dw and got[2] is db
        assert_close(dx, dx_ref, atol=linear_atol(n, sdy, 1.0 / math.sqrt(k)))
        assert_close(dw, dw_ref, atol=linear_atol(m, sdy, sx))
        assert_close(db, db_ref, atol=linear_atol(m, sdy))
    assert_unchanged(before, [x, weight, dy])
    assert_gaps_untouched(dx)
    assert_gaps_untouched(dw)


def test_results_are_fresh_tensors_without_out():
    g = generator(0)
    x = torch.randn(2, 3, 40, generator=g)
    w, b = torch.randn(40, generator=g), torch.randn(40, generator=g)
    assert_close(cpu.softmax(x), reference.softmax(x))
    assert_close(cpu.layernorm(x, w, b), reference.layernorm(x, w, b))
    y, h = cpu.rmsnorm(x, w, 1e-6, x)
    y_ref, h_ref = reference.rmsnorm(x, w, 1e-6, x)
    assert_close(y, y_ref)
    assert_close(h, h_ref)
    weight = torch.randn(24, 40, generator=g)
    xm = x.reshape(6, 40)
    assert_close(cpu.linear_forward(xm, weight), reference.linear_forward(xm, weight), atol=1e-4)
    dy = torch.randn(6, 24, generator=g)
    for got, want in zip(cpu.linear_backward(xm, weight, dy), reference.linear_backward(xm, weight, dy),
                         strict=True):
        assert_close(got, want, atol=1e-4)


def test_inputs_whose_rows_share_no_stride_are_read_correctly():
    # x[:, ::2] of a 3-D tensor cannot be flattened to rows with one stride: it is copied, not misread
    g = generator(1)
    x = torch.randn(3, 7, 33, generator=g)[:, ::2]
    with pytest.raises(RuntimeError):
        x.view(-1, 33)
    assert_close(cpu.softmax(x), reference.softmax(x))
    assert_close(cpu.layernorm(x), reference.layernorm(x))


def test_large_problems_take_the_threaded_paths():
    """Past the size where work is split across threads; results are bitwise the same for any split."""
    g = generator(2)
    x = torch.randn(300, 1537, generator=g)
    w = torch.randn(1537, generator=g)
    # k and m beyond one 512-deep block: C tiles are reloaded and accumulated, db summed over blocks
    a = torch.randn(1100, 600, generator=g)
    weight = torch.randn(130, 600, generator=g) / math.sqrt(600)
    dy = torch.randn(1100, 130, generator=g)

    def run():
        return [cpu.softmax(x), cpu.rmsnorm(x, w), cpu.layernorm(x, w), cpu.linear_forward(a, weight),
                *cpu.linear_backward(a, weight, dy)]

    results = same_on_one_and_two_threads(run)
    assert_close(results[0], reference.softmax(x))
    assert_close(results[1], reference.rmsnorm(x, w)[0])
    assert_close(results[2], reference.layernorm(x, w))
    assert_close(results[3], reference.linear_forward(a, weight), atol=linear_atol(600, 1.0))
    dx_ref, dw_ref, db_ref = reference.linear_backward(a, weight, dy)
    assert_close(results[4], dx_ref, atol=linear_atol(130, 1.0 / math.sqrt(600)))
    assert_close(results[5], dw_ref, atol=linear_atol(1100, 1.0))
    assert_close(results[6], db_ref, atol=linear_atol(1100, 1.0))


def test_layernorm_keeps_precision_under_a_large_offset():
    """Centring on a pivot keeps fp32 LayerNorm at 1e-5 where a one-pass fp32 mean would not."""
    g = generator(3)
    x = torch.randn(16, 1537, generator=g) + 1e5
    assert_close(cpu.layernorm(x), reference.layernorm(x))


def test_row_ops_may_write_over_their_input():
    """out=x works in place: every pass reads an element before any pass writes it."""
    g = generator(4)
    w, b = torch.randn(37, generator=g), torch.randn(37, generator=g)
    x = torch.randn(5, 37, generator=g)
    expected = reference.softmax(x)
    assert cpu.softmax(x, out=x) is x
    assert_close(x, expected)
    x = torch.randn(5, 37, generator=g) + 10.0
    expected = reference.layernorm(x, w, b)
    assert cpu.layernorm(x, w, b, out=x) is x
    assert_close(x, expected)
    x, r = torch.randn(5, 37, generator=g), torch.randn(5, 37, generator=g)
    y_ref, h_ref = reference.rmsnorm(x, w, 1e-6, r)
    y, h = cpu.rmsnorm(x, w, 1e-6, r, out=x, residual_out=r)
    assert y is x and h is r
    assert_close(y, y_ref)
    assert_close(h, h_ref)


def test_concurrent_callers_do_not_share_scratch():
    """The GIL is released during a call; callers on other threads each get their own workspace."""
    from concurrent.futures import ThreadPoolExecutor

    g = generator(5)
    cases = [(torch.randn(64 + 8 * i, 300, generator=g), torch.randn(96 + 32 * i, 300, generator=g) / 20)
             for i in range(4)]
    expected = [cpu.linear_forward(x, w) for x, w in cases]
    with ThreadPoolExecutor(4) as pool:
        for _ in range(5):
            results = list(pool.map(lambda case: cpu.linear_forward(*case), cases))
            for got, want in zip(results, expected, strict=True):
                assert torch.equal(got, want)


def test_parameters_and_leading_dims_take_the_common_path():
    """nn.Parameter weights and N-d contiguous inputs are the everyday case: right answers there too."""
    g = generator(6)
    x = torch.randn(2, 3, 5, 48, generator=g)
    w = torch.nn.Parameter(torch.randn(48, generator=g))
    b = torch.nn.Parameter(torch.randn(48, generator=g))
    with torch.no_grad():
        assert_close(cpu.layernorm(x, w, b), reference.layernorm(x, w, b))
        assert_close(cpu.rmsnorm(x, w), reference.rmsnorm(x, w)[0])
        lw = torch.nn.Parameter(torch.randn(7, 48, generator=g))
        xm = x.reshape(-1, 48)
        assert_close(cpu.linear_forward(xm, lw, b[:7]), reference.linear_forward(xm, lw, b[:7]), atol=1e-4)


def test_norms_of_a_four_million_element_row_stay_near_float64():
    """A 4,194,301-element row: summed in fp32 alone, the statistics drift to ~2e-5 from float64 (torch
    stays at ~6e-7); the blocked sums keep both norms within 2e-6, NaN-poisoned outputs fully written."""
    g = generator(7)
    n = 4_194_301
    x = torch.randn(1, n, generator=g) + 1.0
    w, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
    y = cpu.layernorm(x, w, b, out=poisoned((1, n)))
    torch.testing.assert_close(y.double(), reference.layernorm(x, w, b), rtol=0, atol=2e-6)
    y = cpu.rmsnorm(x, w, out=poisoned((1, n)))
    torch.testing.assert_close(y.double(), reference.rmsnorm(x, w)[0], rtol=0, atol=2e-6)


@pytest.mark.parametrize("m", [1, 3, 8, 9, 16])
def test_decode_rows_take_the_skinny_paths_bitwise_alike_on_any_split(m):
    """Few rows of x (up to 8) stream W instead of packing it; threads split W's rows
    (forward) or its columns (backward), so every result is the same whatever the split."""
    g = generator(m)
    x = torch.randn(m, 515, generator=g)
    weight = torch.randn(260, 515, generator=g) / math.sqrt(515)  # past the two-thread size, odd K, N % 4 == 0
    bias, dy = torch.randn(260, generator=g), torch.randn(m, 260, generator=g)

    def run():
        return [cpu.linear_forward(x, weight, bias), *cpu.linear_backward(x, weight, dy)]

    results = same_on_one_and_two_threads(run)
    assert_close(results[0], reference.linear_forward(x, weight, bias), atol=linear_atol(515, 1.0 / math.sqrt(515)))
    for got, want, reduction in zip(results[1:], reference.linear_backward(x, weight, dy), (260, m, m), strict=True):
        assert_close(got, want, atol=linear_atol(reduction, 1.0))


def same_on_one_and_two_threads(run):
    """``run()``'s results with two threads, checked bitwise equal to its results with one."""
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        results = run()
        torch.set_num_threads(1)
        serial = run()
    finally:
        torch.set_num_threads(previous)
    for got, want in zip(results, serial, strict=True):
        assert torch.equal(got, want)
    return results


@pytest.mark.parametrize("m", [1, 4, 8, 9, 40])
@pytest.mark.parametrize("layout", ["aligned", "offset", "row stride 65"])
def test_weight_gradient_with_and_without_streaming_stores(m, layout):
    """dW goes out with streaming stores when it is aligned for them (a fresh tensor with K % 16 == 0) and
    with plain stores otherwise (a buffer one float off, or rows 65 floats apart): the same truth, every
    element written, both on the skinny path (m <= 8) and the GEMM's, whose edge tiles (N = 40 is not
    a whole number of 32-column tiles) never stream."""
    g = generator(m)
    k, n = 64, 40
    x, weight, dy = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) / 8, torch.randn(m, n, generator=g)
    if layout == "aligned":
        dw = torch.full((n, k), NAN)
    elif layout == "offset":
        dw = torch.full((n * k + 1,), NAN)[1:].view(n, k)
    else:
        dw = poisoned((n, k), pad=1)
    dx, db = cpu.linear_backward(x, weight, dy, dweight=dw)[::2]
    for got, want, reduction in zip((dx, dw, db), reference.linear_backward(x, weight, dy), (n, m, m), strict=True):
        assert_close(got, want, atol=linear_atol(reduction, 1.0))
    if layout == "row stride 65":
        assert_gaps_untouched(dw)
