"""The compiler: a model (torch ``nn.Module`` or a spec) to one callable.

    frontend -> ir -> passes -> codegen -> runner

``frontend`` reads the model into IR blocks and their parameters; ``ir`` is the program the passes
fill in (validated on the way into and out of every pass); ``passes`` is the linear pipeline of
named passes with what each requires and ensures; ``codegen`` turns the planned program into
launchable steps; ``runner`` is the driver (``compile_model``) and the ``CompiledModel`` it returns;
``checks`` is the compiler's evidence for the report. Only ``runner`` and ``codegen`` touch the GPU.
"""

from __future__ import annotations

from .runner import CompiledModel, compile_model

__all__ = ["CompiledModel", "compile_model"]
