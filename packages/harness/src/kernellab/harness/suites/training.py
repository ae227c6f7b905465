"""The cpu-ops suite's training problems: each norm's backward from the statistics its forward saves,
and forward+backward through autograd of softmax, RMSNorm, LayerNorm and linear.

Backward problems take what the forward saves as inputs (softmax: y; RMSNorm: rstd; LayerNorm: mean
and rstd; computed in make_inputs from the rounded x in float64, then rounded) and the output
gradient; the truth is float64 autograd at x (``reference.*_backward``). Their control is the
kernel torch's autograd runs for that backward: ``aten::_softmax_backward_data`` and
``aten::native_layer_norm_backward``; torch has no CPU RMSNorm backward kernel
(``aten::_fused_rms_norm_backward`` is CUDA-only and ``F.rms_norm`` on the CPU is a composite), so
its control is the torch ops of that composite's gradient. The forward+backward problems take
leaf copies of the inputs, run the forward and ``torch.autograd.grad`` in one call; their control
is the same call on torch's functional ops, so both sides pay the autograd engine.
"""

from __future__ import annotations

import math

from ..case import Problem, Tensors, Tolerance, prod, torch_dtype
from . import reference


def _f32(t):
    import torch

    return t.to(torch.float32)


class _Rows(Problem):
    """An (M, N) problem whose outputs are named gradients: dx of x's shape, per-feature ones (N,)."""

    grads: tuple[str, ...] = ("dx",)

    def make_outputs(self, inputs: Tensors) -> Tensors:
        import torch

        m, n = self.shape
        dt = torch_dtype(self.dtype)
        return {g: torch.empty((m, n) if g == "dx" else (n,), dtype=dt, device=self.device) for g in self.grads}

    def vector_grads(self) -> int:
        return len(self.grads) - 1

    def tolerance(self) -> Tolerance:
        # the per-feature gradients are sums over M rows
        return Tolerance(1e-5, 1e-5 * math.sqrt(self.shape[0]))


class SoftmaxBackward(_Rows):
    """dx of y = softmax(x) from the saved output y and dy."""

    op = "softmax_backward"

    def make_inputs(self, seed: int) -> Tensors:
        g = self.generator(seed)
        x = self.randn(self.shape, g, scale=2.0)
        return {"x": x, "y": _f32(reference.softmax(x)), "grad_out": self.randn(self.shape, g)}

    def reference(self, inputs: Tensors) -> Tensors:
        return {"dx": reference.softmax_backward_of_x(inputs["x"], inputs["grad_out"])}

    def control(self, inputs: Tensors, outputs: Tensors) -> Tensors:
        import torch

        torch.ops.aten._softmax_backward_data.out(inputs["grad_out"], inputs["y"], -1, torch.float32,
                                                  grad_input=outputs["dx"])
        return outputs

    def bytes_moved(self) -> int:
        return 3 * prod(self.shape) * self.element_size()

    def flops(self) -> int:
        return 4 * prod(self.shape)


class RMSNormBackward(_Rows):
    """(dx, dweight) of y = x * rstd * weight from x, the saved rstd and dy."""

    op = "rmsnorm_backward"
    grads = ("dx", "dweight")

    def __init__(self, shape, dtype, device, eps: float = 1e-6, **params):
        super().__init__(shape, dtype, device, eps=eps, **params)

    def make_inputs(self, seed: int) -> Tensors:
        import torch

        g = self.generator(seed)
        n = self.shape[-1]
        x = self.randn(self.shape, g)
        x64 = x.double()
        rstd = torch.rsqrt(x64.pow(2).mean(-1) + self.params["eps"])
        return {"x": x, "weight": self.randn((n,), g, scale=0.5, shift=1.0), "rstd": _f32(rstd),
                "grad_out": self.randn(self.shape, g)}

    def reference(self, inputs: Tensors) -> Tensors:
        dx, dweight, _ = reference.rmsnorm_backward(inputs["x"], inputs["weight"], self.params["eps"],
                                                    inputs["grad_out"])
        return {"dx": dx, "dweight": dweight}

    def control(self, inputs: Tensors, outputs: Tensors) -> Tensors:
        x, dy, w = inputs["x"], inputs["grad_out"], inputs["weight"]
        rstd = inputs["rstd"].unsqueeze(-1)
        xhat = x * rstd
        gw = dy * w
        return {"dx": rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True)), "dweight": (dy * xhat).sum(0)}

    def bytes_moved(self) -> int:
        m, n = self.shape
        return (3 * m * n + 2 * n + m) * self.element_size()

    def flops(self) -> int:
        return 8 * prod(self.shape)


