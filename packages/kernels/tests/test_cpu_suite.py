"""Every cpu-ops case, torch's control and the native contender alike, passes the harness's correctness
protocol (poisoned outputs, float64 truth, inputs unchanged) once: the suite's backward, forward+backward
and linear sweep cases included."""

from __future__ import annotations

import pytest

from kernellab.harness import suites, validate
from kernellab.harness.case import Unsupported
from kernellab.kernels import bench

PROBLEMS = suites.cpu_ops().make_problems()


def test_suite_has_training_cases_and_the_linear_sweep():
    ops = {p.op for p in PROBLEMS}
    assert "copy" in ops and suites.cpu_ops().ceiling_op == "copy", "the row ops are read against a copy"
    for op in ("softmax", "rmsnorm", "layernorm"):
        assert {f"{op}_backward", f"{op}_train"} <= ops
    assert "linear_train" in ops
    linear = {p.shape for p in PROBLEMS if p.op == "linear_backward"}
    assert any(m == 1 for m, _, _ in linear), "the decode case (one row) is swept"
    assert any(k % 2 for _, k, _ in linear) and any(k > n for _, k, n in linear) and any(n > k for _, k, n in linear)


@pytest.mark.parametrize("problem", PROBLEMS, ids=[p.name for p in PROBLEMS])
@pytest.mark.parametrize("impl", ["torch", "native"])
def test_case_validates(problem, impl):
    if impl == "native" and problem.op == "copy":  # the bandwidth ceiling: torch alone measures it
        with pytest.raises(Unsupported, match="native has no copy"):
            bench._native_call(problem)
        return
    call = problem.control if impl == "torch" else bench._native_call(problem)
    report = validate.validate_call(problem, call, seed=7)
    assert report["passed"], report
