"""The audit against planted implementations and planted reports, on the CPU, end to end: a git
repository holding the harness and a planted softmax contender, reports benched at two commits,
then kernellab-audit on them."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernellab.audit import audit as audit_mod
from kernellab.harness import report

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
if not (ROOT / "packages" / "harness" / "pyproject.toml").is_file():
    pytest.skip("the end-to-end audit tests build a git repository from the monorepo's packages/harness and "
                "packages/audit; an unpacked sdist has neither", allow_module_level=True)
# Commits carry fixed dates, so the same files and message make the same commit in every test's repository,
# and a report benched at one commit in one test serves every later test asking for it (copied, never shared).
GIT_DATES = {"GIT_AUTHOR_DATE": "2026-01-01T00:00:00+00:00", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+00:00"}
_REPORTS: dict[tuple, Path] = {}
# One mode: e2e_latency evicts the cache before every sample (a write of twice the last-level cache, 42 ms
# where the OS reports 480 MiB), which would be most of these tests' time and tests nothing the audit
# does differently per mode.
BENCH = ["--suite", "cpu-ops", "--cases", "softmax_128x512_fp32", "--impls", "planted", "--modes", "e2e_throughput",
         "--rounds", "3", "--samples", "12", "--warmup", "2", "--iterations", "3", "--rotation-limit", "16", "--quiet",
         "--no-plot"]


class Repo:
    def __init__(self, path: Path, bench_args: list[str] = BENCH):
        self.path = path
        self.bench_args = bench_args
        self.extra_paths: list[str] = []  # site directories of contenders installed outside the checkout
        shutil.copytree(ROOT / "packages" / "harness", path / "packages" / "harness",
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "tests"))
        shutil.copytree(ROOT / "packages" / "audit", path / "packages" / "audit",
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "tests"))
        shutil.copytree(HERE / "planted", path / "packages" / "planted")
        self.git("init", "-q")
        self.commit("honest", "baseline")

    @property
    def module(self) -> Path:
        return self.path / "packages" / "planted" / "src" / "kernellab" / "planted" / "__init__.py"

    def git(self, *args) -> str:
        res = subprocess.run(["git", "-C", str(self.path), "-c", "user.name=t", "-c", "user.email=t@example.invalid",
                              *args], capture_output=True, text=True, check=True, env={**os.environ, **GIT_DATES})
        return res.stdout.strip()

    def commit(self, behaviour: str, message: str) -> str:
        text = self.module.read_text()
        start = text.index('BEHAVIOUR = "')
        end = text.index('"', start + len('BEHAVIOUR = "'))
        self.module.write_text(f'{text[:start]}BEHAVIOUR = "{behaviour}"{text[end + 1:]}')
        self.git("add", "-A")
        self.git("commit", "-qm", message, "--allow-empty")
        return self.git("rev-parse", "HEAD")

    def env(self) -> dict:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([*(str(p) for p in sorted(self.path.glob("packages/*/src"))),
                                             *self.extra_paths])
        env["KERNELLAB_SOURCE_ROOT"] = str(self.path)
        env["OMP_NUM_THREADS"] = "1"  # one thread per process: a loaded CI machine slows the tests, not breaks them
        return env

    def bench(self, commit: str, out: Path) -> Path:
        key = (commit, tuple(self.bench_args), tuple(self.extra_paths))
        if key in _REPORTS:
            shutil.copy(_REPORTS[key], out)
            return out
        branch = self.git("rev-parse", "--abbrev-ref", "HEAD")
        self.git("checkout", "-q", commit)
        try:
            res = subprocess.run([sys.executable, "-m", "kernellab.harness", *self.bench_args, "--out", str(out)],
                                 cwd=self.path, env=self.env(), capture_output=True, text=True, timeout=600)
        finally:
            self.git("checkout", "-q", branch)
        assert out.exists(), res.stderr
        _REPORTS[key] = out.with_suffix(".pristine.json")
        shutil.copy(out, _REPORTS[key])
        return out

    def audit(self, reference: Path, candidate: Path) -> tuple[int, dict]:
        out = self.path.parent / "audit.json"
        cmd = [sys.executable, "-m", "kernellab.audit", str(reference), str(candidate), "--out", str(out), "--quiet",
               "--max-rounds", "3"]  # the reports' own rounds: extra rounds are tested on synthetic samples
        res = subprocess.run(cmd, cwd=self.path, env=self.env(), capture_output=True, text=True, timeout=600)
        assert out.exists(), f"{res.stdout}\n{res.stderr}"
        return res.returncode, json.loads(out.read_text())


def _pair(repo, tmp_path, behaviour: str):
    base = repo.git("rev-parse", "HEAD")
    cand = repo.commit(behaviour, f"candidate: {behaviour}")
    return repo.bench(base, tmp_path / "ref.json"), repo.bench(cand, tmp_path / "cand.json")


def only_noise(reasons: list[str]) -> bool:
    """Whether every reason is one a loaded machine gives an honest pair: a claim the replay could not decide, or a
    report's control times too far from the replay's (either made while the machine was busier)."""
    return all("undecided" in r or "control time(s) further than" in r for r in reasons)


def test_honest_revisions_pass(repo, tmp_path):
    ref, cand = _pair(repo, tmp_path, "honest")
    code, audit = repo.audit(ref, cand)
    # a loaded machine may leave the replay uninformative: then inconclusive, and only for that reason
    assert audit["status"] in ("pass", "inconclusive"), audit["reasons"]
    assert code == {"pass": 0, "inconclusive": 2}[audit["status"]]
    if audit["status"] == "inconclusive":
        assert only_noise(audit["reasons"]), audit["reasons"]
    assert audit["replay_pairs"] == 1 and audit["executed_output_validations"] > 0  # one case, one mode
    # small results: every one shipped and checked again by the driver, none judged in the worker alone
    assert audit["output_validations_by_driver"] > 0 and audit["validated_in_worker_only"] == []
    assert audit["recorded_unchanged_artifacts"] == 2 and audit["current_artifacts_checked"] is True
    assert set(audit["source_reports_sha256"]) == {"reference", "candidate"}
    lo, hi = audit["torch_probe_control_ratio_range"]
    assert 0 < lo <= hi
    for field in ("replay_sha256", "audit_sha256", "summaries", "records"):
        assert field in audit
    assert audit["audit_sha256"] == report.report_hash(audit, "audit_sha256")


def _edit(path: Path, change, reseal: bool) -> None:
    data = json.loads(path.read_text())
    change(data)
    if reseal:
        data["sha256"] = report.report_hash(data)
    path.write_text(json.dumps(data))


def _scale_planted(factor):
    """The planted contender's samples scaled, and every number derived from them recomputed: a forgery
    consistent with itself, which only the replay can tell from a real measurement."""
    def change(data):
        from kernellab.harness import assemble, consistency

        for case in data["cases"]:
            if case["impl"] == "planted":
                for mode in case["modes"].values():
                    mode["rounds_us"] = [[x * factor for x in r] for r in mode["rounds_us"]]
        data["cases"] = consistency.recompute_cases(data["cases"], data["ceiling_op"], data["control"])
        data["versus_control"] = assemble.versus_control(data["cases"], data["control"])
        assert consistency.check(data) == []
    return change


def test_edited_timings_fail_on_the_hash(repo, tmp_path):
    ref, cand = _pair(repo, tmp_path, "honest")
    _edit(cand, _scale_planted(0.5), reseal=False)
    code, audit = repo.audit(ref, cand)
    assert code == 1 and any("sha256 mismatch" in r for r in audit["reasons"])
    assert "replay_pairs" not in audit


def test_resealed_claim_is_contradicted_by_the_replay(repo, tmp_path):
    ref, cand = _pair(repo, tmp_path, "honest")
    _edit(cand, _scale_planted(0.002), reseal=True)  # a claim 500x off: contradicted even on a loaded machine
    code, audit = repo.audit(ref, cand)
    assert code == 1 and any("contradicted by the replay" in r for r in audit["reasons"]), audit["reasons"]


def test_a_candidate_whose_own_harness_forges_its_samples_is_replayed_by_the_auditors(repo, tmp_path):
    """The candidate revision changes the harness itself: its runner divides the planted contender's samples by 500
    (its sources hashed in no report: the harness measures, it is not measured). Its report is consistent with
    itself; the replay measures both trees with the auditor's own harness, so the claim is contradicted (500x off:
    even on a loaded machine). With each tree's own harness in its worker the same forgery had made the replay."""
    base = repo.git("rev-parse", "HEAD")
    runner = repo.path / "packages" / "harness" / "src" / "kernellab" / "harness" / "runner.py"
    measured = "result[\"samples_us\"][mode], result[\"disturbance\"][mode] = self._measure(mode, calls, check)\n"
    text = runner.read_text()
    indent = text[:text.index(measured)].rsplit("\n", 1)[1]
    forgery = (f'{indent}if case.impl.name == "planted":\n'
               f'{indent}    result["samples_us"][mode] = [x / 500 for x in result["samples_us"][mode]]\n')
    runner.write_text(text.replace(measured, measured + forgery))
    forged = repo.commit("honest", "candidate: a harness that reports the planted contender 500x faster")
    ref, cand = repo.bench(base, tmp_path / "ref.json"), repo.bench(forged, tmp_path / "cand.json")
    claimed = json.loads(cand.read_text())
    assert claimed["provenance"]["git"]["commit"] == forged
    repo.git("checkout", "-q", base)  # the auditor runs its own (the honest) harness
    code, audit = repo.audit(ref, cand)
    assert code == 1 and any("contradicted by the replay" in r for r in audit["reasons"]), audit["reasons"]
    (record,) = [r for r in audit["records"] if "e2e_throughput" in r]
    assert record["e2e_throughput"]["claimed_gain"] > 100 and record["e2e_throughput"]["gain"] < 10, record


