"""One revision's measurement: rounds x samples x iterations over every case of a suite.

``Bench`` runs in the process that owns the code being measured: in-process for a plain run, in a
worker subprocess per revision for an A/B comparison (``revision.py``). A round visits every
problem; within a problem its impls run in an order that alternates from round to round, each with
a fresh validation (poisoned outputs, fresh inputs), then every mode's warmup and samples, each timed
batch followed by a validation in the buffers it just used (fresh values written in place).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import integrity, noise, provenance, threads, timing, validate
from .case import Impl, Problem, Suite, Unsupported, seed_for
from .progress import Progress, describe_samples

WARM_MS = 20.0  # least wall time of warmup calls before each mode's samples


@dataclasses.dataclass
class Config:
    rounds: int = 3
    samples: int = 30
    warmup: int = 10
    iterations: int = 5
    seed: int = 0
    modes: tuple[str, ...] | None = None  # None: every mode the device has
    rotate: bool = True  # False: the fewest input sets a batch needs, not enough to exceed the cache
    rotation_limit_bytes: int = 4 * 2**30  # the cache-exceeding sets' memory; a batch's sets are made past it
    validations_per_round: int = 1
    fresh_workers: bool = False  # a new worker process a side every round (``revision.run_sides``)

    def __post_init__(self):
        for field in ("rounds", "samples", "warmup", "iterations", "validations_per_round"):
            value = getattr(self, field)
            minimum = 0 if field == "warmup" else 1
            if not isinstance(value, int) or value < minimum:
                raise ValueError(f"{field} must be an integer >= {minimum}, got {value!r}")
        if self.modes is not None:
            unknown = sorted(set(self.modes) - set(timing.ALL_MODES))
            if unknown:
                raise ValueError(f"unknown modes {unknown}; modes are {list(timing.ALL_MODES)}")
            self.modes = tuple(self.modes)

    def to_json(self) -> dict:
        return dataclasses.asdict(self) | {"modes": list(self.modes) if self.modes else None}


def match(name: str, patterns: str | None) -> bool:
    """Comma-separated shell patterns (``softmax_*,*bf16``); None or empty matches everything."""
    if not patterns:
        return True
    return any(fnmatch.fnmatchcase(name, p.strip()) for p in patterns.split(",") if p.strip())


@dataclasses.dataclass
class Case:
    problem: Problem
    impl: Impl
    call: Callable | None = None
    status: str = "pending"  # ok | failed | unsupported | unavailable | error
    reason: str | None = None

    @property
    def id(self) -> str:
        return f"{self.problem.name}/{self.impl.name}"

    def describe(self) -> dict[str, Any]:
        return {"id": self.id, "problem": self.problem.describe(), "impl": self.impl.name,
                "status": self.status, "reason": self.reason}


class Bench:
    def __init__(self, suite: Suite, config: Config, *, cases: str | None = None, impls: str | None = None):
        self.suite = suite
        self.config = config
        self.device = timing.Device(suite.device)
        modes = config.modes or self.device.modes
        missing = [m for m in modes if m not in self.device.modes]
        if missing:
            raise ValueError(f"modes {missing} do not exist on {suite.device}; available: {list(self.device.modes)}")
        self.modes = tuple(modes)
        problems = [p for p in suite.make_problems() if match(p.name, cases)]
        if not problems:
            raise ValueError(f"no case of suite {suite.name!r} matches --cases {cases!r}")
        wanted = [i for i in suite.impls if i.name == suite.control or match(i.name, impls)]
        self.cases: list[Case] = []
        for problem in problems:
            for impl in wanted:
                self.cases.append(Case(problem, impl))
        self._problems = [(p, integrity.state_of(p)) for p in problems]  # before any contender has them
        threads.begin()  # every thread from now on is an impl's, a case's or a stray
        self._bind_all()

    # ---- setup -----------------------------------------------------------------------------
    def _bind_all(self) -> None:
        for case in self.cases:
            why = threads.own(case.impl.name, case.impl.available)  # contender code: its threads are the impl's
            if why:
                case.status, case.reason = "unavailable", why
                continue
            try:
                case.call = threads.own(case.impl.name, lambda case=case: case.impl.bind(case.problem))
                case.status = "ok"
            except Unsupported as e:
                case.status, case.reason = "unsupported", str(e)
            except Exception as e:  # noqa: BLE001 - a contender that cannot even bind is reported, not fatal
                case.status, case.reason = "error", f"bind failed: {type(e).__name__}: {e}"

    def artifacts(self) -> list[str]:
        """Built files of every impl that has a runnable case; an impl whose artifacts cannot be listed
        has its cases marked as errors rather than measured without provenance."""
        out: list[str] = []
        impls = {id(c.impl): c.impl for c in self.cases if c.call is not None}
        for impl in impls.values():
            try:
                out.extend(impl.artifacts())
            except Exception as e:  # noqa: BLE001
                for case in self.cases:
                    if case.impl is impl:
                        case.call, case.status = None, "error"
                        case.reason = f"artifacts failed: {type(e).__name__}: {e}"
        return sorted(set(out))

    def measured_packages(self) -> list[str]:
        """The ``kernellab.<package>`` names whose code this bench runs: the harness, the suite's
        package and every impl's; their sources go into provenance."""
        modules = [getattr(self.suite.make_problems, "__module__", None) or ""]
        modules += [m for impl in self.runnable_impls() for m in (provenance.impl_module(impl),
                                                                   provenance.bind_module(impl))]
        names = {"harness"}
        for module in modules:
            parts = module.split(".")
            if len(parts) > 1 and parts[0] == "kernellab":
                names.add(parts[1])
        return sorted(names)

    def runnable_impls(self) -> list[Impl]:
        """Each impl with a runnable case, once (their code is hashed into provenance)."""
        return list({id(c.impl): c.impl for c in self.cases if c.call is not None}.values())

    def describe(self) -> list[dict]:
        return [c.describe() for c in self.cases]

    # ---- one round ---------------------------------------------------------------------------
    def schedule(self, index: int) -> list[str]:
        """Runnable case ids of round ``index``: problem by problem, impl order alternating by round."""
        by_problem: dict[str, list[Case]] = {}
        for case in self.cases:
            if case.call is not None:
                by_problem.setdefault(case.problem.name, []).append(case)
        order = []
        for group in by_problem.values():
            order.extend(c.id for c in (group if index % 2 == 0 else reversed(group)))
        return order

    def run_round(self, index: int, progress: Progress | None = None) -> dict[str, Any]:
        """Validation and samples of every case for round ``index``: {case id: {...}}."""
        out: dict[str, Any] = {}
        if index == 0:
            self.device.warm_up()
        for cid in self.schedule(index):
            out[cid] = self.run_case(cid, index)
            if progress:
                progress.step(f"round {index + 1}: {cid}  {describe_samples(out[cid])}")
        return out

    def run_case(self, case_id: str, index: int, ship_dir: str | None = None) -> dict[str, Any]:
        case = next((c for c in self.cases if c.id == case_id), None)
        if case is None or case.call is None:
            raise KeyError(f"no runnable case {case_id!r}")
        with threads.measuring(case.impl.name):
            return self._run_case(case, index, ship_dir)

    def _run_case(self, case: Case, index: int, ship_dir: str | None) -> dict[str, Any]:
        """Validations with fresh buffers, the changed-input graph replay, then every mode's samples with
        every timed batch checked (``validate.BatchCheck``) and what disturbed each sample recorded; the
        harness checked unpatched before and after. With ``ship_dir``, a result of each validation and of
        each mode's last batch is written there for the driver to check outside this process."""
        cfg = self.config
        problem = case.problem
        result: dict[str, Any] = {"validations": [], "samples_us": {}, "disturbance": {}, "shipped": []}

        def ship(tag: str, seed: int, res, inputs) -> None:
            if ship_dir is None:
                return
            path = Path(ship_dir) / f"{len(result['shipped'])}-{problem.name}-{case.impl.name}-{index}-{tag}.pt"
            info = validate.ship(path, seed, res, inputs)
            result["shipped"].append({"tag": tag, **(info or {"skipped": "larger than the ship limit"})})

        try:
            self._unpatched(case)
            threads.settle_processes()  # none left by an earlier case or by any contender's import or bind
            self._validate(case, index, result, ship)
            if self.device.kind == "cuda" and case.impl.graphable and "graph_throughput" in self.modes:
                seeds = [seed_for(cfg.seed, problem.name, case.impl.name, "graph", index, k) for k in (0, 1)]
                result["graph_replay"] = validate.validate_graph_replay(problem, case.call, *seeds)
            self._sample_modes(case, index, result, ship)
            threads.settle_processes()
        except Exception as e:  # noqa: BLE001 - a crashing kernel is reported, not fatal to the run
            result["error"] = f"{type(e).__name__}: {e}"
        finally:
            if "error" in result:  # a case that ended early leaves no process of its contender to the next case
                with contextlib.suppress(threads.ProcessLeft):
                    threads.settle_processes(0)
            self.device.release()
        passed = all(v["passed"] for v in result["validations"]) and "error" not in result
        if "graph_replay" in result:
            passed &= result["graph_replay"]["passed"]
        result["passed"] = passed
        return result

    def _validate(self, case: Case, index: int, result: dict[str, Any], ship) -> None:
        """The round's validations, each with fresh inputs and poisoned outputs, in a frame of their own (as
        ``_sample_modes``): nothing of theirs is left for the device's release to miss, whatever ends them."""
        for v in range(self.config.validations_per_round):
            seed = seed_for(self.config.seed, case.problem.name, case.impl.name, "validate", index, v)
            report, res, inputs = validate.validate_call(case.problem, case.call, seed, keep=True)
            result["validations"].append(report)
            ship(f"validate{v}", seed, res, inputs)

    def _sample_modes(self, case: Case, index: int, result: dict[str, Any], ship) -> None:
        """Every mode's samples over the rotated input sets, each timed batch checked, then the harness checked
        unpatched. The sets live in this frame alone, so the device's release after the case gives their memory
        back: an A/B's other worker, taking its turn on the same GPU, needs it."""
        calls, sets = self._rotated_calls(case, index)
        checks = []
        for mode in self.modes:
            if mode == "graph_throughput" and not case.impl.graphable:
                continue
            check = validate.BatchCheck(case.problem, sets)
            checks.append(check)
            result["samples_us"][mode], result["disturbance"][mode] = self._measure(mode, calls, check)
            result["validations"].append(check.record() | {"mode": mode})
            if check.last is not None:
                ship(mode, *check.last)
        self._unpatched(case, checks)

    def _guarded(self) -> list:
        """The harness objects a case's measurement goes through, checked with the harness's code
        (``integrity.tampered``): contender code can reach them (``gc``) as it can reach a module."""
        probes = [p for p in (self.device.probe, self.device.gpu_probe) if p is not None]
        return [self, self.device, self.config, *probes]

    def _unpatched(self, case: Case, checks: list | None = None) -> None:
        """Refuse the case if contender code changed the harness (``integrity.verify``), the objects its
        measurement goes through, what the torch control's ops go through (``integrity.control_path_changes``),
        the problems it was handed (their truth, tolerance, inputs) or which case the harness waits for the threads
        of (``threads.measured``)."""
        patched = integrity.verify(self._guarded() + (checks or [])) + integrity.control_path_changes()
        for problem, state in self._problems:
            patched += integrity.changed_since(problem, state)
        if threads.measured() != case.impl.name:
            patched.append(f"threads._active (names {threads.measured()!r}, not {case.impl.name!r})")
        if patched:
            raise HarnessPatched(f"{integrity.REPLACED} while {case.impl.name!r} was loaded or run: "
                                 f"{sorted(patched)}; nothing it measured can be trusted")
        strays = threads.strays()
        if strays:
            raise threads.ThreadLeft(f"thread(s) {strays} running that no impl owns and no case started (one an "
                                     f"impl's thread started after its bind): they could load the machine under "
                                     f"{case.impl.name!r}'s case unwaited")

    def _measure(self, mode: str, calls: list[Callable[[], Any]], check: validate.BatchCheck) -> tuple[list, dict]:
        """Warm up, then one mode's samples, every batch checked: (samples kept, what disturbed them)."""
        after_contender, measure = integrity.guard(), timing.measure
        self._warm(calls)
        after_contender("the warmup calls")
        marks: list[dict] = []
        gpu = self.device.gpu_probe
        gpu_before = gpu.read() if gpu else None
        mhz = noise.cpu_mhz()
        raw = measure(mode, calls, self.device, samples=self.config.samples, iterations=self.config.iterations,
                      batch=check, marks=marks)
        kept, disturbance = noise.split(raw, marks)
        disturbance["cpu_mhz"] = noise.clock_range(mhz + noise.cpu_mhz())
        if gpu:
            disturbance |= noise.gpu_record(gpu_before, gpu.read())
        return kept, disturbance

    def _warm(self, calls: list[Callable[[], Any]]) -> None:
        """``warmup`` batches of ``iterations`` calls, going on over the rotated calls until WARM_MS of wall time
        have passed: each mode's samples start from the device's working clocks, not from the idle state that the
        validation before them (a float64 reference) can leave it in. Batches, not passes over every rotated set:
        a small problem rotates up to 4096 sets, and ten passes of a host-bound call over them took minutes."""
        start = time.perf_counter()
        batches, n, size = 0, len(calls), self.config.iterations
        while batches < self.config.warmup or (time.perf_counter() - start) * 1e3 < WARM_MS:
            for i in range(size):
                calls[(batches * size + i) % n]()
            self.device.sync()
            batches += 1

    def _rotated_calls(self, case: Case, index: int) -> tuple[list[Callable[[], Any]], list]:
        """Calls over enough input sets that they exceed twice the cache (without ``rotate``: no more than the
        next rule asks), and at least one per call of the longest batch whatever the memory limit (so that no call
        of a batch reads what an earlier one did), all writing one output set.

        Outputs do not rotate: a torch op allocates its result, and the caching allocator hands it the
        block the previous call freed, so its stores land in cache; impls given rotated buffers would
        store to memory against it. One output set per case puts every impl where torch is."""
        problem, cfg = case.problem, self.config
        first_in = problem.make_inputs(seed_for(cfg.seed, problem.name, "time", index, 0))
        outputs = problem.make_outputs(first_in)
        set_bytes = sum(t.numel() * t.element_size() for t in first_in.values())
        least = timing.LONGEST_BATCH * cfg.iterations  # without rotation too: see ``timing.rotation_count``
        n = timing.rotation_count(set_bytes, self.device.cache_bytes, limit_bytes=cfg.rotation_limit_bytes,
                                  least=least) if cfg.rotate else least
        sets = [(first_in, outputs)]
        for k in range(1, n):
            sets.append((problem.make_inputs(seed_for(cfg.seed, problem.name, "time", index, k)), outputs))
        call = case.call
        calls = [(lambda i=i, o=o: call(i, o)) for i, o in sets]
        return calls, sets


class HarnessPatched(RuntimeError):
    """Contender code replaced part of the harness's own timing or validation code."""


integrity.seal()  # before any contender is imported: the registry imports them after this module
