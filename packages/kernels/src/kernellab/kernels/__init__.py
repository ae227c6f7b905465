"""Softmax, RMSNorm and LayerNorm over the last dimension, and linear forward/backward.

Each public function dispatches on the tensor's device: CUDA tensors go to the CuTe DSL kernels
(``kernellab.kernels.gpu``), CPU tensors to the native C++ backend (``kernellab.kernels.cpu``).
"""

from .dispatch import layernorm, linear_backward, linear_forward, rmsnorm, softmax

__version__ = "0.10.6"

__all__ = ["layernorm", "linear_backward", "linear_forward", "rmsnorm", "softmax", "__version__"]
