"""The regression gate: a run compared with a reference (a committed run report or a revision) by the
A/B statistics of ``assemble.comparison_report``, failing on a significant slowdown beyond a margin.

A case regresses where its whole gain interval (reference/candidate, Bonferroni-adjusted over the
comparison) lies below ``1 / (1 + pct/100)``: slower by more than ``pct`` percent, beyond noise. A pass needs
every interval wholly above that limit: one that holds it (noise, or a contender slow in some rounds only) neither
shows a slowdown nor rules it out, and neither does a pair the reference measured that this run selected and did
not measure (a case now unsupported, failed, unavailable or absent, a mode it no longer gives): both make the
verdict ``inconclusive``. A
control probe that drifted past ``assemble.CONTROL_DRIFT_TOLERANCE`` in any pair makes the verdict
``inconclusive``: the machine moved, so neither a pass nor a failure can be trusted; so does a pair measured in
rounds the machine disturbed (``noise``), on either side or its control's (``control_disturbed``).

Against a stored run report the two sides ran at different times: a shift of the machine under that tolerance
(clocks, a neighbour, a driver) would read as the code's gain. There every pair is decided on its interval
widened by how far its control moved between the sides (``decision_interval``, as the audit widens a replay's),
and a pair without a control on both sides decides nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace

from . import assemble, stats
from .runner import match
from .timing import ALL_MODES

PASS, REGRESSION, INCONCLUSIVE = "pass", "regression", "inconclusive"


class GateError(ValueError):
    """A reference that cannot be compared with this run; the message says why."""


def side_from_report(report: dict, path: str | None = None) -> dict:
    """Rebuild the runner's side (case descriptions, per-round data) from a sealed run report, so that
    the comparison is computed exactly as the A/B path computes it."""
    if report.get("kind") != "run":
        raise GateError(f"--against needs a run report, {path or 'this report'} is a {report.get('kind')!r} report")
    rounds: list[dict] = []
    cases = []
    for case in report["cases"]:
        cases.append({"id": case["id"], "problem": case["problem"], "impl": case["impl"],
                      "status": case["status"], "reason": case.get("reason")})
        for v in case["validations"]:
            while len(rounds) <= v["round"]:
                rounds.append({})
            data = {"passed": v["passed"], "samples_us": {},
                    "validations": [{"inputs_unchanged": v.get("inputs_unchanged", True),
                                     "error": "; ".join(v.get("errors", [])) or None}]}
            if "replay_changed_input" in v:
                data["graph_replay"] = {"replay_changed_input": v["replay_changed_input"]}
            rounds[v["round"]][case["id"]] = data
        for mode, m in case["modes"].items():
            noise = m.get("disturbance") or [{} for _ in m["rounds_us"]]
            for v, samples, marks in zip(case["validations"], m["rounds_us"], noise, strict=True):
                rounds[v["round"]][case["id"]]["samples_us"][mode] = samples
                rounds[v["round"]][case["id"]].setdefault("disturbance", {})[mode] = marks  # a comparison reads it
    revision = dict(report.get("revision") or {})
    revision.update({"report": path, "report_sha256": report.get("sha256")})
    return {"cases": cases, "rounds": rounds, "provenance": report["provenance"], "revision": revision}


def common_rounds(reference: dict, candidate: dict) -> int:
    """Pair the sides' rounds by index; where their counts differ, both keep the first ``n`` rounds
    (the per-round ratios need a partner). Returns ``n``."""
    n = min(len(reference["rounds"]), len(candidate["rounds"]))
    if n == 0:
        raise GateError("the reference or this run has no measured rounds")
    reference["rounds"], candidate["rounds"] = reference["rounds"][:n], candidate["rounds"][:n]
    return n


def compare_with_report(suite, config: dict, reference_report: dict, candidate_side: dict,
                        path: str | None = None) -> dict:
    """The comparison report of a fresh run (``candidate_side``) against a committed run report."""
    if reference_report.get("suite") != suite.name:
        raise GateError(f"--against {path or 'report'} is a report of suite {reference_report.get('suite')!r}, "
                        f"not of {suite.name!r}")
    reference = side_from_report(reference_report, path)
    candidate = dict(candidate_side)
    common_rounds(reference, candidate)
    shape = SimpleNamespace(name=suite.name, device=suite.device, control=suite.control,
                            ceiling_op=getattr(suite, "ceiling_op", None))
    return assemble.comparison_report(shape, config, reference, candidate)


@dataclass
class Finding:
    """One (case, mode) pair of the comparison as the gate reads it."""

    name: str
    mode: str
    reference_us: float
    candidate_us: float
    gain: float
    gain_ci: tuple[float, float]
    control_ratio_range: tuple[float, float] | None
    decision_ci: tuple[float, float]  # the interval decided on: gain_ci, widened against a stored report
    control_flagged: bool
    regressed: bool
    disturbed: bool = False  # a round of either side (or of its control) disturbed: its interval proves nothing
    few_rounds: bool = False  # fewer than stats.MIN_ROUNDS rounds: its interval proves nothing either
    undecided: bool = False  # not regressed, but its interval holds the limit: no slowdown ruled out either


@dataclass
class Verdict:
    status: str
    threshold_pct: float
    findings: list[Finding] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[Finding]:
        return [f for f in self.findings if f.regressed]

    @property
    def drifted(self) -> list[Finding]:
        return [f for f in self.findings if f.control_flagged]

    @property
    def disturbed(self) -> list[Finding]:
        return [f for f in self.findings if f.disturbed]

    @property
    def few_rounds(self) -> list[Finding]:
        return [f for f in self.findings if f.few_rounds]

    @property
    def undecided(self) -> list[Finding]:
        return [f for f in self.findings if f.undecided]


def gain_limit(pct: float) -> float:
    """The gain below which a case is slower by more than ``pct`` percent."""
    if not (pct >= 0.0 and math.isfinite(pct)):
        raise GateError(f"--fail-on-regression expects a percentage >= 0, got {pct}")
    return 1.0 / (1.0 + pct / 100.0)


def evaluate(comparison: dict, pct: float, cases: str | None = None, impls: str | None = None) -> Verdict:
    """The gate's verdict on a comparison report: ``pass``, ``regression`` or ``inconclusive``; ``cases`` and
    ``impls`` are the run's selection (``--cases``, ``--impls``), outside which the reference's pairs are not
    asked for."""
    if comparison.get("kind") != "comparison":
        raise GateError(f"the gate reads a comparison report, got a {comparison.get('kind')!r} report")
    limit = gain_limit(pct)
    verdict = Verdict(PASS, pct)
    stored = stored_reference(comparison)
    for rec in comparison["records"]:
        for mode in ALL_MODES:
            r = rec.get(mode)
            if r is None:
                continue
            drift = r.get("control_ratio_range")
            lo, hi = decision = decision_interval(r["gain_ci"], drift, stored)
            verdict.findings.append(Finding(
                name=rec["name"], mode=mode, reference_us=r["reference_us"], candidate_us=r["candidate_us"],
                gain=r["gain"], gain_ci=tuple(r["gain_ci"]), control_ratio_range=tuple(drift) if drift else None,
                decision_ci=decision, control_flagged=bool(r.get("control_flagged")), regressed=hi < limit,
                undecided=lo < limit <= hi,
                disturbed=bool(r.get("disturbed")) or control_disturbed(comparison, rec, mode),
                few_rounds=len(r["reference_rounds_us"]) < stats.MIN_ROUNDS))
    unmeasured = unmeasured_pairs(comparison, cases, impls)
    devices = [_device(comparison, side) for side in ("reference", "candidate")]
    if not verdict.findings:
        verdict.status = INCONCLUSIVE
        verdict.reasons.append("no case and mode was measured on both sides")
    elif devices[0] != devices[1]:
        verdict.status = INCONCLUSIVE
        verdict.reasons.append(f"the reference ran on {devices[0]!r} and this run on {devices[1]!r}: times of two "
                               "machines say nothing about the code; compare on one machine (--against REV)")
    elif verdict.drifted:
        verdict.status = INCONCLUSIVE
        worst = max(verdict.drifted, key=lambda f: max(abs(x - 1.0) for x in f.control_ratio_range))
        verdict.reasons.append(
            f"the control (torch) drifted beyond {assemble.CONTROL_DRIFT_TOLERANCE:.0%} between the runs in "
            f"{len(verdict.drifted)} pair(s), worst {worst.name} {worst.mode} "
            f"{_range(worst.control_ratio_range)}; rerun on a quiet machine")
    elif verdict.disturbed:
        verdict.status = INCONCLUSIVE
        first = verdict.disturbed[0]
        verdict.reasons.append(f"{len(verdict.disturbed)} pair(s) measured in rounds the machine disturbed "
                               f"(preemption, steal or throttling), first {first.name} {first.mode}: their "
                               "intervals prove neither a slowdown nor its absence; rerun on a quiet machine")
    elif verdict.few_rounds:
        verdict.status = INCONCLUSIVE
        first = verdict.few_rounds[0]
        verdict.reasons.append(f"{len(verdict.few_rounds)} pair(s) with fewer than {stats.MIN_ROUNDS} rounds the "
                               f"two sides share, first {first.name} {first.mode}: an interval over so few rounds "
                               f"proves nothing; run --rounds {stats.MIN_ROUNDS} or more (a reference too)")
    elif verdict.regressions:
        verdict.status = REGRESSION
    elif unmeasured:
        verdict.status = INCONCLUSIVE
        verdict.reasons.append(f"{len(unmeasured)} pair(s) the reference measured were not measured in this run "
                               f"(unsupported, failed, unavailable or absent now), first {unmeasured[0]}: a slowdown "
                               "there is not ruled out (leave them out with --cases or --impls)")
    elif verdict.undecided:
        verdict.status = INCONCLUSIVE
        first = verdict.undecided[0]
        widened = " (widened by its control's shift between the report and this run)" if stored else ""
        verdict.reasons.append(f"{len(verdict.undecided)} pair(s) whose gain interval{widened} holds {limit:.4f}, "
                               f"first {first.name} {first.mode} {_range(first.decision_ci)}: a slowdown past "
                               f"{pct:g}% is neither shown nor ruled out; add rounds (--max-rounds) or rerun on a "
                               "quiet machine" + (", or compare with a revision (--against REV), whose sides run "
                                                  "in the same rounds" if stored else ""))
    for f in verdict.regressions:
        verdict.reasons.append(
            f"{f.name} {f.mode}: {_slowdown(f.gain):+.1f}% ({f.reference_us:.3f} -> {f.candidate_us:.3f} us), "
            f"gain interval {_range(f.decision_ci)} wholly below {limit:.4f}"
            + (" (suspected: the control drifted)" if verdict.status == INCONCLUSIVE else ""))
    return verdict


def stored_reference(comparison: dict) -> bool:
    """Whether the comparison's reference side was read from a stored run report (``--against REPORT``) rather
    than measured in the same rounds as the candidate."""
    reference = ((comparison.get("sides") or {}).get("reference") or {})
    return bool((reference.get("revision") or {}).get("report"))


def decision_interval(gain_ci, control_ratio_range, stored: bool) -> tuple[float, float]:
    """The gain interval a pair is decided on. In one run (an A/B) the sides shared their rounds: the recorded
    interval. Against a stored report, that interval widened on both sides by the control's largest move between
    the report and this run (its per-round ratio's farthest from 1), which a machine shift moves as much as the
    contender; no control measured on both sides leaves the shift unknown: (0, inf), which decides nothing."""
    lo, hi = gain_ci
    if not stored:
        return lo, hi
    shift = stats.control_shift(control_ratio_range)  # inf: (0, inf)
    return lo * math.exp(-shift), hi * math.exp(shift)


def unmeasured_pairs(comparison: dict, cases: str | None = None, impls: str | None = None) -> list[str]:
    """'case mode' of every pair the reference measured that this run asked for and did not measure: a case
    without that mode (now unsupported, failed or unavailable) or absent (an impl that no longer imports, or
    renamed). Pairs outside the run's selection (``cases``, ``impls``, the config's modes) are not asked for."""
    sides = comparison.get("sides") or {}
    if not sides:  # a bare ``compare_cases`` has none
        return []
    chosen = (comparison.get("config") or {}).get("modes")
    measured = sorted({m for side in sides.values() for c in side["cases"] for m in c.get("modes") or {}})
    control = comparison.get("control", "torch")
    candidate = {c["id"]: c for c in sides["candidate"]["cases"]}
    asked = [c for c in sides["reference"]["cases"] if match(c["problem"]["name"], cases)
             and (c["impl"] == control or match(c["impl"], impls))]
    out = []
    for c in asked:
        # a runnable case an A/B's reference side never measured: the candidate's side did not offer it (the rounds
        # run the ids both sides schedule), so every mode the run measured is asked of it
        modes = c.get("modes") or (measured if c["status"] == "ok" else [])
        out += [f"{c['id']} {mode}" for mode in modes if (chosen is None or mode in chosen)
                and mode not in ((candidate.get(c["id"]) or {}).get("modes") or {})]
    return out


def control_disturbed(comparison: dict, record: dict, mode: str) -> bool:
    """Whether the control of a record's problem had a disturbed round in ``mode`` on either side: noise that
    slowed it on one side moves the drift guard and every gain normalized by it (a record's own ``disturbed``
    counts its contender's rounds only)."""
    name = record["name"].removesuffix(f"/{record['impl']}")
    control = f"{name}/{comparison.get('control', 'torch')}"
    for side in (comparison.get("sides") or {}).values():  # a bare ``compare_cases`` has none
        for case in side["cases"]:
            if case["id"] == control and case["modes"].get(mode, {}).get("disturbed_rounds"):
                return True
    return False


def _device(comparison: dict, side: str) -> str:
    device = (comparison["sides"][side].get("provenance") or {}).get("device") or {}
    return device.get("name") or "unknown"


def _slowdown(gain: float) -> float:
    """Percent change of the candidate's time: +10 means 10% slower."""
    return (1.0 / gain - 1.0) * 100.0


def _range(pair) -> str:
    return f"[{pair[0]:.4f}, {pair[1]:.4f}]"


def describe(verdict: Verdict) -> str:
    """The lines printed after a gated run."""
    head = {PASS: f"no case is significantly slower than the reference by more than {verdict.threshold_pct:g}%",
            REGRESSION: f"{len(verdict.regressions)} case(s) significantly slower than the reference by more "
                        f"than {verdict.threshold_pct:g}%",
            INCONCLUSIVE: "neither a pass nor a failure can be trusted"}[verdict.status]
    return "\n".join([f"gate: {verdict.status}: {head}", *(f"  {r}" for r in verdict.reasons)])


def markdown(comparison: dict, verdict: Verdict | None) -> str:
    """A CI job summary: the verdict, then one row per case and mode (regressions first)."""
    ref = (comparison["sides"]["reference"].get("revision") or {})
    cand = (comparison["sides"]["candidate"].get("revision") or {})
    lines = [f"## kernellab-bench: {comparison['suite']}", ""]
    if verdict is not None:
        icon = {PASS: "PASS", REGRESSION: "FAIL", INCONCLUSIVE: "INCONCLUSIVE"}[verdict.status]
        lines += [f"**{icon}**: " + describe(verdict).splitlines()[0].removeprefix("gate: "), ""]
        lines += [f"- {r}" for r in verdict.reasons] + ([""] if verdict.reasons else [])
    drift = comparison.get("torch_probe_control_ratio_range")
    lines += [f"Reference: {_who(ref)}; candidate: {_who(cand)}; control drift range "
              f"{_range(drift) if drift else 'n/a'}.",
              "", "| case | mode | reference us | candidate us | change | gain interval | control | |",
              "|---|---|---:|---:|---:|---|---|---|"]
    gated = verdict is not None
    findings = verdict.findings if gated else evaluate(comparison, 0.0).findings
    for f in sorted(findings, key=lambda f: (not (gated and f.regressed), f.gain)):
        lo, hi = f.decision_ci
        mark = ("regression" if gated and f.regressed else "faster" if lo > 1.0 else "slower" if hi < 1.0
                else "not significant")
        control = _range(f.control_ratio_range) + (" drift" if f.control_flagged else "") \
            if f.control_ratio_range else "n/a"
        lines.append(f"| {f.name} | {f.mode} | {f.reference_us:.3f} | {f.candidate_us:.3f} | "
                     f"{_slowdown(f.gain):+.1f}% | {_range(f.decision_ci)} | {control} | {mark} |")
    return "\n".join(lines) + "\n"


def _who(revision: dict) -> str:
    if revision.get("report"):
        return f"report `{revision['report']}` (commit {str(revision.get('commit'))[:10]})"
    commit = str(revision.get("commit") or revision.get("zip_sha256") or "?")[:10]
    return f"{revision.get('revision', '?')} ({commit}{', dirty' if revision.get('dirty') else ''})"
