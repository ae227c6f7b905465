"""The engine report: ``python -m kernellab.megakernel.report`` (console script ``kernellab-megakernel-report``).

For every development and assessment shape and every engine: bind (which engine serves the shape:
``served_by``), validate (poisoned outputs, fresh inputs, the float64 reference, inputs unchanged,
and the changed-input CUDA-graph replay), then time in ``--rounds`` rounds of ``--samples`` calls,
engine order alternating between rounds: ``stream_summary`` from the harness's ``gpu_throughput`` (CUDA
events around K calls queued behind a hold, so that the device time per call is measured, not the host's
time to issue it; K is sized from the warmup to about ``--stream-us`` of work), ``host_summary`` from the
host clock around each call plus a synchronize. Each round also times the launch floor the same
way (``launch_floor``: an empty kernel called as every engine is, directly and replayed in a CUDA
graph), the least any engine call can take. Then the compiler block, the sanitizer results
(``--sanitizers``, from ``python -m kernellab.megakernel.sanitize``), the targets, provenance, and a
sha256 over the canonical JSON. A table of stream p50 and the launch floor's line close the run.

A run longer than one sitting (torch.compile's max-autotune is slow to compile) can be split:
``--engines``/``--shapes`` select, ``--resume REPORT`` keeps what that report measured for every
(shape, engine) this run does not measure again. Nothing measured is lost to a run cut short: the
report is written after each shape's validation and after each round, marked ``partial`` (what was
done and what was not) until the last write.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from . import bench, engines, model

STREAM_CALLS_MAX = 64  # calls queued behind one hold: well inside the driver's launch queue

LIMITATIONS = [
    "Random-weight residual MLP (fp16 operands, fp32 accumulation and output); no model-accuracy or serving claim.",
    "Device-resident inputs and outputs, one input set per shape and round (small working sets stay in L2); "
    "Stream times are device time per call with calls queued back to back behind a hold (no host gaps); a "
    "user's loop of single calls also pays the host's cost per call, which host_summary shows.",
    "launch_floor is an empty kernel (one CTA, one tensor argument) compiled and called as the engines' kernels "
    "are: through TVM-FFI on the current stream, directly and replayed in a CUDA graph. At the small shapes an "
    "engine's time is read against it, not against zero. It passes one tensor where a kernel engine's call passes "
    "seven (twice for the two-launch engines), whose argument checks cost the host a little more.",
    "All rounds share one process; the assessment shapes were never used for tuning (planning does not know "
    "them), which is evidence of generalization, not proof.",
    "persistent-global keeps persistent's owners and arithmetic order but moves the hidden rows to global memory, "
    "which also changes its shared-memory footprint and occupancy.",
    "conventional-tc needs channels and hidden multiples of 8 (16-byte cp.async); persistent-tc loads other "
    "shapes element by element (tile_vector 1 in its plan) and needs channels <= 512; shapes an engine cannot serve "
    "go down the fallback chain (served_by). At the large shapes even the FMA units' peak is above 0.25x cuBLAS, "
    "and the CUDA-core engines, whose weights do not fit in shared memory there, read them from global memory "
    "element by element, far below that peak: they are not expected to compete there.",
    "models section: compile_model packs each model's weights once, before timing (padded, concatenated, the norm "
    "weights in fp32), as a serving runtime would; torch eager and torch.compile take the nn.Module as it is "
    "(no freezing), in inference (no parameter requires grad), torch.compile for each row count alone. The fp32 "
    "output the protocol asks for costs eager one cast kernel a call, which torch.compile fuses into its last.",
]
FLOOR_WHAT = ("An empty kernel (one CTA of 32 threads, given y, writing nothing) launched as every engine is: compiled "
              "for TVM-FFI, called with a torch tensor on the current stream, directly (stream_summary, host_summary) "
              "and replayed in a CUDA graph (graph_summary, graph_host_summary); the least an engine call can take.")
TARGETS = {"best_persistent_graph_vs_torch_cublas_graph": 0.5, "best_persistent_graph_vs_torch_compile_graph": 0.8,
           "persistent_vs_torch_cublas": 0.25}


def _shape_list(text: str | None) -> list[tuple[str, tuple[int, int, int]]]:
    """(set, shape) pairs: 'development', 'assessment', or RxCxH items (recorded as development)."""
    sets = {"development": bench.DEVELOPMENT_SHAPES, "assessment": bench.ASSESSMENT_SHAPES}
    if not text:
        return [(name, s) for name, shapes in sets.items() for s in shapes]
    out = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        if item in sets:
            out += [(item, s) for s in sets[item]]
            continue
        try:
            shape = tuple(int(v) for v in item.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--shapes: {item!r} is neither a set name nor RxCxH") from None
        if len(shape) != 3:
            raise SystemExit(f"--shapes: {item!r} is not RxCxH")
        kind = next((name for name, shapes in sets.items() if shape in shapes), "development")
        out.append((kind, shape))
    return out


def _engine_list(text: str | None) -> list[str]:
    if not text:
        return list(engines.ENGINES)
    patterns = [p.strip() for p in text.split(",") if p.strip()]
    chosen = [e for e in engines.ENGINES if any(fnmatch.fnmatchcase(e, p) for p in patterns)]
    if not chosen:
        raise SystemExit(f"--engines {text!r} matches none of {list(engines.ENGINES)}")
    return chosen


def _ms_summary(samples_us: list[float]) -> dict:
    from kernellab.harness import stats

    s = stats.summary(samples_us)
    return {"count": s["count"], **{f"{k}_ms": s[k] / 1e3 for k in ("p50", "p95", "min", "max", "mean")}}


def _clock_summaries(samples: dict[str, list[float]]) -> dict:
    """``stream_summary`` and ``host_summary`` from the samples ``Run.time_call`` gathered."""
    return {f"{clock}_summary": _ms_summary(samples[clock]) for clock in ("stream", "host")}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kernellab-megakernel-report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="reports/h200/megakernel.json", help="report path (JSON)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--samples", type=int, default=200, help="timed calls per round, per engine, per clock")
    p.add_argument("--warmup", type=int, default=20, help="untimed calls before each engine's samples")
    p.add_argument("--stream-us", type=float, default=200.0,
                   help="device time per stream sample: calls per sample = this / the warmup's time per call "
                        f"(1 to {STREAM_CALLS_MAX})")
    p.add_argument("--engines", help="comma-separated names or shell patterns (default: all)")
    p.add_argument("--shapes", help="'development', 'assessment' and/or RxCxH items, comma-separated "
                   "(default: both sets)")
    p.add_argument("--activation", default=bench.DEFAULT_ACTIVATION, choices=model.ACTIVATIONS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sanitizers", help="JSON written by python -m kernellab.megakernel.sanitize")
    p.add_argument("--resume", help="a report to extend: its (shape, engine) results are kept unless re-measured")
    p.add_argument("--no-compiler", action="store_true", help="skip the compiler block (kept from --resume if any)")
    p.add_argument("--models", action="store_true",
                   help="add the models section: the four whole models at rows 1..4096, every contender validated "
                        "and timed (torch.compile max-autotune for each: long); kept from --resume otherwise")
    p.add_argument("--model-cases", help="with --models: comma-separated model names or shell patterns (default: "
                                         "all four); entries of other models are kept from --resume")
    p.add_argument("--model-rows", help="with --models: comma-separated row counts (default: 1,16,64,1024,4096); "
                                        "entries of other row counts are kept from --resume")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--show", metavar="REPORT", help="verify a report's sha256 and print its table, then exit")
    p.add_argument("--models-only", action="store_true", help="with --show: the models section's table and targets "
                   "alone")
    p.add_argument("--format", default="simple", help="table format for --show (tabulate's; 'github' for READMEs)")
    p.add_argument("--plot", metavar="PNG", help="with --show: draw the report's picture (default for a run: the "
                                                 "report's path with .png, where matplotlib is installed)")
    return p


class Run:
    def __init__(self, args):
        from kernellab.harness import timing

        self.args = args
        self.device = timing.Device("cuda")
        self.shapes = _shape_list(args.shapes)
        self.engines = _engine_list(args.engines)
        self.results: dict[tuple, dict] = {}  # (shape tuple, engine) -> entry
        self.bound: dict[tuple, engines.Bound] = {}
        self.samples: dict[tuple, dict[str, list[float]]] = {}
        self.floor_calls: dict[str, Callable] = {}  # "direct" and "graph": the empty kernel as a harness call
        self.floor_samples = {how: {"stream": [], "host": []} for how in ("direct", "graph")}
        self.floor_error: str | None = None

    def log(self, text: str) -> None:
        if not self.args.quiet:
            print(text, file=sys.stderr, flush=True)

    def bind_and_validate(self, after_shape: Callable[[int], None] = lambda done: None) -> None:
        """Bind and validate every (shape, engine); ``after_shape(shapes done)`` after each shape."""
        from . import validation

        for done, (_, shape) in enumerate(self.shapes, 1):
            problem = bench.ResidualMLP(shape, activation=self.args.activation)
            for name in self.engines:
                key = (shape, name)
                why = engines.unavailable(name)
                if why:
                    self.results[key] = {"passed": False, "replay_changed_input": False, "error": why}
                    continue
                start = time.perf_counter()
                try:
                    bound = engines.bind(name, problem.model_shape, self.args.activation)
                    check = validation.check(problem, name, bound.call, self.args.seed)
                except Exception as e:  # noqa: BLE001 - a failing engine is reported, the run goes on
                    self.results[key] = {"passed": False, "replay_changed_input": False,
                                         "error": f"{type(e).__name__}: {e}"}
                    self.log(f"{problem.name} {name}: ERROR {type(e).__name__}: {e}")
                    continue
                entry = {"passed": check["passed"], "replay_changed_input": check["replay_changed_input"],
                         "served_by": bound.served_by,
                         "validation": {k: check[k] for k in ("max_abs_error", "violations", "elements", "rtol",
                                                              "atol", "max_slack", "inputs_unchanged")
                                        if k in check},
                         "setup_s": round(time.perf_counter() - start, 3)}
                if bound.plan:
                    entry["plan"] = bound.plan
                if bound.skipped:
                    entry["skipped"] = bound.skipped
                if bound.formulation:
                    entry["torch_formulation"] = bound.formulation
                if "error" in check:
                    entry["error"] = check["error"]
                self.results[key] = entry
                self.bound[key] = bound
                self.log(f"{problem.name} {name}: served_by {bound.served_by}, passed {check['passed']}, "
                         f"replay {check['replay_changed_input']}, max_abs {check['max_abs_error']}")
            after_shape(done)

    def bind_floor(self) -> None:
        """The empty kernel as a harness call writing ``outputs["y"]``, and that call in a GraphCall: the
        wrapping every kernel engine and its graph variant get. Where it cannot run, records why."""
        import torch

        try:
            from .engines import floor
            from .engines.graph import GraphCall

            run = floor.launcher()
        except Exception as e:  # noqa: BLE001 - the report goes on without its floor and says why
            self.floor_error = f"{type(e).__name__}: {e}"
            self.log(f"launch floor: ERROR {self.floor_error}")
            return
        outputs = {"y": torch.empty((1, 1), dtype=torch.float32, device="cuda")}

        def call(inputs, outputs):
            run(outputs["y"])
            return outputs

        graphed = GraphCall(call)
        self.floor_calls = {"direct": lambda: call({}, outputs), "graph": lambda: graphed({}, outputs)}

    def time_call(self, once: Callable[[], object], got: dict[str, list[float]]) -> None:
        """Add one round's samples of ``once`` to ``got``: ``stream`` (gpu_throughput, K calls a sample, K sized
        from the warmup to about --stream-us of work) and ``host`` (e2e_throughput, one call a sample)."""
        from kernellab.harness import timing

        args = self.args
        t0 = time.perf_counter()
        for _ in range(args.warmup):
            once()
        self.device.sync()
        per_call_us = (time.perf_counter() - t0) * 1e6 / max(args.warmup, 1)  # an upper bound
        calls = max(1, min(STREAM_CALLS_MAX, round(args.stream_us / per_call_us)))
        got["stream"] += timing.measure("gpu_throughput", [once], self.device, samples=args.samples, iterations=calls)
        got["host"] += timing.measure("e2e_throughput", [once], self.device, samples=args.samples, iterations=1)

    def time_floor(self) -> None:
        """One round of the launch floor, directly and in its CUDA graph, timed as the engines are."""
        for how, once in self.floor_calls.items():
            self.time_call(once, self.floor_samples[how])

    def time_rounds(self, after_round: Callable[[int], None] = lambda done: None) -> None:
        """Time every bound engine in --rounds rounds, engine order alternating; each (shape, engine)'s
        summaries cover the rounds done when ``after_round(rounds done)`` is called."""
        import torch

        from kernellab.harness.case import seed_for

        args = self.args
        for r in range(args.rounds):
            self.time_floor()
            for _, shape in self.shapes:
                names = [n for n in self.engines if (shape, n) in self.bound]
                if not names:
                    continue
                problem = bench.ResidualMLP(shape, activation=args.activation)
                inputs = problem.make_inputs(seed_for(args.seed, problem.name, "time", r))
                order = names if r % 2 == 0 else list(reversed(names))
                for name in order:
                    outputs = problem.make_outputs(inputs)
                    call = self.bound[(shape, name)].call

                    def once(call=call, inputs=inputs, outputs=outputs):
                        call(inputs, outputs)

                    self.time_call(once, self.samples.setdefault((shape, name), {"stream": [], "host": []}))
                    del outputs
                del inputs
                torch.cuda.empty_cache()
            for key, got in self.samples.items():
                self.results[key].update(_clock_summaries(got))
            self.log(f"round {r + 1}/{args.rounds} done")
            after_round(r + 1)

    def models_section(self) -> dict:
        """The report's ``models`` section (``models.section``): each contender validated with the engines'
        protocol and timed for --rounds rounds, their order alternating, as the engines are; the floor from this
        run's launch floor and a copy-bandwidth measurement."""
        from kernellab.harness.case import seed_for

        from . import models, validation

        if not self.floor_samples["direct"]["stream"]:
            self.time_floor()
        floor = self.launch_floor()
        launch_us = floor["stream_summary"]["p50_ms"] * 1e3 if "stream_summary" in floor else None
        bandwidth = models.copy_bandwidth_gbs()

        def validate(name, contender):
            return validation.check(contender.problem, name, contender.call, self.args.seed)

        def time_round(contender, r, got):
            problem = contender.problem
            inputs = problem.make_inputs(seed_for(self.args.seed, problem.name, "time", r))  # alike for every side
            outputs = problem.make_outputs(inputs)
            for clock in ("stream", "host"):
                got.setdefault(clock, [])
            self.time_call(lambda: contender.call(inputs, outputs), got)

        cases, row_counts = models.select(self.args.model_cases, self.args.model_rows)
        return models.section(time_round, _clock_summaries, validate,
                              lambda case: models.floor_entry(case, launch_us, bandwidth),
                              cases=cases, row_counts=row_counts, rounds=self.args.rounds)

    def launch_floor(self) -> dict:
        """The report's ``launch_floor`` block: the direct call's summaries as an engine's, the graph's
        prefixed ``graph_``."""
        if self.floor_error:
            return {"what": FLOOR_WHAT, "error": self.floor_error}
        if not self.floor_samples["direct"]["stream"]:
            return {"what": FLOOR_WHAT, "error": "not timed yet (the report is partial)"}
        graph = _clock_summaries(self.floor_samples["graph"])
        return {"what": FLOOR_WHAT, **_clock_summaries(self.floor_samples["direct"]),
                "graph_summary": graph["stream_summary"], "graph_host_summary": graph["host_summary"]}


