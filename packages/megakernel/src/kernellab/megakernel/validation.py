"""The correctness protocol for an engine at a shape (DESIGN section 3), on the harness's helpers.

- ``validate.validate_call``: fresh inputs, NaN-poisoned outputs, the float64 reference, and the
  inputs checked unchanged after the call;
- the changed-input replay: capture, change every input in place, replay, compare to the new truth.
  Engines that own their graphs (``*-graph``) are replayed through their own call (capturing them
  again would nest graphs); the others are captured by the harness's ``validate_graph_replay``.
"""

from __future__ import annotations

from kernellab.harness import validate
from kernellab.harness.case import Problem, seed_for


def owned_graph_replay(problem: Problem, call, seed: int, changed_seed: int) -> dict:
    """For a call that captures its own CUDA graph: first call captures (per buffer set), then the
    inputs change in place and the second call must replay the graph on the new values."""
    import torch

    inputs = problem.make_inputs(seed)
    outputs = problem.make_outputs(inputs)
    call(inputs, outputs)
    fresh = problem.make_inputs(changed_seed)
    for name, t in inputs.items():
        t.copy_(fresh[name])
    before = validate.snapshot(inputs)
    validate.poison(outputs)
    result = call(inputs, outputs)
    torch.cuda.synchronize()
    tol = problem.tolerance()
    report = validate.compare(result, problem.reference(before), tol.rtol, tol.atol, problem.slack(before))
    report["replay_changed_input"] = report["passed"]
    return report


def check(problem: Problem, engine: str, call, seed: int = 0) -> dict:
    """One validation and one changed-input replay; ``passed`` needs both."""
    from .engines import split_graph

    owns_graph = split_graph(engine)[1]
    first = validate.validate_call(problem, call, seed_for(seed, problem.name, engine, "validate"))
    seeds = [seed_for(seed, problem.name, engine, "replay", k) for k in (0, 1)]
    if owns_graph:
        replay = owned_graph_replay(problem, call, *seeds)
    else:
        replay = validate.validate_graph_replay(problem, call, *seeds)
    out = first["outputs"].get("y", {})
    return {
        "passed": bool(first["passed"] and replay["passed"]),
        "replay_changed_input": bool(replay["replay_changed_input"]),
        "inputs_unchanged": first.get("inputs_unchanged", False),
        "max_abs_error": out.get("max_abs_error"),
        "violations": out.get("violations"),
        "elements": out.get("elements"),
        "rtol": out.get("rtol"),
        "atol": out.get("atol"),
        "max_slack": out.get("max_slack"),
        **({"error": first["error"]} if "error" in first else {}),
    }


def error_summary(out, truth, rtol: float, atol: float, slack=None) -> dict:
    """The report's error block of one output against its truth (harness ``compare`` plus the mean)."""
    allowance = None if slack is None else {"y": slack}
    entry = validate.compare({"y": out}, {"y": truth}, rtol, atol, allowance)["outputs"]["y"]
    diff = (out.double() - truth.double()).abs()
    return {"passed": entry["passed"], "max_abs_error": entry["max_abs_error"],
            "mean_abs_error": float(diff.mean()), "violations": entry["violations"], "elements": entry["elements"],
            "rtol": rtol, "atol": atol}
