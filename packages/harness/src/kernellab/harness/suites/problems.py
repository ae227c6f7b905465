"""The problems of the norm and linear suites, on either device: inputs, outputs, truth, control, bytes and flops."""

from __future__ import annotations

import functools
import math
import types

from ..case import Inputs, Problem, Tensors, Tolerance, prod, torch_dtype
from . import reference


class RowProblem(Problem):
    """An op over the last dimension of an (M, N) tensor."""

    def make_outputs(self, inputs: Tensors) -> Tensors:
        import torch

        return {"y": torch.empty_like(inputs["x"])}

    def row_bytes(self, extra_vectors: int = 0) -> int:
        m, n = self.shape
        return 2 * m * n * self.element_size() + extra_vectors * n * self.element_size()


class Softmax(RowProblem):
    op = "softmax"

    def make_inputs(self, seed: int) -> Tensors:
        g = self.generator(seed)
        return {"x": self.randn(self.shape, g, scale=2.0)}

    def reference(self, inputs: Tensors) -> Tensors:
        return {"y": reference.softmax(inputs["x"])}

    def control(self, inputs: Tensors, outputs: Tensors) -> Tensors:
        import torch

        return {"y": torch.softmax(inputs["x"], dim=-1)}

    def bytes_moved(self) -> int:
        return self.row_bytes()

    def flops(self) -> int:
        return 4 * prod(self.shape)


class RMSNorm(RowProblem):
    op = "rmsnorm"

    def __init__(self, shape, dtype, device, eps: float = 1e-6, **params):
        super().__init__(shape, dtype, device, eps=eps, **params)

    def make_inputs(self, seed: int) -> Tensors:
        g = self.generator(seed)
        n = self.shape[-1]
        return {"x": self.randn(self.shape, g), "weight": self.randn((n,), g, scale=0.5, shift=1.0)}

    def reference(self, inputs: Tensors) -> Tensors:
        y, _ = reference.rmsnorm(inputs["x"], inputs["weight"], self.params["eps"])
        return {"y": y}

    def control(self, inputs: Tensors, outputs: Tensors) -> Tensors:
        import torch.nn.functional as F

        x = inputs["x"]
        return {"y": F.rms_norm(x, (x.shape[-1],), inputs["weight"], self.params["eps"])}

    def bytes_moved(self) -> int:
        return self.row_bytes(extra_vectors=1)

    def flops(self) -> int:
        return 4 * prod(self.shape)


class LayerNorm(RowProblem):
    op = "layernorm"

    def __init__(self, shape, dtype, device, eps: float = 1e-5, **params):
        super().__init__(shape, dtype, device, eps=eps, **params)

    def make_inputs(self, seed: int) -> Tensors:
        g = self.generator(seed)
        n = self.shape[-1]
        return {
            "x": self.randn(self.shape, g, scale=1.5, shift=0.25),
            "weight": self.randn((n,), g, scale=0.5, shift=1.0),
            "bias": self.randn((n,), g, scale=0.5),
        }

    def reference(self, inputs: Tensors) -> Tensors:
        return {"y": reference.layernorm(inputs["x"], inputs["weight"], inputs["bias"], self.params["eps"])}

    def control(self, inputs: Tensors, outputs: Tensors) -> Tensors:
        import torch.nn.functional as F

        x = inputs["x"]
        return {"y": F.layer_norm(x, (x.shape[-1],), inputs["weight"], inputs["bias"], self.params["eps"])}

    def bytes_moved(self) -> int:
        return self.row_bytes(extra_vectors=2)

    def flops(self) -> int:
        return 7 * prod(self.shape)


class Copy(RowProblem):
    """Device-to-device copy: the bandwidth ceiling every other case is read against. On a GPU an elementwise
    kernel (``y = x * 1``, exact), not ``copy_``: a CUDA graph records ``copy_`` as a memcpy node, which on the H200 ran
    fp32 copies of 512 MB at two thirds of the kernel's rate (``tools/device/copy_ceiling.py``,
    ``reports/h200/norm-backward/copy-ceiling.json``) and so let kernels pass their "ceiling" by half."""

    op = "copy"

    def make_inputs(self, seed: int) -> Tensors:
        return {"x": self.randn(self.shape, self.generator(seed))}

    def reference(self, inputs: Tensors) -> Tensors:
        return {"y": inputs["x"]}

    def control(self, inputs: Tensors, outputs: Tensors) -> Tensors:
        import torch

        if inputs["x"].is_cuda:
            torch.mul(inputs["x"], 1, out=outputs["y"])
        else:  # no graph on the CPU: the plain copy
            outputs["y"].copy_(inputs["x"])
        return outputs

    def bytes_moved(self) -> int:
        return self.row_bytes()

    def tolerance(self) -> Tolerance:
        return Tolerance(0.0, 0.0)


