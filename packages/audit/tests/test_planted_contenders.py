"""Planted contenders, end to end (see test_audit.py for the repository the reports are benched in):
kernels that cheat and are failed by the audit's replay, plugins that cheat the bench's timing, and a
contender installed outside the checkout. Apart from test_audit.py so that the tests session's two
processes (one per file) share the end-to-end work."""

import json
from pathlib import Path

import pytest
from test_audit import BENCH, _pair


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


@pytest.mark.parametrize("behaviour, symptom", [
    ("works_when_poisoned", "timed batches gave wrong results"),
    ("patches_the_comparison", "harness's own code was replaced"),
    ("patches_its_samples", "harness's own code was replaced"),
])
def test_the_bench_fails_contenders_that_cheat_its_timing(repo, tmp_path, behaviour, symptom):
    commit = repo.commit(behaviour, behaviour)
    report = json.loads(repo.bench(commit, tmp_path / "run.json").read_text())
    case = next(c for c in report["cases"] if c["impl"] == "planted")
    assert case["status"] == "failed" and symptom in case["reason"], case["reason"]


def _outsider(site: Path, text: str) -> Path:
    """A contender installed outside the checkout, in no kernellab package: a module and its dist-info."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "outsider.py").write_text(text)
    info = site / "outsider-1.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: outsider\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[kernellab.suites]\ncpu-ops.outsider = outsider:impls\n")
    return site / "outsider.py"


OUTSIDER = '''
def impls():
    import torch
    from kernellab.harness.case import Impl, Unsupported

    def bind(problem):
        if problem.op != "softmax":
            raise Unsupported("softmax only")
        return lambda i, o: (torch.softmax(i["x"], dim=-1, out=o["y"]), o)[1]

    return [Impl("outsider", bind=bind)]
'''


def test_a_contender_installed_outside_the_checkout_is_hashed_and_rechecked(repo, tmp_path):
    module = _outsider(tmp_path / "site", OUTSIDER)
    repo.extra_paths.append(str(tmp_path / "site"))
    repo.bench_args = [a if a != "planted" else "outsider" for a in BENCH]
    head = repo.git("rev-parse", "HEAD")
    ref, cand = repo.bench(head, tmp_path / "ref.json"), repo.bench(head, tmp_path / "cand.json")
    recorded = json.loads(cand.read_text())["provenance"]["impl_sources"]["outsider"]
    assert recorded["distribution"] == "outsider" and not recorded["in_tree"] and "outsider.py" in recorded["files"]
    module.write_text(OUTSIDER + "\n# changed after the report\n")
    code, audit = repo.audit(ref, cand)
    assert code == 1 and any("contender code differs" in r and "outsider" in r for r in audit["reasons"])
    module.unlink()  # not installed where the audit runs: it cannot be re-checked or replayed
    code, audit = repo.audit(ref, cand)
    assert audit["status"] != "pass" and any("not installed here" in r for r in audit["reasons"]), audit["reasons"]
