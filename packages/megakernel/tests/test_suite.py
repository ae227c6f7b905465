"""The gpu-megakernel suite as the harness sees it (entry point, problems, impls, control)."""

import torch

from kernellab.harness import registry
from kernellab.megakernel import bench, engines, model


def test_suite_is_discovered_through_the_entry_point():
    suite = registry.get("gpu-megakernel")
    assert suite.device == "cuda" and suite.control == "torch-cublas"
    assert [i.name for i in suite.impls] == list(engines.ENGINES)
    assert not any(i.graphable for i in suite.impls if i.name.endswith("-graph"))  # they own their graphs
    names = [p.name for p in suite.make_problems()]
    assert names[0] == "residual_mlp_1x7x13_fp16_gelu" and len(names) == 11


def test_problem_on_cpu_makes_inputs_outputs_and_truth():
    problem = bench.ResidualMLP((5, 19, 37), device="cpu", activation="silu")
    inputs = problem.make_inputs(0)
    outputs = problem.make_outputs(inputs)
    assert outputs["y"].shape == (5, 19) and outputs["y"].dtype == torch.float32
    truth = problem.reference(inputs)["y"]
    torch.testing.assert_close(truth, model.reference(**inputs, activation="silu"))
    assert problem.flops() == 4 * 5 * 19 * 37
    assert (problem.tolerance().rtol, problem.tolerance().atol) == (1e-3, 1e-3)


def test_engines_are_unavailable_without_a_gpu_and_say_why():
    if torch.cuda.is_available():
        return
    assert engines.unavailable("persistent-tc") == "no CUDA device"
    assert engines.split_graph("persistent-tc-graph") == ("persistent-tc", True)
