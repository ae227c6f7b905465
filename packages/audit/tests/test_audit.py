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

from kernellab.harness import report

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
if not (ROOT / "packages" / "harness" / "pyproject.toml").is_file():
    pytest.skip("the end-to-end audit tests build a git repository from the monorepo's packages/harness and "
                "packages/audit; an unpacked sdist has neither", allow_module_level=True)
BENCH = ["--suite", "cpu-ops", "--cases", "softmax_*", "--impls", "planted", "--rounds", "3", "--samples", "12",
         "--warmup", "2", "--iterations", "3", "--quiet", "--no-plot"]


class Repo:
    def __init__(self, path: Path, bench_args: list[str] = BENCH):
        self.path = path
        self.bench_args = bench_args
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
                              *args], capture_output=True, text=True, check=True)
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
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in sorted(self.path.glob("packages/*/src")))
        env["KERNELLAB_SOURCE_ROOT"] = str(self.path)
        return env

    def bench(self, commit: str, out: Path) -> Path:
        branch = self.git("rev-parse", "--abbrev-ref", "HEAD")
        self.git("checkout", "-q", commit)
        try:
            res = subprocess.run([sys.executable, "-m", "kernellab.harness", *self.bench_args, "--out", str(out)],
                                 cwd=self.path, env=self.env(), capture_output=True, text=True, timeout=600)
        finally:
            self.git("checkout", "-q", branch)
        assert out.exists(), res.stderr
        return out

    def audit(self, reference: Path, candidate: Path) -> tuple[int, dict]:
        out = self.path.parent / "audit.json"
        cmd = [sys.executable, "-m", "kernellab.audit", str(reference), str(candidate), "--out", str(out), "--quiet"]
        res = subprocess.run(cmd, cwd=self.path, env=self.env(), capture_output=True, text=True, timeout=600)
        assert out.exists(), f"{res.stdout}\n{res.stderr}"
        return res.returncode, json.loads(out.read_text())


@pytest.fixture
def repo(tmp_path):
    return Repo(tmp_path / "repo")


def _pair(repo, tmp_path, behaviour: str):
    base = repo.git("rev-parse", "HEAD")
    cand = repo.commit(behaviour, f"candidate: {behaviour}")
    return repo.bench(base, tmp_path / "ref.json"), repo.bench(cand, tmp_path / "cand.json")


def test_honest_revisions_pass(repo, tmp_path):
    ref, cand = _pair(repo, tmp_path, "honest")
    code, audit = repo.audit(ref, cand)
    assert audit["status"] == "pass", audit["reasons"]
    assert code == 0
    assert audit["replay_pairs"] == 2 and audit["executed_output_validations"] > 0
    assert audit["recorded_unchanged_artifacts"] == 2 and audit["current_artifacts_checked"] is True
    assert set(audit["source_reports_sha256"]) == {"reference", "candidate"}
    lo, hi = audit["torch_probe_control_ratio_range"]
    assert 0 < lo <= hi
    for field in ("replay_sha256", "audit_sha256", "summaries", "records"):
        assert field in audit
    assert audit["audit_sha256"] == report.report_hash(audit, "audit_sha256")


@pytest.mark.parametrize("behaviour, symptom", [
    ("skips_after_first_call", "unwritten or NaN"),
    ("caches_by_pointer", "elements wrong"),
    ("writes_input", "wrote its inputs"),
    ("leaves_tail_unwritten", "unwritten or NaN"),
])
def test_planted_kernels_fail(repo, tmp_path, behaviour, symptom):
    ref, cand = _pair(repo, tmp_path, behaviour)
    code, audit = repo.audit(ref, cand)
    assert audit["status"] == "fail" and code == 1
    assert any("validation(s) failed" in r and symptom in r for r in audit["reasons"]), audit["reasons"]


def _edit(path: Path, change, reseal: bool) -> None:
    data = json.loads(path.read_text())
    change(data)
    if reseal:
        data["sha256"] = report.report_hash(data)
    path.write_text(json.dumps(data))


def _scale_planted(factor):
    def change(data):
        for case in data["cases"]:
            if case["impl"] == "planted":
                for mode in case["modes"].values():
                    mode["rounds_us"] = [[x * factor for x in r] for r in mode["rounds_us"]]
                    mode["round_medians_us"] = [x * factor for x in mode["round_medians_us"]]
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


@pytest.mark.gpu
def test_graph_replaying_a_stale_result_fails(tmp_path):
    repo = Repo(tmp_path / "repo", ["--suite", "gpu-norm", "--cases", "softmax_256x3072_fp32", *BENCH[4:]])
    ref, cand = _pair(repo, tmp_path, "stale_graph")
    code, audit = repo.audit(ref, cand)
    assert code == 1
    assert any("validation(s) failed" in r for r in audit["reasons"]), audit["reasons"]


def test_usage_errors(tmp_path):
    from kernellab.audit.cli import main

    assert main(["only-one.json", "--repo", str(ROOT)]) == 64
    assert main(["--repo", str(tmp_path)]) == 64