class LayerNormBackward(_Rows):
    """(dx, dweight, dbias) of y = (x - mean) * rstd * weight + bias from x, the saved mean and rstd, dy."""

    op = "layernorm_backward"
    grads = ("dx", "dweight", "dbias")

    def __init__(self, shape, dtype, device, eps: float = 1e-5, **params):
        super().__init__(shape, dtype, device, eps=eps, **params)

    def make_inputs(self, seed: int) -> Tensors:
        import torch

        g = self.generator(seed)
        n = self.shape[-1]
        x = self.randn(self.shape, g, scale=1.5, shift=0.25)
        x64 = x.double()
        mean = x64.mean(-1)
        rstd = torch.rsqrt((x64 - mean.unsqueeze(-1)).pow(2).mean(-1) + self.params["eps"])
        return {"x": x, "weight": self.randn((n,), g, scale=0.5, shift=1.0), "bias": self.randn((n,), g, scale=0.5),
                "mean": _f32(mean), "rstd": _f32(rstd), "grad_out": self.randn(self.shape, g)}

    def reference(self, inputs: Tensors) -> Tensors:
        dx, dweight, dbias = reference.layernorm_backward(inputs["x"], inputs["weight"], inputs["bias"],
                                                          self.params["eps"], inputs["grad_out"])
        return {"dx": dx, "dweight": dweight, "dbias": dbias}

    def control(self, inputs: Tensors, outputs: Tensors) -> Tensors:
        import torch

        n = self.shape[-1]
        torch.ops.aten.native_layer_norm_backward.out(
            inputs["grad_out"], inputs["x"], [n], inputs["mean"].unsqueeze(-1), inputs["rstd"].unsqueeze(-1),
            inputs["weight"], inputs["bias"], [True, True, True], out0=outputs["dx"], out1=outputs["dweight"],
            out2=outputs["dbias"])
        return outputs

    def bytes_moved(self) -> int:
        m, n = self.shape
        return (3 * m * n + 4 * n + 2 * m) * self.element_size()

    def flops(self) -> int:
        return 10 * prod(self.shape)


# ---- forward + backward through autograd ---------------------------------------------------------------
def grads_through_autograd(forward, primals, grad_out):
    """The gradients of forward(*leaves) with respect to leaf copies of ``primals``, given dy: one
    training step's forward and backward, as autograd runs them."""
    import torch

    with torch.enable_grad():
        leaves = [p.detach().requires_grad_() for p in primals]
        return torch.autograd.grad(forward(*leaves), leaves, grad_out)


class _Train(_Rows):
    """Forward and backward of one op through autograd; ``forward_of`` maps an impl's functions to it."""

    def make_outputs(self, inputs: Tensors) -> Tensors:
        return {}  # autograd returns fresh gradients

    def primals(self, inputs: Tensors):
        names = ("x", "weight", "bias")[:len(self.grads)]
        return [inputs[k] for k in names]

    def run(self, forward, inputs: Tensors) -> Tensors:
        grads = grads_through_autograd(forward, self.primals(inputs), inputs["grad_out"])
        return dict(zip(self.grads, grads, strict=True))

    def bytes_moved(self) -> int:
        # forward: x read, y written; backward: x (or y) and dy read, dx written; the vectors
        m, n = self.shape
        return (5 * m * n + 2 * self.vector_grads() * n) * self.element_size()


class SoftmaxTrain(_Train):
    op = "softmax_train"

    def make_inputs(self, seed: int) -> Tensors:
        g = self.generator(seed)
        return {"x": self.randn(self.shape, g, scale=2.0), "grad_out": self.randn(self.shape, g)}

    def reference(self, inputs: Tensors) -> Tensors:
        return {"dx": reference.softmax_backward_of_x(inputs["x"], inputs["grad_out"])}

    def control(self, inputs: Tensors, outputs: Tensors) -> Tensors:
        import torch

        return self.run(lambda x: torch.softmax(x, dim=-1), inputs)

    def flops(self) -> int:
        return 8 * prod(self.shape)


