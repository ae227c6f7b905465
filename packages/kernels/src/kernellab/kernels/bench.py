"""Contenders this package adds to the harness's suites (entry points ``kernellab.suites``).

Each impl binds a suite problem to one of our kernels writing into the harness's output buffers,
so that poisoned outputs catch unwritten elements.
"""

from __future__ import annotations


def _native_call(problem):
    from kernellab.harness.case import Unsupported

    from . import cpu

    if problem.device != "cpu":
        raise Unsupported(f"native is the CPU backend; {problem.name} runs on {problem.device}")
    if problem.dtype != "fp32":
        raise Unsupported(f"native runs fp32; {problem.name} is {problem.dtype}")
    op = problem.op
    if op == "softmax":
        return lambda i, o: {"y": cpu.softmax(i["x"], out=o["y"])}
    if op == "rmsnorm":
        eps = problem.params["eps"]
        return lambda i, o: {"y": cpu.rmsnorm(i["x"], i["weight"], eps, out=o["y"])}
    if op == "layernorm":
        eps = problem.params["eps"]
        return lambda i, o: {"y": cpu.layernorm(i["x"], i["weight"], i["bias"], eps, out=o["y"])}
    if op == "linear_forward":
        return lambda i, o: {"y": cpu.linear_forward(i["x"], i["weight"], i["bias"], out=o["y"])}
    if op == "linear_backward":
        def call(i, o):
            dx, dw, db = cpu.linear_backward(i["x"], i["weight"], i["grad_out"],
                                             dx=o["dx"], dweight=o["dweight"], dbias=o["dbias"])
            return {"dx": dx, "dweight": dw, "dbias": db}
        return call
    if op == "softmax_backward":
        return lambda i, o: {"dx": cpu.softmax_backward(i["y"], i["grad_out"], out=o["dx"])}
    if op == "rmsnorm_backward":
        def rmsnorm_grads(i, o):
            dx, dw = cpu.rmsnorm_backward(i["x"], i["rstd"], i["grad_out"], i["weight"], dx=o["dx"],
                                          dweight=o["dweight"])
            return {"dx": dx, "dweight": dw}
        return rmsnorm_grads
    if op == "layernorm_backward":
        def layernorm_grads(i, o):
            dx, dw, db = cpu.layernorm_backward(i["x"], i["mean"], i["rstd"], i["grad_out"], i["weight"],
                                                dx=o["dx"], dweight=o["dweight"], dbias=o["dbias"])
            return {"dx": dx, "dweight": dw, "dbias": db}
        return layernorm_grads
    train = _TRAIN_FORWARDS.get(op)
    if train is not None:
        forward = train(problem)
        return lambda i, o: problem.step(forward, i)
    raise Unsupported(f"native has no {op}")


# The forward each "<op>_train" problem runs through autograd with our functions.
_TRAIN_FORWARDS = {
    "softmax_train": lambda p: _public().softmax,
    "rmsnorm_train": lambda p: lambda x, w: _public().rmsnorm(x, w, p.params["eps"]),
    "layernorm_train": lambda p: lambda x, w, b: _public().layernorm(x, w, b, p.params["eps"]),
    "linear_train": lambda p: _public().linear_forward,
}


def _public():
    """The public functions (device dispatch included), as a training loop would call them."""
    import kernellab.kernels as kernels

    return kernels


def native_impls():
    from kernellab.harness.case import Impl

    def artifacts():
        from . import cpu

        return [cpu.library_path()]

    return [Impl(name="native", bind=_native_call, artifacts=artifacts, graphable=False,
                 description="kernellab native C++ CPU backend (vectorized, OpenMP)")]


# ---- GPU contenders of the gpu-norm suite ------------------------------------------------------------
_TORCH_NAMES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
_READ_AGAINST = {  # the suites' reference problems: torch alone measures them
    "copy": "copy is the bandwidth ceiling every case is read against; torch alone measures it",
    "autograd_floor": "autograd_floor is the host floor every training step is read against; torch alone measures it",
}


