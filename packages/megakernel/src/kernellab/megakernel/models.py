"""Whole models: a residual-MLP stack as a torch user writes it, the four models the report's
``models`` section measures, and that section's schema.

``StackModel`` is the ``nn.Module`` of any stack form (``stack``): ``nn.Linear``, ``nn.RMSNorm`` /
``nn.LayerNorm``, activation modules, traceable by torch.fx, so ``compile_model`` reads it back.
``build_module(spec, seed)`` makes one with the weights ``frontend.from_spec`` makes for the same
spec and seed: the compiled model, torch eager and torch.compile then run the same weights.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from torch import nn

from kernellab.harness.case import Problem, Tolerance

from . import model, stack
from .compiler import frontend
from .engines import STACK_ENGINES

ACTIVATION_MODULES = {"relu": nn.ReLU, "gelu": lambda: nn.GELU(approximate="tanh"), "gelu_erf": nn.GELU,
                      "silu": nn.SiLU}


def _norm_module(norm, channels: int) -> nn.Module:
    if norm.kind == "rmsnorm":
        return nn.RMSNorm(channels, eps=norm.eps)
    return nn.LayerNorm(channels, eps=norm.eps, bias=norm.bias)


class StackBlock(nn.Module):
    """``x + W2 (act(W1 u) [* W3 u])`` with ``u = norm(x)`` or ``x``."""

    def __init__(self, block):
        super().__init__()
        c, h = block.channels, block.hidden
        self.norm = _norm_module(block.norm, c) if block.norm is not None else None
        self.w1 = nn.Linear(c, h, bias=block.bias1)
        self.w3 = nn.Linear(c, h, bias=block.bias3) if block.gated else None
        self.act = ACTIVATION_MODULES[block.activation]()
        self.w2 = nn.Linear(h, c, bias=block.bias2)

    def forward(self, x):
        u = self.norm(x) if self.norm is not None else x
        hidden = self.act(self.w1(u))
        if self.w3 is not None:
            hidden = hidden * self.w3(u)
        return x + self.w2(hidden)


class StackModel(nn.Module):
    """Blocks, then an optional final norm."""

    def __init__(self, blocks, final_norm=None):
        super().__init__()
        self.blocks = nn.ModuleList(StackBlock(b) for b in blocks)
        self.final_norm = _norm_module(final_norm, blocks[-1].channels) if final_norm is not None else None

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.final_norm(x) if self.final_norm is not None else x


def _load_norm(module, params: dict) -> None:
    if module.weight is not None:
        module.weight.copy_(params["norm_weight"])
    if getattr(module, "bias", None) is not None:
        module.bias.copy_(params["norm_bias"])


@torch.no_grad()
def build_module(spec: dict, *, seed: int = 0, dtype=torch.float32, device="cpu") -> StackModel:
    """The ``StackModel`` of ``spec`` with the weights ``frontend.from_spec(spec, seed=seed)`` gives, for
    inference: its parameters require no grad, or every call would record an autograd graph (time the report's
    torch contenders do not owe, and through ``y.copy_`` a chain holding every earlier call's activations)."""
    source = frontend.from_spec(spec, seed=seed, device=device)
    module = StackModel(source.blocks, source.final_norm).to(device=device)
    for layer, params in zip(module.blocks, source.parameters, strict=True):
        for name in ("w1", "w2", "w3"):
            linear = getattr(layer, name)
            if linear is None:
                continue
            linear.weight.copy_(params[name])
            if linear.bias is not None:
                linear.bias.copy_(params["b" + name[1]])
        if layer.norm is not None:
            _load_norm(layer.norm, params)
    if module.final_norm is not None:
        _load_norm(module.final_norm, source.final_parameters)
    return module.to(dtype=dtype).requires_grad_(False)


# ---- the report's models ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ModelCase:
    name: str
    spec: dict
    fits_l2: bool  # the weights fit in an H200's L2 (the latency targets differ for the one that does not)

    def weight_bytes(self) -> int:
        """Bytes of fp16 weights (biases and norm weights, fp32 and small, not counted)."""
        blocks, _ = frontend.read_spec(self.spec)
        return sum((3 if b.gated else 2) * 2 * b.channels * b.hidden for b in blocks)


def _uniform(channels: int, hidden: int, depth: int, **block) -> dict:
    return {"channels": channels, "blocks": [{"hidden": hidden, **block} for _ in range(depth)]}


REPORT_MODELS = (
    ModelCase("mlp4-c256-h1024-gelu", _uniform(256, 1024, 4, activation="gelu"), fits_l2=True),
    ModelCase("mlp8-c512-h2048-rms-silu", _uniform(512, 2048, 8, activation="silu", norm="rmsnorm"), fits_l2=True),
    ModelCase("swiglu2-c1024-h2816-final-norm",
              {**_uniform(1024, 2816, 2, activation="silu", norm="rmsnorm", gated=True, bias=False),
               "final_norm": "rmsnorm"}, fits_l2=True),
    ModelCase("swiglu4-c2048-h8192-1b-ffn",
              _uniform(2048, 8192, 4, activation="silu", norm="rmsnorm", gated=True, bias=False), fits_l2=False),
)
"""The issue's four models; the last is the FFN stack of a 1B-parameter decoder (about 400 MB of fp16)."""
REPORT_ROWS = (1, 16, 64, 1024, 4096)
CONTENDERS = (*STACK_ENGINES, "block-chain-graph", "torch-eager", "torch-compile-max-autotune-graph")
"""The fused engine and its graph, today's per-block chain in a graph, the nn.Module eagerly and
under torch.compile(mode="max-autotune") captured in a CUDA graph."""
SUMMARY_KEYS = ("count", "p50_ms", "p95_ms", "min_ms", "max_ms", "mean_ms")
"""An engine's summary in the report (``report._ms_summary``)."""
VALIDATION_KEYS = ("passed", "replay_changed_input", "inputs_unchanged", "max_abs_error")
FLOOR_KEYS = ("launch_floor_us", "weight_bytes", "copy_bandwidth_gbs", "weight_floor_us")


# ---- the targets, read from a section -------------------------------------------------------------------

FUSED, CHAIN, COMPILED = "persistent-stack-graph", "block-chain-graph", "torch-compile-max-autotune-graph"
DECODE_TARGET_ROWS, LARGE_TARGET_ROWS = (1, 16, 64), (1024, 4096)


def _p50_us(entry: dict, contender: str) -> float | None:
    got = entry.get("contenders", {}).get(contender, {})
    if not got.get("validation", {}).get("passed"):
        return None
    p50 = got.get("stream_summary", {}).get("p50_ms")
    return None if p50 is None else p50 * 1e3


def targets(section: dict, cases=REPORT_MODELS) -> list[dict]:
    """Issue 33's targets for every entry of a section: ``what`` is measured, ``value`` against ``target``
    (``at_most`` or ``at_least``), ``met`` (None where a contender did not pass or was not timed)."""
    fits = {c.name: c.fits_l2 for c in cases}
    out = []

    def add(entry, what, value, target, at_most=True):
        met = None if value is None else (value <= target if at_most else value >= target)
        out.append({"model": entry["model"], "rows": entry["rows"], "what": what, "value": value, "target": target,
                    "at_most": at_most, "met": met})

    def ratio(a, b):
        return None if a is None or b is None else a / b

    for entry in section.get("entries", []):
        fused, chain, compiled = (_p50_us(entry, c) for c in (FUSED, CHAIN, COMPILED))
        rows, in_l2 = entry["rows"], fits.get(entry["model"])
        if in_l2 and rows in DECODE_TARGET_ROWS:
            add(entry, f"{FUSED} / {COMPILED}", ratio(fused, compiled), 0.5)
            add(entry, f"{FUSED} / {CHAIN}", ratio(fused, chain), 0.5)
        elif in_l2 and rows in LARGE_TARGET_ROWS:
            add(entry, f"{FUSED} / {COMPILED}", ratio(fused, compiled), 0.8)
        elif in_l2 is False and rows in (1, 16):
            add(entry, f"weight floor / {FUSED}", ratio(entry.get("floor", {}).get("weight_floor_us"), fused), 0.8,
                at_most=False)
            add(entry, f"{FUSED} / {COMPILED}", ratio(fused, compiled), 0.9)
        for name, got in entry.get("contenders", {}).items():
            out.append({"model": entry["model"], "rows": rows, "what": f"{name} passes validation", "value": None,
                        "target": None, "at_most": None, "met": bool(got.get("validation", {}).get("passed"))})
    return out


def table(section: dict, fmt: str = "simple") -> str:
    """Stream p50 per call in microseconds, a row per (model, rows), a column per contender, then the weight
    floor; and the targets, met or missed, under it."""
    from tabulate import tabulate

    contenders = section.get("contenders", list(CONTENDERS))
    rows = []
    for entry in section.get("entries", []):
        cells = [_p50_us(entry, c) for c in contenders]
        rows.append([entry["model"], entry["rows"], *("-" if v is None else f"{v:.1f}" for v in cells),
                     f"{entry.get('floor', {}).get('weight_floor_us', float('nan')):.1f}"])
    lines = ["models: stream p50 per call, microseconds ('-': did not pass or not timed)",
             tabulate(rows, headers=["model", "rows", *contenders, "weight floor"], tablefmt=fmt)]
    misses = [t for t in targets(section) if t["target"] is not None and t["met"] is not True]
    failed = [t for t in targets(section) if t["target"] is None and not t["met"]]
    met = sum(1 for t in targets(section) if t["target"] is not None and t["met"])
    lines.append(f"targets: {met} met, {len(misses)} missed or unmeasured; validations failed: {len(failed)}")
    lines += [f"  missed: {t['model']} rows={t['rows']} {t['what']} = {_ratio_text(t['value'], t['target'])} "
              f"({'<=' if t['at_most'] else '>='} {t['target']})" for t in misses]
    lines += [f"  failed: {t['model']} rows={t['rows']} {t['what']}" for t in failed]
    return "\n".join(lines)


def _ratio_text(value: float | None, target: float) -> str:
    """A missed ratio with as many decimals as it takes to differ from its target (0.803 against 0.8 reads 0.803,
    not a met-looking 0.80)."""
    if value is None:
        return "unmeasured"
    digits = 2
    while digits < 6 and float(format(value, f".{digits}f")) == target:
        digits += 1
    return format(value, f".{digits}f")


def select(case_patterns: str | None, row_counts: str | None) -> tuple[tuple[ModelCase, ...], tuple[int, ...]]:
    """The report's models and row counts that ``--model-cases`` (names or shell patterns, comma-separated) and
    ``--model-rows`` (integers, comma-separated) pick; None picks all. Nothing picked is an error naming the
    argument."""
    import fnmatch

    cases = REPORT_MODELS
    if case_patterns:
        patterns = [p.strip() for p in case_patterns.split(",") if p.strip()]
        cases = tuple(c for c in REPORT_MODELS if any(fnmatch.fnmatchcase(c.name, p) for p in patterns))
        if not cases:
            raise ValueError(f"--model-cases {case_patterns!r} matches none of {[c.name for c in REPORT_MODELS]}")
    rows = REPORT_ROWS
    if row_counts:
        try:
            rows = tuple(int(r) for r in row_counts.split(",") if r.strip())
        except ValueError:
            raise ValueError(f"--model-rows must be comma-separated integers, got {row_counts!r}") from None
        if not rows or min(rows) < 1:
            raise ValueError(f"--model-rows must be integers >= 1, got {row_counts!r}")
    return cases, rows


def merge_sections(previous: dict | None, new: dict) -> dict:
    """``new``'s entries over ``previous``'s (a report being extended with ``--resume``): an entry measured now
    replaces the one of the same model and row count, the others are kept, in the report's model order."""
    entries = {(e["model"], e["rows"]): e for e in (previous or {}).get("entries", [])}
    entries.update({(e["model"], e["rows"]): e for e in new["entries"]})
    order = {c.name: i for i, c in enumerate(REPORT_MODELS)}
    ordered = sorted(entries.values(), key=lambda e: (order.get(e["model"], len(order)), e["model"], e["rows"]))
    row_counts = sorted({*(previous or {}).get("row_counts", []), *new["row_counts"]})
    return {**new, "row_counts": row_counts, "entries": ordered}


def check_models_section(section: dict, cases=REPORT_MODELS, row_counts=REPORT_ROWS) -> list[str]:
    """What is wrong with a report's ``models`` section (empty when nothing): every model and row
    count, every contender with stream and host summaries and a validation, and the floor."""
    problems = []
    entries = {(m.get("model"), m.get("rows")): m for m in section.get("entries", [])}
    for case in cases:
        for rows in row_counts:
            where = f"{case.name} rows={rows}"
            entry = entries.get((case.name, rows))
            if entry is None:
                problems.append(f"{where}: missing")
                continue
            floor = entry.get("floor", {})
            problems += [f"{where}: floor lacks {k}" for k in FLOOR_KEYS if k not in floor]
            if floor.get("weight_bytes") not in (None, case.weight_bytes()):
                problems.append(f"{where}: floor weight_bytes {floor['weight_bytes']} is not the model's "
                                f"{case.weight_bytes()}")
            for contender in CONTENDERS:
                got = entry.get("contenders", {}).get(contender)
                if got is None:
                    problems.append(f"{where}: {contender} missing")
                    continue
                for clock in ("stream_summary", "host_summary"):
                    summary = got.get(clock, {})
                    problems += [f"{where}: {contender} {clock} lacks {k}" for k in SUMMARY_KEYS if k not in summary]
                validation = got.get("validation", {})
                problems += [f"{where}: {contender} validation lacks {k}" for k in VALIDATION_KEYS
                             if k not in validation]
                if validation.get("passed") is not True:
                    problems.append(f"{where}: {contender} did not pass validation")
    return problems


# ---- the contenders and their validation (the report's models section) -------------------------------------

STACK_TOLERANCE = 5e-3
"""rtol = atol for the compiled stack against the float64 reference with the kernels' rounding points: fp32
accumulation is far below it, an fp16 hidden value rounded to the other neighbour a few 1e-4."""
TORCH_FP16_TOLERANCE = 3e-2
"""rtol = atol for the nn.Module run by torch in fp16 (eagerly or compiled): its stream and norms are fp16, so
it rounds at every op where the kernels keep fp32; the same reference, a wider band."""


class StackProblem(Problem):
    """A model of ``REPORT_MODELS`` (or any ``ModelCase``) at ``rows`` rows, as a harness problem: the input x
    (fp16) is the only input, y (fp32) the only output, the truth ``stack.reference_stack`` of the weights
    ``frontend.from_spec(case.spec, seed=weights_seed)`` makes (the contenders hold the same weights)."""

    op = "stack"

    def __init__(self, case: ModelCase, rows: int, *, tolerance: float = STACK_TOLERANCE, weights_seed: int = 0,
                 device: str = "cuda"):
        self.case, self.weights_seed = case, weights_seed
        blocks, _ = frontend.read_spec(case.spec)
        super().__init__((rows, blocks[0].channels), "fp16", device, model=case.name)
        self._tolerance = tolerance

    @functools.cached_property
    def source(self) -> frontend.Source:
        """The weights, made on first use (a suite lists its problems on machines without the device)."""
        return frontend.from_spec(self.case.spec, seed=self.weights_seed, device=self.device)

    def name_suffix(self) -> str:
        return f"_{self.case.name}"

    def make_inputs(self, seed: int):
        return {"x": model.make_input(*self.shape, seed=seed, device=self.device)}

    def make_outputs(self, inputs):
        return {"y": torch.empty(self.shape, dtype=torch.float32, device=self.device)}

    def reference(self, inputs):
        s = self.source
        return {"y": stack.reference_stack(inputs["x"], s.blocks, s.parameters, s.final_norm, s.final_parameters)}

    def control(self, inputs, outputs):
        """torch with the kernels' rounding points, block by block (``stack.torch_stack``)."""
        s = self.source
        stack.torch_stack(inputs["x"], s.blocks, s.parameters, s.final_norm, s.final_parameters, outputs["y"])
        return outputs

    def bytes_moved(self) -> int:
        return self.case.weight_bytes() + self.shape[0] * self.shape[1] * (2 + 4)

    def flops(self) -> int:
        return sum(2 * (3 if b.gated else 2) * self.shape[0] * b.channels * b.hidden for b in self.source.blocks)

    def tolerance(self) -> Tolerance:
        return Tolerance(self._tolerance, self._tolerance)


@dataclasses.dataclass
class Contender:
    """One way to run a model: a harness call writing ``outputs["y"]``, the problem that validates it (its
    tolerance), and where it is served by something else than its name says, by what and why."""

    call: object
    problem: StackProblem
    served_by: str | None = None
    reason: str | None = None


def writes_y(module: nn.Module):
    """``y.copy_(module(x))`` as one function of (x, y): the fp32 output the protocol asks for, written where
    torch.compile can fuse the cast into the module's last kernel, as a user compiling the same would."""
    def forward(x, y):
        return y.copy_(module(x))
    return forward


def module_call(run, module: nn.Module):
    """A harness call of ``run(x, y)`` (``writes_y(module)``, or it compiled) on ``inputs["x"]`` and
    ``outputs["y"]``. ``module``'s parameters must require no grad (``build_module``'s do): a torch contender is
    timed as inference."""
    if any(p.requires_grad for p in module.parameters()):
        raise ValueError("module: expected parameters that require no grad (an inference module, as build_module "
                         "makes); with grad each call records an autograd graph")

    def call(inputs, outputs):
        run(inputs["x"], outputs["y"])
        return outputs
    return call


def compile_module(module: nn.Module, backend="inductor"):
    """``writes_y(module)`` under torch.compile as the report times it: Inductor's ``max-autotune-no-cudagraphs``
    (the report captures the graph), compiled for each row count alone (``dynamic=False``: every model shares one
    ``forward``, so dynamo would otherwise turn to a graph of any row count at the second count it sees), with no
    silent fallback to eager past the recompile limit (``compile_config``)."""
    from kernellab.harness import compile_config

    from .engines.torch_baselines import COMPILE_MODE, RECOMPILE_LIMIT

    compile_config.for_contenders(RECOMPILE_LIMIT)
    mode = COMPILE_MODE if backend == "inductor" else None
    return torch.compile(writes_y(module), backend=backend, mode=mode, dynamic=False)


def contenders(case: ModelCase, rows: int, *, weights_seed: int = 0) -> dict[str, Contender]:
    """The ``CONTENDERS`` of ``case`` at ``rows`` on the GPU. torch.compile runs with
    ``mode="max-autotune-no-cudagraphs"`` and is captured in a CUDA graph as every other graph contender is
    (``max-autotune`` is that mode plus torch's own graphs), as ``compile_module`` sets it up."""
    from .compiler.runner import compile_model
    from .engines.graph import GraphCall
    from .planning.stack import STACK_ENGINE

    fused = compile_model(case.spec, rows=rows, seed=weights_seed, engine=STACK_ENGINE)  # or its recorded fallback
    chained = compile_model(case.spec, rows=rows, seed=weights_seed, engine="persistent-tc")
    module = build_module(case.spec, seed=weights_seed, dtype=torch.float16, device="cuda")
    autotuned = compile_module(module)
    ours = StackProblem(case, rows, weights_seed=weights_seed)
    theirs = StackProblem(case, rows, tolerance=TORCH_FP16_TOLERANCE, weights_seed=weights_seed)

    def compiled_call(compiled):
        def call(inputs, outputs):
            compiled(inputs["x"], out=outputs["y"])
            return outputs
        return call

    served, reason = None, None
    if fused.fused is None:  # the stack pass refused: the contender is the chain, and says so
        plan = fused.plan()
        served, reason = "block-chain", f"{plan.form}: {plan.form_reason}"
    return {
        "persistent-stack": Contender(compiled_call(fused), ours, served, reason),
        "persistent-stack-graph": Contender(GraphCall(compiled_call(fused)), ours,
                                            served and served + "-graph", reason),
        "block-chain-graph": Contender(GraphCall(compiled_call(chained)), ours),
        "torch-eager": Contender(module_call(writes_y(module), module), theirs),
        "torch-compile-max-autotune-graph": Contender(GraphCall(module_call(autotuned, module)), theirs),
    }


def copy_bandwidth_gbs(megabytes: int = 1024, repeats: int = 20) -> float:
    """Device-to-device copy bandwidth (bytes read plus written per second, median of ``repeats``), in GB/s."""
    src = torch.empty(megabytes << 20, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    seconds = sorted(times[1:])[repeats // 2]
    return 2 * src.numel() / seconds / 1e9


def floor_entry(case: ModelCase, launch_floor_us: float, bandwidth_gbs: float) -> dict:
    """The least a call can take: a launch, and streaming the weights once at the copy bandwidth."""
    weight_bytes = case.weight_bytes()
    return {"launch_floor_us": launch_floor_us, "weight_bytes": weight_bytes, "copy_bandwidth_gbs": bandwidth_gbs,
            "weight_floor_us": weight_bytes / (bandwidth_gbs * 1e9) * 1e6}


def section(time_round, summarize, validate, floor_of, cases=REPORT_MODELS, row_counts=REPORT_ROWS,
            make=contenders, rounds: int = 1) -> dict:
    """The report's ``models`` section: for each case and row count, each contender validated
    (``validate(name, contender)`` -> the validation block), then those that passed timed in ``rounds`` rounds,
    their order alternating from round to round as the engines' is (``time_round(contender, round, samples)`` adds
    one round's samples to the contender's own dict; ``summarize(samples)`` -> its stream and host summaries), so
    that a drift of the clock or the machine over a case falls on every side alike; ``floor_of(case)`` the floor
    block. A contender that cannot be built or fails is recorded with its error; the section goes on."""
    entries = []
    for case in cases:
        for rows in row_counts:
            entry = {"model": case.name, "rows": rows, "contenders": {}, "floor": floor_of(case)}
            try:
                built = make(case, rows)
            except Exception as e:  # noqa: BLE001 - the section records why and goes on
                entry["error"] = f"{type(e).__name__}: {e}"
                entries.append(entry)
                continue
            samples = {}
            for name, contender in built.items():
                got = {k: v for k, v in (("served_by", contender.served_by), ("reason", contender.reason)) if v}
                try:
                    got["validation"] = validate(name, contender)
                    if got["validation"].get("passed"):
                        samples[name] = {}
                except Exception as e:  # noqa: BLE001 - as above
                    got["error"] = f"{type(e).__name__}: {e}"
                entry["contenders"][name] = got
            for r in range(rounds):
                order = list(samples) if r % 2 == 0 else list(reversed(samples))
                for name in order:
                    try:
                        time_round(built[name], r, samples[name])
                    except Exception as e:  # noqa: BLE001 - as above: this contender is timed no further
                        entry["contenders"][name]["error"] = f"{type(e).__name__}: {e}"
                        del samples[name]
            for name, got in samples.items():
                entry["contenders"][name].update(summarize(got))
            entries.append(entry)
    return {"contenders": list(CONTENDERS), "row_counts": list(row_counts), "entries": entries}
