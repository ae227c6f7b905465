"""The problems of the norm and linear suites: inputs, outputs, truth, control, bytes and flops."""

from __future__ import annotations

import math

from ..case import Problem, Tensors, Tolerance, prod, torch_dtype
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
    """Device-to-device copy: the bandwidth ceiling every other case is read against."""

    op = "copy"

    def make_inputs(self, seed: int) -> Tensors:
        return {"x": self.randn(self.shape, self.generator(seed))}

    def reference(self, inputs: Tensors) -> Tensors:
        return {"y": inputs["x"]}

    def control(self, inputs: Tensors, outputs: Tensors) -> Tensors:
        outputs["y"].copy_(inputs["x"])
        return outputs

    def bytes_moved(self) -> int:
        return self.row_bytes()

    def tolerance(self) -> Tolerance:
        return Tolerance(0.0, 0.0)


class LinearForward(Problem):
    """y = x W^T + b with x (M, K), W (N, K); shape is (M, K, N)."""

    op = "linear_forward"

    def make_inputs(self, seed: int) -> Tensors:
        m, k, n = self.shape
        g = self.generator(seed)
        return {"x": self.randn((m, k), g), "weight": self.randn((n, k), g, scale=1.0 / math.sqrt(k)),
                "bias": self.randn((n,), g, scale=0.5)}

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
        m, k, n = self.shape
        g = self.generator(seed)
        return {"x": self.randn((m, k), g), "weight": self.randn((n, k), g, scale=1.0 / math.sqrt(k)),
                "grad_out": self.randn((m, n), g)}

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