def test_resealed_report_with_artifacts_that_no_longer_match(repo, tmp_path):
    ref, cand = _pair(repo, tmp_path, "honest")

    def change(data):
        arts = data["provenance"]["artifacts_sha256"]
        for k in arts:
            arts[k] = "0" * 64
    _edit(cand, change, reseal=True)
    code, audit = repo.audit(ref, cand)
    assert code == 1 and any("artifacts differ from the report" in r for r in audit["reasons"])


def test_source_changed_after_the_report(repo, tmp_path):
    ref, cand = _pair(repo, tmp_path, "honest")
    repo.module.write_text(repo.module.read_text() + "\n# changed after the report\n")
    code, audit = repo.audit(ref, cand)
    assert code == 1
    assert any("source files differ" in r and "planted/__init__.py" in r for r in audit["reasons"])


def test_dirty_report_is_located_by_its_sources(repo, tmp_path):
    from kernellab.audit import trees
    from kernellab.harness import provenance

    stale = repo.git("rev-parse", "HEAD")  # what a copied tree's stale .git names
    sources = provenance.source_hashes(provenance.tree_roots(repo.path))
    dirty = {"provenance": {"git": {"commit": stale, "dirty": True}, "sources_sha256": sources}}
    holder = repo.commit("honest", "the measured files, committed")
    repo.module.write_text(repo.module.read_text() + "\n# later work\n")
    repo.git("commit", "-qam", "later work")
    where = trees.locate(dirty, repo.path, tmp_path / "a")
    assert where["commit"] == holder and not any(trees.source_changes(dirty, where["root"]).values())
    clean = {"provenance": {"git": {"commit": stale, "dirty": False}, "sources_sha256": sources}}
    assert trees.locate(clean, repo.path, tmp_path / "b")["source"] == f"commit {stale}"
    repo.git("checkout", "-q", holder)  # a checkout holding the files is used as it is
    assert trees.locate(dirty, repo.path, tmp_path / "c")["root"] == str(repo.path)
    lost = dict(dirty, provenance=dict(dirty["provenance"], sources_sha256={**sources, "planted/x.py": "0" * 64}))
    assert trees.locate(lost, repo.path, tmp_path / "d")["source"] == f"commit {stale}"  # no commit holds them


