import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from kernellab.harness import stats

positive = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False)
samples = st.lists(positive, min_size=1, max_size=40)
rounds = st.lists(st.lists(positive, min_size=1, max_size=12), min_size=1, max_size=5)


@given(samples, st.floats(min_value=0, max_value=100))
def test_percentile_matches_numpy(values, q):
    assert stats.percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12, abs=1e-12)


@given(samples)
def test_summary_fields(values):
    s = stats.summary(values)
    assert s["count"] == len(values)
    assert s["min"] <= s["p50"] <= s["p95"] <= s["max"]
    assert s["mean"] == pytest.approx(float(np.mean(values)), rel=1e-12)
    assert s["p50"] == pytest.approx(float(np.median(values)), rel=1e-12)


def _paired(data, n_rounds):
    a = [data.draw(st.lists(positive, min_size=1, max_size=10)) for _ in range(n_rounds)]
    b = [data.draw(st.lists(positive, min_size=1, max_size=10)) for _ in range(n_rounds)]
    return a, b


@given(st.data(), st.integers(1, 5))
def test_gain_is_reciprocal_when_sides_swap(data, n_rounds):
    a, b = _paired(data, n_rounds)
    ab, ba = stats.compare(a, b, resamples=50), stats.compare(b, a, resamples=50)
    assert ab["gain"] == pytest.approx(1.0 / ba["gain"], rel=1e-12)
    assert ab["gain_min"] == pytest.approx(1.0 / ba["gain_max"], rel=1e-12)
    lo, hi = ab["gain_ci"]
    assert lo == pytest.approx(1.0 / ba["gain_ci"][1], rel=1e-9)
    assert hi == pytest.approx(1.0 / ba["gain_ci"][0], rel=1e-9)


@given(st.data(), st.integers(1, 5))
def test_gain_lies_within_its_round_extremes_and_interval(data, n_rounds):
    a, b = _paired(data, n_rounds)
    c = stats.compare(a, b, b, resamples=50)
    assert c["gain_min"] <= c["gain"] * (1 + 1e-12) and c["gain"] <= c["gain_max"] * (1 + 1e-12)
    lo, hi = c["gain_ci"]
    assert lo <= c["gain"] <= hi
    assert c["ratio_min"] <= c["native_torch_ratio"] * (1 + 1e-12) <= c["ratio_max"] * (1 + 1e-12)
    assert c["significant"] == (not lo <= 1.0 <= hi)


@given(rounds, st.integers(-6, 6))
def test_scaled_copy_by_power_of_two_gives_exactly_the_scale(ref, exponent):
    scale = 2.0 ** exponent
    cand = [[x / scale for x in r] for r in ref]
    c = stats.compare(ref, cand, resamples=20)
    assert c["gain"] == scale and c["gain_min"] == scale and c["gain_max"] == scale


@given(rounds, st.floats(min_value=0.01, max_value=100))
def test_scaled_copy_gives_the_scale(ref, scale):
    cand = [[x / scale for x in r] for r in ref]
    assert stats.compare(ref, cand, resamples=20)["gain"] == pytest.approx(scale, rel=1e-12)


def test_bootstrap_interval_widens_with_noise_and_excludes_one_for_a_clear_gain():
    rng = np.random.default_rng(1)
    ref = [list(100 + rng.normal(0, 1, 30)) for _ in range(4)]
    fast = [list(50 + rng.normal(0, 1, 30)) for _ in range(4)]
    noisy = [list(50 + rng.normal(0, 20, 30).clip(-40, 40)) for _ in range(4)]
    tight, wide = stats.compare(ref, fast), stats.compare(ref, noisy)
    assert tight["significant"] and tight["gain_ci"][0] > 1.5
    assert (wide["gain_ci"][1] - wide["gain_ci"][0]) > (tight["gain_ci"][1] - tight["gain_ci"][0])


def test_identical_sample_sets_are_not_significant():
    rng = np.random.default_rng(2)
    ref = [list(10 + rng.exponential(1, 25)) for _ in range(4)]
    c = stats.compare(ref, [list(r) for r in ref])
    assert c["gain"] == 1.0 and not c["significant"]


def test_log_median_rejects_bad_ratios():
    with pytest.raises(ValueError, match="finite and positive"):
        stats.log_median([1.0, 0.0])
    with pytest.raises(ValueError, match="empty"):
        stats.log_median([])


def test_rounds_must_pair_up():
    with pytest.raises(ValueError, match="same, non-zero number of rounds"):
        stats.ratio_stats([[1.0]], [[1.0], [2.0]])


