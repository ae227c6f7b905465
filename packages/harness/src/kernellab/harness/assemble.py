"""Turn measured rounds into reports: a run report for one revision, a comparison of two revisions
in the example audit's per-record format, and the before/after record of the native CPU example."""

from __future__ import annotations

import datetime
import hashlib
import json
from typing import Any

from . import report as report_io
from . import stats
from .timing import ALL_MODES, THROUGHPUT_MODES

IDENTICAL_NOTICE = ("the two sides have identical sources and built artifacts: every difference below is noise, "
                    "and a significant one is a false alarm of the statistics")
CONTROL_DRIFT_TOLERANCE = 0.10  # a pair whose control moved more than 10% between runs is flagged
FAMILY_ERROR = 0.05  # the chance that any of a comparison's intervals misses, split over its pairs


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


def _compact_validation(index: int, data: dict) -> dict:
    vals = data.get("validations", [])
    worst = [o for v in vals for o in v.get("outputs", {}).values()]
    out = {
        "round": index,
        "passed": bool(data.get("passed")),
        "checks": len(vals),
        "inputs_unchanged": all(v.get("inputs_unchanged", True) for v in vals),
        "max_abs_error": max((o.get("max_abs_error", 0.0) for o in worst), default=None),
        "violations": sum(o.get("violations", 0) for o in worst),
        "checked_outside_worker": sum(1 for v in vals if v.get("external")),
        "timed_batches_checked": sum(v.get("checked", 0) for v in vals if v.get("timed_batches")),
        "timed_batches_failed": sum(v.get("failed_batches", 0) for v in vals if v.get("timed_batches")),
    }
    if "graph_replay" in data:
        out["replay_changed_input"] = bool(data["graph_replay"].get("replay_changed_input"))
    errors = [v["error"] for v in vals if v.get("error")] + ([data["error"]] if data.get("error") else [])
    if errors:
        out["errors"] = errors
    return out


def case_table(cases: list[dict], rounds: list[dict], ceiling_op: str | None = None,
               control: str = "torch") -> list[dict]:
    """Per case: validation per round, samples per round per mode, summaries, and bandwidth against
    the suite's ceiling problem (``ceiling_op`` run by the control) where it has one."""
    out = []
    for desc in cases:
        cid = desc["id"]
        entry = {
            "id": cid,
            "name": desc["problem"]["name"],
            "impl": desc["impl"],
            "problem": desc["problem"],
            "status": desc["status"],
            "reason": desc.get("reason"),
            "validations": [],
            "modes": {},
        }
        if "device" in desc:  # a cluster run's: the device this case's task ran on
            entry["device"] = desc["device"]
        per_mode: dict[str, list[list[float]]] = {}
        noise_of: dict[str, list[dict]] = {}
        for r, data in enumerate(rounds):
            if cid not in data:
                continue
            entry["validations"].append(_compact_validation(r, data[cid]))
            for mode, samples in data[cid].get("samples_us", {}).items():
                per_mode.setdefault(mode, []).append(samples)
                noise_of.setdefault(mode, []).append(data[cid].get("disturbance", {}).get(mode, {}))
        for mode in ALL_MODES:
            if mode in per_mode and len(per_mode[mode]) == len(entry["validations"]) and per_mode[mode]:
                entry["modes"][mode] = mode_entry(per_mode[mode], noise_of[mode])
        settle_status(entry)
        out.append(entry)
    bandwidth(out, ceiling_op, control)
    return out


def mode_entry(rounds_us: list[list[float]], disturbance: list[dict] | None = None) -> dict:
    """One mode of a case: its samples per round (disturbed ones dropped, see ``noise``), their per-round
    medians and pooled summary, and per round what disturbed them."""
    entry = {
        "rounds_us": rounds_us,
        "round_medians_us": stats.round_medians(rounds_us),
        "summary_us": stats.summary([s for r in rounds_us for s in r]),
    }
    if disturbance is not None:
        entry["disturbance"] = disturbance
        entry["disturbed_rounds"] = sum(1 for d in disturbance if d.get("disturbed"))
    return entry


def settle_status(entry: dict) -> None:
    """A runnable case (status ``ok``) whose validations failed in any round becomes ``failed``."""
    if entry["status"] == "ok" and entry["validations"]:
        failed = [v for v in entry["validations"] if not v["passed"]]
        if failed:
            entry["status"] = "failed"
            entry["reason"] = "; ".join(e for v in failed for e in v.get("errors", [])) or \
                f"validation failed in rounds {[v['round'] for v in failed]}"