def _targets(sections: dict) -> list[dict]:
    """Per shape: the ratios the brief targets, where both sides were measured."""
    out = []
    for section in ("development", "assessment"):
        for item in sections.get(section, []):
            eng = item["engines"]

            def p50(name, eng=eng):
                e = eng.get(name)
                return e["stream_summary"]["p50_ms"] if e and e.get("passed") and "stream_summary" in e else None

            row = {"shape": item["shape"]}
            graphs = [v for v in (p50("persistent-graph"), p50("persistent-tc-graph")) if v is not None]
            best = min(graphs) if graphs else None
            for key, other, mine in (("best_persistent_graph_vs_torch_cublas_graph", "torch-cublas-graph", best),
                                     ("best_persistent_graph_vs_torch_compile_graph", "torch-compile-graph", best),
                                     ("persistent_vs_torch_cublas", "torch-cublas", p50("persistent"))):
                theirs = p50(other)
                if mine is not None and theirs:
                    row[key] = {"ratio": mine / theirs, "target": TARGETS[key], "met": mine / theirs <= TARGETS[key]}
            out.append(row)
    return out


def shape_label(shape: dict) -> str:
    """RxCxH of a report's ``shape`` entry."""
    return "x".join(str(shape[k]) for k in ("rows", "channels", "hidden"))


