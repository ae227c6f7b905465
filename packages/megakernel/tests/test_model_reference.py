"""The model and its float64 reference: rounding points against an independent computation."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernellab.megakernel import model, stack
from kernellab.megakernel.compiler.ir import Block
from kernellab.megakernel.stack import Norm


def numpy_reference(x, w1, b1, w2, b2, activation):
    """Independent float64 computation: numpy, written from the model's definition."""
    x, w1, b1, w2, b2 = (t.double().numpy() for t in (x, w1, b1, w2, b2))
    pre = x @ w1.T + b1
    if activation == "relu":
        act = np.maximum(pre, 0.0)
    elif activation == "gelu":
        act = 0.5 * pre * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (pre + 0.044715 * pre**3)))
    else:
        act = pre / (1.0 + np.exp(-pre))
    hidden = act.astype(np.float16).astype(np.float64)  # the hidden's rounding point
    return x + hidden @ w2.T + b2


@pytest.mark.parametrize("activation", model.ACTIVATIONS)
@pytest.mark.parametrize("shape", [(1, 7, 13), (33, 32, 64), (5, 19, 37)])
def test_reference_matches_independent_float64(shape, activation):
    t = model.make_problem_tensors(model.Shape(*shape), seed=3)
    ours = model.reference(t["x"], t["w1"], t["b1"], t["w2"], t["b2"], activation)
    theirs = numpy_reference(t["x"], t["w1"], t["b1"], t["w2"], t["b2"], activation)
    assert ours.dtype == torch.float64
    np.testing.assert_allclose(ours.numpy(), theirs, rtol=1e-13, atol=1e-13)


def test_reference_rounds_the_hidden_to_fp16():
    """Without the rounding the answer moves by far more than float64 noise: the point is real."""
    t = model.make_problem_tensors(model.Shape(64, 48, 96), seed=1)
    f64 = torch.float64
    pre = t["x"].to(f64) @ t["w1"].to(f64).T + t["b1"].to(f64)
    unrounded = t["x"].to(f64) + model.activation_float64("gelu", pre) @ t["w2"].to(f64).T + t["b2"].to(f64)
    rounded = model.reference(t["x"], t["w1"], t["b1"], t["w2"], t["b2"], "gelu")
    assert (rounded - unrounded).abs().max() > 1e-6


@pytest.mark.parametrize("activation", model.ACTIVATIONS)
def test_activation_formulas_match_torch(activation):
    v = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    expected = model.torch_activation(activation)(v)
    torch.testing.assert_close(model.activation_float64(activation, v), expected, rtol=1e-12, atol=1e-12)


def test_problem_tensors_dtypes_scales_and_no_zeros():
    t = model.make_problem_tensors(model.Shape(256, 64, 128), seed=0)
    assert t["x"].dtype == t["w1"].dtype == t["w2"].dtype == torch.float16
    assert t["b1"].dtype == t["b2"].dtype == torch.float32
    assert t["w1"].shape == (128, 64) and t["w2"].shape == (64, 128)
    for name in ("w1", "w2", "b1", "b2"):
        assert t[name].abs().max() > 0
    y = model.reference(t["x"], t["w1"], t["b1"], t["w2"], t["b2"], "gelu")
    assert 0.3 < y.std() < 3.0  # O(1) outputs


def test_problem_tensors_are_reproducible_and_seed_dependent():
    a = model.make_problem_tensors(model.Shape(4, 8, 8), seed=5)
    b = model.make_problem_tensors(model.Shape(4, 8, 8), seed=5)
    c = model.make_problem_tensors(model.Shape(4, 8, 8), seed=6)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["x"], c["x"])