def bandwidth(cases: list[dict], ceiling_op: str | None, control: str) -> None:
    """GB/s per mode by the problem's minimum bytes, and, where the suite has a ceiling problem, the
    fraction of the same-shape ceiling (a copy) that the control measured.

    For the throughput modes the ceiling is the fastest copy among them, so that no one mode's slow copy
    lowers the bar (the copy is a kernel, ``problems.Copy``, since a graph's memcpy node ran slower)."""
    ceilings: dict[tuple, dict[str, float]] = {}
    for c in cases:
        p = c["problem"]
        if p["op"] == ceiling_op and c["impl"] == control:
            bw = {m: p["bytes"] / (v["summary_us"]["p50"] * 1e3) for m, v in c["modes"].items()}
            best = max((bw[m] for m in THROUGHPUT_MODES if m in bw), default=None)
            ceilings[(tuple(p["shape"]), p["dtype"])] = {m: best if m in THROUGHPUT_MODES else v for m, v in bw.items()}
    for c in cases:
        p = c["problem"]
        if not p.get("bytes"):
            continue
        ceiling = ceilings.get((tuple(p["shape"]), p["dtype"]), {})
        for mode, m in c["modes"].items():
            m["gbps"] = p["bytes"] / (m["summary_us"]["p50"] * 1e3)
            if ceiling.get(mode):
                m["copy_ceiling_gbps"] = ceiling[mode]
                m["ceiling_fraction"] = m["gbps"] / ceiling[mode]


def versus_control(cases: list[dict], control: str) -> list[dict]:
    """Each contender against torch measured side by side in the same rounds (native_torch_ratio)."""
    by_id = {c["id"]: c for c in cases}
    out = []
    for c in cases:
        if c["impl"] == control or not c["modes"]:
            continue
        ctrl = by_id.get(f"{c['name']}/{control}")
        if not ctrl or not ctrl["modes"]:
            continue
        rec: dict[str, Any] = {"name": c["name"], "impl": c["impl"], "status": c["status"]}
        for mode, m in c["modes"].items():
            if mode not in ctrl["modes"]:
                continue
            ratio = stats.ratio_stats(m["rounds_us"], ctrl["modes"][mode]["rounds_us"])
            rec[mode] = {
                "candidate_us": stats.median(m["round_medians_us"]),
                "torch_us": stats.median(ctrl["modes"][mode]["round_medians_us"]),
                "native_torch_ratio": ratio["value"],
                "ratio_min": ratio["min"],
                "ratio_max": ratio["max"],
            }
        out.append(rec)
    return out


def run_report(suite, config: dict, side: dict) -> dict:
    """A plain run: one revision, every case, torch as the control in the same rounds."""
    cases = case_table(side["cases"], side["rounds"], suite.ceiling_op, suite.control)
    return {
        "schema": report_io.SCHEMA,
        "kind": "run",
        "suite": suite.name,
        "suite_device": suite.device,
        "control": suite.control,
        "ceiling_op": suite.ceiling_op,
        "created_at": now_iso(),
        "config": config,
        "revision": side.get("revision"),
        "provenance": side["provenance"],
        "cases": cases,
        "versus_control": versus_control(cases, suite.control),
    }


def _contenders(cases: list[dict], control: str) -> list[str]:
    impls = sorted({c["impl"] for c in cases if c["impl"] != control})
    return impls or [control]


def comparison_report(suite, config: dict, reference: dict, candidate: dict, *, resamples: int = 1000) -> dict:
    """Reference revision vs candidate revision, per case and mode, in the example audit's format.

    ``suite`` needs only ``name``, ``device`` and ``control``; each side has ``cases`` (as described by
    the runner), ``rounds`` (per round, case id -> measured data), ``provenance`` and ``revision``.
    """
    ceiling = getattr(suite, "ceiling_op", None)
    ref_cases = case_table(reference["cases"], reference["rounds"], ceiling, suite.control)
    cand_cases = case_table(candidate["cases"], candidate["rounds"], ceiling, suite.control)
    identical = identical_sides(reference["provenance"], candidate["provenance"])
    return {
        "schema": report_io.SCHEMA,
        "kind": "comparison",
        "suite": suite.name,
        "suite_device": suite.device,
        "control": suite.control,
        "ceiling_op": ceiling,
        "created_at": now_iso(),
        "config": config,
        "resamples": resamples,
        "significance_min_rounds": stats.MIN_ROUNDS,
        "interval_correlation": "pooled",
        "stopping": candidate.get("stopping"),
        "identical_sides": identical,
        "notice": IDENTICAL_NOTICE if identical else None,
        "sides": {
            "reference": {"revision": reference.get("revision"), "provenance": reference["provenance"],
                          "cases": ref_cases},
            "candidate": {"revision": candidate.get("revision"), "provenance": candidate["provenance"],
                          "cases": cand_cases},
        },
        **compare_cases(ref_cases, cand_cases, suite.control, resamples),
    }