def _table(sections: dict, fmt: str = "simple") -> str:
    from tabulate import tabulate

    shapes, columns = [], []
    for section in ("development", "assessment"):
        for item in sections.get(section, []):
            shapes.append(item)
            columns.append(shape_label(item["shape"]) + ("*" if section == "assessment" else ""))
    rows = []
    for name in engines.ENGINES:
        cells, seen = [], False
        for item in shapes:
            e = item["engines"].get(name)
            if e is None:
                cells.append("")
                continue
            seen = True
            if "stream_summary" not in e:
                cells.append("FAIL" if not e.get("passed") else "-")
                continue
            mark = "" if e.get("passed") else " FAIL"
            cells.append(f"{e['stream_summary']['p50_ms'] * 1e3:.1f}{mark}")
        if seen:
            rows.append([name, *cells])
    return ("stream p50 per call, microseconds (* assessment shape)\n"
            + tabulate(rows, headers=["engine", *columns], disable_numparse=True, tablefmt=fmt))


def floor_line(report: dict) -> str | None:
    """The line under the table: the launch floor's stream p50, directly and in a CUDA graph; None for a
    report from before the floor was measured."""
    floor = report.get("launch_floor")
    if floor is None:
        return None
    if "error" in floor:
        return f"launch floor (empty kernel): not measured: {floor['error']}"
    return (f"launch floor (empty kernel): {floor['stream_summary']['p50_ms'] * 1e3:.1f} us on the stream, "
            f"{floor['graph_summary']['p50_ms'] * 1e3:.1f} us in a CUDA graph")


