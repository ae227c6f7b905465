import json
import re

import planted
import pytest

from kernellab.harness import assemble, cli, gate, registry
from kernellab.harness import report as report_io


def comparison(ours_after: float, torch_after: float = 150.0) -> dict:
    return report_io.seal(assemble.comparison_report(
        planted.suite(), planted.CONFIG, planted.side(), planted.side(ours_after, torch_after, seed=1)))


def test_a_ten_percent_slowdown_fails_at_five_percent():
    verdict = gate.evaluate(comparison(110.0), 5.0)
    assert verdict.status == gate.REGRESSION
    assert {(f.name, f.mode) for f in verdict.regressions} == {
        (f"affine_{m}x{n}_fp32", mode) for m, n in planted.SHAPES for mode in planted.MODES}
    assert all(0.90 < f.gain < 0.92 and f.gain_ci[1] < 1 / 1.05 for f in verdict.regressions)
    assert re.search(r"affine_64x64_fp32 e2e_latency: \+(9\.\d|10\.\d)% \(", gate.describe(verdict))


def test_a_two_percent_slowdown_passes_at_five_percent_though_significant():
    verdict = gate.evaluate(comparison(102.0), 5.0)
    assert verdict.status == gate.PASS and not verdict.regressions
    assert all(f.gain_ci[1] < 1.0 for f in verdict.findings)  # slower, beyond noise, but within the margin
    assert gate.evaluate(comparison(102.0), 1.0).status == gate.REGRESSION


def test_a_speedup_passes_at_zero_percent():
    assert gate.evaluate(comparison(90.0), 0.0).status == gate.PASS


def test_control_drift_makes_a_slowdown_inconclusive():
    verdict = gate.evaluate(comparison(110.0, torch_after=180.0), 5.0)
    assert verdict.status == gate.INCONCLUSIVE
    assert verdict.drifted and len(verdict.regressions) == 4
    text = gate.describe(verdict)
    assert "the control (torch) drifted beyond 10%" in text and "(suspected: the control drifted)" in text


def test_a_reference_from_another_machine_is_inconclusive():
    result = report_io.seal(assemble.comparison_report(
        planted.suite(), planted.CONFIG, planted.side(device="NVIDIA H200"), planted.side(110.0, seed=1)))
    verdict = gate.evaluate(result, 5.0)
    assert verdict.status == gate.INCONCLUSIVE and len(verdict.regressions) == 4
    assert "the reference ran on 'NVIDIA H200' and this run on 'Planted CPU'" in verdict.reasons[0]


def test_a_comparison_without_common_pairs_is_inconclusive():
    empty = comparison(100.0)
    empty["records"] = []
    verdict = gate.evaluate(empty, 5.0)
    assert verdict.status == gate.INCONCLUSIVE and "no case and mode" in verdict.reasons[0]


def _slowed(factors: list[float], unsupported: str | None = None, absent: str | None = None) -> dict:
    """A candidate side whose contender is slower by ``factors[r]`` in round r, ``unsupported``'s case (an id) no
    longer measured, and ``absent``'s no longer there (its impl failed to import, or was renamed)."""
    cand = planted.side(100.0, seed=1)
    for r, f in enumerate(factors):
        for cid, d in cand["rounds"][r].items():
            if cid.endswith("/ours"):
                d["samples_us"] = {m: [x * f for x in v] for m, v in d["samples_us"].items()}
    if unsupported:
        next(c for c in cand["cases"] if c["id"] == unsupported).update(status="unsupported", reason="not any more")
        for data in cand["rounds"]:
            del data[unsupported]
    if absent:
        cand["cases"] = [c for c in cand["cases"] if c["id"] != absent]
        for data in cand["rounds"]:
            del data[absent]
    return report_io.seal(assemble.comparison_report(planted.suite(), planted.CONFIG, planted.side(), cand))