def test_summary_counts():
    recs = [
        {"gain": 1.2, "gain_min": 1.1, "gain_max": 1.3, "ratio_max": 0.5},
        {"gain": 0.8, "gain_min": 0.7, "gain_max": 0.9, "ratio_max": 1.5},
        {"gain": 1.05, "gain_min": 0.95, "gain_max": 1.1},
    ]
    assert stats.summary_counts(recs) == {"positive_medians": 2, "all_pairs_positive": 1,
                                          "all_pairs_negative": 1, "faster_torch_all_pairs": 1}


@given(samples)
def test_percentile_extremes(values):
    assume(len(values) > 0)
    assert stats.percentile(values, 0) == min(values)
    assert stats.percentile(values, 100) == max(values)
    assert not math.isnan(stats.median(values))


def test_disturbed_samples_are_dropped_while_most_are_clean():
    from kernellab.harness import noise

    quiet, hit = {"disturbed": False}, {"disturbed": True, "involuntary_switches": 2}
    kept, record = noise.split([10.0, 4010.0, 11.0, 12.0], [quiet, hit, quiet, quiet])
    assert kept == [10.0, 11.0, 12.0] and record["dropped_us"] == [4010.0] and not record["disturbed"]
    assert record["involuntary_switches"] == 2 and record["disturbed_samples"] == 1
    kept, record = noise.split([4010.0, 4011.0, 12.0], [hit, hit, quiet])  # most disturbed: kept, flagged
    assert kept == [4010.0, 4011.0, 12.0] and record["disturbed"] and record["dropped_us"] == []


def test_a_record_over_too_few_rounds_claims_no_significance():
    reference, candidate = [[10.0, 10.2, 10.1]] * 2, [[5.0, 5.1, 5.05]] * 2
    free = stats.compare(reference, candidate)
    assert free["significant"] and "too_few_rounds" not in free
    held = stats.compare(reference, candidate, min_rounds=3)
    assert not held["significant"] and held["too_few_rounds"]
    assert (held["gain"], held["gain_ci"]) == (free["gain"], free["gain_ci"])
    enough = stats.compare(reference * 2, candidate * 2, min_rounds=3)
    assert enough["significant"] and "too_few_rounds" not in enough


def _ar_series(rng, n, phi):
    x, out = 0.0, []
    for _ in range(n):
        x = phi * x + rng.gauss(0.0, 0.02)
        out.append(100.0 * math.exp(x))
    return out


def test_sample_correlation_reads_autocorrelated_rounds_and_mostly_zero_for_independent_ones():
    import random

    rng = random.Random(7)
    assert stats.sample_correlation([_ar_series(rng, 20, 0.0) for _ in range(40)]) < 0.1
    assert stats.sample_correlation([_ar_series(rng, 20, 0.9) for _ in range(40)]) > 0.5
    # nothing to estimate from: short, constant or non-positive series
    assert stats.sample_correlation([[1.0, 2.0], [5.0, 5.0, 5.0], [0.0, 1.0, 2.0, 3.0]]) == 0.0
    assert 0.8 < stats.sample_correlation([[float(k) for k in range(1, 50)]]) <= stats.MAX_CORRELATION  # a drift
    assert stats.sample_correlation([[1.0, 2.0] * 10]) == 0.0  # alternating: negative, read as none


def test_effective_samples_shrink_with_correlation_to_at_least_one():
    assert stats.effective_samples(30, 0.0) == 30
    assert stats.effective_samples(30, 0.5) == 10
    assert stats.effective_samples(5, 0.95) == 1
    with pytest.raises(ValueError, match="correlation"):
        stats.bootstrap_gain_ci([[1.0, 1.1]] * 3, [[1.0, 1.2]] * 3, correlation=1.0)


def test_the_interval_widens_with_the_correlation_and_is_unchanged_without():
    import random

    rng = random.Random(3)
    reference = [_ar_series(rng, 20, 0.0) for _ in range(4)]
    candidate = [[x / 1.02 for x in _ar_series(rng, 20, 0.0)] for _ in range(4)]
    independent = stats.bootstrap_gain_ci(reference, candidate, resamples=200)
    assert stats.bootstrap_gain_ci(reference, candidate, resamples=200, correlation=0.0) == independent
    lo, hi = stats.bootstrap_gain_ci(reference, candidate, resamples=200, correlation=0.8)
    assert lo < independent[0] and hi > independent[1]