def partial_line(report: dict) -> str | None:
    """The line over the table of a report written before its run ended; None for a complete one."""
    partial = report.get("partial")
    if partial is None:
        return None
    return (f"PARTIAL report (the run stopped before its end): {partial['shapes_validated']} of "
            f"{partial['shapes']} shapes validated, {partial['rounds_done']} of {partial['rounds']} rounds timed")


def printout(report: dict, fmt: str = "simple", models_only: bool = False) -> str:
    """The table of stream p50 and, where the report has it, the launch floor's line under it (and a
    partial report's line over it); the models section's table and targets where it has one (``models_only``:
    those alone, the block a models README shows)."""
    lines = []
    if not models_only:
        engines = {k: report[k] for k in ("development", "assessment")}
        lines = [partial_line(report), _table(engines, fmt), floor_line(report)]
    if "models" in report:  # the whole models and issue 33's targets
        from . import models

        lines.append(models.table(report["models"], fmt))
    return "\n".join(line for line in lines if line is not None)


def _provenance() -> dict:
    from kernellab.harness import provenance

    repo = provenance.find_repo_root(Path(__file__).resolve().parent)
    roots = provenance.tree_roots(repo) if repo else provenance.kernellab_roots()
    # the engines and the clocks that time them: both decide what the report's numbers mean
    sources = provenance.source_hashes({k: v for k, v in roots.items() if k in ("megakernel", "harness")})
    return {"source_sha256": sources, "source_commit": provenance.git_state(repo).get("commit") if repo else None,
            "packages": {k: v for k, v in provenance.package_versions().items()
                         if k in ("torch", "nvidia-cutlass-dsl", "apache-tvm-ffi", "kernellab-megakernel",
                                  "kernellab-harness")}}