def linear_operands(problem: Problem, g, *, bias: bool) -> Tensors:
    """x (M, K), W (N, K) scaled by 1/sqrt(K) [and b (N,)] of a linear problem of shape (M, K, N), drawn from
    ``g`` in that order: every linear problem's operands (a gradient, where there is one, is drawn after)."""
    m, k, n = problem.shape
    out = {"x": problem.randn((m, k), g), "weight": problem.randn((n, k), g, scale=1.0 / math.sqrt(k))}
    if bias:
        out["bias"] = problem.randn((n,), g, scale=0.5)
    return out


class LinearForward(Problem):
    """y = x W^T + b with x (M, K), W (N, K); shape is (M, K, N)."""

    op = "linear_forward"

    def make_inputs(self, seed: int) -> Tensors:
        return linear_operands(self, self.generator(seed), bias=True)

    def make_outputs(self, inputs: Tensors) -> Tensors:
        import torch

        m, _, n = self.shape
        return {"y": torch.empty((m, n), dtype=torch_dtype(self.dtype), device=self.device)}

    def reference(self, inputs: Tensors) -> Tensors:
        return {"y": reference.linear_forward(inputs["x"], inputs["weight"], inputs["bias"])}

    def control(self, inputs: Tensors, outputs: Tensors) -> Tensors:
        import torch

        torch.addmm(inputs["bias"], inputs["x"], inputs["weight"].t(), out=outputs["y"])
        return outputs

    def bytes_moved(self) -> int:
        m, k, n = self.shape
        return (m * k + n * k + n + m * n) * self.element_size()

    def flops(self) -> int:
        m, k, n = self.shape
        return 2 * m * n * k

    def tolerance(self) -> Tolerance:
        return Tolerance(1e-5, 1e-5 * math.sqrt(self.shape[1]))


class LinearBackward(Problem):
    """(dx, dW, db) of y = x W^T + b given dy; shape is (M, K, N)."""

    op = "linear_backward"

    def make_inputs(self, seed: int) -> Tensors:
        m, _, n = self.shape
        g = self.generator(seed)
        return {**linear_operands(self, g, bias=False), "grad_out": self.randn((m, n), g)}

    def make_outputs(self, inputs: Tensors) -> Tensors:
        import torch

        m, k, n = self.shape
        dt = torch_dtype(self.dtype)
        return {"dx": torch.empty((m, k), dtype=dt, device=self.device),
                "dweight": torch.empty((n, k), dtype=dt, device=self.device),
                "dbias": torch.empty((n,), dtype=dt, device=self.device)}

    def reference(self, inputs: Tensors) -> Tensors:
        dx, dw, db = reference.linear_backward(inputs["x"], inputs["weight"], inputs["grad_out"])
        return {"dx": dx, "dweight": dw, "dbias": db}

    def control(self, inputs: Tensors, outputs: Tensors) -> Tensors:
        import torch

        dy = inputs["grad_out"]
        torch.mm(dy, inputs["weight"], out=outputs["dx"])
        torch.mm(dy.t(), inputs["x"], out=outputs["dweight"])
        torch.sum(dy, dim=0, out=outputs["dbias"])
        return outputs

    def bytes_moved(self) -> int:
        m, k, n = self.shape
        return (2 * m * k + 2 * n * k + m * n + n) * self.element_size()

    def flops(self) -> int:
        m, k, n = self.shape
        return 4 * m * n * k + m * n

    def tolerance(self) -> Tolerance:
        return Tolerance(1e-5, 1e-5 * math.sqrt(max(self.shape)))


# ---- backward: gradients of the row ops -------------------------------------------------------------------
FP32_UNIT = 2.0 ** -24


