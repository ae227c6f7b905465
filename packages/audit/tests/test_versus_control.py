"""What the candidate report claims against its control, judged by the replay (planted ``run_sides``, reports built
by the harness's assemble, sealed and consistent with themselves): a contender both reports show 2.5x faster than
torch, which the replay measures 2x slower, fails; a contender only the candidate's tree has, which the two sides
never run in common, is not replayed, and the verdict says so."""

import random
import re

import pytest
from test_forged_control import CONFIG, MODE, PROBLEM, run_report

from kernellab.audit import audit as audit_mod
from kernellab.audit import verdict
from kernellab.harness import report as report_io


def side(times: dict[str, float], seed: int, measured=None) -> dict:
    """Every impl of ``times`` offered; those of ``measured`` (default all) measured at their time, 0.3% jitter."""
    rng = random.Random(seed)
    cases = [{"id": f"{PROBLEM['name']}/{i}", "problem": PROBLEM, "impl": i, "status": "ok", "reason": None}
             for i in times]
    ran = [i for i in times if measured is None or i in measured]
    rounds = [{f"{PROBLEM['name']}/{i}": {
        "passed": True, "validations": [{"passed": True, "outputs": {}, "inputs_unchanged": True}],
        "samples_us": {MODE: [times[i] * (1 + rng.uniform(-0.003, 0.003)) for _ in range(CONFIG["samples"])]}}
        for i in ran} for _ in range(CONFIG["rounds"])]
    prov = {"device": {"kind": "cpu", "name": "Planted CPU"}, "git": {"commit": "a" * 40, "dirty": False},
            "artifacts_sha256": {}, "impl_sources": {}}
    return {"cases": cases, "rounds": rounds, "provenance": prov, "revision": {}}


def audit(reports: dict, replayed: dict, monkeypatch, tmp_path) -> dict:
    """The audit of ``reports`` with ``replayed`` as the replay's sides; each report's claims against its control
    are judged on its own side (``versus_control_claims``, labelled by side)."""
    monkeypatch.setattr(audit_mod, "run_sides", lambda roots, request, rounds, **kw: replayed)
    paths = {n: report_io.write(r, tmp_path / f"{n}.json") for n, r in reports.items()}
    a = audit_mod.Audit(paths["reference"], paths["candidate"], tmp_path, audit_mod.Options(progress=False))
    a._replay(reports, {"reference": str(tmp_path), "candidate": str(tmp_path)})
    return a._finish()


def test_a_lead_over_torch_both_reports_claim_and_the_replay_reverses_fails(monkeypatch, tmp_path):
    """Both reports scale the contender alike, so their A/B gain (1.0) is reproduced; their claim against torch
    (2.5x faster) is not: the replay measures it 2x slower."""
    forged = {"torch": 50.0, "planted": 20.0}
    reports = {"reference": run_report(side(forged, 1), "torch"), "candidate": run_report(side(forged, 2), "torch")}
    truth = {"torch": 50.0, "planted": 100.0}
    out = audit(reports, {"reference": side(truth, 3), "candidate": side(truth, 4)}, monkeypatch, tmp_path)
    assert out["status"] == "fail", out["reasons"]
    assert any("versus torch" in r and "contradicted" in r for r in out["reasons"]), out["reasons"]
    (judged,) = [j for j in out["versus_control_claims"] if j["label"].startswith("candidate: ")]
    assert judged["claim"] == verdict.CONTRADICTED and judged["claimed_gain"] > 2 and judged["replayed_gain"] < 1


def test_an_honest_lead_over_torch_is_reproduced(monkeypatch, tmp_path):
    times = {"torch": 50.0, "planted": 20.0}
    reports = {"reference": run_report(side(times, 1), "torch"), "candidate": run_report(side(times, 2), "torch")}
    out = audit(reports, {"reference": side(times, 3), "candidate": side(times, 4)}, monkeypatch, tmp_path)
    assert out["status"] == "pass", out["reasons"]
    (judged,) = [j for j in out["versus_control_claims"] if j["label"].startswith("candidate: ")]
    assert judged["claim"] == verdict.REPRODUCED and 2.4 < judged["replayed_gain"] < 2.6


def test_a_contender_only_the_candidate_has_is_never_taken_as_replayed(monkeypatch, tmp_path):
    """The candidate adds 'fastnew' (claimed 50x faster than torch); the reference tree has no such impl, so the
    replay's sides never run it in common, though the candidate's worker offered it."""
    reports = {"reference": run_report(side({"torch": 50.0, "planted": 100.0}, 1), "torch"),
               "candidate": run_report(side({"torch": 50.0, "planted": 100.0, "fastnew": 1.0}, 2), "torch")}
    replayed = {"reference": side({"torch": 50.0, "planted": 100.0}, 3),
                "candidate": side({"torch": 50.0, "planted": 100.0, "fastnew": 100.0}, 4,
                                  measured={"torch", "planted"})}
    out = audit(reports, replayed, monkeypatch, tmp_path)
    assert out["status"] == "inconclusive", out["reasons"]
    assert any("fastnew (offered, never measured" in r for r in out["reasons"]), out["reasons"]
    assert any("fastnew versus torch" in r and "not replayed" in r for r in out["reasons"]), out["reasons"]