def test_an_interval_that_holds_the_limit_is_inconclusive_not_a_pass():
    """A contender slower in every round, several times slower in one (noise, or one that knows its rounds): its
    interval reaches past the limit on both sides. The gate had read "not wholly below the limit" as a pass."""
    verdict = gate.evaluate(_slowed([1.3, 1.3, 4.0, 1.0, 1.0]), 5.0)
    assert verdict.status == gate.INCONCLUSIVE and not verdict.regressions
    assert all(f.gain < gate.gain_limit(5.0) and f.gain_ci[0] < gate.gain_limit(5.0) <= f.gain_ci[1]
               for f in verdict.undecided) and len(verdict.undecided) == 4
    assert "whose gain interval holds 0.9524" in verdict.reasons[0] and "neither shown nor ruled out" in \
        verdict.reasons[0]


def test_a_pair_the_reference_measured_and_this_run_did_not_is_inconclusive():
    """A case slower than the reference (a regression) that becomes unsupported leaves only its faster cases to
    judge: the gate had said pass."""
    slow = "affine_64x64_fp32/ours"
    assert gate.evaluate(_slowed([3.0] * 5), 5.0).status == gate.REGRESSION
    verdict = gate.evaluate(_slowed([1.0] * 5, unsupported=slow), 5.0)
    assert verdict.status == gate.INCONCLUSIVE and not verdict.regressions and not verdict.undecided
    assert f"were not measured in this run (unsupported, failed, unavailable or absent now), first {slow} " in \
        verdict.reasons[0]
    assert gate.unmeasured_pairs(_slowed([1.0] * 5)) == []


def test_a_case_the_run_no_longer_has_is_inconclusive_unless_the_run_did_not_select_it():
    """A contender whose import fails (or that is renamed) leaves no case of its id at all; the gate had judged the
    cases left and said pass. A case the run's --cases or --impls did not select is not asked for."""
    gone = "affine_64x64_fp32/ours"
    verdict = gate.evaluate(_slowed([1.0] * 5, absent=gone), 5.0)
    assert verdict.status == gate.INCONCLUSIVE and f"first {gone} " in verdict.reasons[0], verdict.reasons
    others = ",".join(f"affine_{m}x{n}_fp32" for m, n in planted.SHAPES if (m, n) != (64, 64))
    assert gate.evaluate(_slowed([1.0] * 5, absent=gone), 5.0, cases=others).status == gate.PASS
    assert gate.unmeasured_pairs(_slowed([1.0] * 5, absent=gone), impls="torch") == []


@pytest.mark.parametrize("how", ["absent", "unsupported"])
def test_an_ab_whose_candidate_no_longer_offers_a_case_is_inconclusive(how):
    """In an A/B both workers run only the ids both schedule, so a contender the candidate no longer imports (or now
    refuses) is measured on neither side: the reference's case is runnable and has no modes, and the gate, asking
    only for the reference's measured modes, had said pass."""
    gone = "affine_64x64_fp32/ours"
    reference = planted.side()
    for data in reference["rounds"]:
        del data[gone]
    candidate = planted.side(seed=1)
    for data in candidate["rounds"]:
        del data[gone]
    if how == "absent":
        candidate["cases"] = [c for c in candidate["cases"] if c["id"] != gone]
    else:
        next(c for c in candidate["cases"] if c["id"] == gone).update(status="unsupported", reason="not any more")
    result = report_io.seal(assemble.comparison_report(planted.suite(), planted.CONFIG, reference, candidate))
    verdict = gate.evaluate(result, 5.0)
    assert verdict.status == gate.INCONCLUSIVE and f"first {gone} " in verdict.reasons[0], verdict.reasons


@pytest.mark.parametrize("pct", [-1.0, float("nan"), float("inf")])
def test_a_bad_percentage_is_refused(pct):
    with pytest.raises(gate.GateError, match="expects a percentage >= 0"):
        gate.evaluate(comparison(100.0), pct)