def merge_sections(results: dict, kinds: dict, previous: dict | None) -> dict[str, list]:
    """The report's development and assessment lists: this run's (shape, engine) results over the
    previous report's (``--resume``), shapes in the suite's order, engines in report order."""
    merged: dict[tuple, tuple[str, dict]] = {}
    for section in ("development", "assessment"):
        for item in (previous or {}).get(section, []):
            shape = tuple(item["shape"][k] for k in ("rows", "channels", "hidden"))
            for name, entry in item["engines"].items():
                merged[(shape, name)] = (section, entry)
    for (shape, name), entry in results.items():
        merged[(shape, name)] = (kinds[shape], entry)
    order = {shape: i for i, shape in enumerate(bench.DEVELOPMENT_SHAPES + bench.ASSESSMENT_SHAPES)}
    sections: dict[str, list] = {"development": [], "assessment": []}
    for shape in sorted({shape for shape, _ in merged}, key=lambda s: (order.get(s, len(order)), s)):
        section = next(sec for (sh, _name), (sec, _entry) in merged.items() if sh == shape)
        by_engine = {name: merged[(shape, name)][1] for name in engines.ENGINES if (shape, name) in merged}
        sections[section].append({"shape": dict(zip(("rows", "channels", "hidden"), shape, strict=True)),
                                  "engines": by_engine})
    return sections


