"""tools/stats_coverage.py: the A/B record's significance rate on drawn samples, seeded."""

import json

import pytest


def test_independent_samples_hold_the_promised_error_and_a_large_gain_is_found(load_tool, tmp_path):
    out = tmp_path / "coverage.json"
    rows = load_tool("stats_coverage").main(["--rounds", "8", "--samples", "5", "--phi", "0", "--gains", "1,1.2",
                                             "--trials", "60", "--resamples", "100", "--out", str(out)])
    rate = {row["gain"]: row["significant_rate"] for row in rows}
    assert rate[1.0] <= 0.05 and rate[1.2] == 1.0, rate
    assert json.loads(out.read_text())["rows"] == rows


def test_allowing_for_the_samples_correlation_brings_false_positives_back_under_the_promise(load_tool):
    """Samples autocorrelated within a round (AR(1), 0.8), 20 a round: taken as independent, the interval calls
    noise significant well past 5% of the time; allowing for the pooled correlation, as comparison reports since
    harness 0.12.1 do (``interval_correlation``), it stays within it."""
    tool = load_tool("stats_coverage")
    args = ["--rounds", "4", "--samples", "20", "--phi", "0.8", "--gains", "1", "--trials", "60", "--resamples", "100"]
    pooled = tool.main(args)[0]["significant_rate"]
    independent = tool.main([*args, "--independent"])[0]["significant_rate"]
    assert pooled <= 0.05 < independent, (pooled, independent)


def test_the_same_seeds_give_the_same_rates(load_tool):
    tool = load_tool("stats_coverage")
    args = ["--rounds", "4", "--samples", "5", "--phi", "0.9", "--gains", "1", "--trials", "20", "--resamples", "50"]
    assert tool.main(args) == tool.main(args)


@pytest.mark.parametrize(("args", "named"), [(["--phi", "1"], "--phi"), (["--gains", "0"], "--gains"),
                                             (["--rounds", "0"], "--rounds"), (["--trials", "0"], "--trials")])
def test_bad_arguments_are_refused_by_name(load_tool, capsys, args, named):
    with pytest.raises(SystemExit):
        load_tool("stats_coverage").main(args)
    assert named in capsys.readouterr().err