def test_the_comparison_against_a_report_is_the_ab_comparison():
    """Rebuilding the reference side from its sealed run report loses nothing the A/B path reads."""
    reference, candidate = planted.side(), planted.side(110.0, seed=1)
    direct = assemble.comparison_report(planted.suite(), planted.CONFIG, reference, candidate)
    via_report = gate.compare_with_report(planted.suite(), planted.CONFIG, planted.run_report(), candidate,
                                          "ref.json")
    assert via_report["records"] == direct["records"]
    assert via_report["summaries"] == direct["summaries"]
    assert via_report["sides"]["reference"]["revision"]["report"] == "ref.json"


@pytest.mark.parametrize("rounds", [1, 2])
def test_a_gate_over_fewer_than_three_rounds_is_inconclusive(rounds):
    """Over one round the interval is the gain itself, over two it rests on one pair of rounds: neither a clear
    slowdown nor a clear speedup is decided (the planted noise makes both look certain)."""
    for ours, pct in ((110.0, 5.0), (90.0, 0.0)):
        few = report_io.seal(assemble.comparison_report(
            planted.suite(), planted.CONFIG, planted.side(rounds=rounds), planted.side(ours, seed=1, rounds=rounds)))
        verdict = gate.evaluate(few, pct)
        assert verdict.status == gate.INCONCLUSIVE, verdict.reasons
        assert "fewer than 3 rounds the two sides share" in verdict.reasons[0], verdict.reasons
    three = report_io.seal(assemble.comparison_report(
        planted.suite(), planted.CONFIG, planted.side(rounds=3), planted.side(110.0, seed=1, rounds=3)))
    assert gate.evaluate(three, 5.0).status == gate.REGRESSION


def test_rounds_are_paired_by_index_when_the_counts_differ():
    reference = planted.run_report(rounds=7)
    result = gate.compare_with_report(planted.suite(), planted.CONFIG, reference, planted.side(110.0, rounds=4))
    rec = result["records"][0]["e2e_latency"]
    assert len(rec["reference_rounds_us"]) == len(rec["candidate_rounds_us"]) == 4


def test_the_reference_must_be_a_run_of_the_same_suite():
    other = planted.run_report()
    other["suite"] = "cpu-ops"
    with pytest.raises(gate.GateError, match="suite 'cpu-ops', not of 'affine'"):
        gate.compare_with_report(planted.suite(), planted.CONFIG, other, planted.side())
    with pytest.raises(gate.GateError, match="needs a run report"):
        gate.side_from_report(comparison(100.0), "c.json")


def test_markdown_lists_regressions_first_with_the_verdict():
    result = comparison(110.0)
    result["records"][0]["e2e_latency"]["gain_ci"] = [0.99, 1.01]  # one pair within noise
    text = gate.markdown(result, gate.evaluate(result, 5.0))
    rows = [line for line in text.splitlines() if line.startswith("| affine")]
    assert text.startswith("## kernellab-bench: affine") and "**FAIL**" in text
    assert len(rows) == 4 and [r.endswith("| regression |") for r in rows] == [True, True, True, False]
    assert rows[-1].endswith("| not significant |")


@pytest.fixture
def fake_bench(monkeypatch):
    """kernellab-bench with the planted suite, its measurement replaced by a planted side."""
    monkeypatch.setattr(registry, "discover", lambda impls=True, names=None: ({"affine": planted.suite()}, {}))

    def use(**kw):
        monkeypatch.setattr(cli, "measure_side", lambda suite, config, args: planted.side(seed=1, **kw))
    return use