class RowBackward(RowProblem):
    """Gradients of a row op given dy, from what its forward saves. Bytes: the minimum the backward must move,
    each row tensor it reads (x, or y for softmax, and dy) and dx once, each weight once (the weight read and
    its gradient written).

    cpu-ops (fp32) and gpu-norm-backward measured these problems before they were one family: where a choice
    shapes their committed reports (inputs, truth, tolerance, bytes, buffers), each device keeps its own, in a
    branch that says so."""

    vectors = 0  # weight-like (N,) vectors: each read once and its gradient written once
    statistics = 0  # (M,) statistics the forward saves for the backward (rstd, mean)
    former_names = types.MappingProxyType({"dy": "grad_out"})  # the gradient's name before 5bed5f1 (issue 34's A/B)

    def make_inputs(self, seed: int) -> Tensors:
        return Inputs(self.draw_inputs(seed), self.former_names)

    def draw_inputs(self, seed: int) -> Tensors:
        """The inputs under today's names."""
        raise NotImplementedError

    def bytes_moved(self) -> int:
        m, n = self.shape
        moved = 3 * m * n + 2 * self.vectors * n
        if self.device == "cpu":  # cpu-ops counts the reads of the saved statistics too
            moved += self.statistics * m
        return moved * self.element_size()

    def make_outputs(self, inputs: Tensors) -> Tensors:
        import torch

        out = {"dx": torch.empty_like(inputs["x" if "x" in inputs else "y"])}
        for name in ("weight", "bias")[:self.vectors]:
            out[f"d{name}"] = torch.empty_like(inputs[name])
        return out

    def tolerance(self) -> Tolerance:
        if self.device == "cpu":  # cpu-ops' bound (fp32 only): atol grown as sqrt(M), the rows a column sums
            return Tolerance(1e-5, 1e-5 * math.sqrt(self.shape[0]))
        return super().tolerance()

    def slack(self, inputs: Tensors) -> Tensors:
        """dweight and dbias sum M rows in fp32: allow twice the fp32 unit roundoff times the sum of the
        terms' magnitudes, the rounding of an fp32 column sum whatever its blocking (torch's own backward
        passed 16 units of the terms' root sum of squares on the H200 only for M up to a few thousand);
        a column whose sum is near 0 is otherwise held to atol."""
        if self.device == "cpu":  # cpu-ops' tolerance already allows for the column sums
            return {}
        terms = self.column_terms(inputs)
        return {name: 2 * FP32_UNIT * t.abs().sum(dim=0) for name, t in terms.items()}

    def column_terms(self, inputs: Tensors) -> Tensors:
        """float64 (M, N) terms whose column sums are the vector gradients."""
        return {}

    def in_forward_precision(self, x):
        """x in the precision the device's forward computes what it saves (y, rstd, mean) in: float64 on the CPU,
        rounded once as the native forward's double-accumulated statistics are, fp32 on the GPU as torch's."""
        return x.double() if self.device == "cpu" else x.float()


class SoftmaxBackward(RowBackward):
    """dx = y * (dy - sum(dy * y)) from the forward's output y. The truth is that formula's from the rounded y
    (a bf16 y is too far from softmax(x) for x's gradient to be the truth); cpu-ops (fp32) takes the gradient
    at x instead and carries x for it. The control is the kernel torch's autograd runs,
    ``aten::_softmax_backward_data``."""

    op = "softmax_backward"

    def draw_inputs(self, seed: int) -> Tensors:
        import torch

        g = self.generator(seed)
        x = self.randn(self.shape, g, dtype="fp32", scale=2.0)
        y = torch.softmax(self.in_forward_precision(x), dim=-1).to(torch_dtype(self.dtype))
        grad_out = self.randn(self.shape, g)
        if self.device == "cpu":  # cpu-ops' truth is the gradient at x
            return {"x": x, "y": y, "grad_out": grad_out}
        return {"y": y, "grad_out": grad_out}

    def reference(self, inputs: Tensors) -> Tensors:
        if self.device == "cpu":  # cpu-ops' truth is the gradient at x
            return {"dx": reference.softmax_backward_of_x(inputs["x"], inputs["grad_out"])}
        return {"dx": reference.softmax_backward(inputs["y"], inputs["grad_out"])}

    def control(self, inputs: Tensors, outputs: Tensors) -> Tensors:
        import torch

        dy, y = inputs["grad_out"], inputs["y"]
        if self.device == "cpu":  # the CPU contenders write into the given buffers, and so does the control
            torch.ops.aten._softmax_backward_data.out(dy, y, -1, y.dtype, grad_input=outputs["dx"])
            return outputs
        return {"dx": torch.ops.aten._softmax_backward_data(dy, y, -1, y.dtype)}

    def flops(self) -> int:
        return 4 * prod(self.shape)


