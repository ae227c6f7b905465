"""The correctness protocol: poisoned outputs, fresh inputs, float64 truth, input-mutation check,
and changed-input CUDA-graph replay. A kernel that is fast and wrong is worse than none."""

from __future__ import annotations

import os
from typing import Any

from . import integrity
from .case import Call, Problem, Tensors


def fresh_seed() -> int:
    """A seed no code in this process can know before it is drawn (the operating system's random source): the
    inputs of a timed batch, written from it just before the batch, cannot be computed ahead outside the clock."""
    return int.from_bytes(os.urandom(8), "little") >> 2


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


def input_spans(sets: list[Tensors]) -> list[tuple[str, int, int]]:
    """(device, first byte, end) of the storage behind every tensor of the input sets (``result_fault``)."""
    out = []
    for t in (t for one in sets for t in one.values()):
        storage = t.untyped_storage()
        out.append((str(t.device), storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
    return out


def result_fault(result: object, taken: list[tuple[str, int, int]]) -> str | None:
    """Why a call's result cannot be checked as it stands, or None. It must be a plain dict of plain tensors:
    a subclass of either could do the call's work when the harness reads it, after the clock stopped. No
    output may share memory with an input (``taken``: ``input_spans`` of every set the call may have read): an
    alias of an input is a result that moved no bytes. Nor may one record autograd: a baseline run with grad is
    timed with work it does not owe (a handicap read as our gain). Read without calling any method of the result."""
    import torch

    if type(result) is not dict:
        return f"the call returned a {type(result).__name__}, not a dict of tensors"
    for key, value in dict.items(result):
        if type(value) is not torch.Tensor:
            return f"output {key!r} is a {type(value).__name__}, not a torch.Tensor"
        if value.requires_grad:
            return (f"output {key!r} records autograd (requires_grad): the call would be timed with autograd's "
                    "work, its graph chained across calls; run the contender as inference")
        device, lo, hi = input_spans([{key: value}])[0]
        if hi > lo and any(d == device and lo < end and start < hi for d, start, end in taken):
            return f"output {key!r} shares memory with an input: a result must be written, not aliased"
    return None


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


def validate_call(problem: Problem, call: Call, seed: int, keep: bool = False):
    """One validation: fresh inputs from ``seed``, poisoned outputs, truth, and inputs unchanged. With
    ``keep``, (report, the call's result, its inputs) so that the result can be checked elsewhere too."""
    inputs = problem.make_inputs(seed)
    report, result = _check(problem, call, inputs, problem.make_outputs(inputs), seed)
    return (report, result, inputs) if keep else report


def _check(problem: Problem, call: Call, inputs: Tensors, outputs: Tensors,
           seed: int) -> tuple[dict[str, Any], Tensors]:
    """Poison the outputs, call, compare with the float64 truth of the inputs as they were before."""
    before = snapshot(inputs)
    poison(outputs)
    _sync(problem)
    after_contender = integrity.guard()
    result = call(inputs, outputs)
    after_contender("a validation call")
    _sync(problem)
    after_contender("a validation call's threads")
    fault = result_fault(result, input_spans([inputs]))
    if fault:
        return {"passed": False, "outputs": {}, "error": fault, "seed": seed}, {}
    tol = problem.tolerance()
    report = compare(result, problem.reference(before), tol.rtol, tol.atol, problem.slack(before))
    mutated = sorted(k for k in inputs if not _same(inputs[k], before[k]))
    report["inputs_unchanged"] = not mutated
    if mutated:
        report["passed"] = False
        report["error"] = f"the call wrote its inputs {mutated}"
    report["seed"] = seed
    return report, result


def validate_graph_replay(problem: Problem, call: Call, seed: int, changed_seed: int) -> dict[str, Any]:
    """Capture one call in a CUDA graph, change the inputs in place, replay, check the new answer."""
    import torch

    inputs = problem.make_inputs(seed)
    outputs = problem.make_outputs(inputs)
    after_contender = integrity.guard()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call(inputs, outputs)
    after_contender("the call before a graph's capture")
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = call(inputs, outputs)
    after_contender("a graph's capture")
    fault = result_fault(result, input_spans([inputs]))
    if fault:
        return {"passed": False, "outputs": {}, "error": fault, "replay_changed_input": False}
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
    after_contender("a graph's replay")  # a graph can hold host functions of the contender's
    tol = problem.tolerance()
    report = compare(result, problem.reference(before), tol.rtol, tol.atol, problem.slack(before))
    report["replay_changed_input"] = report["passed"]
    return report


def _sync(problem: Problem) -> None:
    """The call is over: every host thread its contender started has ended, and the device is idle."""
    from . import threads

    threads.settle()
    if problem.device == "cuda":
        import torch

        torch.cuda.synchronize()


class BatchCheck:
    """The ``timing.Batch`` of one case and mode: before every sample, fresh random contents (a seed drawn
    then, ``fresh_seed``) are written into the input sets its calls will read and the outputs are poisoned; after
    it, the last call's result is checked against the float64 truth of that call's inputs, and the
    inputs against what was written. A result kept from an earlier call, or work done only when the
    outputs look poisoned, fails here; so does work left for after the clock stopped, however soon it
    ends: the outputs are copied as soon as the clock stops and the seal is verified (``stopped``), and that copy is
    checked."""

    def __init__(self, problem: Problem, sets: list):
        self.problem, self.sets = problem, sets
        self._taken = input_spans([inputs for inputs, _ in sets])  # the sets' storage does not move
        self._written: dict[int, tuple[int, Tensors]] = {}  # set index -> (seed, the contents written)
        self.checked = self.failed = 0
        self.first_failure: dict | None = None
        self.last: tuple[int, Tensors, Tensors] | None = None  # (seed, result, inputs after) of the last sample
        self._held: tuple[Tensors | str] | None = None  # the outputs when the clock stopped, or why unreadable

    def before(self, first: int, count: int) -> None:
        n = len(self.sets)
        for index in sorted({(first + i) % n for i in range(min(count, n))}):
            seed = fresh_seed()
            fresh = self.problem.make_inputs(seed)
            for k, t in self.sets[index][0].items():
                t.copy_(fresh[k])
            self._written[index] = (seed, fresh)
        poison(self.sets[0][1])
        _sync(self.problem)

    def stopped(self, result) -> None:
        fault = result_fault(result, self._taken)
        self._held = (fault or {k: v.detach().clone() for k, v in dict.items(result)},)

    def after(self, last: int, result) -> None:
        if self._held is None:
            raise RuntimeError("BatchCheck.after without stopped: the outputs must be held when the clock stops")
        (result,), self._held = self._held, None
        index = last % len(self.sets)
        seed, fresh = self._written[index]
        inputs = self.sets[index][0]
        _sync(self.problem)
        tol = self.problem.tolerance()
        if isinstance(result, str):  # result_fault's reason
            report, result = {"passed": False, "outputs": {}, "error": result}, {}
        else:
            report = compare(result, self.problem.reference(fresh), tol.rtol, tol.atol, self.problem.slack(fresh))
        mutated = sorted(k for k in inputs if not _same(inputs[k], fresh[k]))
        if mutated:
            report["passed"] = False
            report["error"] = f"the call wrote its inputs {mutated}"
        self.checked += 1
        self.last = (seed, result, inputs)
        if not report["passed"]:
            self.failed += 1
            if self.first_failure is None:
                self.first_failure = report | {"seed": seed, "batch": self.checked}

    def record(self) -> dict[str, Any]:
        """The validation record of every timed batch of the mode."""
        out: dict[str, Any] = {"timed_batches": True, "checked": self.checked, "failed_batches": self.failed,
                               "passed": self.failed == 0 and self.checked > 0, "outputs": {}}
        if self.first_failure is not None:
            out["outputs"] = self.first_failure.get("outputs", {})
            out["error"] = (f"{self.failed} of {self.checked} timed batches gave wrong results; first: "
                            + (self.first_failure.get("error") or _first_bad(self.first_failure)))
        return out


def _first_bad(report: dict) -> str:
    bad = {k: o for k, o in report.get("outputs", {}).items() if not o.get("passed")}
    return "; ".join(f"{k}: {o.get('violations', '?')} of {o.get('elements', '?')} elements wrong "
                     f"({o.get('unwritten_or_nan', 0)} unwritten or NaN)" for k, o in bad.items()) or "failed"


# ---- outputs checked outside the process that runs contender code ------------------------------
SHIP_LIMIT_BYTES = 64 * 2**20  # results larger than this are checked in the worker only


def ship(path, seed: int, result: Tensors, inputs: Tensors) -> dict[str, Any] | None:
    """Write one call's result and its inputs as they were after it, for ``check_shipped`` in the driver;
    None where they exceed SHIP_LIMIT_BYTES."""
    import torch

    tensors = {**{f"result.{k}": v for k, v in result.items()}, **{f"input.{k}": v for k, v in inputs.items()}}
    if sum(t.numel() * t.element_size() for t in tensors.values()) > SHIP_LIMIT_BYTES:
        return None
    torch.save({k: v.detach().to("cpu").clone() for k, v in tensors.items()}, path)
    return {"file": str(path), "seed": int(seed)}


def check_shipped(problem: Problem, shipped: dict[str, Any]) -> dict[str, Any]:
    """In the driver, which never imports contender code: the inputs remade from their seed, the
    float64 truth, and the shipped result and inputs compared against them."""
    import torch

    data = torch.load(shipped["file"], map_location=problem.device, weights_only=True)
    inputs = problem.make_inputs(shipped["seed"])
    result = {k.split(".", 1)[1]: v for k, v in data.items() if k.startswith("result.")}
    after = {k.split(".", 1)[1]: v for k, v in data.items() if k.startswith("input.")}
    tol = problem.tolerance()
    report = compare(result, problem.reference(inputs), tol.rtol, tol.atol, problem.slack(inputs))
    unshipped = sorted(k for k in inputs if k not in after)
    mutated = sorted(k for k in inputs if k in after and not _same(after[k], inputs[k]))
    if unshipped:  # a worker whose suite names its inputs otherwise (another revision): nothing to compare
        report["passed"] = False
        report["error"] = (f"the worker shipped no input named {unshipped} (it shipped {sorted(after)}): its "
                           "problem differs from the driver's, so its result cannot be checked outside it")
    elif mutated:
        report["passed"] = False
        report["error"] = f"the call wrote its inputs {mutated} (checked outside the worker)"
    report["seed"] = shipped["seed"]
    return report
