"""The residual-MLP megakernel: ``y = x + W2 act(W1 x + b1) + b2`` row-wise, fp16 operands, fp32
accumulation and output.

- engines (``engines.bind``): conventional, persistent, persistent-global, conventional-tc,
  persistent-tc (CuTe DSL), torch-cublas, torch-compile, and each as ``<name>-graph``; and the whole-stack
  engine persistent-stack (``compile_model``);
- the compiler (``compiler``: frontend -> ir -> passes -> codegen -> runner):
  ``compile_model(nn.Module or spec, rows=...)``: the per-block chain with the fallback persistent-tc ->
  persistent -> persistent-global -> conventional; with ``engine="persistent-stack"`` (opt-in) the whole
  stack in one launch where it fits, else that chain, the reason recorded;
- ``compile_all(arch="sm_90a")``: every kernel variant ahead of time, no GPU needed;
- ``python -m kernellab.megakernel.report`` and ``... .sanitize``: the engine report, compute-sanitizer.

Importing this package needs neither a GPU nor CuTe DSL; kernels compile on first use.
"""

from __future__ import annotations

from .model import ACTIVATIONS, Shape, reference, torch_forward
from .planning import choose

__version__ = "0.31.3"


def compile_all(arch: str = "sm_90a", representative: bool = False, log=None) -> list[str]:
    """Compile every kernel variant for ``arch`` (no GPU needed); returns the variant names."""
    from .aot import compile_all as compile_variants

    return compile_variants(arch, representative, log)


def compile_model(source, *, rows: int, **options):
    """Compile an nn.Module or a spec for ``rows`` rows; see ``runner.compile_model``."""
    from .compiler.runner import compile_model as compile_source

    return compile_source(source, rows=rows, **options)


__all__ = ["ACTIVATIONS", "Shape", "choose", "compile_all", "compile_model", "reference", "torch_forward",
           "__version__"]
