"""Statistics of timing samples: summaries, per-round comparisons, bootstrap intervals.

Medians of ratios are taken in log space (for an even count, the geometric mean of the two middle
values), so that gain(a, b) == 1 / gain(b, a) exactly and a scaled copy of a sample set gives the
scale itself as its gain.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default method), q in [0, 100]."""
    if not values:
        raise ValueError("percentile of an empty sample set")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q must be in [0, 100], got {q}")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    frac = pos - lo
    return xs[lo] + (xs[hi] - xs[lo]) * frac


def median(values: Sequence[float]) -> float:
    return percentile(values, 50.0)


def summary(values: Sequence[float]) -> dict[str, float]:
    """count, p50, p95, min, max, mean: the seeds' ``stream_summary``."""
    if not values:
        raise ValueError("summary of an empty sample set")
    return {
        "count": len(values),
        "p50": median(values),
        "p95": percentile(values, 95.0),
        "min": min(values),
        "max": max(values),
        "mean": math.fsum(values) / len(values),
    }


def log_median(ratios: Sequence[float]) -> float:
    """Median of positive ratios taken in log space; reciprocal-symmetric."""
    if not ratios:
        raise ValueError("median of an empty ratio set")
    if any(not (r > 0.0) or math.isinf(r) for r in ratios):
        raise ValueError(f"ratios must be finite and positive, got {list(ratios)}")
    xs = sorted(ratios)
    n = len(xs)
    if n % 2:
        return xs[n // 2]
    lo, hi = xs[n // 2 - 1], xs[n // 2]
    return lo if lo == hi else math.sqrt(lo * hi)


def round_medians(rounds: Sequence[Sequence[float]]) -> list[float]:
    return [median(r) for r in rounds]


def ratio_stats(numer_rounds: Sequence[Sequence[float]], denom_rounds: Sequence[Sequence[float]]) -> dict:
    """Per-round ratio of medians numer/denom: its log-space median, min and max over rounds."""
    if len(numer_rounds) != len(denom_rounds) or not numer_rounds:
        raise ValueError(f"both sides need the same, non-zero number of rounds "
                         f"({len(numer_rounds)} vs {len(denom_rounds)})")
    per_round = [a / b for a, b in zip(round_medians(numer_rounds), round_medians(denom_rounds), strict=True)]
    return {"value": log_median(per_round), "min": min(per_round), "max": max(per_round), "rounds": per_round}


def control_shift(control_ratio_range: Sequence[float] | None) -> float:
    """How far a control moved between two sides, as |log| of its per-round ratio farthest from 1; inf where unknown
    (no control measured on both sides). A gain interval widened by it on both sides (``exp(-shift)``,
    ``exp(shift)``) holds a shift of the machine that moved contender and control alike."""
    if not control_ratio_range or not min(control_ratio_range) > 0.0:
        return math.inf
    return max(abs(math.log(x)) for x in control_ratio_range)


MIN_ROUNDS = 3
"""The fewest rounds the regression gate decides on and a comparison report calls a gain significant over: over one
round the bootstrap's interval is the gain itself, over two it rests on one pair of rounds (noise alone read as a
difference far more often than the 5% the interval promises); the audit's replay takes as many
(``MIN_REPLAY_ROUNDS``)."""


MAX_CORRELATION = 0.95  # the most lag-1 autocorrelation an interval takes from the samples


def sample_correlation(series: Iterable[Sequence[float]]) -> float:
    """The lag-1 autocorrelation of log times within each series (a round of one case's samples, in the order
    taken), pooled over the series of three or more samples and clamped to [0, ``MAX_CORRELATION``]: 0 where none
    can say. Pooled over a run's cases because one round's few samples cannot estimate it; the estimate leans low
    (each series' own mean is taken out), so that independent samples mostly read 0."""
    products = squares = 0.0
    for samples in series:
        if len(samples) < 3 or min(samples) <= 0.0:
            continue
        logs = [math.log(x) for x in samples]
        mean = math.fsum(logs) / len(logs)
        dev = [x - mean for x in logs]
        products += math.fsum(u * v for u, v in zip(dev[:-1], dev[1:], strict=True))
        squares += math.fsum(u * u for u in dev)
    if squares <= 0.0:
        return 0.0
    return min(MAX_CORRELATION, max(0.0, products / squares))


def effective_samples(count: int, correlation: float) -> int:
    """How many independent samples ``count`` samples of lag-1 autocorrelation ``correlation`` are worth to an
    average of them, as for an AR(1) process (the median's worth is taken alike): count (1 - rho) / (1 + rho), at
    least one."""
    return max(1, min(count, round(count * (1.0 - correlation) / (1.0 + correlation))))


def bootstrap_gain_ci(
    reference_rounds: Sequence[Sequence[float]],
    candidate_rounds: Sequence[Sequence[float]],
    *,
    resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    correlation: float = 0.0,
) -> tuple[float, float]:
    """Confidence interval of the gain (reference/candidate) by a two-level bootstrap.

    Rounds are resampled (drift between rounds), then samples within each chosen round on each side
    (noise within a round), as many as are worth independent ones at the samples' lag-1 ``correlation``
    (``effective_samples``; all of them at 0): correlated samples drawn one by one as if independent made the
    interval too narrow. The interval is the normal interval of log(gain) around the estimate,
    so it always holds the estimate and swapping the sides gives the reciprocal interval.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if not 0.0 <= correlation < 1.0:
        raise ValueError(f"correlation must be in [0, 1), got {correlation}")
    estimate = ratio_stats(reference_rounds, candidate_rounds)["value"]
    spread = math.exp(_normal_quantile(0.5 + confidence / 2.0)
                      * _bootstrap_log_sd(reference_rounds, candidate_rounds, resamples, seed, correlation))
    return estimate / spread, estimate * spread


def _bootstrap_log_sd(a_rounds, b_rounds, resamples: int, seed: int, correlation: float = 0.0) -> float:
    """Standard deviation of log(gain) over bootstrap resamples, computed in one canonical
    orientation of the two sides, so that it does not depend on which side is which."""
    a = tuple(tuple(r) for r in a_rounds)
    b = tuple(tuple(r) for r in b_rounds)
    if b < a:
        a, b = b, a
    n_rounds = len(a)
    draws = [(effective_samples(len(x), correlation), effective_samples(len(y), correlation))
             for x, y in zip(a, b, strict=True)]  # per round, not per resample
    rng = random.Random(seed)
    logs = []
    for _ in range(resamples):
        ratios = []
        for _ in range(n_rounds):
            r = rng.randrange(n_rounds)
            (ref, cand), (ref_draws, cand_draws) = (a[r], b[r]), draws[r]
            ref_m = median([ref[rng.randrange(len(ref))] for _ in range(ref_draws)])
            cand_m = median([cand[rng.randrange(len(cand))] for _ in range(cand_draws)])
            ratios.append(ref_m / cand_m)
        logs.append(math.log(log_median(ratios)))
    mean = math.fsum(logs) / len(logs)
    return math.sqrt(math.fsum((x - mean) ** 2 for x in logs) / max(1, len(logs) - 1))


def _normal_quantile(p: float) -> float:
    """Inverse standard normal CDF by bisection on erf (no scipy needed for one number)."""
    lo, hi = -10.0, 10.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if 0.5 * (1.0 + math.erf(mid / math.sqrt(2.0))) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def compare(
    reference_rounds: Sequence[Sequence[float]],
    candidate_rounds: Sequence[Sequence[float]],
    torch_rounds: Sequence[Sequence[float]] | None = None,
    *,
    bootstrap_seed: int = 0,
    resamples: int = 1000,
    confidence: float = 0.95,
    disturbed: bool = False,
    min_rounds: int = 1,
    correlation: float = 0.0,
) -> dict:
    """One record of the example audit: reference vs candidate (and vs torch), per round. A record whose
    rounds were ``disturbed`` (see ``noise``), or that has fewer than ``min_rounds`` rounds a side (a comparison
    report's ``significance_min_rounds``), keeps its interval but claims no significance. ``correlation``: the
    samples' lag-1 autocorrelation the interval allows for (``bootstrap_gain_ci``)."""
    ref_meds = round_medians(reference_rounds)
    cand_meds = round_medians(candidate_rounds)
    too_few = min(len(ref_meds), len(cand_meds)) < min_rounds
    gain = ratio_stats(reference_rounds, candidate_rounds)
    lo, hi = bootstrap_gain_ci(reference_rounds, candidate_rounds, seed=bootstrap_seed, resamples=resamples,
                               confidence=confidence, correlation=correlation)
    out = {
        "reference_us": median(ref_meds),
        "candidate_us": median(cand_meds),
        "reference_rounds_us": ref_meds,
        "candidate_rounds_us": cand_meds,
        "gain": gain["value"],
        "gain_min": gain["min"],
        "gain_max": gain["max"],
        "gain_ci": [lo, hi],
        "ci_level": confidence,
        "significant": not (lo <= 1.0 <= hi) and not disturbed and not too_few,
    }
    if disturbed:  # only then: a record from before disturbance was measured reads the same
        out["disturbed"] = True
    if too_few:  # likewise
        out["too_few_rounds"] = True
    if torch_rounds is not None:
        torch_meds = round_medians(torch_rounds)
        ratio = ratio_stats(candidate_rounds, torch_rounds)
        out.update({
            "torch_us": median(torch_meds),
            "torch_rounds_us": torch_meds,
            "native_torch_ratio": ratio["value"],
            "ratio_min": ratio["min"],
            "ratio_max": ratio["max"],
        })
    return out


def summary_counts(records: Sequence[dict]) -> dict[str, int]:
    """The four counts of the example audit's ``summaries`` over one mode's records."""
    return {
        "positive_medians": sum(1 for r in records if r["gain"] > 1.0),
        "all_pairs_positive": sum(1 for r in records if r["gain_min"] > 1.0),
        "all_pairs_negative": sum(1 for r in records if r["gain_max"] < 1.0),
        "faster_torch_all_pairs": sum(1 for r in records if r.get("ratio_max") is not None and r["ratio_max"] < 1.0),
    }