def test_artifacts_are_matched_across_checkouts():
    """A report made in another checkout names its built files under that checkout: a changed file is
    found by its path in the tree, not left unchecked."""
    from kernellab.audit import trees

    recorded = {"/a/co/build/x.so": "h1", "/a/co/build/y.so": "h2", "/opt/z.so": "h3"}
    current = {"/b/tree/build/x2.so": "h1", "/b/tree/build/y.so": "hX"}
    assert trees.artifact_changes(recorded, current, "/a/co", "/b/tree") == {
        "unchanged": ["/a/co/build/x.so"], "changed": ["/a/co/build/y.so"], "unchecked": ["/opt/z.so"]}
    assert trees.artifact_changes(recorded, current)["unchecked"] == ["/a/co/build/y.so", "/opt/z.so"]


@pytest.mark.gpu
def test_graph_replaying_a_stale_result_fails(tmp_path):
    repo = Repo(tmp_path / "repo", ["--suite", "gpu-norm", "--cases", "softmax_256x3072_fp32",
                                         *[a if a != "e2e_throughput" else "graph_throughput" for a in BENCH[4:]]])
    ref, cand = _pair(repo, tmp_path, "stale_graph")
    code, audit = repo.audit(ref, cand)
    assert code == 1
    assert any("validation(s) failed" in r for r in audit["reasons"]), audit["reasons"]


