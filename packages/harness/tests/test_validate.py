import pytest
import torch
from fakes import Affine, caches_by_pointer, honest, leaves_tail_unwritten, writes_input

from kernellab.harness import validate
from kernellab.harness.case import seed_for

PROBLEM = Affine((7, 13), "fp32", "cpu")


def test_honest_call_passes():
    r = validate.validate_call(PROBLEM, honest(PROBLEM), seed=1)
    assert r["passed"] and r["inputs_unchanged"]
    assert r["outputs"]["y"]["violations"] == 0 and r["outputs"]["y"]["elements"] == 91


def test_unwritten_output_fails_through_poison():
    r = validate.validate_call(PROBLEM, leaves_tail_unwritten(PROBLEM), seed=1)
    assert not r["passed"]
    assert r["outputs"]["y"]["unwritten_or_nan"] == 7


def test_writing_the_input_fails():
    r = validate.validate_call(PROBLEM, writes_input(PROBLEM), seed=1)
    assert not r["passed"] and not r["inputs_unchanged"]
    assert "wrote its inputs ['x']" in r["error"]


def test_pointer_cache_fails_on_fresh_inputs_in_the_same_buffer():
    call = caches_by_pointer(PROBLEM)
    inputs = PROBLEM.make_inputs(seed_for("a"))
    outputs = PROBLEM.make_outputs(inputs)
    call(inputs, outputs)
    inputs["x"].copy_(PROBLEM.make_inputs(seed_for("b"))["x"])
    result = call(inputs, outputs)
    r = validate.compare(result, PROBLEM.reference(inputs), 1e-6, 1e-6)
    assert not r["passed"]


def test_nan_never_passes_unless_the_truth_is_nan():
    truth = {"y": torch.tensor([1.0, float("nan"), float("inf"), -float("inf")], dtype=torch.float64)}
    good = {"y": torch.tensor([1.0, float("nan"), float("inf"), -float("inf")])}
    assert validate.compare(good, truth, 0, 0)["passed"]
    for bad in ([float("nan"), float("nan"), float("inf"), -float("inf")],
                [1.0, 1.0, float("inf"), -float("inf")],
                [1.0, float("nan"), -float("inf"), -float("inf")],
                [1.0, float("nan"), 1e308, -float("inf")]):
        assert not validate.compare({"y": torch.tensor(bad, dtype=torch.float64)}, truth, 1e-3, 1e-3)["passed"]


def test_missing_output_and_wrong_shape_fail():
    truth = {"y": torch.zeros(3, dtype=torch.float64) + 1}
    assert "missing" in validate.compare({}, truth, 0, 0)["error"]
    assert not validate.compare({"y": torch.ones(4)}, truth, 0, 0)["passed"]


def test_slack_widens_the_bound_only_where_given():
    truth = {"y": torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)}
    out = {"y": torch.tensor([1.0, 2.1, 3.1], dtype=torch.float64)}
    assert validate.compare(out, truth, 0, 1e-3)["outputs"]["y"]["violations"] == 2
    entry = validate.compare(out, truth, 0, 1e-3, {"y": torch.tensor([0.0, 0.2, 0.0])})["outputs"]["y"]
    assert entry["violations"] == 1 and entry["max_slack"] == pytest.approx(0.2)
    nan_out = {"y": torch.tensor([1.0, float("nan"), 3.0], dtype=torch.float64)}
    assert not validate.compare(nan_out, truth, 0, 1e-3, {"y": torch.full((3,), 1e9)})["passed"]
    with pytest.raises(ValueError, match="slack for 'y' has shape"):
        validate.compare(out, truth, 0, 1e-3, {"y": torch.zeros(2)})


@pytest.mark.gpu
def test_graph_replay_with_changed_inputs_on_gpu():
    p = Affine((64, 128), "fp32", "cuda")
    assert validate.validate_graph_replay(p, honest(p), 1, 2)["replay_changed_input"]
    assert not validate.validate_graph_replay(p, caches_by_pointer(p), 1, 2)["replay_changed_input"]


def test_shipped_results_are_checked_by_a_process_that_runs_no_contender(tmp_path):
    """What a worker ships is judged by the driver's own comparison against inputs remade from the seed,
    so a contender that patched the worker's comparison still fails there."""
    import torch

    seed = 5
    inputs = PROBLEM.make_inputs(seed)
    right = {"y": inputs["x"].double().mul(2).add(1).float()}
    ok = validate.ship(tmp_path / "ok.pt", seed, right, inputs)
    assert validate.check_shipped(PROBLEM, ok)["passed"]
    wrong = validate.ship(tmp_path / "wrong.pt", seed, {"y": torch.zeros_like(right["y"])}, inputs)
    assert not validate.check_shipped(PROBLEM, wrong)["passed"]
    stale = validate.ship(tmp_path / "stale.pt", seed + 1, right, inputs)  # an answer to other inputs
    assert not validate.check_shipped(PROBLEM, stale)["passed"]
    mutated = {"x": inputs["x"] + 1}
    report = validate.check_shipped(PROBLEM, validate.ship(tmp_path / "mut.pt", seed, right, mutated))
    assert not report["passed"] and "wrote its inputs" in report["error"]
    renamed = {"x_renamed": inputs["x"]}  # a baseline's suite that names the input otherwise
    report = validate.check_shipped(PROBLEM, validate.ship(tmp_path / "renamed.pt", seed, right, renamed))
    assert not report["passed"] and "shipped no input named ['x']" in report["error"]
    assert "wrote its inputs" not in report["error"]