def build_report(run: Run, previous: dict | None, partial: dict | None = None) -> dict:
    """The report of what ``run`` measured so far over ``previous``'s (``--resume``). ``partial`` (what is
    done and what is not) marks a checkpoint written before the end: it skips the compiler checks."""
    import torch

    from .compiler import checks as compiler_checks

    args = run.args
    sections = merge_sections(run.results, {shape: kind for kind, shape in run.shapes}, previous)
    prov = _provenance()
    report = {
        "recorded_on": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(torch.cuda.current_device()),
        "precision": "FP16 input/weights and hidden state; FP32 accumulation, bias and output",
        "activation": args.activation,
        "tolerance": dict(zip(("rtol", "atol"), model.tolerance_for(model.Shape(1, 1, 1)), strict=True),
                          why=" ".join(model.tolerance_for.__doc__.split())),
        "packages": prov["packages"],
        "rounds": args.rounds,
        "samples_per_round": args.samples,
        "source_sha256": prov["source_sha256"],
        **sections,
        "launch_floor": run.launch_floor(),
        "targets": _targets(sections),
        "limitations": LIMITATIONS,
        "sanitizers": _sanitizers(args.sanitizers, previous),
        "source_replay_checks": "Each output poisoned before validation; fresh inputs; inputs checked unchanged; "
                                "changed-input graph replay verified for every engine.",
        "source_commit": prov["source_commit"],
    }
    if partial:
        report["partial"] = partial
    if args.no_compiler or partial:
        if previous and "compiler" in previous:
            report["compiler"] = previous["compiler"]
    else:
        run.log("compiler checks ...")
        report["compiler"] = {"source_commit": prov["source_commit"], **compiler_checks.report_block(args.seed)}
    if args.models and not partial:
        run.log("models section ...")
        from . import models

        report["models"] = models.merge_sections(previous.get("models") if previous else None, run.models_section())
    elif previous and "models" in previous:
        report["models"] = previous["models"]
    return report