class RMSNormTrain(_Train):
    op = "rmsnorm_train"
    grads = ("dx", "dweight")

    def __init__(self, shape, dtype, device, eps: float = 1e-6, **params):
        super().__init__(shape, dtype, device, eps=eps, **params)

    def make_inputs(self, seed: int) -> Tensors:
        g = self.generator(seed)
        return {"x": self.randn(self.shape, g), "weight": self.randn((self.shape[-1],), g, scale=0.5, shift=1.0),
                "grad_out": self.randn(self.shape, g)}

    def reference(self, inputs: Tensors) -> Tensors:
        dx, dweight, _ = reference.rmsnorm_backward(inputs["x"], inputs["weight"], self.params["eps"],
                                                    inputs["grad_out"])
        return {"dx": dx, "dweight": dweight}

    def control(self, inputs: Tensors, outputs: Tensors) -> Tensors:
        import torch.nn.functional as F

        n, eps = self.shape[-1], self.params["eps"]
        return self.run(lambda x, w: F.rms_norm(x, (n,), w, eps), inputs)

    def flops(self) -> int:
        return 12 * prod(self.shape)


class LayerNormTrain(_Train):
    op = "layernorm_train"
    grads = ("dx", "dweight", "dbias")

    def __init__(self, shape, dtype, device, eps: float = 1e-5, **params):
        super().__init__(shape, dtype, device, eps=eps, **params)

    def make_inputs(self, seed: int) -> Tensors:
        g = self.generator(seed)
        n = self.shape[-1]
        return {"x": self.randn(self.shape, g, scale=1.5, shift=0.25),
                "weight": self.randn((n,), g, scale=0.5, shift=1.0), "bias": self.randn((n,), g, scale=0.5),
                "grad_out": self.randn(self.shape, g)}

    def reference(self, inputs: Tensors) -> Tensors:
        dx, dweight, dbias = reference.layernorm_backward(inputs["x"], inputs["weight"], inputs["bias"],
                                                          self.params["eps"], inputs["grad_out"])
        return {"dx": dx, "dweight": dweight, "dbias": dbias}

    def control(self, inputs: Tensors, outputs: Tensors) -> Tensors:
        import torch.nn.functional as F

        n, eps = self.shape[-1], self.params["eps"]
        return self.run(lambda x, w, b: F.layer_norm(x, (n,), w, b, eps), inputs)

    def flops(self) -> int:
        return 17 * prod(self.shape)


class LinearTrain(Problem):
    """(dx, dW, db) of y = x W^T + b through autograd, forward included; shape is (M, K, N)."""

    op = "linear_train"
    grads = ("dx", "dweight", "dbias")

    def make_inputs(self, seed: int) -> Tensors:
        m, k, n = self.shape
        g = self.generator(seed)
        return {"x": self.randn((m, k), g), "weight": self.randn((n, k), g, scale=1.0 / math.sqrt(k)),
                "bias": self.randn((n,), g, scale=0.5), "grad_out": self.randn((m, n), g)}

    def make_outputs(self, inputs: Tensors) -> Tensors:
        return {}

    def run(self, forward, inputs: Tensors) -> Tensors:
        grads = grads_through_autograd(forward, [inputs["x"], inputs["weight"], inputs["bias"]], inputs["grad_out"])
        return dict(zip(self.grads, grads, strict=True))

    def reference(self, inputs: Tensors) -> Tensors:
        dx, dw, db = reference.linear_backward(inputs["x"], inputs["weight"], inputs["grad_out"])
        return {"dx": dx, "dweight": dw, "dbias": db}

    def control(self, inputs: Tensors, outputs: Tensors) -> Tensors:
        import torch.nn.functional as F

        return self.run(F.linear, inputs)

    def bytes_moved(self) -> int:
        m, k, n = self.shape
        return (3 * m * k + 3 * n * k + 3 * m * n + 2 * n) * self.element_size()

    def flops(self) -> int:
        m, k, n = self.shape
        return 6 * m * n * k

    def tolerance(self) -> Tolerance:
        return Tolerance(1e-5, 1e-5 * math.sqrt(max(self.shape)))