class RMSNormBackward(RowBackward):
    """(dx, dweight) of y = x * rstd * w from x, w, dy and the forward's rstd (fp32, (M,)). The truth is float64
    autograd at x; the control is ``aten::_fused_rms_norm_backward``, or on the CPU, where torch has no kernel
    of it (``F.rms_norm`` there is a composite), the torch ops of that composite's gradient."""

    op = "rmsnorm_backward"
    vectors = 1
    statistics = 1

    def __init__(self, shape, dtype, device, eps: float = 1e-6, **params):
        super().__init__(shape, dtype, device, eps=eps, **params)

    def draw_inputs(self, seed: int) -> Tensors:
        import torch

        g = self.generator(seed)
        n = self.shape[-1]
        x = self.randn(self.shape, g)
        rstd = torch.rsqrt(self.in_forward_precision(x).pow(2).mean(dim=-1) + self.params["eps"]).float()
        return {"x": x, "weight": self.randn((n,), g, scale=0.5, shift=1.0), "grad_out": self.randn(self.shape, g),
                "rstd": rstd}

    def reference(self, inputs: Tensors) -> Tensors:
        dx, dw, _ = reference.rmsnorm_backward(inputs["x"], inputs["weight"], self.params["eps"], inputs["grad_out"])
        return {"dx": dx, "dweight": dw}

    def column_terms(self, inputs: Tensors) -> Tensors:
        y, _ = reference.rmsnorm(inputs["x"], None, self.params["eps"])
        return {"dweight": y * inputs["grad_out"].double()}

    def control(self, inputs: Tensors, outputs: Tensors) -> Tensors:
        import torch

        x, dy, w, rstd = inputs["x"], inputs["grad_out"], inputs["weight"], inputs["rstd"][:, None]
        if self.device == "cpu":  # torch has no CPU kernel of aten::_fused_rms_norm_backward
            xhat = x * rstd
            gw = dy * w
            return {"dx": rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True)), "dweight": (dy * xhat).sum(0)}
        dx, dw = torch.ops.aten._fused_rms_norm_backward(dy, x, [x.shape[-1]], rstd, w, [True, True])
        return {"dx": dx, "dweight": dw}

    def flops(self) -> int:
        return 8 * prod(self.shape)


class LayerNormBackward(RowBackward):
    """(dx, dweight, dbias) of y = (x - mean) * rstd * w + b from x, w, dy and the forward's mean and rstd. The
    truth is float64 autograd at x; the control is ``aten::native_layer_norm_backward``."""

    op = "layernorm_backward"
    vectors = 2
    statistics = 2

    def __init__(self, shape, dtype, device, eps: float = 1e-5, **params):
        super().__init__(shape, dtype, device, eps=eps, **params)

    def draw_inputs(self, seed: int) -> Tensors:
        import torch

        g = self.generator(seed)
        n = self.shape[-1]
        x = self.randn(self.shape, g, scale=1.5, shift=0.25)
        xs = self.in_forward_precision(x)
        mean = xs.mean(dim=-1)
        rstd = torch.rsqrt((xs - mean[:, None]).pow(2).mean(dim=-1) + self.params["eps"])
        return {"x": x, "weight": self.randn((n,), g, scale=0.5, shift=1.0), "bias": self.randn((n,), g, scale=0.5),
                "grad_out": self.randn(self.shape, g), "mean": mean.float(), "rstd": rstd.float()}

    def reference(self, inputs: Tensors) -> Tensors:
        dx, dw, db = reference.layernorm_backward(inputs["x"], inputs["weight"], inputs["bias"], self.params["eps"],
                                                  inputs["grad_out"])
        return {"dx": dx, "dweight": dw, "dbias": db}

    def column_terms(self, inputs: Tensors) -> Tensors:
        xhat = reference.layernorm(inputs["x"], None, None, self.params["eps"])
        dy = inputs["grad_out"].double()
        return {"dweight": xhat * dy, "dbias": dy}

    def control(self, inputs: Tensors, outputs: Tensors) -> Tensors:
        import torch

        x = inputs["x"]
        args = (inputs["grad_out"], x, [x.shape[-1]], inputs["mean"][:, None], inputs["rstd"][:, None],
                inputs["weight"], inputs["bias"], [True, True, True])
        if self.device == "cpu":  # the CPU contenders write into the given buffers, and so does the control
            torch.ops.aten.native_layer_norm_backward.out(*args, out0=outputs["dx"], out1=outputs["dweight"],
                                                          out2=outputs["dbias"])
            return outputs
        dx, dw, db = torch.ops.aten.native_layer_norm_backward(*args)
        return {"dx": dx, "dweight": dw, "dbias": db}

    def flops(self) -> int:
        return 10 * prod(self.shape)


