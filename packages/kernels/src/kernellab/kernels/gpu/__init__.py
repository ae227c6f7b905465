"""GPU backend: softmax, RMSNorm and LayerNorm over the last dimension in CuTe DSL (Hopper, sm_90a).

fp32, fp16 and bf16 inputs with fp32 accumulation; any N >= 1 and any leading shape; rows may have a
row stride != N (the last dimension must have stride 1). One kernel module per op
(``softmax_kernel``, ``rmsnorm_kernel``, ``layernorm_kernel``: named apart from the functions they
serve) over shared tiling and reductions (``base``); ``compiler`` compiles each variant once per
process; ``ops`` holds the checked public functions and the torch custom ops.
"""

from .ops import layernorm, layernorm_backward, rmsnorm, rmsnorm_backward, softmax, softmax_backward


def compile_all(arch: str = "sm_90a") -> list[str]:
    """Compile every kernel variant the suites and a representative set of shapes need, for ``arch``,
    without a GPU; raises on any compile error. Returns the names of the variants compiled."""
    from .compiler import compile_all as _compile_all

    return _compile_all(arch)


def artifacts() -> list[str]:
    """The cubins of the variants compiled in this process (for provenance)."""
    from .compiler import artifacts as _artifacts

    return _artifacts()


__all__ = ["artifacts", "compile_all", "layernorm", "layernorm_backward", "rmsnorm", "rmsnorm_backward", "softmax",
           "softmax_backward"]
