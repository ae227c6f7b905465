"""``kernellab-audit --ray``: the replay on a local Ray cluster on the CPU, each problem on a node that has
a device of the name its reports recorded, or said not to be replayed."""

import subprocess
import sys

import pytest

pytest.importorskip("ray", reason="Ray is not installed here (pip install 'kernellab-harness[ray]'): the cluster "
                                  "audit tests need it")

from test_audit import SMALL, Repo, _copy, only_noise  # noqa: E402

from kernellab.harness import cluster  # noqa: E402


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """A plain run and a cluster run of the planted contender, at one commit."""
    tmp = tmp_path_factory.mktemp("ray-audit")
    repo = Repo(tmp / "repo", SMALL)
    head = repo.git("rev-parse", "HEAD")
    plain = repo.bench(head, tmp / "plain.json")
    repo.bench_args = [*SMALL, "--ray"]
    on_cluster = repo.bench(head, tmp / "cluster.json")
    return repo, plain, on_cluster


def audit_on_cluster(repo, reference, candidate, out):
    cmd = [sys.executable, "-m", "kernellab.audit", str(reference), str(candidate), "--out", str(out), "--quiet",
           "--max-rounds", "2", "--ray"]
    res = subprocess.run(cmd, cwd=repo.path, env=repo.env(), capture_output=True, text=True, timeout=600)
    assert out.exists(), f"{res.stdout}\n{res.stderr}"
    import json

    return res.returncode, json.loads(out.read_text())


def test_each_problem_is_replayed_on_a_device_of_its_recorded_name(reports, tmp_path):
    repo, plain, on_cluster = reports
    code, audit = audit_on_cluster(repo, plain, on_cluster, tmp_path / "audit.json")
    checks = {c["name"]: c for c in audit["checks"]}
    matched = checks["each problem replayed on a device of its recorded name"]
    assert matched["passed"] is True, matched
    assert "reference report made on this device" not in checks  # the cluster's devices are matched instead
    assert audit["replay_pairs"] == 1 and audit["executed_output_validations"] > 0
    assert audit["replay_provenance"]["candidate"]["cluster"]["tasks"] == 1
    assert audit["status"] in ("pass", "inconclusive"), audit["reasons"]
    assert only_noise(audit["reasons"]), audit["reasons"]


def test_a_device_the_cluster_lacks_is_said_not_replayed(reports, tmp_path):
    repo, plain, on_cluster = reports

    def on_b200(data):
        for case in data["cases"]:
            case["device"] = {"kind": "cuda", "name": "NVIDIA B200"}
    ref = _copy(on_cluster, tmp_path / "ref.json", on_b200)
    cand = _copy(on_cluster, tmp_path / "cand.json", on_b200)
    code, audit = audit_on_cluster(repo, ref, cand, tmp_path / "audit.json")
    assert code == 2 and audit["status"] == "inconclusive"
    assert "replay_pairs" not in audit
    assert any("no problem can be replayed on the device its report recorded" in r
               and "no node of the cluster has a cuda device named 'NVIDIA B200'" in r for r in audit["reasons"]), \
        audit["reasons"]


def test_nodes_are_matched_by_device_name():
    nodes = [{"node_id": "a", "cpu": "Xeon", "gpus": ["NVIDIA H100 80GB HBM3"] * 2},
             {"node_id": "b", "cpu": "Xeon", "gpus": ["NVIDIA H200"]}]
    found, missing = cluster.nodes_with({"p": ("cuda", "NVIDIA H200"), "q": ("cuda", "NVIDIA H100 80GB HBM3"),
                                         "r": ("cpu", "Xeon"), "s": ("cuda", "NVIDIA B200")}, nodes)
    assert found == {"p": ["b"], "q": ["a"], "r": ["a", "b"]}
    assert missing == {"s": "no node of the cluster has a cuda device named 'NVIDIA B200' (it has "
                            "['NVIDIA H100 80GB HBM3', 'NVIDIA H200'])"}