def test_usage_errors(tmp_path):
    from kernellab.audit.cli import main

    assert main(["only-one.json", "--repo", str(ROOT)]) == 64
    assert main(["--repo", str(tmp_path)]) == 64


# ---- forged reports caught before any replay: one real report, edited and resealed -------------------

SMALL = ["--suite", "cpu-ops", "--cases", "softmax_128x512_fp32", "--impls", "planted", "--modes", "e2e_throughput",
         "--rounds", "2", "--samples", "3", "--warmup", "0", "--iterations", "1", "--quiet", "--no-plot"]


@pytest.fixture(scope="module")
def benched(tmp_path_factory):
    """One honest report of the planted contender; every test below forges copies of it."""
    tmp = tmp_path_factory.mktemp("forged")
    repo = Repo(tmp / "repo", SMALL)
    return repo, repo.bench(repo.git("rev-parse", "HEAD"), tmp / "honest.json")


def _copy(src: Path, dst: Path, change=None, reseal: bool = True) -> Path:
    shutil.copy(src, dst)
    if change is not None:
        _edit(dst, change, reseal)
    return dst


def _planted_p50_over_50(data):
    i = next(k for k, c in enumerate(data["cases"]) if c["impl"] == "planted")
    data["cases"][i]["modes"]["e2e_throughput"]["summary_us"]["p50"] /= 50
    return i


def test_resealed_p50_over_50_fails_naming_the_field(benched, tmp_path):
    repo, honest = benched
    i = _planted_p50_over_50(json.loads(honest.read_text()))
    forged = _copy(honest, tmp_path / "cand.json", _planted_p50_over_50)
    code, audit = repo.audit(honest, forged)
    assert code == 1 and audit["status"] == "fail"
    assert any(r.startswith("candidate report internally consistent: inconsistent: "
                            f"cases[{i}].modes.e2e_throughput.summary_us.p50: recorded") for r in audit["reasons"]), \
        audit["reasons"]
    assert "replay_pairs" not in audit  # a report that contradicts itself is not replayed


def _load_only(repo, reference, candidate, **options):
    from kernellab.audit.audit import Audit, Options

    audit = Audit(reference, candidate, repo.path, Options(progress=False, **options))
    loaded = audit._load_reports()
    return loaded, audit._finish()