def compare_cases(reference: list[dict], candidate: list[dict], control: str, resamples: int,
                  min_rounds: int = stats.MIN_ROUNDS, pooled_correlation: bool = True) -> dict:
    """A comparison's derived part from the two sides' case tables: ``records`` per contender case
    and mode, ``summaries`` per mode and the control probe's ``torch_probe_control_ratio_range``; a record of
    fewer than ``min_rounds`` rounds a side claims no significance. With ``pooled_correlation`` (a comparison
    report's ``interval_correlation: pooled``) each mode's intervals allow for the lag-1 autocorrelation of its
    samples, pooled over every case of both sides (``stats.sample_correlation``, in the mode's summary)."""
    ref_cases = {c["id"]: c for c in reference}
    cand_cases = {c["id"]: c for c in candidate}
    contenders = _contenders(candidate, control)
    correlation = {mode: stats.sample_correlation(r for c in (*reference, *candidate) if mode in c["modes"]
                                                  for r in c["modes"][mode]["rounds_us"]) if pooled_correlation else 0.0
                   for mode in ALL_MODES}
    pairs = sum(1 for cid, c in cand_cases.items() if c["impl"] in contenders and cid in ref_cases
                for m in c["modes"] if m in ref_cases[cid]["modes"])
    confidence = 1.0 - FAMILY_ERROR / max(1, pairs)  # Bonferroni: every interval holds at once at 95%
    records, drift = [], []
    for cid, cand in cand_cases.items():
        ref = ref_cases.get(cid)
        if cand["impl"] not in contenders or ref is None:
            continue
        name = cand["name"] if len(contenders) == 1 else f"{cand['name']}/{cand['impl']}"
        ref_ctrl = ref_cases.get(f"{cand['name']}/{control}")
        cand_ctrl = cand_cases.get(f"{cand['name']}/{control}")
        rec: dict[str, Any] = {"name": name, "impl": cand["impl"],
                               "reference_status": ref["status"], "candidate_status": cand["status"]}
        for mode in ALL_MODES:
            if mode not in cand["modes"] or mode not in ref["modes"]:
                continue
            torch_rounds = cand_ctrl["modes"][mode]["rounds_us"] if cand_ctrl and mode in cand_ctrl["modes"] else None
            seed = int(hashlib.sha256(f"{name}/{mode}".encode()).hexdigest()[:8], 16)
            disturbed = bool(ref["modes"][mode].get("disturbed_rounds") or cand["modes"][mode].get("disturbed_rounds"))
            rec[mode] = stats.compare(ref["modes"][mode]["rounds_us"], cand["modes"][mode]["rounds_us"], torch_rounds,
                                      bootstrap_seed=seed, resamples=resamples, confidence=confidence,
                                      disturbed=disturbed, min_rounds=min_rounds, correlation=correlation[mode])
            if ref_ctrl and cand_ctrl and mode in ref_ctrl["modes"] and mode in cand_ctrl["modes"]:
                ctrl = [a / b for a, b in zip(ref_ctrl["modes"][mode]["round_medians_us"],
                                              cand_ctrl["modes"][mode]["round_medians_us"], strict=True)]
                rec[mode]["control_ratio_range"] = [min(ctrl), max(ctrl)]
                rec[mode]["control_flagged"] = any(abs(x - 1.0) > CONTROL_DRIFT_TOLERANCE for x in ctrl)
                drift.extend(ctrl)
        replay = [v.get("replay_changed_input") for v in cand["validations"] if "replay_changed_input" in v]
        rec["passed"] = ref["status"] == "ok" and cand["status"] == "ok"
        if replay:
            rec["replay_changed_input"] = all(replay)
        records.append(rec)
    summaries = {}
    for mode in ALL_MODES:
        mode_records = [r[mode] for r in records if mode in r]
        if mode_records:
            summaries[mode] = stats.summary_counts(mode_records)
            summaries[mode]["not_significant"] = sum(1 for r in mode_records if not r["significant"])
            summaries[mode]["control_flagged"] = sum(1 for r in mode_records if r.get("control_flagged"))
            disturbed = sum(1 for r in mode_records if r.get("disturbed"))
            if disturbed:
                summaries[mode]["disturbed"] = disturbed
            if pooled_correlation:
                summaries[mode]["sample_correlation"] = correlation[mode]
    return {
        "torch_probe_control_ratio_range": [min(drift), max(drift)] if drift else None,
        "summaries": summaries,
        "records": records,
    }


