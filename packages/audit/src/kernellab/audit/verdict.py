"""Claims of two reports against their replay.

A report pair claims, per contender case and mode, a gain: reference time / candidate time. Each
side is first divided by its own torch control measured in the same rounds, so machine drift between
the two reports cancels. The replay measures the same gain with both revisions alternating, and its
confidence interval, widened by the drift its own control probe saw and a tolerance, is the band a
claim must meet.
"""

from __future__ import annotations

import math

from kernellab.harness import stats

REPRODUCED, CONTRADICTED, UNDECIDED = "reproduced", "contradicted", "undecided"


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
            if normalized:
                ref_r = [a / b for a, b in zip(ref_r, ref_cases[ctrl_id]["modes"][mode]["round_medians_us"],
                                              strict=True)]
                cand_r = [a / b for a, b in zip(cand_r, cand_cases[ctrl_id]["modes"][mode]["round_medians_us"],
                                               strict=True)]
            out[(name, mode)] = {
                "claimed_gain": stats.median(ref_r) / stats.median(cand_r),
                "claimed_range": [min(ref_r) / max(cand_r), max(ref_r) / min(cand_r)],
                "control_normalized": normalized,
            }
    return out


def judge(claim: dict, replayed: dict, tolerance: float) -> dict:
    """Does the replay reproduce the claim? ``replayed`` is one record's mode entry of the replay."""
    lo, hi = replayed["gain_ci"]
    ctrl = replayed.get("control_ratio_range") or [1.0, 1.0]
    drift = max(abs(math.log(ctrl[0])), abs(math.log(ctrl[1])))
    band = [lo * math.exp(-drift) / (1.0 + tolerance), hi * math.exp(drift) * (1.0 + tolerance)]
    c_lo, c_hi = claim["claimed_range"]
    informative = hi / lo <= (1.0 + tolerance) ** 4 and not replayed.get("control_flagged")
    gap = math.log(band[0] / c_hi) if c_hi < band[0] else math.log(c_lo / band[1]) if c_lo > band[1] else 0.0
    if gap == 0.0:
        outcome = REPRODUCED
    elif informative or gap > math.log(band[1] / band[0]):  # noisy, but the claim is further off than the noise
        outcome = CONTRADICTED
    else:
        outcome = UNDECIDED
    return {**claim, "replay_band": band, "claim": outcome}