@given(rows=st.integers(1, 40), channels=st.integers(1, 96), hidden=st.integers(1, 200), seed=st.integers(0, 99))
def test_dyadic_data_makes_fp32_accumulation_exact(rows, channels, hidden, seed):
    """Any fp32 summation order gives the float64 answer on dyadic data (the fallback check's premise)."""
    t = model.make_dyadic_problem_tensors(model.Shape(rows, channels, hidden), seed=seed)
    truth = model.reference(t["x"], t["w1"], t["b1"], t["w2"], t["b2"], "relu")
    x, w1, b1, w2, b2 = (t[k].float() for k in ("x", "w1", "b1", "w2", "b2"))
    hidden_fp16 = torch.relu(x @ w1.T + b1).half().float()
    reversed_order = (hidden_fp16.flip(1) @ w2.flip(1).T) + b2 + x
    assert torch.equal(reversed_order.double(), truth)


def test_stack_reference_first_block_is_the_single_block_model():
    shape = model.Shape(9, 16, 24)
    t = model.make_problem_tensors(shape, seed=2)
    params = {k: t[k] for k in ("w1", "b1", "w2", "b2")}
    single = model.reference(t["x"], **params, activation="silu")
    stacked = stack.reference_stack(t["x"], [Block(16, 24, "silu")], [params])
    assert torch.equal(single, stacked)


def test_stack_reference_norm_and_stream_rounding():
    shape = model.Shape(6, 16, 24)
    x = model.make_input(shape.rows, shape.channels, seed=0)
    blocks = [model.make_block_parameters(16, 24, seed=1, norm=True), model.make_block_parameters(16, 40, seed=2)]
    got = stack.reference_stack(x, [Block(16, 24, "gelu", norm=Norm("rmsnorm", 1e-6)), Block(16, 40, "relu")], blocks)
    # by hand: block 0 normalizes the fp16 input, block 1 casts the fp32 stream to fp16
    f64 = torch.float64
    s = x.to(f64)
    u = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * blocks[0]["norm_weight"].to(f64)
    s = model.reference_block(u.half(), s, blocks[0]["w1"], blocks[0]["b1"], blocks[0]["w2"], blocks[0]["b2"], "gelu")
    s = s.float().to(f64)
    s = model.reference_block(s.half(), s, blocks[1]["w1"], blocks[1]["b1"], blocks[1]["w2"], blocks[1]["b2"], "relu")
    torch.testing.assert_close(got, s, rtol=1e-13, atol=1e-13)


def test_torch_forward_upcast_formulation_on_cpu():
    """The formulation torch falls back to without out_dtype runs anywhere and meets the tolerance."""
    shape = model.Shape(17, 40, 72)
    t = model.make_problem_tensors(shape, seed=4)
    y = torch.empty((shape.rows, shape.channels), dtype=torch.float32)
    model.torch_forward(t["x"], t["w1"], t["b1"], t["w2"], t["b2"], y, "gelu", "upcast-fp32")
    truth = model.reference(t["x"], t["w1"], t["b1"], t["w2"], t["b2"], "gelu")
    rtol, atol = model.tolerance_for(shape)
    torch.testing.assert_close(y.double(), truth, rtol=rtol, atol=atol)


def test_unknown_activation_and_bad_shapes_are_rejected():
    with pytest.raises(ValueError, match="activation must be one of"):
        model.check_activation("tanh")
    with pytest.raises(ValueError, match="rows must be an integer >= 1"):
        model.Shape(0, 4, 4)
    with pytest.raises(ValueError, match="formulation must be one of"):
        model.torch_forward(*[torch.zeros(1, 1)] * 6, "relu", "cublaslt")


def _fp32_kernel_hidden(t, activation, bias=True):
    """The hidden as a CUDA-core kernel makes it: a sequential fp32 sum (bias first), the fp32
    activation, one rounding to fp16. Returns (pre-activation, hidden)."""
    f32 = torch.float32
    products = t["x"].to(f32)[:, None, :] * t["w1"].to(f32)[None, :, :]  # exact: fp16 x fp16 fits fp32
    pre = t["b1"].expand(products.shape[:2]).clone() if bias else torch.zeros(products.shape[:2])
    for k in range(products.shape[-1]):
        pre = pre + products[..., k]
    return pre, model.torch_activation(activation)(pre).to(torch.float16)


