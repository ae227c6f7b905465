"""``torch-cublas`` and ``torch-compile``: the model in plain torch (``model.torch_forward``).

The formulation is chosen once per process by probing: the fastest of ``model.TORCH_FORMULATIONS``
that this torch build runs on this device and that matches the float64 reference (cuBLAS fp16
GEMMs with fp32 output where ``out_dtype`` exists, fp32 GEMMs otherwise). torch-compile compiles
the very same function with ``mode="max-autotune-no-cudagraphs"`` and static shapes, one compile
per shape and activation.
"""

from __future__ import annotations

import functools

from .. import model

COMPILE_MODE = "max-autotune-no-cudagraphs"
RECOMPILE_LIMIT = 256
"""Every (shape, activation) is a recompile of the same function; torch's default limit of 8 would
silently send later shapes to eager mode."""


@functools.cache
def formulation(traced: bool = False) -> str:
    """The first formulation that runs on this device and matches the reference; with ``traced``, the
    first that torch.compile can also trace (some builds' meta kernels reject ``out_dtype``)."""
    import torch

    shape = model.Shape(5, 24, 40)
    t = model.make_problem_tensors(shape, seed=0, device="cuda")
    truth = model.reference(t["x"], t["w1"], t["b1"], t["w2"], t["b2"], "gelu")
    rtol, atol = model.tolerance_for(shape)
    failures = []
    for name in model.TORCH_FORMULATIONS:
        y = torch.empty((shape.rows, shape.channels), dtype=torch.float32, device="cuda")
        run = functools.partial(model.torch_forward, formulation=name)
        if traced:
            torch._dynamo.reset()
            run = torch.compile(run, backend="eager", dynamic=False)
        try:
            run(t["x"], t["w1"], t["b1"], t["w2"], t["b2"], y, "gelu")
        except Exception as e:  # noqa: BLE001 - any failure (dynamo's own types included) rules the formulation out
            failures.append(f"{name}: {type(e).__name__}: {str(e)[:200]}")
            continue
        if torch.allclose(y.double(), truth, rtol=rtol, atol=atol):
            return name
        failures.append(f"{name}: does not match the reference")
    raise RuntimeError("no torch formulation of the model works here: " + "; ".join(failures))


def cublas_call(activation: str):
    form = formulation()

    def call(inputs, outputs):
        model.torch_forward(inputs["x"], inputs["w1"], inputs["b1"], inputs["w2"], inputs["b2"], outputs["y"],
                            activation, form)
        return outputs

    return call


def compile_call(activation: str):
    import torch

    from kernellab.harness import compile_config

    compile_config.for_contenders(RECOMPILE_LIMIT)  # no silent eager fallback, no threads left by Inductor
    form = formulation(traced=True)

    def forward(x, w1, b1, w2, b2, y):
        return model.torch_forward(x, w1, b1, w2, b2, y, activation, form)

    compiled = torch.compile(forward, mode=COMPILE_MODE, dynamic=False)

    def call(inputs, outputs):
        compiled(inputs["x"], inputs["w1"], inputs["b1"], inputs["w2"], inputs["b2"], outputs["y"])
        return outputs

    return call
