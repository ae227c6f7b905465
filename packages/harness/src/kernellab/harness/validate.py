"""The correctness protocol: poisoned outputs, fresh inputs, float64 truth, input-mutation check,
and changed-input CUDA-graph replay. A kernel that is fast and wrong is worse than none."""

from __future__ import annotations

from typing import Any

from .case import Call, Problem, Tensors


def poison(outputs: Tensors) -> None:
    """NaN-fill float outputs (max value for integer ones) so that an unwritten element fails."""
    import torch

    for t in outputs.values():
        if t.is_floating_point():
            t.fill_(float("nan"))
        else:
            t.fill_(torch.iinfo(t.dtype).max)


def snapshot(inputs: Tensors) -> Tensors:
    return {k: v.detach().clone() for k, v in inputs.items()}


def _same(a, b) -> bool:
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        return bool(torch.equal(torch.nan_to_num(a, nan=0.0), torch.nan_to_num(b, nan=0.0))
                    and torch.equal(torch.isnan(a), torch.isnan(b)))
    return bool(torch.equal(a, b))


def compare(result: Tensors, truth: Tensors, rtol: float, atol: float, slack: Tensors | None = None) -> dict[str, Any]:
    """Elementwise |out - ref| <= atol + rtol |ref| (+ slack, where the problem gives one for that
    output: see ``Problem.slack``); NaN passes only where the truth is NaN, infinities only where the
    truth has the same infinity."""
    import torch

    report: dict[str, Any] = {"passed": True, "outputs": {}}
    missing = sorted(set(truth) - set(result))
    if missing:
        report["passed"] = False
        report["error"] = f"outputs missing from the result: {missing}"
        return report
    for key, ref in truth.items():
        out = result[key]
        if tuple(out.shape) != tuple(ref.shape):
            report["passed"] = False
            report["outputs"][key] = {"passed": False, "error": f"shape {tuple(out.shape)} != {tuple(ref.shape)}"}
            continue
        o = out.detach().to(torch.float64)
        r = ref.detach().to(device=o.device, dtype=torch.float64)
        o_nan, r_nan = torch.isnan(o), torch.isnan(r)
        o_inf, r_inf = torch.isinf(o), torch.isinf(r)
        finite = ~(r_nan | r_inf)
        diff = (o - r).abs()
        bound = atol + rtol * r.abs()
        allowance = (slack or {}).get(key)
        if allowance is not None:
            if tuple(allowance.shape) != tuple(ref.shape):
                raise ValueError(f"slack for {key!r} has shape {tuple(allowance.shape)}, expected {tuple(ref.shape)}")
            allowance = allowance.detach().to(device=o.device, dtype=torch.float64)
            bound = bound + allowance
        ok = torch.where(finite, diff <= bound, torch.zeros_like(r_nan))
        ok |= r_nan & o_nan
        ok |= r_inf & o_inf & (torch.sign(o) == torch.sign(r))
        ok &= ~(o_nan & ~r_nan)
        bad = int((~ok).sum())
        fin = finite & ~o_nan & ~o_inf
        max_abs = float(diff[fin].max()) if bool(fin.any()) else 0.0
        denom = r.abs().clamp_min(1e-30)
        max_rel = float((diff / denom)[fin].max()) if bool(fin.any()) else 0.0
        entry = {
            "passed": bad == 0,
            "elements": int(r.numel()),
            "violations": bad,
            "unwritten_or_nan": int((o_nan & ~r_nan).sum()),
            "max_abs_error": max_abs,
            "max_rel_error": max_rel,
            "rtol": rtol,
            "atol": atol,
        }
        if allowance is not None:
            entry["max_slack"] = float(allowance.max())
        report["outputs"][key] = entry
        report["passed"] &= entry["passed"]
    return report


def validate_call(problem: Problem, call: Call, seed: int) -> dict[str, Any]:
    """One validation: fresh inputs from ``seed``, poisoned outputs, truth, and inputs unchanged."""
    inputs = problem.make_inputs(seed)
    return _check(problem, call, inputs, problem.make_outputs(inputs), seed)


def validate_in_place(problem: Problem, call: Call, inputs: Tensors, outputs: Tensors, seed: int) -> dict[str, Any]:
    """Fresh inputs written into buffers the call has already seen, poisoned outputs, truth.

    Run after each timed batch, this catches a kernel that skips work after its first calls or
    caches results by buffer address, which fresh allocations alone could miss.
    """
    fresh = problem.make_inputs(seed)
    for k, t in inputs.items():
        t.copy_(fresh[k])
    return _check(problem, call, inputs, outputs, seed) | {"in_place": True}


def _check(problem: Problem, call: Call, inputs: Tensors, outputs: Tensors, seed: int) -> dict[str, Any]:
    """Poison the outputs, call, compare with the float64 truth of the inputs as they were before."""
    before = snapshot(inputs)
    poison(outputs)
    _sync(problem)
    result = call(inputs, outputs)
    _sync(problem)
    tol = problem.tolerance()
    report = compare(result, problem.reference(before), tol.rtol, tol.atol, problem.slack(before))
    mutated = sorted(k for k in inputs if not _same(inputs[k], before[k]))
    report["inputs_unchanged"] = not mutated
    if mutated:
        report["passed"] = False
        report["error"] = f"the call wrote its inputs {mutated}"
    report["seed"] = seed
    return report


def validate_graph_replay(problem: Problem, call: Call, seed: int, changed_seed: int) -> dict[str, Any]:
    """Capture one call in a CUDA graph, change the inputs in place, replay, check the new answer."""
    import torch

    inputs = problem.make_inputs(seed)
    outputs = problem.make_outputs(inputs)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call(inputs, outputs)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = call(inputs, outputs)
    fresh = problem.make_inputs(changed_seed)
    for k, t in inputs.items():
        t.copy_(fresh[k])
    before = snapshot(inputs)
    poison(outputs)
    for t in result.values():  # results that are not the output buffers live in the graph's pool
        if t.is_floating_point():
            t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    tol = problem.tolerance()
    report = compare(result, problem.reference(before), tol.rtol, tol.atol, problem.slack(before))
    report["replay_changed_input"] = report["passed"]
    return report


def _sync(problem: Problem) -> None:
    if problem.device == "cuda":
        import torch

        torch.cuda.synchronize()
