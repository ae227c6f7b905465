"""Is a report consistent with itself? Every number it derives is recomputed, by the harness's own
functions, from the raw samples and records it holds, and compared with the number it presents.

This catches a report whose derived numbers (a p50, a ratio, a gain, a status, a validation's verdict)
were edited and the hash re-sealed, and names the field. A forgery that scales the raw samples and
recomputes everything from them is consistent; only a replay of the code can catch that one.

Each check is one function registered for the report kinds it applies to (``@check_of("run")``);
it yields ``Inconsistency`` records. Fields a check does not know are allowed, so new raw fields
need no change here until they get a check of their own.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from . import assemble, table
from . import report as report_io
from .timing import ALL_MODES

REL_TOL = 1e-9
RESAMPLES_DEFAULT = 1000  # what comparisons were bootstrapped with before reports recorded ``resamples``
SIGNIFICANCE_MIN_ROUNDS_DEFAULT = 1  # the rounds significance took before reports recorded ``significance_min_rounds``
# before reports recorded ``interval_correlation``, intervals took the samples as independent
BANDWIDTH_FIELDS = ("gbps", "copy_ceiling_gbps", "ceiling_fraction")
# fields that a report may present only where its raw data derives them: one that appears where the
# recomputation has none (a mode nobody measured, a ceiling with no ceiling problem) is a claim from nowhere
DERIVED_ONLY = frozenset(ALL_MODES) | frozenset(BANDWIDTH_FIELDS) | {
    "control_ratio_range", "control_flagged", "replay_changed_input", "torch_us", "torch_rounds_us",
    "native_torch_ratio", "ratio_min", "ratio_max",
}


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING = _Missing()


@dataclass(frozen=True)
class Inconsistency:
    """One presented value that its report's raw data does not give: where, what is there, what should be."""

    path: str
    recorded: Any
    recomputed: Any
    note: str = ""

    def __str__(self) -> str:
        text = f"{self.path}: recorded {_short(self.recorded)}, recomputed {_short(self.recomputed)}"
        return f"{text} ({self.note})" if self.note else text


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


Check = Callable[[dict], Iterator[Inconsistency]]
CHECKS: dict[str, list[Check]] = {kind: [] for kind in report_io.KINDS}


def check_of(*kinds: str) -> Callable[[Check], Check]:
    """Register a check for the report kinds it applies to."""
    def register(fn: Check) -> Check:
        for kind in kinds:
            CHECKS[kind].append(fn)
        return fn
    return register


def check(report: dict) -> list[Inconsistency]:
    """Every inconsistency of a report of any kind; empty when each derived number matches its raw data.

    A check that meets data too malformed to recompute reports that, as an inconsistency at the
    report's root naming the check, instead of raising."""
    kind = report.get("kind")
    if kind not in CHECKS:
        return [Inconsistency("kind", kind, f"one of {report_io.KINDS}", "unknown report kind")]
    found: list[Inconsistency] = []
    for fn in CHECKS[kind]:
        try:
            found.extend(fn(report))
        except (KeyError, IndexError, TypeError, ValueError, AttributeError, ZeroDivisionError) as e:
            found.append(Inconsistency("$", "malformed", fn.__name__.strip("_"), f"{type(e).__name__}: {e}"))
    return found


# ---- comparing a recorded structure with its recomputation ------------------------------------