def _sanitizers(path: str | None, previous: dict | None) -> dict | str:
    if path:
        try:
            return json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            return f"could not read {path}: {e}"
    if previous and "sanitizers" in previous:
        return previous["sanitizers"]
    return "not run (python -m kernellab.megakernel.sanitize --out DIR, then --sanitizers DIR/sanitize.json)"


def seal_and_write(report: dict, path: str) -> Path:
    """Clean (JSON has no NaN), stamp the sha256 of the canonical JSON (harness.report), write."""
    from kernellab.harness import report as report_io

    body = json.loads(report_io.canonical_json(report))
    body["sha256"] = report_io.report_hash(body)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(body, indent=2) + "\n")
    return out


PLOTTED = ("persistent-graph", "persistent-tc-graph", "conventional-tc-graph", "torch-compile-graph")
TARGET_LABELS = {"best_persistent_graph_vs_torch_cublas_graph": "best persistent graph / torch-cublas-graph",
                 "best_persistent_graph_vs_torch_compile_graph": "best persistent graph / torch-compile-graph",
                 "persistent_vs_torch_cublas": "persistent / torch-cublas"}


def relative(report: dict, engine: str, base: str) -> list[float | None]:
    """Per shape (development, then assessment), stream p50 of ``engine`` over ``base``'s; None where
    either is missing or failed validation."""
    out = []
    for section in ("development", "assessment"):
        for item in report.get(section, []):
            a, b = (item["engines"].get(name) for name in (engine, base))
            ok = all(e and e.get("passed") and "stream_summary" in e for e in (a, b))
            out.append(a["stream_summary"]["p50_ms"] / b["stream_summary"]["p50_ms"] if ok else None)
    return out


