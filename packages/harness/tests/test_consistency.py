"""Forged reports, edited and re-sealed the way the harness seals them: consistency.check names the
field. The reports are assembled from synthetic round data (no timing), except one real run."""

import copy
import json
from pathlib import Path

import pytest
import synthetic

from kernellab.harness import assemble, consistency, stats
from kernellab.harness import report as report_io

ROOT = Path(__file__).resolve().parents[3]
RAW = ("rounds_us", "validations", "problem", "config", "provenance", "revision", "metadata", "created_at",
       "before_samples_ms", "after_samples_ms", "resamples", "significance_min_rounds")


def reseal(report: dict) -> dict:
    report = copy.deepcopy(report)
    report[report_io.HASH_FIELD] = report_io.report_hash(report)
    return report


def edited(report: dict, path: tuple, change) -> dict:
    """A copy with the value at ``path`` replaced by ``change(value)``, re-sealed."""
    out = copy.deepcopy(report)
    holder = out
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = change(holder[path[-1]])
    return reseal(out)


def dotted(path: tuple) -> str:
    text = ""
    for key in path:
        text = f"{text}[{key}]" if isinstance(key, int) else f"{text}.{key}" if text else key
    return text


def paths(report: dict) -> set[str]:
    return {i.path for i in consistency.check(report)}