def _gpu_problem(problem, impl: str) -> None:
    from kernellab.harness.case import Unsupported

    if problem.device != "cuda":
        raise Unsupported(f"{impl} runs on CUDA; {problem.name} runs on {problem.device}")
    if problem.dtype not in _TORCH_NAMES:
        raise Unsupported(f"{impl} runs fp32, fp16 and bf16; {problem.name} is {problem.dtype}")
    if problem.op in _READ_AGAINST:
        raise Unsupported(_READ_AGAINST[problem.op])
    base, _, kind = problem.op.partition("_")
    if base not in ("softmax", "rmsnorm", "layernorm") or kind not in ("", "backward", "train"):
        raise Unsupported(f"{impl} has no {problem.op}")


def _parts(problem) -> tuple[str, str]:
    """(the op, "" for the forward, "backward" or "train" for fwd+bwd through autograd)."""
    base, _, kind = problem.op.partition("_")
    return base, kind


def _cute_call(problem):
    from . import gpu
    from .gpu import compiler

    _gpu_problem(problem, "cute")
    op, kind = _parts(problem)
    if kind:
        return _cute_gradients(problem, op, kind)
    n, dtype = problem.shape[-1], _TORCH_NAMES[problem.dtype]
    # compile now, out of the timed loop: the suite's fresh contiguous buffers are in the widest class
    compiler.compiled(compiler.Variant(op, dtype, n, compiler.widest_vector(n, dtype),
                                       weight=None if op == "softmax" else dtype,
                                       bias=dtype if op == "layernorm" else None))
    if op == "softmax":
        return lambda i, o: {"y": gpu.softmax(i["x"], out=o["y"])}
    eps = problem.params["eps"]
    if op == "rmsnorm":
        return lambda i, o: {"y": gpu.rmsnorm(i["x"], i["weight"], eps, out=o["y"])}
    return lambda i, o: {"y": gpu.layernorm(i["x"], i["weight"], i["bias"], eps, out=o["y"])}


def _cute_gradients(problem, op: str, kind: str):
    """Backward alone (from the forward's saved y, rstd, mean) or forward+backward through autograd."""
    from . import gpu

    eps = problem.params.get("eps")
    if kind == "train":
        forward = {"softmax": lambda x: gpu.softmax(x),
                   "rmsnorm": lambda x, weight: gpu.rmsnorm(x, weight, eps),
                   "layernorm": lambda x, weight, bias: gpu.layernorm(x, weight, bias, eps)}[op]
        return lambda i, o: problem.step(forward, i)
    if op == "softmax":
        return lambda i, o: {"dx": gpu.softmax_backward(i["y"], i["grad_out"])}
    if op == "rmsnorm":
        def rms(i, o):
            dx, dw = gpu.rmsnorm_backward(i["x"], i["weight"], i["grad_out"], i["rstd"])
            return {"dx": dx, "dweight": dw}
        return rms

    def ln(i, o):
        dx, dw, db = gpu.layernorm_backward(i["x"], i["weight"], i["grad_out"], i["mean"], i["rstd"])
        return {"dx": dx, "dweight": dw, "dbias": db}
    return ln


def _cute_available() -> str | None:
    try:
        import cutlass  # noqa: F401
        import tvm_ffi  # noqa: F401
    except ImportError as e:
        return f"CuTe DSL with TVM-FFI is not installed ({e}); pip install 'kernellab-kernels[gpu]'"
    return None


def cute_impls():
    from kernellab.harness.case import Impl

    def artifacts():
        from . import gpu

        return gpu.artifacts()  # cubins kept by each compile (CuTe DSL --keep-cubin)

    return [Impl(name="cute", bind=_cute_call, available=_cute_available, artifacts=artifacts,
                 description="kernellab CuTe DSL kernels (128-bit vector rows, cluster reductions, TVM-FFI calls)")]


RECOMPILE_LIMIT = 256
"""Every case is a recompile of its op's control; past torch's default limit of 8, dynamo would run the
later cases eagerly and time torch under the name ``compile``."""


def _compile_call(problem):
    import torch

    from kernellab.harness import compile_config

    _gpu_problem(problem, "compile")
    compile_config.for_contenders(RECOMPILE_LIMIT)
    if _parts(problem)[1] == "train":  # the forward compiled, as torch.compile(model) in a training loop: its
        forward = torch.compile(problem.torch_forward(), dynamic=False)  # backward is AOTAutograd's, no graph break
        return lambda i, o: problem.step(forward, i)
    return torch.compile(problem.control, dynamic=False)