def test_a_lead_over_a_control_the_replay_saw_disturbed_is_not_reproduced(monkeypatch, tmp_path):
    """The replay's control was disturbed in every round (2x slow) and the contender ran clean: the replay's pair
    then shows the claimed 2x lead over torch that the two do not have; its noise leaves the claim undecided."""
    claimed = {"torch": 100.0, "planted": 50.0}
    reports = {"reference": run_report(side(claimed, 1), "torch"), "candidate": run_report(side(claimed, 2), "torch")}
    noisy = {"reference": side({"torch": 100.0, "planted": 50.0}, 3),
             "candidate": side({"torch": 100.0, "planted": 50.0}, 4)}
    for s in noisy.values():
        for r in s["rounds"]:
            r[f"{PROBLEM['name']}/torch"]["disturbance"] = {MODE: {"disturbed": True}}
    out = audit(reports, noisy, monkeypatch, tmp_path)
    assert out["status"] == "inconclusive", out["reasons"]
    (judged,) = [j for j in out["versus_control_claims"] if j["label"].startswith("candidate: ")]
    assert judged["claim"] == verdict.UNDECIDED and any("disturbed" in w for w in judged["uninformative_because"])


def test_a_report_whose_problem_bytes_were_inflated_fails(monkeypatch, tmp_path):
    """Both reports record the problem's bytes 1.6x over: every ratio holds, the bandwidth and the fraction of the
    copy ceiling they claim do not. The replay's suite describes the problem otherwise."""
    times = {"torch": 50.0, "planted": 50.0}
    inflated = {**PROBLEM, "bytes": int(PROBLEM["bytes"] * 1.6)}

    def forged(seed):
        s = side(times, seed)
        for case in s["cases"]:
            case["problem"] = inflated
        return s
    reports = {"reference": run_report(forged(1), "torch"), "candidate": run_report(forged(2), "torch")}
    out = audit(reports, {"reference": side(times, 3), "candidate": side(times, 4)}, monkeypatch, tmp_path)
    assert out["status"] == "fail", out["reasons"]
    assert any("record a problem the suite describes otherwise" in r and "bytes" in r for r in out["reasons"])


def test_a_contender_only_the_reference_has_leaves_its_claims_undecided(monkeypatch, tmp_path):
    """The reference report claims 'fastref' 5x faster than torch; the candidate has no such impl, so the replay
    never measures it: its claim is not judged, and the verdict says so."""
    reports = {"reference": run_report(side({"torch": 50.0, "planted": 100.0, "fastref": 10.0}, 1), "torch"),
               "candidate": run_report(side({"torch": 50.0, "planted": 100.0}, 2), "torch")}
    replayed = {"reference": side({"torch": 50.0, "planted": 100.0, "fastref": 100.0}, 3,
                                  measured={"torch", "planted"}),
                "candidate": side({"torch": 50.0, "planted": 100.0}, 4)}
    out = audit(reports, replayed, monkeypatch, tmp_path)
    assert out["status"] == "inconclusive", out["reasons"]
    assert any("reference: softmax_128x512_fp32/fastref versus torch" in r and "not replayed" in r
               for r in out["reasons"]), out["reasons"]


def test_reports_whose_every_sample_was_scaled_alike_are_not_passed(monkeypatch, tmp_path):
    """Both reports' samples halved (the contender and the control alike): every ratio the audit judges is the
    replay's, so the pair had passed, its microseconds and GB/s twice the truth. The control's own times, unlike
    the replay's, leave them unconfirmed."""
    truth = {"torch": 50.0, "planted": 20.0}
    halved = {impl: t / 2 for impl, t in truth.items()}
    reports = {"reference": run_report(side(halved, 1), "torch"), "candidate": run_report(side(halved, 2), "torch")}
    out = audit(reports, {"reference": side(truth, 3), "candidate": side(truth, 4)}, monkeypatch, tmp_path)
    assert out["status"] == "inconclusive", out["reasons"]
    assert all(j["claim"] == verdict.REPRODUCED for j in out["versus_control_claims"])  # the ratios hold
    reasons = [r for r in out["reasons"] if "control time(s)" in r]
    assert len(reasons) == 2 and all(re.search(r"torch e2e_throughput: claimed 25(\.0\d*)? us \(p50 25(\.0\d*)?\), "
                                               r"replayed (49\.9|50[ .-])", r) for r in reasons), out["reasons"]
    slower = {impl: t * verdict.CONTROL_TIME_LIMIT * 0.9 for impl, t in truth.items()}  # a busier machine, within
    reports = {"reference": run_report(side(slower, 1), "torch"), "candidate": run_report(side(slower, 2), "torch")}
    out = audit(reports, {"reference": side(truth, 3), "candidate": side(truth, 4)}, monkeypatch, tmp_path)
    assert out["status"] == "pass", out["reasons"]