# ---- forward + backward through autograd ---------------------------------------------------------------
def autograd_step(forward, primals, grad_out):
    """(y, the gradients) of y = forward(*leaves), the leaves fresh autograd leaves of ``primals`` (detached
    views: no copy), given dy: one training step's forward and backward, as autograd runs them."""
    import torch

    with torch.enable_grad():
        leaves = [p.detach().requires_grad_() for p in primals]
        y = forward(*leaves)
        return y.detach(), torch.autograd.grad(y, leaves, grad_out)


@functools.cache
def _two_copies():
    """The least autograd step with the launches a fused op's step has: a Function whose forward copies x and
    whose backward copies dy (one kernel each way)."""
    import torch

    class TwoCopies(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, dy):
            return dy.clone()

    return TwoCopies


class RowTrain(RowBackward):
    """Forward then backward through autograd (one training step of the op): the outputs are y and the
    gradients, the control the same step through torch's functional op, so both sides pay the autograd
    engine. Bytes: the forward's minimum (x read, y written, each vector read) plus the backward's."""

    def bytes_moved(self) -> int:
        m, n = self.shape
        passes = 2 if self.device == "cpu" else 3  # cpu-ops does not count the forward's read of each vector
        return (5 * m * n + passes * self.vectors * n) * self.element_size()

    def make_outputs(self, inputs: Tensors) -> Tensors:
        import torch

        if self.device == "cpu":  # the step returns fresh tensors: cpu-ops poisons no buffers before its samples
            return {}
        return {"y": torch.empty_like(inputs["x"]), **super().make_outputs(inputs)}

    def checked(self, outputs: Tensors) -> Tensors:
        """The outputs a step is checked on: y and the gradients, or in cpu-ops the gradients alone."""
        if self.device == "cpu":  # cpu-ops checks the gradients alone (and keeps no y alive between steps)
            return {k: v for k, v in outputs.items() if k != "y"}
        return outputs

    def step(self, forward, inputs: Tensors) -> Tensors:
        """y = forward(x[, weight[, bias]]) and its gradients given dy, through torch.autograd."""
        names = ("x", "weight", "bias")[:1 + self.vectors]
        y, grads = autograd_step(forward, [inputs[k] for k in names], inputs["grad_out"])
        return self.checked({"y": y, **{f"d{k}": gr for k, gr in zip(names, grads, strict=True)}})

    def torch_forward(self):
        """The op's forward in torch (x[, weight[, bias]] -> y): what a training loop runs, eagerly or compiled."""
        raise NotImplementedError

    def control(self, inputs: Tensors, outputs: Tensors) -> Tensors:
        return self.step(self.torch_forward(), inputs)


class AutogradFloor(RowTrain):
    """One training step through autograd that does the least such a step can: a copy forward and a copy backward
    (``_two_copies``). Its end-to-end time is the host floor the row ops' training steps are read against (the
    autograd engine and two launches on this host), as the copy is their bandwidth ceiling."""

    op = "autograd_floor"

    def draw_inputs(self, seed: int) -> Tensors:
        g = self.generator(seed)
        return {"x": self.randn(self.shape, g), "grad_out": self.randn(self.shape, g)}

    def reference(self, inputs: Tensors) -> Tensors:
        return self.checked({"y": inputs["x"], "dx": inputs["grad_out"]})

    def torch_forward(self):
        return _two_copies().apply

    def bytes_moved(self) -> int:
        return 2 * self.row_bytes()

    def tolerance(self) -> Tolerance:
        return Tolerance(0.0, 0.0)


class SoftmaxTrain(RowTrain):
    op = "softmax_train"

    def draw_inputs(self, seed: int) -> Tensors:
        g = self.generator(seed)
        return {"x": self.randn(self.shape, g, scale=2.0), "grad_out": self.randn(self.shape, g)}

    def reference(self, inputs: Tensors) -> Tensors:
        y, dx = reference.softmax_train(inputs["x"], inputs["grad_out"])
        return self.checked({"y": y, "dx": dx})

    def torch_forward(self):
        import torch

        return lambda x: torch.softmax(x, dim=-1)

    def flops(self) -> int:
        return 8 * prod(self.shape)