def _fp32_kernel_output(t, hidden):
    f32 = torch.float32
    return t["x"].to(f32) + hidden.to(f32) @ t["w2"].to(f32).T + t["b2"]


@pytest.mark.parametrize("channels", [7, 300, 2048])
def test_sequential_fp32_sum_stays_well_within_the_accumulation_spread(channels):
    t = model.make_problem_tensors(model.Shape(48, channels, 24), seed=channels)
    pre, _ = _fp32_kernel_hidden(t, "relu")
    f64 = torch.float64
    u, w, b = t["x"].to(f64), t["w1"].to(f64), t["b1"].to(f64)
    exact = u @ w.T + b
    terms = channels + 1
    spread = model.ACCUMULATION_SPREAD * min(terms, 2 * math.sqrt(terms)) * (u.abs() @ w.abs().T + b.abs())
    assert float(((pre.to(f64) - exact).abs() / spread).max()) < 0.5


@pytest.mark.parametrize("activation", model.ACTIVATIONS)
def test_a_flipped_hidden_rounding_passes_only_through_the_slack(activation):
    """hidden = 1: a hidden value that a correct kernel may round either way moves a whole row by
    2^-10 |h| |W2|, beyond 1e-3; the slack admits exactly that flip."""
    from kernellab.harness import validate

    t = model.make_problem_tensors(model.Shape(400, 300, 1), seed=5)
    truth = model.reference(t["x"], t["w1"], t["b1"], t["w2"], t["b2"], activation)
    slack = model.hidden_rounding_slack(t["x"], t["w1"], t["b1"], t["w2"], activation)
    _, hidden = _fp32_kernel_hidden(t, activation)
    assert validate.compare({"y": _fp32_kernel_output(t, hidden)}, {"y": truth}, 1e-3, 1e-3, {"y": slack})["passed"]
    # round the most consequential ambiguous hidden value to its other fp16 neighbour
    row = int(slack.amax(1).argmax())
    h = float(hidden[row, 0])
    up, down = (torch.nextafter(hidden[row, 0], torch.tensor(d, dtype=torch.float16)) for d in (1e4, -1e4))
    f64 = torch.float64
    pre = t["x"][row].to(f64) @ t["w1"][0].to(f64) + t["b1"][0].to(f64)
    act = float(model.activation_float64(activation, pre))
    flipped = hidden.clone()
    flipped[row, 0] = up if abs(float(up) - act) < abs(float(down) - act) else down
    assert float(flipped[row, 0]) != h
    y = _fp32_kernel_output(t, flipped)
    assert not validate.compare({"y": y}, {"y": truth}, 1e-3, 1e-3)["passed"]
    assert validate.compare({"y": y}, {"y": truth}, 1e-3, 1e-3, {"y": slack})["passed"]


@pytest.mark.parametrize("shape", [(165, 300, 1), (64, 96, 2048)])
def test_the_slack_does_not_hide_a_wrong_answer(shape):
    """The slack is a few ulp of the hidden times |W2|: a kernel that drops b1 still fails."""
    from kernellab.harness import validate

    t = model.make_problem_tensors(model.Shape(*shape), seed=2)
    truth = model.reference(t["x"], t["w1"], t["b1"], t["w2"], t["b2"], "gelu")
    slack = model.hidden_rounding_slack(t["x"], t["w1"], t["b1"], t["w2"], "gelu")
    assert float(slack.max()) < 1e-2
    _, hidden = _fp32_kernel_hidden(t, "gelu", bias=False)
    assert not validate.compare({"y": _fp32_kernel_output(t, hidden)}, {"y": truth}, 1e-3, 1e-3, {"y": slack})["passed"]