def _halved_but_the_last_round(seed: int) -> dict:
    s = side({"torch": 50.0, "planted": 20.0}, seed)
    for data in s["rounds"][:-1]:
        for d in data.values():
            d["samples_us"] = {m: [x / 2 for x in v] for m, v in d["samples_us"].items()}
    return s


def _halved_with_the_control_failed(seed: int) -> dict:
    s = side({"torch": 25.0, "planted": 10.0}, seed)
    s["rounds"][0][f"{PROBLEM['name']}/torch"].update(passed=False)
    s["rounds"][0][f"{PROBLEM['name']}/torch"]["validations"][0]["error"] = "a validation said to fail"
    return s


def _a_mode_the_replay_never_measures(seed: int) -> dict:
    s = side({"torch": 50.0, "planted": 20.0}, seed)
    for data in s["rounds"]:
        data[f"{PROBLEM['name']}/torch"]["samples_us"]["e2e_latency"] = [5.0] * CONFIG["samples"]
    return s


def _pooled_median_a_third(seed: int) -> dict:
    """One round all at a third, 9 samples of 20 at a third in the others: the rounds' medians stand, the pooled
    p50 (behind the report's GB/s) is a third."""
    s = side({"torch": 50.0, "planted": 20.0}, seed)
    for r, data in enumerate(s["rounds"]):
        for d in data.values():
            d["samples_us"] = {m: [x / 3 if r == 0 or k < 9 else x for k, x in enumerate(v)]
                               for m, v in d["samples_us"].items()}
    return s


def _halved_without_the_control(seed: int) -> dict:
    s = side({"torch": 25.0, "planted": 10.0}, seed)
    s["cases"] = [c for c in s["cases"] if c["impl"] != "torch"]
    for data in s["rounds"]:
        del data[f"{PROBLEM['name']}/torch"]
    return s


@pytest.mark.parametrize("forge", [_halved_but_the_last_round, _halved_with_the_control_failed,
                                   _a_mode_the_replay_never_measures, _pooled_median_a_third,
                                   _halved_without_the_control])
def test_control_times_forged_around_the_check_are_not_passed(monkeypatch, tmp_path, forge):
    """Ways past a check of every claimed round against the replay's, of ok control cases, in the replayed modes:
    one honest round of three (the report's p50 still halved), the control's case said to have failed, a mode only
    the control has (the replay measures the config's modes), the pooled p50 forged under standing round medians,
    no control case at all."""
    reports = {}
    for seed, name in enumerate(("reference", "candidate"), 1):
        rep = run_report(forge(seed), "torch")
        if forge is _a_mode_the_replay_never_measures:
            rep["config"]["modes"] = [MODE]
            rep = report_io.seal(rep)
        reports[name] = rep
    truth = {"torch": 50.0, "planted": 20.0}
    out = audit(reports, {"reference": side(truth, 3), "candidate": side(truth, 4)}, monkeypatch, tmp_path)
    assert out["status"] != "pass" and any("control time(s)" in r for r in out["reasons"]), out["reasons"]


def test_the_replays_interval_against_its_control_allows_for_correlated_samples():
    """The same rounds give a wider interval when their samples are autocorrelated than when the same values come
    shuffled, independent, within each round."""
    rng = random.Random(5)

    def series(level):
        x, out = 0.0, []
        for _ in range(20):
            x = 0.9 * x + rng.gauss(0.0, 0.02)
            out.append(level * (1.0 + x))
        return out

    rounds = [{"ours": {"samples_us": {MODE: series(10.0)}}, "torch": {"samples_us": {MODE: series(11.0)}}}
              for _ in range(4)]
    correlated = verdict.replay_versus_control(rounds, "ours", "torch", MODE)["gain_ci"]
    for r in rounds:
        for case in r.values():
            rng.shuffle(case["samples_us"][MODE])
    shuffled = verdict.replay_versus_control(rounds, "ours", "torch", MODE)["gain_ci"]
    assert correlated[1] / correlated[0] > shuffled[1] / shuffled[0], (correlated, shuffled)