def _compile_available() -> str | None:
    try:
        import triton  # noqa: F401
    except ImportError as e:
        return f"torch.compile for CUDA needs triton ({e})"
    return None


def compile_impls():
    from kernellab.harness.case import Impl

    return [Impl(name="compile", bind=_compile_call, available=_compile_available,
                 description="torch.compile (default mode, dynamic=False) of the problem's torch control")]


def _quack_call(problem):
    """QuACK's forward ops (the ones behind its public functions), writing into the harness's output
    buffers as ours do, so that both are timed storing to the same memory and both outputs are
    poisoned before every validation."""
    from kernellab.harness.case import Unsupported

    _gpu_problem(problem, "quack")
    import importlib

    quack_softmax = importlib.import_module("quack.softmax")  # the modules (quack.softmax is the function)
    quack_norms = importlib.import_module("quack.rmsnorm")

    op, kind = _parts(problem)
    n = problem.shape[-1]
    vec = 128 // (8 * problem.element_size())
    if kind:
        return _quack_gradients(problem, op, kind, n % vec == 0)
    if op == "softmax":
        if n % vec:  # its tiled copy asserts N % (128-bit vector) == 0
            raise Unsupported(f"quack 0.6.5 softmax needs N % {vec} == 0 for {problem.dtype}; N={n}")

        def call(i, o):
            quack_softmax._softmax_fwd(i["x"], o["y"])
            return {"y": o["y"]}

        return call
    if problem.dtype != "fp32" and n % vec:  # fails to compile (16-bit dtypes, unaligned rows)
        raise Unsupported(f"quack 0.6.5 {op} does not compile for {problem.dtype} at N % {vec} != 0; N={n}")
    eps, layernorm = problem.params["eps"], op == "layernorm"

    def call(i, o):  # (x, weight, out, bias, rstd, mean, residual, residual_out, eps, is_layernorm)
        quack_norms._rmsnorm_fwd(i["x"], i["weight"], o["y"], i.get("bias"), None, None, None, None, eps, layernorm)
        return {"y": o["y"]}

    return call


def _quack_gradients(problem, op: str, kind: str, aligned: bool):
    """QuACK's backward ops (dw/db as fp32 per-SM partials summed by torch, as its autograd does), or its
    autograd functions for forward+backward."""
    import importlib

    from kernellab.harness.case import Unsupported

    if not aligned:  # its tiled copies assert 128-bit vectors per row
        raise Unsupported(f"quack 0.6.5 backward needs N % (128-bit vector) == 0; N={problem.shape[-1]}")
    quack_softmax = importlib.import_module("quack.softmax")
    quack_norms = importlib.import_module("quack.rmsnorm")
    eps = problem.params.get("eps")
    if kind == "train":
        if op == "layernorm":
            raise Unsupported("quack 0.6.5 has no autograd LayerNorm function")
        forward = {"softmax": lambda x: quack_softmax.softmax(x),
                   "rmsnorm": lambda x, weight: quack_norms.rmsnorm(x, weight, eps=eps)}[op]
        return lambda i, o: problem.step(forward, i)
    if op == "softmax":
        def soft(i, o):
            quack_softmax._softmax_backward(i["grad_out"], i["y"], o["dx"])
            return {"dx": o["dx"]}
        return soft
    if op == "rmsnorm":
        def rms(i, o):
            dx, dw, _, _ = quack_norms.rmsnorm_bwd(i["x"], i["weight"], i["grad_out"], i["rstd"])
            return {"dx": dx, "dweight": dw}
        return rms

    def ln(i, o):
        dx, dw, db = quack_norms.layernorm_bwd(i["x"], i["weight"], i["grad_out"], i["rstd"], i["mean"], has_bias=True)
        return {"dx": dx, "dweight": dw, "dbias": db}
    return ln


def _quack_available() -> str | None:
    try:
        import quack  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure makes the comparison point unavailable
        return f"quack is not importable ({type(e).__name__}: {e})"
    return None


def quack_impls():
    from kernellab.harness.case import Impl

    return [Impl(name="quack", bind=_quack_call, available=_quack_available,
                 description="QuACK 0.6.5 softmax and norm forward and backward ops (comparison point)")]