@pytest.mark.parametrize("ours, torch, code, says", [
    (110.0, 150.0, cli.EXIT_REGRESSION, "gate: regression: 4 case(s)"),
    (102.0, 150.0, cli.EXIT_OK, "gate: pass"),
    (110.0, 180.0, cli.EXIT_INCONCLUSIVE, "gate: inconclusive"),
])
def test_cli_gate_exit_codes(fake_bench, tmp_path, capsys, ours, torch, code, says):
    ref = report_io.write(planted.run_report(), tmp_path / "ref.json")
    fake_bench(ours_us=ours, torch_us=torch)
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    argv = ["--against", str(ref), "--fail-on-regression", "5", "--summary", str(summary),
            "--out", str(tmp_path / "out"), "--no-plot", "--quiet"]
    assert cli.main(argv) == code
    assert says in capsys.readouterr().out
    md = summary.read_text()
    assert md.startswith("earlier step\n## kernellab-bench: affine")  # appended, as CI summary files are
    written = sorted(p.name.split("-")[0] + ("-ab" if "-ab-" in p.name else "") for p in (tmp_path / "out").iterdir())
    assert written == ["affine", "affine-ab"]
    comparison_path = next((tmp_path / "out").glob("affine-ab-*.json"))
    assert report_io.load(comparison_path)["sides"]["reference"]["revision"]["report"] == str(ref)


def test_cli_against_a_revision_gates_the_ab_comparison(fake_bench, monkeypatch, tmp_path, capsys):
    """--against REV is --baseline REV: the A/B path runs both revisions, then the gate reads its comparison."""
    asked = []

    def run_ab(suite, config, args):
        asked.append(args.baseline)
        return comparison(110.0), None
    monkeypatch.setattr(cli, "run_ab", run_ab)
    summary = tmp_path / "s.md"
    argv = ["--suite", "affine", "--against", "HEAD~1", "--out", str(tmp_path), "--no-plot", "--quiet"]
    assert cli.main([*argv, "--fail-on-regression", "5"]) == cli.EXIT_REGRESSION
    assert cli.main([*argv, "--fail-on-regression", "15"]) == cli.EXIT_OK
    assert cli.main([*argv, "--summary", str(summary)]) == cli.EXIT_OK  # no gate: a summary, no verdict
    assert asked == ["HEAD~1"] * 3
    text = summary.read_text()
    assert "**FAIL**" not in text and "**PASS**" not in text and "| slower |" in text and "| regression |" not in text


def test_cli_summary_of_a_plain_run_is_its_table(fake_bench, tmp_path):
    fake_bench()
    summary = tmp_path / "summary.md"
    assert cli.main(["--suite", "affine", "--summary", str(summary), "--out", str(tmp_path), "--no-plot",
                     "--quiet"]) == 0
    assert "| affine_64x64_fp32" in summary.read_text()


@pytest.mark.parametrize("argv, message", [
    (["--fail-on-regression", "5"], "--fail-on-regression needs a reference"),
    (["--against", "HEAD", "--baseline", "HEAD"], "either --against or --baseline"),
    (["--against", "missing.json"], "--against: report missing.json does not exist"),
    (["--against", "HEAD", "--fail-on-regression", "5", "--rounds", "2"],
     "--fail-on-regression decides nothing over fewer than 3 rounds (stats.MIN_ROUNDS): give --rounds 3 or more"),
])
def test_cli_gate_usage_errors(fake_bench, capsys, argv, message):
    assert cli.main(argv) == cli.EXIT_USAGE
    assert message in capsys.readouterr().err