def derived_numbers(obj, path=()):
    """Every number (bool included) a report derives: all but those under its raw fields."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k not in RAW:
                yield from derived_numbers(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from derived_numbers(v, (*path, i))
    elif isinstance(obj, (int, float)):
        yield path


def forge(value):
    return (not value) if isinstance(value, bool) else value / 50 if value else 1.0


@pytest.fixture(scope="module")
def run():
    return synthetic.run_report(failing="softmax_64x64_fp32/ours")


@pytest.fixture(scope="module")
def comparison():
    return synthetic.comparison_report()


def _case(report, name, impl, cases_key=("cases",)):
    cases = report
    for k in cases_key:
        cases = cases[k]
    return next(i for i, c in enumerate(cases) if c["name"] == name and c["impl"] == impl)


def test_honest_reports_of_every_kind_are_consistent(run, comparison):
    before_after = synthetic.before_after_report(comparison)
    for report in (run, comparison, before_after):
        assert consistency.check(report) == []
    assert consistency.check_before_after(before_after, comparison) == []


def test_p50_divided_by_50_is_named(run):
    i = _case(run, "softmax_32x96_fp32", "ours")
    forged = edited(run, ("cases", i, "modes", "e2e_throughput", "summary_us", "p50"), lambda x: x / 50)
    found = consistency.check(forged)
    assert [f.path for f in found] == [f"cases[{i}].modes.e2e_throughput.summary_us.p50"]
    assert found[0].recorded == pytest.approx(run["cases"][i]["modes"]["e2e_throughput"]["summary_us"]["p50"] / 50)
    assert found[0].recomputed == run["cases"][i]["modes"]["e2e_throughput"]["summary_us"]["p50"]
    assert "summary_us.p50: recorded" in str(found[0])


@pytest.mark.parametrize("kind", ["run", "comparison", "before_after"])
def test_every_derived_number_edited_alone_is_named_alone(run, comparison, kind):
    report = {"run": run, "comparison": comparison,
              "before_after": synthetic.before_after_report(comparison)}[kind]
    numbers = list(derived_numbers(report))
    # p50s, summaries, bandwidth, ratios; gains, intervals, significance; medians and speedups
    assert len(numbers) >= {"run": 100, "comparison": 100, "before_after": 6}[kind]
    for path in numbers:
        forged = edited(report, path, forge)
        # a before/after record's medians and paired speedup come from its comparison's rounds
        named = {i.path for i in consistency.check_before_after(forged, comparison)} if kind == "before_after" \
            else paths(forged)
        assert named == {dotted(path)}, dotted(path)


def test_a_versus_control_ratio(run):
    r = next(i for i, rec in enumerate(run["versus_control"]) if rec["impl"] == "ours")
    forged = edited(run, ("versus_control", r, "e2e_throughput", "native_torch_ratio"), lambda x: x / 50)
    assert paths(forged) == {f"versus_control[{r}].e2e_throughput.native_torch_ratio"}


def test_versus_control_records_missing_extra_or_claiming_an_unmeasured_mode(run):
    dropped = edited(run, ("versus_control",), lambda recs: recs[1:])
    name = f"{run['versus_control'][0]['name']}/{run['versus_control'][0]['impl']}"
    assert paths(dropped) == {f"versus_control[{name}]"}
    doubled = edited(run, ("versus_control",), lambda recs: recs + recs[:1])
    assert paths(doubled) == {f"versus_control[{len(run['versus_control'])}]"}
    claimed = edited(run, ("versus_control", 0), lambda rec: rec | {"gpu_throughput": rec["e2e_throughput"]})
    assert paths(claimed) == {"versus_control[0].gpu_throughput"}


def test_a_failed_status_flipped_to_ok(run):
    i = _case(run, "softmax_64x64_fp32", "ours")
    assert run["cases"][i]["status"] == "failed"
    forged = edited(run, ("cases", i, "status"), lambda _: "ok")
    assert f"cases[{i}].status" in paths(forged)
    # the versus_control record repeats the status: flipping both still leaves the case's own one named
    r = next(k for k, rec in enumerate(run["versus_control"]) if rec["name"] == "softmax_64x64_fp32")
    both = edited(forged, ("versus_control", r, "status"), lambda _: "ok")
    assert f"cases[{i}].status" in paths(both)


def test_a_validation_passed_flag_its_violations_contradict(run):
    i = _case(run, "softmax_64x64_fp32", "ours")
    v = next(k for k, val in enumerate(run["cases"][i]["validations"]) if not val["passed"])
    forged = edited(run, ("cases", i, "validations", v, "passed"), lambda _: True)
    found = {f.path: f for f in consistency.check(forged)}
    assert f"cases[{i}].validations[{v}].passed" in found
    assert "7 violations" in found[f"cases[{i}].validations[{v}].passed"].note
    # the status then follows the forged flag, and is still caught through the validation
    both = edited(forged, ("cases", i, "status"), lambda _: "ok")
    assert f"cases[{i}].validations[{v}].passed" in paths(both)


@pytest.mark.parametrize("flag, value, note", [
    ("inputs_unchanged", False, "inputs changed"),
    ("errors", ["RuntimeError: boom"], "errors"),
    ("replay_changed_input", False, "graph replay"),
])
def test_a_passed_validation_recording_what_fails_one(run, flag, value, note):
    i = _case(run, "softmax_32x96_fp32", "ours")
    forged = edited(run, ("cases", i, "validations", 0), lambda v: v | {flag: value})
    found = [f for f in consistency.check(forged) if f.path == f"cases[{i}].validations[0].passed"]
    assert found and note in found[0].note


def test_comparison_gain_interval_and_summaries(comparison):
    r = 0
    mode = "e2e_throughput"
    assert paths(edited(comparison, ("records", r, mode, "gain"), lambda x: x * 50)) == {f"records[{r}].{mode}.gain"}
    assert paths(edited(comparison, ("records", r, mode, "gain_ci"), lambda ci: [ci[0] * 50, ci[1] * 50])) == {
        f"records[{r}].{mode}.gain_ci[0]", f"records[{r}].{mode}.gain_ci[1]"}
    assert paths(edited(comparison, ("summaries", mode, "positive_medians"), lambda n: n + 1)) == {
        f"summaries.{mode}.positive_medians"}
    assert paths(edited(comparison, ("records", r, mode, "significant"), lambda s: not s)) == {
        f"records[{r}].{mode}.significant"}


def test_comparison_side_cases_are_checked_like_a_run(comparison):
    i = _case(comparison, "softmax_64x64_fp32", "ours", ("sides", "candidate", "cases"))
    forged = edited(comparison, ("sides", "candidate", "cases", i, "modes", "e2e_latency", "round_medians_us", 1),
                    lambda x: x / 50)
    assert paths(forged) == {f"sides.candidate.cases[{i}].modes.e2e_latency.round_medians_us[1]"}


def test_before_after_speedup(comparison):
    before_after = synthetic.before_after_report(comparison)
    forged = edited(before_after, ("records", 0, "speedup"), lambda x: x * 50)
    assert paths(forged) == {"records[0].speedup"}  # alone: outside its own interval
    assert [i.path for i in consistency.check_before_after(forged, comparison)] == ["records[0].speedup"]
    other = synthetic.comparison_report(resamples=5)
    assert [i.path for i in consistency.check_before_after(before_after, other)] == ["comparison_sha256"]


def test_before_after_samples_against_its_comparison(comparison):
    before_after = synthetic.before_after_report(comparison)
    forged = edited(before_after, ("records", 0, "after_samples_ms"), lambda s: s[:-1])
    assert "records[0].after_samples_ms" in {i.path for i in consistency.check_before_after(forged, comparison)}


def test_samples_and_rounds_against_the_config(run):
    i = _case(run, "softmax_32x96_fp32", "ours")
    fewer = edited(run, ("cases", i, "modes", "e2e_latency", "rounds_us", 2), lambda s: s[:2])
    assert f"cases[{i}].modes.e2e_latency.rounds_us[2]" in paths(fewer)
    dropped = copy.deepcopy(run)  # the round that disagreed dropped everywhere, derived numbers recomputed
    for case in dropped["cases"]:
        case["validations"] = case["validations"][:2]
        for m in case["modes"].values():
            m["rounds_us"] = m["rounds_us"][:2]
    dropped["cases"] = consistency.recompute_cases(dropped["cases"], "copy", "torch")
    dropped["versus_control"] = assemble.versus_control(dropped["cases"], "torch")
    assert paths(reseal(dropped)) == {f"cases[{k}].validations" for k in range(len(run["cases"]))}


def test_a_consistent_forgery_passes_here_and_is_left_to_the_replay(run):
    """Every raw timing of the contender / 50 and every derived number recomputed from them: nothing
    in the report contradicts itself, so only re-running the code can tell (the audit's replay)."""
    forged = copy.deepcopy(run)
    for case in forged["cases"]:
        if case["impl"] == "ours":
            for m in case["modes"].values():
                m["rounds_us"] = [[s / 50 for s in r] for r in m["rounds_us"]]
    forged["cases"] = consistency.recompute_cases(forged["cases"], "copy", "torch")
    forged["versus_control"] = assemble.versus_control(forged["cases"], "torch")
    forged = reseal(forged)
    assert forged["versus_control"][0]["e2e_throughput"]["native_torch_ratio"] < 0.05
    assert consistency.check(forged) == []


def test_unknown_extra_fields_are_allowed(run):
    extra = copy.deepcopy(run)
    extra["cases"][0]["modes"]["e2e_throughput"]["disturbances"] = [{"round": 0, "sample": 1}]
    extra["cases"][0]["batch_validations"] = 12
    assert consistency.check(reseal(extra)) == []


def test_a_bandwidth_claim_with_no_ceiling_problem(run):
    forged = copy.deepcopy(run)
    copy_case = _case(run, "copy_64x64_fp32", "torch")
    del forged["cases"][copy_case]  # no ceiling problem left: no ceiling fraction is derivable
    forged["cases"] = consistency.recompute_cases(forged["cases"], "copy", "torch")
    forged["cases"][0]["modes"]["e2e_throughput"]["ceiling_fraction"] = 0.99
    forged["cases"][0]["modes"]["e2e_throughput"]["copy_ceiling_gbps"] = 100.0
    assert paths(reseal(forged)) == {"cases[0].modes.e2e_throughput.ceiling_fraction",
                                     "cases[0].modes.e2e_throughput.copy_ceiling_gbps"}


def test_a_case_that_did_not_run_cannot_present_timings(run):
    i = _case(run, "softmax_32x96_fp32", "ours")
    forged = edited(run, ("cases", i, "status"), lambda _: "unsupported")
    assert f"cases[{i}].status" in paths(forged)


def test_malformed_data_is_an_inconsistency_not_a_crash(run):
    forged = edited(run, ("cases", 0, "modes", "e2e_throughput", "rounds_us"), lambda _: "fast")
    found = consistency.check(forged)
    assert any(i.recorded == "malformed" for i in found), found
    assert consistency.check({"kind": "nonsense"})[0].path == "kind"


def test_device_mismatch_is_named():
    run = synthetic.run_report()
    here = dict(synthetic.DEVICE)
    assert consistency.check_device(run, here) is None
    assert consistency.check_device(run, here | {"host": "elsewhere", "cpu_count": 64}) is None  # same device
    other = here | {"name": "Other CPU", "cpu": "Other CPU"}
    reason = consistency.check_device(run, other)
    assert "'Synthetic CPU 9000'" in reason and "this machine is cpu 'Other CPU'" in reason
    assert "differs in name, cpu" in reason
    gpu = {"kind": "cuda", "name": "NVIDIA H200", "capability": "9.0", "sm_count": 132, "cpu": "x"}
    gpu_report = copy.deepcopy(run)
    gpu_report["provenance"]["device"] = dict(gpu)
    assert consistency.check_device(gpu_report, gpu) is None
    assert "differs in sm_count" in consistency.check_device(gpu_report, gpu | {"sm_count": 66})
    assert "differs in kind" in consistency.check_device(gpu_report, here)
    comparison = synthetic.comparison_report(resamples=5)
    comparison["sides"]["reference"]["provenance"]["device"]["name"] = "Other CPU"
    assert "(reference side)" in consistency.check_device(comparison, here)
    del gpu_report["provenance"]["device"]
    assert "records no device" in consistency.check_device(gpu_report, gpu)


def test_committed_reports_are_consistent():
    found = 0
    for path in sorted((ROOT / "reports").rglob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and data.get("schema") == report_io.SCHEMA:
            found += 1
            assert consistency.check(report_io.load(path)) == [], path
    assert found >= 1


def test_a_case_failed_before_any_validation_keeps_its_status_but_not_once_it_ran():
    """A cluster task that died leaves its cases failed with no validations or samples: consistent; the
    same status on a case whose validations all passed is a forgery."""
    side = synthetic.side(1)
    side["rounds"] = [{cid: d for cid, d in r.items() if not cid.startswith("softmax_64x64_fp32/")}
                      for r in side["rounds"]]
    for case in side["cases"]:
        if case["id"].startswith("softmax_64x64_fp32/"):
            case.update(status="failed", reason="cluster task failed: worker died")
    report = report_io.seal(assemble.run_report(synthetic.SUITE, synthetic.CONFIG, side))
    assert consistency.check(report) == []
    ran = _case(report, "softmax_32x96_fp32", "ours")
    forged = edited(report, ("cases", ran, "status"), lambda _: "failed")
    assert f"cases[{ran}].status" in paths(forged)


def test_samples_that_are_not_positive_times_are_named(run):
    """All samples negated (contender and control alike) keep every derived ratio consistent, and read as a lead
    over torch where the contender is slower: a sample is a finite positive time."""
    out = copy.deepcopy(run)
    for case in out["cases"]:
        for m in case["modes"].values():
            m["rounds_us"] = [[-x for x in r] for r in m["rounds_us"]]
    found = consistency.check(reseal(out))
    assert any(i.note == "samples are times" for i in found), found
    for bad in (0.0, float("nan"), float("inf")):
        one = edited(run, ("cases", 0, "modes", next(iter(run["cases"][0]["modes"])), "rounds_us", 0, 0),
                     lambda _, bad=bad: bad)
        assert any(i.note == "samples are times" for i in consistency.check(one)), bad


def test_a_case_given_twice_or_misnamed_is_named(run):
    """A duplicate of a case listed first (a forged p50 there) is what a table shows while checks read the last."""
    twice = copy.deepcopy(run)
    twice["cases"].insert(0, copy.deepcopy(twice["cases"][1]))
    assert any(i.note == "a case given twice" for i in consistency.check(reseal(twice)))
    misnamed = edited(run, ("cases", 0, "id"), lambda cid: cid + "x")
    assert any(i.note == "name/impl" for i in consistency.check(misnamed))


def test_a_comparison_of_two_rounds_claims_nothing_and_its_rule_is_checked_with_its_records():
    """Over fewer than ``stats.MIN_ROUNDS`` rounds a side no gain is called significant, however far apart the
    sides (the interval rests on one pair of rounds); the rule is recorded, and a report whose rule is lowered
    without its records re-derived no longer follows from its raw data (one re-derived whole is a consistent
    forgery, left to the replay)."""
    reference, candidate = synthetic.side(1), synthetic.side(2, speed=1.25)
    for side in (reference, candidate):
        side["rounds"] = side["rounds"][:2]
    config = dict(synthetic.CONFIG, rounds=2)
    report = report_io.seal(assemble.comparison_report(synthetic.SUITE, config, reference, candidate, resamples=50))
    assert report["significance_min_rounds"] == stats.MIN_ROUNDS == 3
    records = [r[m] for r in report["records"] for m in synthetic.MODES if m in r]
    assert records and all(not m["significant"] and m["too_few_rounds"] for m in records)
    assert consistency.check(report) == []
    lowered = edited(report, ("significance_min_rounds",), lambda _: 1)
    assert any(p.startswith("records") for p in paths(lowered)), paths(lowered)