class RMSNormTrain(RowTrain):
    op = "rmsnorm_train"
    vectors = 1

    def __init__(self, shape, dtype, device, eps: float = 1e-6, **params):
        super().__init__(shape, dtype, device, eps=eps, **params)

    def draw_inputs(self, seed: int) -> Tensors:
        g = self.generator(seed)
        n = self.shape[-1]
        return {"x": self.randn(self.shape, g), "weight": self.randn((n,), g, scale=0.5, shift=1.0),
                "grad_out": self.randn(self.shape, g)}

    def reference(self, inputs: Tensors) -> Tensors:
        y, dx, dw = reference.rmsnorm_train(inputs["x"], inputs["weight"], inputs["grad_out"], self.params["eps"])
        return self.checked({"y": y, "dx": dx, "dweight": dw})

    def column_terms(self, inputs: Tensors) -> Tensors:
        return RMSNormBackward.column_terms(self, inputs)

    def torch_forward(self):
        import torch.nn.functional as F

        eps, n = self.params["eps"], self.shape[-1]
        return lambda x, weight: F.rms_norm(x, (n,), weight, eps)

    def flops(self) -> int:
        return 12 * prod(self.shape)


class LayerNormTrain(RowTrain):
    op = "layernorm_train"
    vectors = 2

    def __init__(self, shape, dtype, device, eps: float = 1e-5, **params):
        super().__init__(shape, dtype, device, eps=eps, **params)

    def draw_inputs(self, seed: int) -> Tensors:
        g = self.generator(seed)
        n = self.shape[-1]
        return {"x": self.randn(self.shape, g, scale=1.5, shift=0.25),
                "weight": self.randn((n,), g, scale=0.5, shift=1.0), "bias": self.randn((n,), g, scale=0.5),
                "grad_out": self.randn(self.shape, g)}

    def reference(self, inputs: Tensors) -> Tensors:
        y, dx, dw, db = reference.layernorm_train(inputs["x"], inputs["weight"], inputs["bias"], inputs["grad_out"],
                                                  self.params["eps"])
        return self.checked({"y": y, "dx": dx, "dweight": dw, "dbias": db})

    def column_terms(self, inputs: Tensors) -> Tensors:
        return LayerNormBackward.column_terms(self, inputs)

    def torch_forward(self):
        import torch.nn.functional as F

        eps, n = self.params["eps"], self.shape[-1]
        return lambda x, weight, bias: F.layer_norm(x, (n,), weight, bias, eps)

    def flops(self) -> int:
        return 17 * prod(self.shape)


class LinearTrain(Problem):
    """(dx, dW, db) of y = x W^T + b through autograd, forward included; shape is (M, K, N)."""

    op = "linear_train"

    def make_inputs(self, seed: int) -> Tensors:
        m, _, n = self.shape
        g = self.generator(seed)
        return {**linear_operands(self, g, bias=True), "grad_out": self.randn((m, n), g)}

    def make_outputs(self, inputs: Tensors) -> Tensors:
        return {}  # autograd returns fresh gradients

    def step(self, forward, inputs: Tensors) -> Tensors:
        """The gradients of y = forward(x, weight, bias) given dy, through torch.autograd."""
        _, (dx, dw, db) = autograd_step(forward, [inputs["x"], inputs["weight"], inputs["bias"]], inputs["grad_out"])
        return {"dx": dx, "dweight": dw, "dbias": db}

    def reference(self, inputs: Tensors) -> Tensors:
        dx, dw, db = reference.linear_backward(inputs["x"], inputs["weight"], inputs["grad_out"])
        return {"dx": dx, "dweight": dw, "dbias": db}

    def control(self, inputs: Tensors, outputs: Tensors) -> Tensors:
        import torch.nn.functional as F

        return self.step(F.linear, inputs)

    def bytes_moved(self) -> int:
        m, k, n = self.shape
        return (3 * m * k + 3 * n * k + 3 * m * n + 2 * n) * self.element_size()

    def flops(self) -> int:
        m, k, n = self.shape
        return 6 * m * n * k

    def tolerance(self) -> Tolerance:
        return Tolerance(1e-5, 1e-5 * math.sqrt(max(self.shape)))
