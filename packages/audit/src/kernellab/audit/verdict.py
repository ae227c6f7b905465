"""Claims of two reports against their replay.

A report pair claims, per contender case and mode, a gain: reference time / candidate time. Each
side is first divided by its own torch control measured in the same rounds, so machine drift between
the two reports cancels. The replay measures the same gain with both revisions alternating; its
confidence interval, widened by the drift its own control probe saw and a tolerance, is the band a
claim must meet. The reports carry noise of their own, measured the same way: how far their control
moved between the two runs, and how far apart the rounds that make each side's median lie. A claim
that misses the band by no more than that noise is not evidence against the reports.

The rules, stated once (``judge``):

- the replay is *informative* when its interval, drift included, is at most ``INFORMATIVE_WIDTH``
  wide (hi / lo), its samples were not disturbed past use (``disturbed``), it has at least
  ``MIN_REPLAY_ROUNDS`` rounds a side (fewer leave the interval nothing to resample: one round's is a
  point) and its control was measured on both sides (no control, no drift known);
- a claim is ``reproduced`` only by an informative replay whose band holds the claimed gain (the
  median over the reports' rounds: a gain claimed in two rounds of three is claimed) and, where the claim
  is a speed-up or a slowdown past the tolerance, whose own interval, drift included, shows it too
  (``shown``): a band that holds both the claim and no change at all confirms nothing of the change;
- a claim outside an informative replay, further off than the reports' own noise (``claim_noise``)
  explains, is ``contradicted``; so is a claim that an uninformative but bounded replay (at most
  ``DECISIVE_WIDTH`` wide) puts further off than the band's own width and that noise (a change the replay
  shows the other way round lies outside its band: the tolerance widens both alike);
- anything else is ``undecided``: the verdict is then ``inconclusive``, never ``pass``.
"""

from __future__ import annotations

import math

from kernellab.harness import stats

REPRODUCED, CONTRADICTED, UNDECIDED = "reproduced", "contradicted", "undecided"
INFORMATIVE_WIDTH = 1.5  # an interval hi/lo wider than this cannot confirm a claim
DECISIVE_WIDTH = 64.0  # an interval wider than this says nothing, not even that a claim is far off
DRIFT_LIMIT = 1.25  # a replay whose control moved more than 25% between its two sides decides nothing
MIN_REPLAY_ROUNDS = 3  # rounds a side below which a replay's interval says nothing of its spread
MIN_REPLAY_SAMPLES = 5  # samples a round the audit replays at least, whatever the report's config
CONTROL_TIME_LIMIT = 1.5  # a report's control times further than this from every replayed round are unconfirmed


def majority_spread(values: list[float]) -> float:
    """hi / lo of the tightest majority of ``values`` (the shorth): how far apart the rounds that make a
    median lie. One stray round of three does not widen it, so a gain claimed in two rounds of three is
    as firm as the two rounds."""
    v = sorted(values)
    if not v or v[0] <= 0.0:
        return math.inf
    k = len(v) // 2 + 1
    return min(v[i + k - 1] / v[i] for i in range(len(v) - k + 1))


def claim_noise(ref_rounds: list[float], cand_rounds: list[float], drift_ratios: list[float]) -> float:
    """The reports' own noise as a factor: each side's majority spread, times the largest move of the
    control between the two runs (``drift_ratios``: reference-run / candidate-run control ratios)."""
    drift = max((max(r, 1.0 / r) for r in drift_ratios), default=1.0) if all(r > 0 for r in drift_ratios) \
        else math.inf
    return majority_spread(ref_rounds) * majority_spread(cand_rounds) * drift


def claims(reference: dict, candidate: dict) -> dict[tuple[str, str], dict]:
    """(case name, mode) -> the gain the two reports claim, with its range over their rounds."""
    control = candidate.get("control", "torch")
    ref_cases = {c["id"]: c for c in reference["cases"]}
    cand_cases = {c["id"]: c for c in candidate["cases"]}
    contenders = sorted({c["impl"] for c in cand_cases.values() if c["impl"] != control}) or [control]
    out = {}
    for cid, cand in cand_cases.items():
        ref = ref_cases.get(cid)
        if cand["impl"] not in contenders or ref is None:
            continue
        name = cand["name"] if len(contenders) == 1 else f"{cand['name']}/{cand['impl']}"
        ctrl_id = f"{cand['name']}/{control}"
        for mode, cm in cand["modes"].items():
            if mode not in ref["modes"]:
                continue
            ref_r, cand_r = ref["modes"][mode]["round_medians_us"], cm["round_medians_us"]
            normalized = cand["impl"] != control and all(
                ctrl_id in cases and mode in cases[ctrl_id]["modes"] for cases in (ref_cases, cand_cases))
            drift_ratios = []
            if normalized:
                ref_c = ref_cases[ctrl_id]["modes"][mode]["round_medians_us"]
                cand_c = cand_cases[ctrl_id]["modes"][mode]["round_medians_us"]
                ref_r = [a / b for a, b in zip(ref_r, ref_c, strict=True)]
                cand_r = [a / b for a, b in zip(cand_r, cand_c, strict=True)]
                # rounds of two runs are not paired: the control's move is its widest ratio across them
                drift_ratios = [min(ref_c) / max(cand_c), max(ref_c) / min(cand_c)] if min(cand_c) > 0 else [0.0]
            out[(name, mode)] = {
                "claimed_gain": stats.median(ref_r) / stats.median(cand_r),
                "claimed_range": [min(ref_r) / max(cand_r), max(ref_r) / min(cand_r)],
                "control_normalized": normalized,
                "claim_noise": claim_noise(ref_r, cand_r, drift_ratios),
            }
    return out