def draw(report: dict, path: str | Path) -> Path:
    """The report's picture: graph engines against torch-cublas-graph per shape, and every target ratio
    over its target (at or left of 1 is met). Needs matplotlib (``pip install 'kernellab-megakernel[plot]'``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [shape_label(i["shape"]) + ("*" if s == "assessment" else "")
              for s in ("development", "assessment") for i in report.get(s, [])]
    ys = list(range(len(labels)))
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 0.42 * len(labels) + 2.2), sharey=True)
    for k, name in enumerate(PLOTTED):
        xs = relative(report, name, "torch-cublas-graph")
        left.scatter([x for x in xs if x is not None], [y + 0.12 * (k - 1.5) for y, x in zip(ys, xs, strict=True)
                                                          if x is not None], label=name, s=22)
    left.axvline(1.0, color="black", lw=0.8)
    left.axvline(TARGETS["best_persistent_graph_vs_torch_cublas_graph"], color="tab:red", ls="--", lw=0.8,
                 label="target for the best persistent graph")
    left.set_xscale("log")
    left.set_xlabel("stream p50 / torch-cublas-graph's (device time per call; lower is faster)")
    left.legend(fontsize=7)
    by_shape = {json.dumps(t["shape"], sort_keys=True): t for t in report.get("targets", [])}
    shapes = [json.dumps(i["shape"], sort_keys=True) for s in ("development", "assessment") for i in report.get(s, [])]
    for k, (key, label) in enumerate(TARGET_LABELS.items()):
        points = [(t[key]["ratio"] / t[key]["target"], y) for y, shape in zip(ys, shapes, strict=True)
                  if key in (t := by_shape.get(shape, {}))]
        right.scatter([p[0] for p in points], [p[1] + 0.15 * (k - 1) for p in points], label=label, s=22)
    right.axvline(1.0, color="tab:red", ls="--", lw=0.8)
    right.set_xscale("log")
    right.set_xlabel("ratio / its target (at or left of the line: met)")
    right.legend(fontsize=7)
    left.set_yticks(ys, labels, fontsize=8)
    left.invert_yaxis()
    fig.suptitle(f"residual MLP engines on {report.get('device')} (* assessment shape)", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def read_sealed(path: str | Path) -> dict:
    """A written report, its sha256 checked against its content; ValueError naming the file otherwise."""
    from kernellab.harness import report as report_io

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read a report there: {e}") from None
    if not isinstance(data, dict) or "sha256" not in data or not {"development", "assessment"} & data.keys():
        raise ValueError(f"{path}: not an engine report of kernellab.megakernel.report (no sha256 seal, or no "
                         "development or assessment shapes)")
    if data["sha256"] != report_io.report_hash(data):
        raise ValueError(f"{path}: sha256 mismatch: recorded {data['sha256']}, content hashes to "
                         f"{report_io.report_hash(data)} (changed after it was written)")
    return data


def show(path: str, fmt: str, plot: str | None = None, models_only: bool = False) -> int:
    """Print a written report's table (and draw its picture to ``plot``) after checking that its sha256
    still matches its content. The READMEs' results blocks are this printout (``kernellab-bench tables``)."""
    try:
        data = read_sealed(path)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 1
    if models_only and "models" not in data:
        print(f"{path}: the report has no models section (run with --models)", file=sys.stderr)
        return 1
    print(printout(data, fmt, models_only))
    if plot:
        print(f"plot: {draw(data, plot)}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.show:
        return show(args.show, args.format, args.plot, args.models_only)
    if args.rounds < 1 or args.samples < 1 or args.warmup < 0:
        print("--rounds and --samples must be >= 1, --warmup >= 0", file=sys.stderr)
        return 2
    previous = None
    if args.resume:
        try:
            previous = read_sealed(args.resume)
        except ValueError as e:
            print(f"--resume {e}", file=sys.stderr)
            return 2
        if Path(args.resume).resolve() == Path(args.out).resolve():
            print(f"--out {args.out} is the --resume report: checkpoints would overwrite it; write elsewhere",
                  file=sys.stderr)
            return 2
        if "partial" in previous:
            print(f"--resume {args.resume} is a partial report ({partial_line(previous)}); measure what it lacks "
                  "with --engines/--shapes and resume from a complete report", file=sys.stderr)
            return 2
        if (previous.get("rounds"), previous.get("samples_per_round")) != (args.rounds, args.samples):
            print(f"--resume {args.resume} was measured with rounds={previous.get('rounds')}, "
                  f"samples={previous.get('samples_per_round')}; use the same here", file=sys.stderr)
            return 2
    try:
        import torch
    except ImportError:
        print("kernellab-megakernel-report: torch is not installed", file=sys.stderr)
        return 2
    if args.model_cases or args.model_rows:
        from . import models

        try:
            models.select(args.model_cases, args.model_rows)
        except ValueError as e:
            print(e, file=sys.stderr)
            return 2
        if not args.models:
            print("--model-cases and --model-rows pick what --models measures; add --models", file=sys.stderr)
            return 2
    if not torch.cuda.is_available():
        print("kernellab-megakernel-report: no CUDA device; this report measures GPU engines", file=sys.stderr)
        return 2
    run = Run(args)
    start = time.perf_counter()
    progress = {"shapes": len(run.shapes), "shapes_validated": 0, "rounds": args.rounds, "rounds_done": 0}

    def checkpoint(**done):
        progress.update(done)
        seal_and_write(build_report(run, previous, partial=dict(progress)), args.out)

    run.bind_and_validate(after_shape=lambda n: checkpoint(shapes_validated=n))
    run.bind_floor()
    run.time_rounds(after_round=lambda n: checkpoint(rounds_done=n))
    report = build_report(run, previous)
    path = seal_and_write(report, args.out)
    print(printout(report))
    try:
        print(f"plot: {draw(report, args.plot or path.with_suffix('.png'))}")
    except ImportError:
        print("no plot: matplotlib is not installed (pip install 'kernellab-megakernel[plot]')")
    failed = [f"{item['shape']} {name}" for section in ("development", "assessment") for item in report[section]
              for name, e in item["engines"].items() if not e.get("passed")]
    print(f"\nwrote {path} ({time.perf_counter() - start:.0f} s); "
          + (f"{len(failed)} engine/shape pairs FAILED validation" if failed else "every engine passed validation"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
