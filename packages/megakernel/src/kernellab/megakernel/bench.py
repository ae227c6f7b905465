"""The harness suites of this package (entry points ``kernellab.suites``):

- ``gpu-megakernel``: the residual MLP at the development and assessment shapes, every engine as an impl,
  torch-cublas as the control. The assessment shapes are measured, never tuned on: nothing in planning looks
  at them.
- ``gpu-megakernel-models``: the report's whole models at its row counts, compiled as one fused launch
  (``persistent-stack``) and as the per-block chain (``block-chain``), against torch block by block with the
  kernels' rounding points (``torch-chain``, the control). Being a suite, it gets the harness's revision A/B
  (``kernellab-bench --suite gpu-megakernel-models --baseline REV``) and ``kernellab-audit``: the way a change
  to the fused engine is measured against the commit before it. (torch eager and torch.compile of the fp16
  ``nn.Module`` round at other points, so they stay in the report's ``models`` section, with their own
  tolerance.)
"""

from __future__ import annotations

from kernellab.harness.case import Impl, Problem, Suite, Tolerance, Unsupported

from . import model, planning

DEVELOPMENT_SHAPES = ((1, 7, 13), (33, 32, 64), (129, 31, 47), (257, 64, 128), (1024, 128, 256), (4096, 256, 1024),
                      (16384, 512, 2048))
ASSESSMENT_SHAPES = ((5, 19, 37), (49, 48, 96), (193, 63, 111), (513, 96, 192))
DEFAULT_ACTIVATION = "gelu"
CONTROL = "torch-cublas"


class ResidualMLP(Problem):
    """``y = x + W2 fp16(act(W1 x + b1)) + b2`` at shape (rows, channels, hidden); fp16 operands,
    fp32 accumulation, bias and output."""

    op = "residual_mlp"

    def __init__(self, shape, dtype: str = "fp16", device: str = "cuda", activation: str = DEFAULT_ACTIVATION):
        model.check_activation(activation)
        super().__init__(shape, dtype, device, activation=activation)
        if len(self.shape) != 3:
            raise ValueError(f"shape is (rows, channels, hidden), got {shape!r}")

    @property
    def model_shape(self) -> model.Shape:
        return model.Shape(*self.shape)

    @property
    def activation(self) -> str:
        return self.params["activation"]

    def name_suffix(self) -> str:
        return f"_{self.activation}"

    def make_inputs(self, seed: int):
        return model.make_problem_tensors(self.model_shape, seed=seed, device=self.device)

    def make_outputs(self, inputs):
        import torch

        rows, channels, _ = self.shape
        return {"y": torch.empty((rows, channels), dtype=torch.float32, device=self.device)}

    def reference(self, inputs):
        return {"y": model.reference(inputs["x"], inputs["w1"], inputs["b1"], inputs["w2"], inputs["b2"],
                                     self.activation)}

    def slack(self, inputs):
        return {"y": model.hidden_rounding_slack(inputs["x"], inputs["w1"], inputs["b1"], inputs["w2"],
                                                 self.activation)}

    def control(self, inputs, outputs):
        from .engines import torch_baselines

        return torch_baselines.cublas_call(self.activation)(inputs, outputs)

    def bytes_moved(self) -> int:
        return planning.minimum_bytes(*self.shape)

    def flops(self) -> int:
        return planning.flops(*self.shape)

    def tolerance(self) -> Tolerance:
        return Tolerance(*model.tolerance_for(self.model_shape))


def cubins() -> list[str]:
    """The compiled kernels' cubins (imported on use: CuTe DSL only where something was compiled)."""
    from .engines.common import artifacts

    return artifacts()


def problems(shapes=DEVELOPMENT_SHAPES + ASSESSMENT_SHAPES, activation: str = DEFAULT_ACTIVATION) -> list[ResidualMLP]:
    return [ResidualMLP(shape, activation=activation) for shape in shapes]