def versus_control_claims(candidate: dict) -> dict[tuple[str, str], dict]:
    """(case name/impl, mode) -> the candidate report's own claim against its control: the gain of the contender
    over the control measured in the same rounds (control time / contender time, 1 / ``native_torch_ratio``), with
    the spread of its rounds as its noise (no drift between two runs: both sides of it ran together)."""
    control = candidate.get("control", "torch")
    cases = {c["id"]: c for c in candidate["cases"]}
    out = {}
    for case in cases.values():
        ctrl = cases.get(f"{case['name']}/{control}")
        if case["impl"] == control or case.get("status") != "ok" or ctrl is None:
            continue
        for mode, cm in case["modes"].items():
            if mode not in ctrl["modes"]:
                continue
            ratios = [a / b if a > 0 and b > 0 else math.nan for a, b in
                      zip(ctrl["modes"][mode]["round_medians_us"], cm["round_medians_us"], strict=True)]
            if not ratios or not all(math.isfinite(r) for r in ratios):  # not a claim of times: judged undecided
                ratios = [math.nan]
            out[(f"{case['name']}/{case['impl']} versus {control}", mode)] = {
                "claimed_gain": stats.median(ratios), "claimed_range": [min(ratios), max(ratios)],
                "control_normalized": False, "claim_noise": majority_spread(ratios)}
    return out


def replay_versus_control(rounds: list[dict], case_id: str, control_id: str, mode: str) -> dict | None:
    """The replay's record of a contender against its control on one side (``rounds``: that side's measured
    rounds), as ``judge`` reads a comparison's: the control's time over the contender's, its interval, and a drift
    of 1 (both ran in the same rounds); None where a round lacks either. The interval allows for the pair's samples'
    lag-1 autocorrelation, as a comparison report's intervals do (``stats.sample_correlation``)."""
    pairs = [(r[control_id]["samples_us"].get(mode), r[case_id]["samples_us"].get(mode)) for r in rounds
             if case_id in r and control_id in r and "samples_us" in r[case_id] and "samples_us" in r[control_id]]
    if not pairs or any(not a or not b for a, b in pairs):
        return None
    disturbed = any(r[cid].get("disturbance", {}).get(mode, {}).get("disturbed") for r in rounds
                    for cid in (case_id, control_id) if cid in r)  # noise on either: the interval proves nothing
    control, contender = [a for a, _ in pairs], [b for _, b in pairs]
    rec = stats.compare(control, contender, bootstrap_seed=0, resamples=300, disturbed=disturbed,
                        correlation=stats.sample_correlation(control + contender))
    return rec | {"control_ratio_range": [1.0, 1.0]}


def replay_band(replayed: dict, tolerance: float) -> tuple[list[float], float, list[str]]:
    """The band a claim must meet, its width (hi / lo), and why the replay is not informative (empty
    when it is). ``replayed`` is one record's mode entry of the replay."""
    lo, hi = replayed["gain_ci"]
    why = []
    if not (lo > 0.0 and math.isfinite(hi) and hi >= lo):
        return [0.0, math.inf], math.inf, [f"replay interval {[lo, hi]} is not a finite positive interval"]
    ctrl = replayed.get("control_ratio_range")
    if not ctrl:
        return [0.0, math.inf], math.inf, ["the replay measured no control on both sides: its drift is unknown"]
    drift = control_drift(replayed)
    band = [lo * math.exp(-drift) / (1.0 + tolerance), hi * math.exp(drift) * (1.0 + tolerance)]
    width = hi / lo * math.exp(2 * drift)
    if width > INFORMATIVE_WIDTH:
        why.append(f"replay interval {lo:.3g}-{hi:.3g} with control drift {math.exp(drift):.3g}x is "
                   f"{width:.3g}x wide (informative: <= {INFORMATIVE_WIDTH}x)")
    if math.exp(drift) > DRIFT_LIMIT:
        why.append(f"the replay's control moved {math.exp(drift):.3g}x between its sides "
                   f"(limit {DRIFT_LIMIT}x)")
    if replayed.get("disturbed"):
        why.append("the replay's samples were disturbed (preemption, throttling or clock events) past use")
    rounds = min(len(replayed.get("reference_rounds_us") or []), len(replayed.get("candidate_rounds_us") or []))
    if rounds < MIN_REPLAY_ROUNDS:
        why.append(f"the replay has {rounds} round(s) a side (informative: at least {MIN_REPLAY_ROUNDS})")
    return band, width, why


