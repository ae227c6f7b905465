"""The ``gpu-megakernel-models`` harness suite, on the CPU: its problems, its torch control (checked against
the float64 reference and the compiled model's CPU chain) and its impls' refusals."""

from __future__ import annotations

import types

import pytest
import torch

from kernellab.harness import validate
from kernellab.harness.case import Unsupported
from kernellab.megakernel import bench, models
from kernellab.megakernel.compiler import runner

CASES = (
    models.ModelCase("small-swiglu", {"channels": 16, "final_norm": "rmsnorm", "blocks": [
        {"hidden": 24, "activation": "silu", "norm": "rmsnorm", "gated": True, "bias": False},
        {"hidden": 40, "activation": "gelu", "norm": {"kind": "layernorm", "bias": True}}]}, fits_l2=True),
    models.ModelCase("plain-relu", {"channels": 24, "blocks": [
        {"hidden": 32, "activation": "relu"}, {"hidden": 8, "activation": "gelu_erf"},
        {"hidden": 72, "activation": "silu", "norm": {"kind": "layernorm", "bias": False}}]}, fits_l2=True),
)


def test_suite_lists_every_model_and_row_count_without_making_weights():
    suite = bench.models_suite()
    problems = suite.make_problems()
    assert [p.name for p in problems] == [f"stack_{rows}x{case.spec['channels']}_fp16_{case.name}"
                                          for case in models.REPORT_MODELS for rows in models.REPORT_ROWS]
    assert suite.control == bench.MODELS_CONTROL and suite.impl(bench.MODELS_CONTROL)
    assert {i.name for i in suite.impls} == {"persistent-stack", "persistent-stack-gemv", "block-chain",
                                             bench.MODELS_CONTROL}
    assert all("source" not in p.__dict__ for p in problems), "listing the suite made a model's weights"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("rows", [1, 7])
def test_control_passes_validation_and_matches_the_compiled_cpu_chain(case, rows):
    problem = models.StackProblem(case, rows, device="cpu")
    result = validate.validate_call(problem, problem.control, seed=11)
    assert result["passed"], result
    inputs = problem.make_inputs(5)
    compiled = runner.compile_model(case.spec, rows=rows, target="cpu")
    ours = problem.control(inputs, problem.make_outputs(inputs))["y"]
    assert torch.equal(ours, compiled(inputs["x"])), "the control and the CPU chain round at different points"


def test_control_that_drops_a_block_fails_validation():
    case = CASES[1]
    problem = models.StackProblem(case, 4, device="cpu")
    short = models.StackProblem(models.ModelCase("short", {**case.spec, "blocks": case.spec["blocks"][:-1]},
                                                 fits_l2=True), 4, device="cpu")

    def drops_the_last_block(inputs, outputs):
        return short.control(inputs, outputs)

    assert not validate.validate_call(problem, drops_the_last_block, seed=2)["passed"]


def test_impls_refuse_without_a_gpu_naming_the_impl():
    problem = models.StackProblem(CASES[0], 4, device="cpu")
    for impl in bench.models_suite().impls:
        if impl.name == bench.MODELS_CONTROL:
            continue
        if not torch.cuda.is_available():
            assert impl.available() == "no CUDA device"
        with pytest.raises(Unsupported, match=impl.name):
            impl.bind(problem)


def test_fused_impl_refuses_a_model_the_stack_pass_did_not_fuse(monkeypatch):
    """A fused impl must not time the per-block chain under its name: the stack pass's reason is the refusal."""
    plan = types.SimpleNamespace(form="per-block chain", form_reason="hidden 40 is not a multiple of 64")
    monkeypatch.setattr(runner, "compile_model", lambda *a, **k: types.SimpleNamespace(fused=None, plan=lambda: plan))
    problem = models.StackProblem(CASES[0], 4, device="cpu")
    with pytest.raises(Unsupported, match="stack pass refused .*hidden 40 is not a multiple of 64"):
        bench.models_suite().impl("persistent-stack").bind(problem)
    chained = bench.models_suite().impl("block-chain").bind(problem)  # the chain impl takes it as it is
    assert callable(chained)


@pytest.mark.parametrize("rows, refused", [(1, True), (16, False)])
def test_a_forced_form_impl_refuses_where_planning_chooses_that_form(monkeypatch, rows, refused):
    """At one row the planned impl already runs the gemv form: the forced gemv impl would time the same kernel,
    and it says so before compiling anything."""
    compiles = []
    monkeypatch.setattr(runner, "compile_model", lambda *a, **k: compiles.append(k) or types.SimpleNamespace(
        fused=object()))
    problem = models.StackProblem(CASES[1], rows, device="cpu")
    impl = bench.models_suite().impl("persistent-stack-gemv")
    if refused:
        with pytest.raises(Unsupported, match="planned in the gemv form, which persistent-stack times"):
            impl.bind(problem)
        assert not compiles
    else:
        assert callable(impl.bind(problem)) and compiles[0]["stack_form"] == "gemv"


def test_torch_contenders_run_the_module_as_inference():
    """The report's torch contenders call the module with weights that require no grad: a call records no
    autograd graph (which ``y.copy_`` would chain across calls, holding each call's activations), and a module
    with grad is refused before any call."""
    module = models.build_module(CASES[0].spec, seed=3)
    assert not any(p.requires_grad for p in module.parameters())
    call = models.module_call(models.writes_y(module), module)
    inputs, outputs = {"x": torch.randn(5, 16)}, {"y": torch.empty(5, 16)}
    for _ in range(3):
        call(inputs, outputs)
    assert outputs["y"].grad_fn is None and not outputs["y"].requires_grad
    with torch.no_grad():
        assert torch.equal(outputs["y"], module(inputs["x"]))
    trained = models.build_module(CASES[0].spec, seed=3).requires_grad_(True)
    with pytest.raises(ValueError, match="module: expected parameters that require no grad"):
        models.module_call(models.writes_y(trained), trained)


def test_torch_compile_contender_compiles_each_row_count_statically():
    """Every model shares ``StackModel.forward``: without ``dynamic=False`` dynamo would compile a graph of any row
    count at the second count it sees, and time later row counts with kernels tuned for another. Each (module, row
    count) must be its own static graph."""
    graphs = []

    def recording(gm, example_inputs):
        graphs.append([tuple(t.shape) if isinstance(t, torch.Tensor) else t for t in example_inputs])
        return gm.forward

    torch._dynamo.reset()
    for case in CASES:
        module = models.build_module(case.spec, seed=1)
        compiled = models.compile_module(module, backend=recording)
        channels = case.spec["channels"]
        for rows in (1, 16, 64, 16):
            x, y = torch.randn(rows, channels), torch.empty(rows, channels)
            compiled(x, y)
            with torch.no_grad():
                assert torch.allclose(y, module(x))
    assert len(graphs) == 2 * 3, graphs  # one graph a model and new row count, none again at 16 rows
    assert all(isinstance(dim, int) for shapes in graphs for shape in shapes if isinstance(shape, tuple)
               for dim in shape), graphs
    assert all(not isinstance(t, torch.SymInt) for shapes in graphs for t in shapes), graphs