def identical_sides(reference: dict, candidate: dict) -> bool:
    """Whether two sides' provenance records the same measured sources and the same built artifacts (by
    content: a materialized tree builds the same file at another path)."""
    same_sources = reference.get("sources_sha256") == candidate.get("sources_sha256")
    same_impls = reference.get("impl_sources") == candidate.get("impl_sources")
    ref_arts = sorted(reference.get("artifacts_sha256", {}).values())
    cand_arts = sorted(candidate.get("artifacts_sha256", {}).values())
    return bool(same_sources and same_impls and ref_arts == cand_arts)


def before_after_report(comparison: dict, mode: str = "e2e_throughput") -> dict:
    """The native CPU example's record: operation, before/after ms, speedup, samples, method, hashes."""
    cfg = comparison["config"]
    sides = comparison["sides"]
    ref_cases = {c["id"]: c for c in sides["reference"]["cases"]}
    records = []
    contenders = _contenders(sides["candidate"]["cases"], comparison["control"])
    for cand in sides["candidate"]["cases"]:
        ref = ref_cases.get(cand["id"])
        if ref is None or mode not in cand["modes"] or mode not in ref["modes"] or cand["impl"] not in contenders:
            continue
        name = cand["name"] if len(contenders) == 1 else f"{cand['name']}/{cand['impl']}"
        paired = next((r[mode] for r in comparison["records"] if r["name"] == name and mode in r), None)
        if paired is not None:
            records.append(before_after_record(_operation(cand["problem"]), cand["impl"],
                                               ref["modes"][mode]["rounds_us"], cand["modes"][mode]["rounds_us"],
                                               paired))
    ref_rev, cand_rev = sides["reference"]["revision"] or {}, sides["candidate"]["revision"] or {}
    binaries = sorted(set(sides["reference"]["provenance"].get("artifacts_sha256", {}).values())
                      | set(sides["candidate"]["provenance"].get("artifacts_sha256", {}).values()))
    return {
        "schema": report_io.SCHEMA,
        "kind": "before_after",
        "suite": comparison["suite"],
        "comparison_sha256": comparison.get(report_io.HASH_FIELD),
        "metadata": {
            "measured_at": comparison["created_at"],
            "rounds": cfg["rounds"],
            "samples": cfg["rounds"] * cfg["samples"],
            "warmup": cfg["warmup"],
            "iterations_per_sample": cfg["iterations"],
            "method": (f"kernellab-bench {mode}: each revision in its own process, revision order alternating "
                       f"every round; {cfg['samples']} samples of {cfg['iterations']}-call averages a round "
                       "(samples disturbed by preemption, steal or throttling dropped while most are clean); "
                       "before_ms and after_ms are medians of the per-round medians, speedup the median over "
                       "rounds of the paired per-round ratio, with its Bonferroni-adjusted bootstrap interval; "
                       "every timed batch's outputs checked; backward includes clearing its output buffers; no "
                       "affinity, thermal or power control."),
            "identical_sides": comparison.get("identical_sides"),
            "notice": comparison.get("notice"),
            "baseline": ref_rev,
            "candidate": cand_rev,
            "baseline_source_zip_sha256": ref_rev.get("zip_sha256"),
            "baseline_source_sha256": _tree_hash(sides["reference"]["provenance"]),
            "candidate_source_sha256": _tree_hash(sides["candidate"]["provenance"]),
            "binary_sha256": binaries,
        },
        "records": records,
    }


def before_after_record(operation: str, impl: str, before_us: list[list[float]], after_us: list[list[float]],
                        paired: dict) -> dict:
    """One before/after record: each side's median of per-round medians in ms and the paired gain of the
    comparison record ``paired`` (with its interval), and the samples."""
    before = [sorted(r) for r in before_us]
    after = [sorted(r) for r in after_us]
    return {
        "operation": operation,
        "impl": impl,
        "before_ms": paired["reference_us"] / 1e3,
        "after_ms": paired["candidate_us"] / 1e3,
        "speedup": paired["gain"],
        "speedup_ci": paired["gain_ci"],
        "significant": paired["significant"],
        **({"too_few_rounds": True} if paired.get("too_few_rounds") else {}),
        "before_samples_ms": [s / 1e3 for r in before for s in r],
        "after_samples_ms": [s / 1e3 for r in after for s in r],
    }


def _operation(problem: dict) -> str:
    return f"{problem['op']}_{'_'.join(map(str, problem['shape']))}"


def _tree_hash(provenance: dict) -> str:
    """One sha256 over a side's per-file source hashes."""
    blob = json.dumps(provenance.get("sources_sha256", {}), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()
