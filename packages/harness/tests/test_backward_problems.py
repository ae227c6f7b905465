"""The backward and forward+backward problems on each device: torch's own backward (the control) meets the
float64 truth within the tolerance, an output off by a little more than it does not, and the byte counts."""

import pytest

from kernellab.harness import validate
from kernellab.harness.case import seed_for
from kernellab.harness.suites import gpu_norm_backward
from kernellab.harness.suites.problems import (
    AutogradFloor,
    LayerNormBackward,
    LayerNormTrain,
    RMSNormBackward,
    RMSNormTrain,
    SoftmaxBackward,
    SoftmaxTrain,
)

KINDS = [SoftmaxBackward, RMSNormBackward, LayerNormBackward, SoftmaxTrain, RMSNormTrain, LayerNormTrain, AutogradFloor]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", [(1, 7), (33, 257), (300, 64)])
def test_torch_control_meets_the_float64_truth(kind, shape, device):
    problem = kind(shape, "fp32", device)
    report = validate.validate_call(problem, problem.control, seed_for(problem.name, 0))
    assert report["passed"], report


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
def test_a_wrong_gradient_fails(kind, device):
    problem = kind((16, 96), "fp32", device)

    def off(i, o):
        out = problem.control(i, o)
        return {k: v * 1.001 if k.startswith("d") else v for k, v in out.items()}

    assert not validate.validate_call(problem, off, seed_for(problem.name, 1))["passed"]


def test_bytes_are_the_minimum_the_backward_moves():
    m, n = 64, 1000
    assert SoftmaxBackward((m, n), "bf16", "cuda").bytes_moved() == 3 * m * n * 2
    assert RMSNormBackward((m, n), "fp32", "cuda").bytes_moved() == (3 * m * n + 2 * n) * 4
    assert LayerNormBackward((m, n), "fp32", "cuda").bytes_moved() == (3 * m * n + 4 * n) * 4
    assert LayerNormTrain((m, n), "bf16", "cuda").bytes_moved() == (5 * m * n + 6 * n) * 2


def test_cpu_ops_counts_the_saved_statistics_and_each_vector_twice_in_a_step():
    m, n = 64, 1000
    assert SoftmaxBackward((m, n), "fp32", "cpu").bytes_moved() == 3 * m * n * 4
    assert RMSNormBackward((m, n), "fp32", "cpu").bytes_moved() == (3 * m * n + 2 * n + m) * 4
    assert LayerNormBackward((m, n), "fp32", "cpu").bytes_moved() == (3 * m * n + 4 * n + 2 * m) * 4
    assert LayerNormTrain((m, n), "fp32", "cpu").bytes_moved() == (5 * m * n + 4 * n) * 4


def test_suite_has_backward_and_train_cases_at_the_example_shapes():
    names = {p.name for p in gpu_norm_backward().make_problems()}
    for op in ("softmax", "rmsnorm", "layernorm"):
        for dtype in ("fp32", "bf16"):
            assert f"{op}_backward_256x3072_{dtype}" in names
            assert f"{op}_backward_16384x8192_{dtype}" in names
            assert f"{op}_train_256x3072_{dtype}" in names
    assert "copy_65536x1024_bf16" in names
    assert {f"autograd_floor_{s}_{d}" for s in ("37x1537", "256x3072", "768x6144", "1024x4096")
            for d in ("fp32", "bf16")} <= names, "the host floor beside each example shape's training steps"


def test_the_autograd_floor_copies_once_each_way():
    assert AutogradFloor((64, 1000), "bf16", "cuda").bytes_moved() == 4 * 64 * 1000 * 2
    problem = AutogradFloor((64, 1000), "fp32", "cpu")
    inputs = problem.make_inputs(5)
    out = problem.control(inputs, problem.make_outputs(inputs))
    assert out["dx"].data_ptr() != inputs["grad_out"].data_ptr() and out["dx"].equal(inputs["grad_out"])


def test_slack_covers_only_the_vector_gradients():
    inputs = LayerNormBackward((8, 16), "fp32", "cpu").make_inputs(3)  # the slack reads x and dy alone
    slack = LayerNormBackward((8, 16), "fp32", "cuda").slack(inputs)
    assert set(slack) == {"dweight", "dbias"}
    assert all(s.shape == (16,) and bool((s > 0).all()) for s in slack.values())
    assert SoftmaxBackward((8, 16), "fp32", "cuda").slack(SoftmaxBackward((8, 16), "fp32", "cpu").make_inputs(3)) == {}
    assert LayerNormBackward((8, 16), "fp32", "cpu").slack(inputs) == {}, "cpu-ops' tolerance covers the sums"


@pytest.mark.parametrize("kind", [SoftmaxTrain, RMSNormTrain, LayerNormTrain])
def test_a_train_problems_torch_forward_compiles_whole(kind):
    """A training step's compiled contender compiles the op's forward (``torch_forward``) and runs autograd on it,
    as ``torch.compile(model)`` in a training loop does: the forward is one graph, with no break, and the step
    through it is the control's."""
    import torch

    problem = kind((16, 96), "fp32", "cpu")
    inputs = problem.make_inputs(seed_for(problem.name, 1))
    torch._dynamo.reset()
    compiled = torch.compile(problem.torch_forward(), backend="eager", fullgraph=True, dynamic=False)
    ours = problem.step(compiled, inputs)
    theirs = problem.control(inputs, problem.make_outputs(inputs))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


@pytest.mark.parametrize("kind", KINDS)
def test_an_impl_reading_the_former_gradient_name_still_validates(kind):
    """A baseline revision's impls read ``dy`` (the name before the suites' merge); today's problems call it
    ``grad_out``. The impl below is the control seen through the old name: it must validate, while the inputs
    list, hash and check today's names alone, and a name that never was one still raises KeyError."""
    problem = kind((16, 96), "fp32", "cpu")

    def former(i, o):
        assert "dy" not in i and list(i).count("grad_out") == 1
        return problem.control({**i, "grad_out": i["dy"]}, o)

    assert validate.validate_call(problem, former, seed_for(problem.name, 2))["passed"]
    with pytest.raises(KeyError, match="dx"):
        problem.make_inputs(3)["dx"]
