"""End to end: the bench CLI on the CPU, a plain run and a revision A/B, as a user runs them."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernellab.harness import consistency, report

ROOT = Path(__file__).resolve().parents[1]
QUICK = ["--rounds", "2", "--samples", "5", "--warmup", "1", "--iterations", "2", "--rotation-limit", "64"]
# a forward, a backward from saved statistics, a training step through autograd and a decode-shape linear
CASES = ["softmax_128x512_fp32", "rmsnorm_backward_128x512_fp32", "layernorm_train_128x512_fp32",
         "linear_forward_1x512x512_fp32"]


def bench(*args, cwd=ROOT):
    res = subprocess.run([sys.executable, "-m", "kernellab.harness", *args], cwd=cwd, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    return res


def test_plain_run_writes_a_sealed_report_with_provenance_table_and_plot(tmp_path):
    res = bench("--suite", "cpu-ops", "--cases", ",".join(CASES), *QUICK, "--out", str(tmp_path))
    [path] = tmp_path.glob("cpu-ops-*.json")
    r = report.load(path)
    prov = r["provenance"]
    for field in ("device", "packages", "git", "sources_sha256", "artifacts_sha256", "clocks_start", "clocks_end"):
        assert field in prov, field
    assert prov["git"]["commit"] is None or len(prov["git"]["commit"]) == 40
    assert any(k.startswith("harness/") for k in prov["sources_sha256"])
    assert "torch" in prov["packages"]
    names = {c["name"] for c in r["cases"]}
    assert names == set(CASES)
    for c in r["cases"]:
        assert c["status"] in ("ok", "unavailable"), c
        if c["status"] == "ok":
            assert set(c["modes"]) == {"e2e_throughput", "e2e_latency"}
            assert all(v["passed"] for v in c["validations"])
            assert all(v["timed_batches_checked"] > 0 and v["checked_outside_worker"] > 0 for v in c["validations"])
    assert "e2e_throughput p50 us" in res.stdout
    if shutil.which("true") and path.with_suffix(".png").exists():
        assert path.with_suffix(".png").stat().st_size > 1000


@pytest.fixture
def checkout(tmp_path):
    """A fresh git repository holding this tree's packages, committed once."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "packages", repo / "packages",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist"))
    git = ["git", "-C", str(repo), "-c", "user.name=ci", "-c", "user.email=ci@example.invalid"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "snapshot"], check=True)
    return repo


def test_baseline_head_writes_comparison_and_before_after_records(checkout, tmp_path):
    out = tmp_path / "out"
    # e2e_throughput alone: the records of one mode are what this checks, and e2e_latency's cache eviction
    # before every sample (twice the last-level cache written) would be most of the test's time
    bench("--suite", "cpu-ops", "--cases", "softmax_128x512_fp32,linear_backward_1x512x512_fp32", "--baseline", "HEAD",
          "--modes", "e2e_throughput", *QUICK, "--out", str(out), "--quiet", cwd=checkout)
    [cmp_path] = out.glob("cpu-ops-ab-*.json")
    [ba_path] = out.glob("cpu-ops-before-after-*.json")
    cmp, ba = report.load(cmp_path), report.load(ba_path)
    assert cmp["sides"]["reference"]["revision"]["kind"] == "git"
    ref_src = cmp["sides"]["reference"]["provenance"]["sources_sha256"]
    cand_src = cmp["sides"]["candidate"]["provenance"]["sources_sha256"]
    assert ref_src == cand_src and ref_src
    assert cmp["identical_sides"] and cmp["notice"] and ba["metadata"]["identical_sides"]  # said first
    assert set(cmp["summaries"]["e2e_throughput"]) >= {"positive_medians", "all_pairs_positive",
                                                        "all_pairs_negative", "faster_torch_all_pairs"}
    lo, hi = cmp["torch_probe_control_ratio_range"]
    assert 0 < lo <= hi
    for rec in cmp["records"]:
        m = rec["e2e_throughput"]
        for field in ("reference_us", "candidate_us", "torch_us", "reference_rounds_us", "candidate_rounds_us",
                      "torch_rounds_us", "gain", "gain_min", "gain_max", "native_torch_ratio", "ratio_min",
                      "ratio_max", "gain_ci"):
            assert field in m, field
        assert len(m["reference_rounds_us"]) == 2
        assert m["gain_min"] <= m["gain"] <= m["gain_max"]
    assert {"measured_at", "rounds", "samples", "warmup", "iterations_per_sample", "method",
            "binary_sha256"} <= set(ba["metadata"])
    assert ba["metadata"]["baseline_source_sha256"] == ba["metadata"]["candidate_source_sha256"]
    gains = {r["name"]: r["e2e_throughput"]["gain"] for r in cmp["records"]}
    for rec in ba["records"]:  # the paired gain of its comparison, inside its interval; disturbed samples dropped
        assert rec["speedup"] in gains.values() and rec["speedup_ci"][0] <= rec["speedup"] <= rec["speedup_ci"][1]
        assert 0 < len(rec["before_samples_ms"]) <= 10 and 0 < len(rec["after_samples_ms"]) <= 10
    assert consistency.check(cmp) == [] and consistency.check_before_after(ba, cmp) == []
    json.dumps(cmp)