def test_cli_refuses_a_bad_percentage(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--fail-on-regression", "-3"])
    assert "expected a percentage >= 0, got -3" in capsys.readouterr().err


def test_cli_against_a_comparison_report_is_refused(fake_bench, tmp_path, capsys):
    fake_bench()
    path = report_io.write(comparison(100.0), tmp_path / "c.json")
    assert cli.main(["--against", str(path), "--suite", "affine", "--out", str(tmp_path), "--quiet",
                     "--no-plot"]) == cli.EXIT_USAGE
    assert "needs a run report" in capsys.readouterr().err
    assert json.loads(path.read_text())["kind"] == "comparison"


def disturbed(side: dict, impl: str, rounds=(0, 1, 2)) -> dict:
    """``side`` with ``impl``'s cases marked disturbed (preemption, steal, throttling) in ``rounds``."""
    for r in rounds:
        for cid, data in side["rounds"][r].items():
            if cid.endswith(f"/{impl}"):
                data["disturbance"] = {m: {"disturbed": True} for m in data["samples_us"]}
    return side


@pytest.mark.parametrize("which", ["contender of this run", "control of the reference"])
def test_a_pair_measured_in_disturbed_rounds_is_inconclusive(which):
    """Noise the harness measured decides nothing: a 10% slowdown (or none) measured in rounds the machine
    disturbed, the contender's or its control's, on either side, was gated as if the machine had been quiet."""
    ref, cand = planted.side(), planted.side(110.0, seed=1)
    disturbed(cand, "ours") if which.startswith("contender") else disturbed(ref, "torch")
    verdict = gate.evaluate(report_io.seal(assemble.comparison_report(planted.suite(), planted.CONFIG, ref, cand)), 5)
    assert verdict.status == gate.INCONCLUSIVE and verdict.disturbed, verdict.reasons
    assert "disturbed" in verdict.reasons[0]


def test_a_reference_reports_disturbed_rounds_reach_the_gate():
    """--against REPORT rebuilds the reference's rounds from the report: what disturbed them comes along."""
    ref = report_io.seal(assemble.run_report(planted.suite(), planted.CONFIG, disturbed(planted.side(), "ours")))
    result = gate.compare_with_report(planted.suite(), planted.CONFIG, ref, planted.side(seed=1))
    assert gate.evaluate(result, 5).status == gate.INCONCLUSIVE


def test_cli_against_a_report_edited_after_it_was_written_is_refused(fake_bench, tmp_path, capsys):
    """A baseline whose contender's samples were scaled and re-hashed would pass a real slowdown."""
    forged = planted.run_report()
    for case in forged["cases"]:
        if case["impl"] == "ours":
            for m in case["modes"].values():
                m["rounds_us"] = [[x * 1.3 for x in r] for r in m["rounds_us"]]
    path = report_io.write(report_io.seal(forged), tmp_path / "ref.json")
    fake_bench(ours_us=125.0)
    assert cli.main(["--against", str(path), "--fail-on-regression", "5", "--out", str(tmp_path / "out"),
                     "--no-plot", "--quiet"]) == cli.EXIT_USAGE
    assert "does not follow from its own raw data" in capsys.readouterr().err


def test_cli_against_with_trusted_keys_takes_only_a_report_one_of_them_signed(fake_bench, tmp_path, capsys):
    """A consistent forgery (rebuilt through assemble) passes every check but a signature: with --trusted-keys the
    baseline must carry one of a trusted key; a signed honest baseline gates as before."""
    pytest.importorskip("cryptography", reason="signing needs the 'sign' extra (cryptography)")
    from kernellab.harness import signing

    private, public = signing.generate_keypair(tmp_path / "keys" / "lab")
    unsigned = report_io.write(planted.run_report(), tmp_path / "unsigned.json")
    signed = report_io.write(signing.sign(planted.run_report(), signing.load_private_key(private)),
                             tmp_path / "signed.json")
    fake_bench(ours_us=102.0)
    argv = ["--fail-on-regression", "5", "--trusted-keys", str(public), "--out", str(tmp_path / "out"), "--no-plot",
            "--quiet"]
    assert cli.main(["--against", str(unsigned), *argv]) == cli.EXIT_USAGE
    assert "is not signed by a trusted key" in capsys.readouterr().err
    assert cli.main(["--against", str(signed), *argv]) == cli.EXIT_OK
    assert cli.main(["--baseline", "HEAD", *argv]) == cli.EXIT_USAGE
    assert "--trusted-keys checks the report given to --against" in capsys.readouterr().err


def test_a_case_unsupported_on_both_sides_fails_no_gated_run(tmp_path):
    """A contender with no case of a problem (the native backend has no copy) had made every --against run exit 1,
    'some cases failed'; a case that failed its validation on either side still does."""
    import argparse

    args = argparse.Namespace(out=str(tmp_path), no_plot=True)

    def with_statuses(reference: str, candidate: str) -> dict:
        sides = [planted.side(), planted.side(seed=1)]
        for side, status in zip(sides, (reference, candidate), strict=True):
            next(c for c in side["cases"] if c["id"] == "affine_64x64_fp32/ours").update(status=status)
        return report_io.seal(assemble.comparison_report(planted.suite(), planted.CONFIG, *sides))

    assert cli.emit(with_statuses("unsupported", "unsupported"), tmp_path / "a.json", args)
    assert cli.emit(with_statuses("ok", "unavailable"), tmp_path / "b.json", args)
    assert not cli.emit(with_statuses("ok", "failed"), tmp_path / "c.json", args)


def _against_stored(ours_us: float, torch_us: float) -> dict:
    """A run (``ours_us``, ``torch_us``) gated against a stored report measured at 100 and 150 us."""
    return gate.compare_with_report(planted.suite(), planted.CONFIG, planted.run_report(),
                                    planted.side(ours_us, torch_us, seed=1), "ref.json")


@pytest.mark.parametrize("ours, torch, what", [
    (108.0, 162.0, "the same code on a machine 8% slower: no regression to find"),
    (110.0 / 1.08, 150.0 / 1.08, "a 10% regression on a machine 8% faster: no pass to give"),
])
def test_a_machine_shift_under_the_drift_tolerance_decides_nothing_against_a_stored_report(ours, torch, what):
    """A shift of the machine between a stored report and this run that the control sees (under the 10% that
    flags drift) moves every gain as much; read raw, the first case failed the gate and the second passed it."""
    verdict = gate.evaluate(_against_stored(ours, torch), 5.0)
    assert verdict.findings and not verdict.drifted, what  # under the tolerance: the drift guard stays silent
    assert verdict.status == gate.INCONCLUSIVE, (what, verdict.reasons)
    assert "widened by its control's shift between the report and this run" in verdict.reasons[0]
    assert all(f.decision_ci[0] < f.gain_ci[0] and f.decision_ci[1] > f.gain_ci[1] for f in verdict.findings)


def test_the_same_shift_inside_one_ab_run_is_read_from_the_recorded_interval():
    """In an A/B both sides share each round, so a machine's shift moves both alike; the recorded interval is
    decided on as it stands (the A/B's sides here are planted apart, as a stored report's would be)."""
    verdict = gate.evaluate(comparison(108.0, torch_after=162.0), 5.0)
    assert verdict.status == gate.REGRESSION
    assert all(f.decision_ci == f.gain_ci for f in verdict.findings)


def test_a_regression_beyond_the_controls_shift_still_fails_against_a_stored_report():
    verdict = gate.evaluate(_against_stored(125.0, 152.0), 5.0)
    assert verdict.status == gate.REGRESSION, verdict.reasons
    assert "gain interval [" in gate.describe(verdict)


def test_a_pair_without_a_control_on_both_sides_decides_nothing_against_a_stored_report():
    result = _against_stored(110.0, 150.0)
    for rec in result["records"]:
        for mode in planted.MODES:
            rec[mode].pop("control_ratio_range")
    verdict = gate.evaluate(result, 5.0)
    assert verdict.status == gate.INCONCLUSIVE and not verdict.regressions
    assert all(f.decision_ci == (0.0, float("inf")) for f in verdict.findings)


def test_cli_gate_against_a_report_of_too_few_rounds_is_refused_before_measuring(fake_bench, tmp_path, capsys):
    """A reference of 2 rounds makes every verdict inconclusive (rounds are paired by index): said before the run,
    not after it."""
    ref = report_io.write(report_io.seal(assemble.run_report(
        planted.suite(), {**planted.CONFIG, "rounds": 2}, planted.side(rounds=2))), tmp_path / "ref.json")
    fake_bench()
    argv = ["--against", str(ref), "--fail-on-regression", "5", "--out", str(tmp_path / "out"), "--no-plot", "--quiet"]
    assert cli.main(argv) == cli.EXIT_USAGE
    assert "ran 2 round(s): --fail-on-regression decides nothing over fewer than 3" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing measured, nothing written