def _at(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def same_value(recorded: Any, recomputed: Any) -> bool:
    """Equal, floats within ``REL_TOL`` relative; a bool equals only a bool, None only None."""
    if isinstance(recorded, bool) or isinstance(recomputed, bool) or recorded is None or recomputed is None:
        return type(recorded) is type(recomputed) and recorded == recomputed
    if isinstance(recorded, (int, float)) and isinstance(recomputed, (int, float)):
        if isinstance(recorded, int) and isinstance(recomputed, int):
            return recorded == recomputed
        return math.isclose(recorded, recomputed, rel_tol=REL_TOL, abs_tol=0.0)
    return recorded == recomputed


def diff(path: str, recorded: Any, recomputed: Any) -> Iterator[Inconsistency]:
    """Walk a recomputed structure against the recorded one: every recomputed value must be there and
    equal; recorded extras are allowed unless their name is one of ``DERIVED_ONLY``."""
    recomputed = report_io.clean(recomputed)
    if isinstance(recomputed, dict):
        if not isinstance(recorded, dict):
            yield Inconsistency(path, recorded, recomputed, "expected an object")
            return
        for key, value in recomputed.items():
            if key not in recorded:
                yield Inconsistency(_at(path, key), MISSING, value)
            else:
                yield from diff(_at(path, key), recorded[key], value)
        for key in recorded.keys() - recomputed.keys():
            if key in DERIVED_ONLY:
                yield Inconsistency(_at(path, key), recorded[key], MISSING, "not derivable from the raw data")
    elif isinstance(recomputed, list):
        if not isinstance(recorded, list) or len(recorded) != len(recomputed):
            yield Inconsistency(path, recorded, recomputed,
                                f"expected a list of {len(recomputed)}" if isinstance(recorded, list) else "")
            return
        for i, (a, b) in enumerate(zip(recorded, recomputed, strict=True)):
            yield from diff(_at(path, i), a, b)
    elif not same_value(recorded, recomputed):
        yield Inconsistency(path, recorded, recomputed)


def diff_keyed(path: str, recorded: list, recomputed: list, key: Callable[[dict], Any]) -> Iterator[Inconsistency]:
    """Records matched by ``key`` (a name): a missing record, an extra one, then each field."""
    if not isinstance(recorded, list):
        yield Inconsistency(path, recorded, f"a list of {len(recomputed)} records")
        return
    wanted = {key(r): r for r in recomputed}
    seen = set()
    for i, rec in enumerate(recorded):
        k = key(rec) if isinstance(rec, dict) else None
        if k not in wanted or k in seen:
            yield Inconsistency(_at(path, i), k, MISSING, "a record the raw data does not give")
            continue
        seen.add(k)
        yield from diff(_at(path, i), rec, wanted[k])
    for k in wanted.keys() - seen:
        yield Inconsistency(f"{path}[{k}]", MISSING, k, "a record the raw data gives is missing")


# ---- case tables (a run report's cases, each side of a comparison) -------------------------------

def recompute_cases(cases: list[dict], ceiling_op: str | None, control: str) -> list[dict]:
    """The case table as ``assemble.case_table`` derives it from each case's raw samples and validations.

    Raw and unknown fields are kept; modes, status and bandwidth are recomputed. Only a runnable case
    (``ok``, or ``failed`` by its validations) has a status that its validations decide; a case failed
    before anything was validated (a cluster task that died) keeps its status and reason."""
    out = []
    for case in cases:
        entry = copy.deepcopy(case)
        entry["modes"] = {mode: {**{k: v for k, v in m.items() if k not in BANDWIDTH_FIELDS},
                                 **assemble.mode_entry(m["rounds_us"], m.get("disturbance"))}
                          for mode, m in case["modes"].items()}
        if case["status"] == "ok" or (case["status"] == "failed" and case["validations"]):
            entry["status"] = "ok"
            assemble.settle_status(entry)
            if entry["status"] == "ok":
                entry["reason"] = case.get("reason")
        out.append(entry)
    assemble.bandwidth(out, ceiling_op, control)
    return out


def _case_table(path: str, cases: list[dict], ceiling_op: str | None, control: str) -> Iterator[Inconsistency]:
    expected = recompute_cases(cases, ceiling_op, control)
    for i, (case, want) in enumerate(zip(cases, expected, strict=True)):
        where = _at(path, i)
        yield from diff(where, case, want)
        yield from _validations(where, case)
        yield from _runnable(where, case)


def _validations(path: str, case: dict) -> Iterator[Inconsistency]:
    """A compact validation that says ``passed`` must not also record what fails one: violations,
    errors, changed inputs or a graph replay that missed the changed input."""
    for i, v in enumerate(case["validations"]):
        against = [why for why, bad in (
            (f"{v.get('violations')} violations", (v.get("violations") or 0) != 0),
            ("errors", bool(v.get("errors"))),
            ("inputs changed", v.get("inputs_unchanged") is False),
            ("the graph replay missed the changed input", v.get("replay_changed_input") is False),
        ) if bad]
        if v.get("passed") is not False and against:
            yield Inconsistency(_at(_at(path, "validations"), i) + ".passed", v.get("passed"), False,
                                "; ".join(against))


def _runnable(path: str, case: dict) -> Iterator[Inconsistency]:
    """Only a case that ran has validations or timings, and a case that ran is ``ok`` or ``failed``;
    every mode holds one list of samples per validated round, as ``case_table`` builds them."""
    if (case["validations"] or case["modes"]) and case["status"] not in ("ok", "failed"):
        yield Inconsistency(_at(path, "status"), case["status"], "ok or failed",
                            "a case with validations or timings ran")
    for mode, m in case["modes"].items():
        if len(m["rounds_us"]) != len(case["validations"]):
            yield Inconsistency(_at(path, f"modes.{mode}.rounds_us"), f"{len(m['rounds_us'])} rounds",
                                f"{len(case['validations'])} rounds", "one per validated round")


def _config_counts(path: str, cases: list[dict], config: dict, stopping: dict | None = None) -> Iterator[Inconsistency]:
    """A case that ran did so in each of ``config.rounds`` rounds (up to ``stopping.rounds`` where extra
    rounds were run), ``config.samples`` samples per mode, the kept ones and the dropped disturbed ones."""
    most = max(config["rounds"], (stopping or {}).get("rounds") or 0)
    for i, case in enumerate(cases):
        n = len(case["validations"])
        if n and not config["rounds"] <= n <= most:
            yield Inconsistency(_at(_at(path, i), "validations"), f"{n} rounds",
                                f"{config['rounds']} rounds" + (f" to {most}" if most > config["rounds"] else ""),
                                "config.rounds")
        for mode, m in case["modes"].items():
            noise = m.get("disturbance") or [{} for _ in m["rounds_us"]]
            for r, samples in enumerate(m["rounds_us"]):
                taken = len(samples) + len(noise[r].get("dropped_us", []) if r < len(noise) else [])
                if taken != config["samples"]:
                    yield Inconsistency(_at(_at(path, i), f"modes.{mode}.rounds_us[{r}]"), f"{taken} samples",
                                        f"{config['samples']} samples", "config.samples")


def _samples_and_ids(path: str, cases: list[dict]) -> Iterator[Inconsistency]:
    """Every sample a finite positive time (a negative one makes a ratio of two negatives look like a lead over
    the control), and every case id ``name/impl`` and given once (a duplicate, listed first, is what a table or
    history shows while the checks read the last)."""
    seen: set[str] = set()
    for i, case in enumerate(cases):
        at = _at(path, i)
        if case.get("id") != f"{case.get('name')}/{case.get('impl')}":
            yield Inconsistency(_at(at, "id"), case.get("id"), f"{case.get('name')}/{case.get('impl')}", "name/impl")
        if case.get("id") in seen:
            yield Inconsistency(_at(at, "id"), case.get("id"), "an id of its own", "a case given twice")
        seen.add(case.get("id"))
        for mode, m in case.get("modes", {}).items():
            for r, samples in enumerate(m.get("rounds_us", [])):
                bad = [x for x in samples if not (isinstance(x, (int, float)) and math.isfinite(x) and x > 0)]
                if bad:
                    yield Inconsistency(_at(at, f"modes.{mode}.rounds_us[{r}]"), _short(bad[:3]),
                                        "finite positive times", "samples are times")


# ---- run reports -------------------------------------------------------------------------------

@check_of("run")
def _run_samples_and_ids(report: dict) -> Iterator[Inconsistency]:
    yield from _samples_and_ids("cases", report["cases"])


@check_of("run")
def _run_cases(report: dict) -> Iterator[Inconsistency]:
    yield from _case_table("cases", report["cases"], table.ceiling_op(report), report.get("control", "torch"))


@check_of("run")
def _run_config_counts(report: dict) -> Iterator[Inconsistency]:
    yield from _config_counts("cases", report["cases"], report["config"], report.get("stopping"))


@check_of("run")
def _versus_control(report: dict) -> Iterator[Inconsistency]:
    control = report.get("control", "torch")
    cases = recompute_cases(report["cases"], table.ceiling_op(report), control)
    yield from diff_keyed("versus_control", report.get("versus_control", MISSING),
                          assemble.versus_control(cases, control), lambda r: f"{r['name']}/{r['impl']}")


# ---- comparison reports ----------------------------------------------------------------------------

def _comparison_sides(report: dict) -> dict[str, list[dict]]:
    control = report.get("control", "torch")
    return {side: recompute_cases(report["sides"][side]["cases"], table.ceiling_op(report), control)
            for side in ("reference", "candidate")}


@check_of("comparison")
def _comparison_cases(report: dict) -> Iterator[Inconsistency]:
    for side in ("reference", "candidate"):
        path = f"sides.{side}.cases"
        cases = report["sides"][side]["cases"]
        yield from _samples_and_ids(path, cases)
        yield from _case_table(path, cases, table.ceiling_op(report), report.get("control", "torch"))
        yield from _config_counts(path, cases, report["config"], report.get("stopping"))


@check_of("comparison")
def _comparison_records(report: dict) -> Iterator[Inconsistency]:
    """Records (gains, intervals, significance, control ranges), summaries and the probe range, from
    the recomputed sides; the bootstrap is seeded, so its intervals recompute exactly."""
    sides = _comparison_sides(report)
    derived = assemble.compare_cases(sides["reference"], sides["candidate"], report.get("control", "torch"),
                                     report.get("resamples", RESAMPLES_DEFAULT),
                                     report.get("significance_min_rounds", SIGNIFICANCE_MIN_ROUNDS_DEFAULT),
                                     report.get("interval_correlation") == "pooled")
    yield from diff_keyed("records", report["records"], derived["records"], lambda r: r["name"])
    yield from diff("summaries", report["summaries"], derived["summaries"])
    yield from diff("torch_probe_control_ratio_range", report["torch_probe_control_ratio_range"],
                    derived["torch_probe_control_ratio_range"])


@check_of("comparison")
def _identical_sides(report: dict) -> Iterator[Inconsistency]:
    """``identical_sides`` (and its notice) from the two sides' recorded sources and artifacts."""
    if "identical_sides" not in report:
        return
    same = assemble.identical_sides(report["sides"]["reference"]["provenance"],
                                    report["sides"]["candidate"]["provenance"])
    yield from diff("identical_sides", report["identical_sides"], same)
    yield from diff("notice", report.get("notice"), assemble.IDENTICAL_NOTICE if same else None)


# ---- before/after records ----------------------------------------------------------------------

@check_of("before_after")
def _before_after_records(report: dict) -> Iterator[Inconsistency]:
    """Alone, a record holds its speedup inside its interval and a significance that agrees with it; its
    medians and paired speedup are recomputed against its comparison (``check_before_after``)."""
    for i, rec in enumerate(report["records"]):
        path = _at("records", i)
        ci = rec.get("speedup_ci")
        if ci is not None and not ci[0] <= rec["speedup"] <= ci[1]:
            yield Inconsistency(_at(path, "speedup"), rec["speedup"], ci, "speedup_ci")
        if ci is not None and rec.get("significant") and ci[0] <= 1.0 <= ci[1]:
            yield Inconsistency(_at(path, "significant"), True, False, "speedup_ci holds 1")


def check_before_after(before_after: dict, comparison: dict) -> list[Inconsistency]:
    """A before/after report against the comparison it was made from: its hash and every record."""
    found = []
    if before_after.get("comparison_sha256") != comparison.get(report_io.HASH_FIELD):
        found.append(Inconsistency("comparison_sha256", before_after.get("comparison_sha256"),
                                   comparison.get(report_io.HASH_FIELD), "not made from this comparison"))
        return found
    want = assemble.before_after_report(comparison)
    found.extend(diff("records", before_after["records"], want["records"]))
    found.extend(diff("metadata", before_after["metadata"], want["metadata"]))
    return found


# ---- the device a report was made on ----------------------------------------------------------------

DEVICE_FIELDS = {"cpu": ("kind", "name", "cpu"), "cuda": ("kind", "name", "capability", "sm_count", "cpu")}


def recorded_devices(report: dict) -> dict[str, dict | None]:
    """Where each measurement of a report was made: ``provenance.device`` (a comparison: per side)."""
    if report.get("kind") == "run":
        return {"report": (report.get("provenance") or {}).get("device")}
    if report.get("kind") == "comparison":
        return {side: ((report.get("sides") or {}).get(side, {}).get("provenance") or {}).get("device")
                for side in ("reference", "candidate")}
    return {}


def describe_device(info: dict) -> str:
    text = f"{info.get('kind')} {info.get('name')!r}"
    if info.get("kind") == "cuda":
        text += f" (capability {info.get('capability')}, {info.get('sm_count')} SMs; host cpu {info.get('cpu')!r})"
    return text


def check_device(report: dict, here: dict) -> str | None:
    """Why the report's timings were not made on this machine (``here``: ``provenance.device_info``),
    or None where its recorded device identity matches this one's."""
    for where, recorded in recorded_devices(report).items():
        label = "" if where == "report" else f" ({where} side)"
        if not isinstance(recorded, dict):
            return f"records no device{label}, so it cannot be matched to this machine"
        fields = DEVICE_FIELDS.get(recorded.get("kind"), DEVICE_FIELDS["cuda"])
        differ = [f for f in fields if recorded.get(f) != here.get(f)]
        if differ:
            return (f"was made on {describe_device(recorded)}{label}; this machine is {describe_device(here)} "
                    f"(differs in {', '.join(differ)})")
    return None