def direction(gain: float, tolerance: float) -> int:
    """+1 for a speed-up past the tolerance, -1 for a slowdown past it, 0 for a gain within it of 1."""
    return 1 if gain > 1.0 + tolerance else -1 if gain * (1.0 + tolerance) < 1.0 else 0


def control_drift(replayed: dict) -> float:
    """How far the replay's control moved between its sides (``stats.control_shift``: inf where unknown)."""
    return stats.control_shift(replayed.get("control_ratio_range"))


def shown(replayed: dict) -> int:
    """The change the replay shows: +1 where its interval widened by its control's drift lies above 1, -1 where
    below, 0 where it holds 1 (no change is then as likely as any it holds)."""
    lo, hi = replayed["gain_ci"]
    drift = control_drift(replayed)
    if not (lo > 0.0 and math.isfinite(drift)):
        return 0
    return 1 if lo * math.exp(-drift) > 1.0 else -1 if hi * math.exp(drift) < 1.0 else 0


def judge(claim: dict, replayed: dict, tolerance: float) -> dict:
    """Does the replay reproduce the claim? See the module docstring for the rules."""
    band, width, why = replay_band(replayed, tolerance)
    gain = claim["claimed_gain"]
    noise = claim.get("claim_noise", 1.0)
    inside = band[0] <= gain <= band[1]
    gap = 0.0 if inside else (math.log(band[0] / gain) if gain < band[0] else math.log(gain / band[1]))
    beyond_noise = math.isfinite(noise) and gap > math.log(noise)
    claimed, replay_shows = direction(gain, tolerance), shown(replayed)
    unshown = []
    if claimed and replay_shows != claimed:
        lo, hi = replayed["gain_ci"]
        unshown.append(f"the claim is a {'speed-up' if claimed > 0 else 'slowdown'} and the replay's interval "
                       f"{lo:.3g}-{hi:.3g}, its control's drift included, "
                       + ("shows the opposite" if replay_shows else "holds no change"))
    if not why and inside and not unshown:
        outcome = REPRODUCED
    elif beyond_noise and (not why or (width <= DECISIVE_WIDTH and gap > math.log(width * noise)
                                       and math.isfinite(gap))):
        outcome = CONTRADICTED
    else:
        outcome = UNDECIDED
    return {**claim, "claim_noise": noise, "replay_band": band, "replay_width": width, "informative": not why,
            "uninformative_because": why, "change_not_shown": unshown, "claim": outcome}


def control_times(report: dict, rounds: list[dict], control: str) -> list[str]:
    """A report's own times, where no ratio reaches them: each of its control's cases (the copy ceiling's included,
    whatever its status) per mode, the median of its rounds' medians and its pooled p50 (the number behind its GB/s
    and fractions of the copy) against the replay's rounds of the same case on that report's side. One further than
    ``CONTROL_TIME_LIMIT`` from every replayed round (either way: the report's machine may have been quieter or
    busier), in a mode the replay did not measure, or a problem of the report without a measured control case, is
    listed, as 'case mode: claimed ..., replayed ...'. Every sample of a report scaled alike, or its copy ceiling's
    alone, changes no ratio the audit judges; it moves these."""
    out = []
    controlled = set()
    for case in report["cases"]:
        if case["impl"] != control:
            continue
        for mode, m in (case.get("modes") or {}).items():
            replayed = [stats.median(r[case["id"]]["samples_us"][mode]) for r in rounds
                        if mode in (r.get(case["id"]) or {}).get("samples_us", {})]
            claimed = [stats.median(m.get("round_medians_us") or [math.nan]),
                       (m.get("summary_us") or {}).get("p50", math.nan)]
            controlled.add(case["name"])
            if not replayed:
                out.append(f"{case['id']} {mode}: claimed {claimed[0]:.4g} us, not replayed")
                continue
            lo, hi = min(replayed) / CONTROL_TIME_LIMIT, max(replayed) * CONTROL_TIME_LIMIT
            if not all(lo <= t <= hi for t in claimed):
                out.append(f"{case['id']} {mode}: claimed {claimed[0]:.4g} us (p50 {claimed[1]:.4g}), replayed "
                           f"{min(replayed):.4g}-{max(replayed):.4g} us")
    out += [f"{name}: no measured {control} case, so no time of it can be checked"
            for name in sorted({c["name"] for c in report["cases"]} - controlled)]
    return out