def impl(name: str) -> Impl:
    """One engine as a harness impl. The ``*-graph`` engines capture their own graphs, so the
    harness must not capture them again (graphable=False)."""
    from . import engines

    def bind(problem: ResidualMLP):
        try:
            return engines.bind(name, problem.model_shape, problem.activation).call
        except Exception as e:  # noqa: BLE001 - a kernel that fails to build is reported per case, not fatal
            raise Unsupported(f"{name} could not be built for {problem.name}: {type(e).__name__}: {e}") from e

    def artifacts():
        return [] if engines.split_graph(name)[0] in engines.TORCH_ENGINES else cubins()

    return Impl(name=name, bind=bind, available=lambda: engines.unavailable(name), artifacts=artifacts,
                graphable=not name.endswith(engines.GRAPH_SUFFIX), description=f"megakernel engine {name}")


def suite() -> Suite:
    from . import engines

    return Suite(
        name="gpu-megakernel",
        device="cuda",
        description="Residual MLP y = x + W2 act(W1 x + b1) + b2 (fp16 operands, fp32 accumulation and output, "
                    f"{DEFAULT_ACTIVATION}) at the development and assessment shapes, every engine",
        make_problems=problems,
        impls=[impl(name) for name in engines.ENGINES],
        control=CONTROL,
        defaults={"rounds": 3, "samples": 50, "warmup": 10, "iterations": 10},
    )


MODELS_CONTROL = "torch-chain"


def model_impl(name: str, engine: str, **options) -> Impl:
    """``compile_model(spec, rows, engine=engine)`` as a harness impl (weights of the problem's seed). A fused
    model the stack pass refused is Unsupported with the pass's reason: it would time the chain under the
    fused name. So is a forced form where planning chooses that form itself: the planned impl times it."""
    from .planning.stack import STACK_ENGINE, StackPlan, plan_stack

    def bind(problem):
        from .compiler import frontend
        from .compiler.runner import compile_model
        from .planning import current_device

        form = options.get("stack_form")
        if engine == STACK_ENGINE and form:  # decided before anything is compiled or packed
            planned = plan_stack(frontend.read_spec(problem.case.spec)[0], problem.shape[0], current_device())
            if isinstance(planned, StackPlan) and planned.form == form:
                raise Unsupported(f"{name}: {problem.name} is planned in the {form} form, which {STACK_ENGINE} "
                                  "times: the same kernel")
        try:
            compiled = compile_model(problem.case.spec, rows=problem.shape[0], seed=problem.weights_seed,
                                     engine=engine, **options)
        except Exception as e:  # noqa: BLE001 - reported per case, not fatal
            raise Unsupported(f"{name} could not be built for {problem.name}: {type(e).__name__}: {e}") from e
        if engine == STACK_ENGINE and compiled.fused is None:
            plan = compiled.plan()
            raise Unsupported(f"{name}: the stack pass refused {problem.name} ({plan.form_reason})")

        def call(inputs, outputs):
            compiled(inputs["x"], out=outputs["y"])
            return outputs

        return call

    def available():
        from . import engines

        return engines.unavailable("persistent-tc")  # a CUDA device, CuTe DSL and TVM-FFI, as the fused engine

    forced = "".join(f", {k}={v!r}" for k, v in options.items())
    return Impl(name=name, bind=bind, available=available, artifacts=cubins,
                description=f"compile_model(engine={engine!r}{forced})")


def models_suite() -> Suite:
    from . import models
    from .planning.stack import STACK_ENGINE

    def problems():
        return [models.StackProblem(case, rows) for case in models.REPORT_MODELS for rows in models.REPORT_ROWS]

    control = Impl(name=MODELS_CONTROL, bind=lambda problem: problem.control,
                   description="torch block by block, the kernels' rounding points")
    return Suite(
        name="gpu-megakernel-models",
        device="cuda",
        description="The report's whole models (residual-MLP stacks, fp16 in, fp32 out) at rows "
                    f"{', '.join(map(str, models.REPORT_ROWS))}: the fused stack in one launch and the per-block "
                    "chain, against torch block by block",
        make_problems=problems,
        impls=[model_impl(STACK_ENGINE, STACK_ENGINE),
               model_impl(f"{STACK_ENGINE}-gemv", STACK_ENGINE, stack_form="gemv"),  # forced: beside the planned form
               model_impl("block-chain", "persistent-tc"), control],
        control=MODELS_CONTROL,
        defaults={"rounds": 3, "samples": 30, "warmup": 10, "iterations": 10},
    )
