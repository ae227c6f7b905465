"""Bad arguments to the native CPU kernels fail before any work, with an error naming the argument."""

from __future__ import annotations

import pytest
import torch

from kernellab.kernels import cpu


def f32(*shape):
    return torch.randn(*shape)


X, W, B = f32(4, 8), f32(8), f32(8)
LW, LB, DY = f32(5, 8), f32(5), f32(4, 5)

BAD_CALLS = {
    # softmax
    "softmax non-tensor": (lambda: cpu.softmax([[1.0, 2.0]]), TypeError, r"x must be a torch\.Tensor"),
    "softmax dtype": (lambda: cpu.softmax(X.double()), TypeError, r"x must have dtype in \(float32\)"),
    "softmax int dtype": (lambda: cpu.softmax(torch.ones(2, 3, dtype=torch.int32)), TypeError, r"x must have dtype"),
    "softmax meta device": (lambda: cpu.softmax(torch.empty(2, 3, device="meta")), ValueError,
                            r"x must be a CPU tensor"),
    "softmax 0-d": (lambda: cpu.softmax(torch.tensor(1.0)), ValueError, r"x must have at least 1 dimension"),
    "softmax empty rows": (lambda: cpu.softmax(f32(0, 8)), ValueError, r"x must not be empty"),
    "softmax empty row": (lambda: cpu.softmax(f32(3, 0)), ValueError, r"x must not be empty"),
    "softmax column stride": (lambda: cpu.softmax(f32(8, 4).t()), ValueError, r"x must be contiguous in its last"),
    "softmax out shape": (lambda: cpu.softmax(X, out=f32(4, 9)), ValueError, r"out must have shape \(4, 8\)"),
    "softmax out dtype": (lambda: cpu.softmax(X, out=X.double()), TypeError, r"out must have dtype float32"),
    "softmax out non-tensor": (lambda: cpu.softmax(X, out=[0.0]), TypeError, r"out must be a torch\.Tensor"),
    "softmax out column stride": (lambda: cpu.softmax(X, out=f32(8, 4).t()), ValueError,
                                  r"out must be contiguous in its last"),
    "softmax out overlapping rows": (lambda: cpu.softmax(X, out=f32(8).expand(4, 8)), ValueError,
                                     r"out must not overlap itself"),
    "softmax out rows without one stride": (lambda: cpu.softmax(f32(3, 4, 8), out=f32(3, 9, 8)[:, :8:2]),
                                            ValueError, r"out must address its rows with one stride"),
    # rmsnorm
    "rmsnorm weight shape": (lambda: cpu.rmsnorm(X, f32(7)), ValueError, r"weight must have shape \(8,\)"),
    "rmsnorm weight dtype": (lambda: cpu.rmsnorm(X, W.half()), TypeError, r"weight must have dtype"),
    "rmsnorm weight non-tensor": (lambda: cpu.rmsnorm(X, 1.0), TypeError, r"weight must be a torch\.Tensor"),
    "rmsnorm weight strided": (lambda: cpu.rmsnorm(X, f32(16)[::2]), ValueError,
                               r"weight must be contiguous in its last"),
    "rmsnorm eps zero": (lambda: cpu.rmsnorm(X, W, 0.0), ValueError, r"eps must be > 0"),
    "rmsnorm eps negative": (lambda: cpu.rmsnorm(X, W, -1e-6), ValueError, r"eps must be > 0"),
    "rmsnorm eps nan": (lambda: cpu.rmsnorm(X, W, float("nan")), ValueError, r"eps must be > 0"),
    "rmsnorm eps string": (lambda: cpu.rmsnorm(X, W, "small"), TypeError, r"eps must be a number"),
    "rmsnorm residual shape": (lambda: cpu.rmsnorm(X, W, 1e-6, f32(4, 9)), ValueError,
                               r"residual must have shape \(4, 8\)"),
    "rmsnorm residual dtype": (lambda: cpu.rmsnorm(X, W, 1e-6, X.double()), TypeError, r"residual must have dtype"),
    "rmsnorm residual_out shape": (lambda: cpu.rmsnorm(X, W, 1e-6, X, residual_out=f32(4)), ValueError,
                                   r"residual_out must have shape"),
    "rmsnorm residual_out without residual": (lambda: cpu.rmsnorm(X, W, residual_out=f32(4, 8)), ValueError,
                                              r"residual_out is only written when residual is given"),
    "rmsnorm out shape": (lambda: cpu.rmsnorm(X, W, out=f32(8, 4)), ValueError, r"out must have shape"),
    # layernorm
    "layernorm bias shape": (lambda: cpu.layernorm(X, W, f32(9)), ValueError, r"bias must have shape \(8,\)"),
    "layernorm bias 2-d": (lambda: cpu.layernorm(X, W, f32(1, 8)), ValueError, r"bias must have 1 dimension"),
    "layernorm weight shape": (lambda: cpu.layernorm(X, f32(4)), ValueError, r"weight must have shape \(8,\)"),
    "layernorm eps zero": (lambda: cpu.layernorm(X, W, B, 0), ValueError, r"eps must be > 0"),
    "layernorm x dtype": (lambda: cpu.layernorm(X.bfloat16()), TypeError, r"x must have dtype"),
    "layernorm out dtype": (lambda: cpu.layernorm(X, out=X.half()), TypeError, r"out must have dtype float32"),
    # linear forward
    "linear x 1-d": (lambda: cpu.linear_forward(f32(8), LW), ValueError, r"x must have 2 dimension"),
    "linear x 3-d": (lambda: cpu.linear_forward(f32(2, 4, 8), LW), ValueError, r"x must have 2 dimension"),
    "linear weight inner size": (lambda: cpu.linear_forward(X, f32(5, 7)), ValueError,
                                 r"weight must have shape \(5, 8\)"),
    "linear weight dtype": (lambda: cpu.linear_forward(X, LW.double()), TypeError, r"weight must have dtype"),
    "linear weight non-tensor": (lambda: cpu.linear_forward(X, None), TypeError, r"weight must be a torch\.Tensor"),
    "linear weight column stride": (lambda: cpu.linear_forward(X, f32(8, 5).t()), ValueError,
                                    r"weight must be contiguous in its last"),
    "linear empty x": (lambda: cpu.linear_forward(f32(0, 8), LW), ValueError, r"x must not be empty"),
    "linear empty weight": (lambda: cpu.linear_forward(X, f32(0, 8)), ValueError, r"weight must not be empty"),
    "linear bias shape": (lambda: cpu.linear_forward(X, LW, f32(4)), ValueError, r"bias must have shape \(5,\)"),
    "linear out shape": (lambda: cpu.linear_forward(X, LW, LB, out=f32(4, 8)), ValueError,
                         r"out must have shape \(4, 5\)"),
    "linear out overlapping rows": (lambda: cpu.linear_forward(X, LW, out=f32(5).expand(4, 5)), ValueError,
                                    r"out must not overlap itself"),
    # linear backward
    "backward grad_out shape": (lambda: cpu.linear_backward(X, LW, f32(4, 6)), ValueError,
                                r"grad_out must have shape \(4, 5\)"),
    "backward grad_out dtype": (lambda: cpu.linear_backward(X, LW, DY.double()), TypeError,
                                r"grad_out must have dtype"),
    "backward grad_out non-tensor": (lambda: cpu.linear_backward(X, LW, 1.0), TypeError,
                                     r"grad_out must be a torch\.Tensor"),
    "backward weight inner size": (lambda: cpu.linear_backward(X, f32(5, 9), DY), ValueError,
                                   r"weight must have shape \(5, 8\)"),
    "backward dx shape": (lambda: cpu.linear_backward(X, LW, DY, dx=f32(8, 4)), ValueError,
                          r"dx must have shape \(4, 8\)"),
    "backward dweight shape": (lambda: cpu.linear_backward(X, LW, DY, dweight=f32(8, 5)), ValueError,
                               r"dweight must have shape \(5, 8\)"),
    "backward dbias shape": (lambda: cpu.linear_backward(X, LW, DY, dbias=f32(4)), ValueError,
                             r"dbias must have shape \(5,\)"),
    "backward dbias dtype": (lambda: cpu.linear_backward(X, LW, DY, dbias=LB.double()), TypeError,
                             r"dbias must have dtype float32"),
    "backward dweight column stride": (lambda: cpu.linear_backward(X, LW, DY, dweight=f32(8, 5).t()), ValueError,
                                       r"dweight must be contiguous in its last"),
    # numbers that only look like eps, and inputs without a last dimension
    "rmsnorm eps numeric string": (lambda: cpu.rmsnorm(X, W, "1e-6"), TypeError, r"eps must be a number.*str"),
    "rmsnorm eps bool": (lambda: cpu.rmsnorm(X, W, True), TypeError, r"eps must be a number.*bool"),
    "layernorm eps numeric string": (lambda: cpu.layernorm(X, W, B, "1e-5"), TypeError, r"eps must be a number"),
    "layernorm eps bool": (lambda: cpu.layernorm(X, W, B, True), TypeError, r"eps must be a number.*bool"),
    "layernorm 0-d": (lambda: cpu.layernorm(torch.tensor(1.0)), ValueError, r"x must have at least 1 dimension"),
    "rmsnorm 0-d": (lambda: cpu.rmsnorm(torch.tensor(1.0)), ValueError, r"x must have at least 1 dimension"),
    # outputs sharing memory with inputs or with each other (torch raises for these too)
    "backward dx is x": (lambda: cpu.linear_backward(X, LW, DY, dx=X), ValueError, r"dx is x itself"),
    "backward dweight is weight": (lambda: cpu.linear_backward(X, LW, DY, dweight=LW), ValueError,
                                   r"dweight is weight itself"),
    "backward dbias inside grad_out": (lambda: cpu.linear_backward(X, LW, DY, dbias=DY[0]), ValueError,
                                       r"dbias overlaps grad_out"),
    "backward dx is dweight's memory": (lambda: (lambda buf: cpu.linear_backward(
        X, LW, DY, dx=buf[:32].view(4, 8), dweight=buf[8:48].view(5, 8)))(f32(64)), ValueError,
        r"dweight overlaps dx"),
    "linear out is x": (lambda: (lambda sq: cpu.linear_forward(sq, f32(8, 8), out=sq))(f32(8, 8)), ValueError,
                        r"out is x itself"),
    "rmsnorm out is residual_out": (lambda: (lambda buf: cpu.rmsnorm(X, W, 1e-6, f32(4, 8), out=buf,
                                                                     residual_out=buf))(f32(4, 8)),
                                    ValueError, r"residual_out is out itself"),
    "rmsnorm out is weight": (lambda: (lambda w: cpu.rmsnorm(w.view(1, 8), w, out=w.view(1, 8)))(f32(8)), ValueError,
                              r"out overlaps weight"),
    "layernorm out shifted over x": (lambda: (lambda buf: cpu.layernorm(buf[:-1], out=buf[1:]))(f32(4097)),
                                     ValueError, r"out overlaps x .* or exactly x \(in place\)"),
    "layernorm strided out over x": (lambda: (lambda buf: cpu.layernorm(buf[:, :8], out=buf[:, 4:12]))(f32(4, 16)),
                                     ValueError, r"out overlaps x"),
    "softmax out shifted over x": (lambda: (lambda buf: cpu.softmax(buf[:, :-1], out=buf[:, 1:]))(f32(3, 9)),
                                   ValueError, r"out overlaps x"),
}


@pytest.mark.parametrize("name", sorted(BAD_CALLS))
def test_bad_arguments_raise_naming_the_argument(name):
    call, error, match = BAD_CALLS[name]
    with pytest.raises(error, match=match):
        call()


def test_a_rejected_call_writes_nothing():
    """Checks run before any work: a bad later argument leaves earlier outputs untouched."""
    dx = torch.full((4, 8), float("nan"))
    with pytest.raises(ValueError, match=r"dbias must have shape"):
        cpu.linear_backward(X, LW, DY, dx=dx, dbias=f32(3))
    assert dx.isnan().all()
    out = torch.full((4, 8), float("nan"))
    with pytest.raises(ValueError, match=r"residual_out must have shape"):
        cpu.rmsnorm(X, W, 1e-6, X, out=out, residual_out=f32(2, 8))
    assert out.isnan().all()


def test_an_output_overlapping_an_input_is_rejected_before_any_write():
    buf = torch.randn(4097)
    before = buf.clone()
    with pytest.raises(ValueError, match=r"out overlaps x"):
        cpu.layernorm(buf[:-1], out=buf[1:])
    assert torch.equal(buf, before)