def test_signatures_of_both_reports(benched, tmp_path):
    pytest.importorskip("cryptography")
    from kernellab.harness import signing

    repo, honest = benched
    key = signing.load_private_key(signing.generate_keypair(tmp_path / "keys" / "lab")[0])
    stranger = signing.load_private_key(signing.generate_keypair(tmp_path / "stranger")[0])
    signed = tmp_path / "signed.json"
    report.write(signing.sign(report.load(honest), key), signed)
    loaded, audit = _load_only(repo, signed, signed, trusted_keys=tmp_path / "keys")
    assert loaded is not None and audit["status"] == "pass", audit["reasons"]
    assert [c["passed"] for c in audit["checks"] if c["name"].endswith("signature")] == [True, True]

    loaded, audit = _load_only(repo, signed, signed)  # no trusted keys: noted, not verified, not a doubt
    notes = [c for c in audit["checks"] if c["name"].endswith("signature")]
    assert [c["passed"] for c in notes] == [None, None] and "not verified" in notes[0]["detail"]
    assert loaded is not None and audit["status"] == "pass"

    by_stranger = tmp_path / "stranger.json"
    report.write(signing.sign(report.load(honest), stranger), by_stranger)
    loaded, audit = _load_only(repo, signed, by_stranger, trusted_keys=tmp_path / "keys")
    assert loaded is None and audit["status"] == "fail"
    assert any(r.startswith("candidate report signature: ") and "not among the trusted keys" in r
               for r in audit["reasons"]), audit["reasons"]

    loaded, audit = _load_only(repo, honest, signed, trusted_keys=tmp_path / "keys")
    assert loaded is None and any("reference report signature: the report is unsigned" in r for r in audit["reasons"])

    tampered = _copy(signed, tmp_path / "tampered.json",
                     lambda d: d["provenance"]["device"].update(host="elsewhere"))  # consistent, but not as signed
    loaded, audit = _load_only(repo, signed, tampered, trusted_keys=tmp_path / "keys")
    assert loaded is None and any("does not match its content" in r for r in audit["reasons"])


def test_a_report_from_another_device_is_inconclusive(benched, tmp_path):
    repo, honest = benched

    def elsewhere(data):
        data["provenance"]["device"].update(name="Another CPU 1000", cpu="Another CPU 1000")
    moved = _copy(honest, tmp_path / "moved.json", elsewhere)
    loaded, audit = _load_only(repo, honest, moved)
    assert loaded is not None and audit["status"] == "inconclusive"
    assert any(r.startswith("candidate report was made on cpu 'Another CPU 1000'; this machine is cpu ")
               and r.endswith("its timing claims cannot be judged here") for r in audit["reasons"]), audit["reasons"]


def test_claims_off_by_50x_fail_here_and_are_doubted_from_another_device(benched):
    """The replay's timing contradicts a 50x claim; made on another device, that is a doubt, not a fail.
    The real report's samples are replaced by steady synthetic ones: how noisy this machine was when it
    benched them must not decide the verdict (under load they made the replay uninformative)."""
    from kernellab.audit.audit import Audit, Options
    from kernellab.harness import assemble, consistency

    _, honest = benched
    ref = report.load(honest)
    for case in ref["cases"]:
        for m in case["modes"].values():
            m["rounds_us"] = [[10.0 + 0.01 * ((k + r) % 3) for k in range(len(samples))]
                              for r, samples in enumerate(m["rounds_us"])]
    ref["cases"] = consistency.recompute_cases(ref["cases"], ref["ceiling_op"], "torch")
    cand = json.loads(json.dumps(ref))
    for case in cand["cases"]:
        if case["impl"] == "planted":
            for m in case["modes"].values():
                m["rounds_us"] = [[s / 50 for s in r] for r in m["rounds_us"]]
    cand["cases"] = consistency.recompute_cases(cand["cases"], cand["ceiling_op"], "torch")
    replay = assemble.compare_cases(ref["cases"], ref["cases"], "torch", resamples=50)
    for foreign, status in ((False, "fail"), (True, "inconclusive")):
        audit = Audit(honest, honest, ROOT, Options(progress=False))
        audit.foreign_device = foreign
        audit._judge_claims({"reference": ref, "candidate": cand}, replay)
        assert audit._finish()["status"] == status


