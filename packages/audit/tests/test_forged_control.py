"""A forged pair of reports that renames its control (consistent with itself, re-hashed) cannot switch the
replay's drift guard off: the audit takes the control the suite registers, and a report naming another fails.
The replay is planted (``run_sides``): its reference side runs 1.5x slower throughout, drift or a contender
slowing the other side, which the honest control turns into ``inconclusive``."""

import random

from kernellab.audit import audit as audit_mod
from kernellab.harness import assemble, consistency
from kernellab.harness import report as report_io

PROBLEM = {"name": "softmax_128x512_fp32", "op": "softmax", "shape": [128, 512], "dtype": "fp32",
           "device": "cpu", "params": {}, "bytes": 524288, "flops": 0}
MODE = "e2e_throughput"
CONFIG = {"rounds": 3, "samples": 20, "warmup": 1, "iterations": 1, "seed": 0}


def side(scale: float, seed: int) -> dict:
    """Both impls at the same speed (planted 100 us, torch 50 us), every sample times ``scale``."""
    rng = random.Random(seed)
    cases = [{"id": f"{PROBLEM['name']}/{i}", "problem": PROBLEM, "impl": i, "status": "ok", "reason": None}
             for i in ("torch", "planted")]
    base = {"torch": 50.0, "planted": 100.0}
    rounds = [{c["id"]: {"passed": True,
                         "validations": [{"passed": True, "outputs": {}, "inputs_unchanged": True}],
                         "samples_us": {MODE: [base[c["impl"]] * scale * (1 + rng.uniform(-0.003, 0.003))
                                               for _ in range(CONFIG["samples"])]}}
               for c in cases} for _ in range(CONFIG["rounds"])]
    prov = {"device": {"kind": "cpu", "name": "Planted CPU"}, "git": {"commit": "a" * 40, "dirty": False},
            "artifacts_sha256": {}, "impl_sources": {}}
    return {"cases": cases, "rounds": rounds, "provenance": prov, "revision": {}}


class Suite:
    name, device, control, ceiling_op = "cpu-ops", "cpu", "torch", None


def run_report(s: dict, control: str) -> dict:
    rep = assemble.run_report(Suite, CONFIG, s)
    rep["control"] = control
    rep["versus_control"] = assemble.versus_control(rep["cases"], control)
    rep = report_io.seal(rep)
    assert consistency.check(rep) == [], consistency.check(rep)  # a forgery consistent with itself
    return rep


def verdict_for(control: str, monkeypatch, tmp_path) -> dict:
    # the reports: the reference run under load (1.5x slower), the candidate (the same code) on a quiet machine
    reports = {"reference": run_report(side(1.5, 1), control), "candidate": run_report(side(1.0, 2), control)}
    # the replay: the reference side again 1.5x slower throughout, its torch control with it
    replayed = {"reference": side(1.5, 3), "candidate": side(1.0, 4)}
    monkeypatch.setattr(audit_mod, "run_sides", lambda roots, request, rounds, **kw: replayed)
    paths = {}
    for name, rep in reports.items():
        paths[name] = report_io.write(rep, tmp_path / f"{name}-{control}.json")
    a = audit_mod.Audit(paths["reference"], paths["candidate"], tmp_path, audit_mod.Options(progress=False))
    a._replay(reports, {"reference": str(tmp_path), "candidate": str(tmp_path)})
    return a._finish()


def test_a_report_that_renames_its_control_fails_the_audit(monkeypatch, tmp_path):
    honest = verdict_for("torch", monkeypatch, tmp_path)
    assert honest["status"] == "inconclusive", honest["reasons"]  # the drift guard, where the control is named
    out = verdict_for("no-such-impl", monkeypatch, tmp_path)
    assert out["status"] == "fail", out["reasons"]
    assert any("is not the suite's 'torch'" in r for r in out["reasons"]), out["reasons"]