def test_check_reports_of_any_kind_without_replaying(benched, tmp_path, capsys):
    from kernellab.audit.cli import main

    _, honest = benched
    forged = _copy(honest, tmp_path / "forged.json", _planted_p50_over_50)
    edited = _copy(honest, tmp_path / "edited.json", _planted_p50_over_50, reseal=False)
    assert main(["--check", str(honest)]) == 0
    assert "[ok  ] internally consistent" in capsys.readouterr().out
    assert main(["--check", str(honest), str(forged)]) == 1
    assert "modes.e2e_throughput.summary_us.p50: recorded" in capsys.readouterr().out
    assert main(["--check", str(edited)]) == 1
    assert "sha256 mismatch" in capsys.readouterr().out
    assert main(["--check", str(honest), "--trusted-keys", str(tmp_path / "absent")]) == 64
    assert "--trusted-keys: trusted keys" in capsys.readouterr().err


def test_check_a_comparison_and_its_before_after(tmp_path, capsys):
    """Reports assembled from synthetic rounds (no timing): the before/after report is checked
    against the comparison it was made from when both are given."""
    import types

    from kernellab.audit.cli import main
    from kernellab.harness import assemble

    def side(scale):
        problem = {"name": "softmax_4x4_fp32", "op": "softmax", "shape": [4, 4], "dtype": "fp32", "bytes": 128}
        cases = [{"id": f"softmax_4x4_fp32/{i}", "problem": problem, "impl": i, "status": "ok"} for i in ("torch", "x")]
        ok = {"validations": [{"passed": True, "outputs": {}, "inputs_unchanged": True}], "passed": True}
        rounds = [{c["id"]: {**ok, "samples_us": {"e2e_throughput": [(k + r + 1.0) * (scale if c["impl"] == "x" else 1)
                                                                     for k in range(3)]}}
                   for c in cases} for r in range(2)]
        return {"cases": cases, "rounds": rounds, "provenance": {"device": {"kind": "cpu"}}, "revision": {}}

    suite = types.SimpleNamespace(name="s", device="cpu", control="torch", ceiling_op=None)
    config = {"rounds": 2, "samples": 3, "warmup": 0, "iterations": 1}
    comparison = report.seal(assemble.comparison_report(suite, config, side(1.0), side(0.5), resamples=20))
    before_after = report.seal(assemble.before_after_report(comparison))
    paths = [report.write(comparison, tmp_path / "ab.json"), report.write(before_after, tmp_path / "ba.json")]
    assert main(["--check", *map(str, paths)]) == 0
    assert "against its comparison: [ok  ]" in capsys.readouterr().out
    record = before_after["records"][0]  # 50x faster, consistent with itself, not with the comparison
    record["after_samples_ms"] = [s / 50 for s in record["after_samples_ms"]]
    record.update(after_ms=record["after_ms"] / 50, speedup=record["speedup"] * 50,
                  speedup_ci=[x * 50 for x in record["speedup_ci"]])
    before_after["sha256"] = report.report_hash(before_after)
    report.write(before_after, paths[1])
    assert main(["--check", *map(str, paths)]) == 1
    out = capsys.readouterr().out
    assert "[ok  ] internally consistent" in out and "against its comparison: [FAIL] " in out
    assert "records[0].after_ms: recorded" in out


def test_cases_validated_in_the_worker_only_are_named(tmp_path):
    """A case none of whose results the driver checked again (each over the ship limit) is named in the audit,
    beside the count of the driver's checks; a failed check of either kind fails the audit's check."""
    def validation(external: bool, passed: bool = True) -> dict:
        return {"passed": passed, "external": True} if external else {"passed": passed, "outputs": {}}

    sides = {"reference": {"rounds": [{"big/ours": {"validations": [validation(False), validation(False)]},
                                       "small/ours": {"validations": [validation(False), validation(True)]}}]},
             "candidate": {"rounds": [{"big/ours": {"validations": [validation(False)]},
                                       "small/ours": {"validations": [validation(True, passed=False)]}}]}}
    a = audit_mod.Audit(tmp_path / "r.json", tmp_path / "c.json", tmp_path, audit_mod.Options())
    a._check_validations(sides)
    assert a.out["executed_output_validations"] == 6 and a.out["output_validations_by_driver"] == 2
    assert a.out["validated_in_worker_only"] == ["candidate big/ours", "reference big/ours"]
    (check,) = a.checks
    assert check["passed"] is False and a.failures and "candidate small/ours round 1" in a.failures[0]
