"""Suites on a local Ray cluster on the CPU (``kernellab-bench --ray``): two worker nodes of one CPU each
on this machine, planted suites installed outside the checkout (tests/ray_planted)."""

import json
import os
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed here (pip install 'kernellab-harness[ray]'): "
                                        "the cluster tests need it")

from ray.cluster_utils import Cluster  # noqa: E402

from kernellab.harness import assemble, cli, cluster, consistency, registry  # noqa: E402
from kernellab.harness import report as report_io  # noqa: E402
from kernellab.harness.runner import Config  # noqa: E402

PLANTED = Path(__file__).parent / "ray_planted"
ROOT = Path(__file__).resolve().parents[3]
QUICK = ["--impls", "torch", "--modes", "e2e_throughput", "--rounds", "1", "--samples", "2", "--warmup", "0",
         "--iterations", "1", "--rotation-limit", "1", "--no-plot", "--quiet"]
CPU_CASES = "softmax_128x512_fp32,rmsnorm_128x512_fp32"


@pytest.fixture(scope="module")
def local_cluster():
    """A head and one worker node, one CPU each, that see the planted suites (workers inherit the
    PYTHONPATH the nodes start with); yields a function that sets the number of nodes."""
    old_path = os.environ.get("PYTHONPATH")
    os.environ["RAY_worker_niceness"] = "0"  # as connect() does for a local cluster: un-niced workers
    os.environ["PYTHONPATH"] = os.pathsep.join([str(PLANTED), *([old_path] if old_path else [])])
    sys.path.insert(0, str(PLANTED))
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    extra = []

    def nodes(n: int) -> None:
        while 1 + len(extra) < n:
            extra.append(c.add_node(num_cpus=1))
        while 1 + len(extra) > n:
            c.remove_node(extra.pop())
        c.wait_for_nodes()
        deadline = time.monotonic() + 60
        while len([x for x in ray.nodes() if x["Alive"]]) != n and time.monotonic() < deadline:
            time.sleep(0.2)

    ray.init(address=c.address)
    try:
        yield nodes
    finally:
        ray.shutdown()
        c.shutdown()
        sys.path.remove(str(PLANTED))
        if old_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old_path


CONFIG = Config(rounds=1, samples=2, warmup=0, iterations=1, modes=("e2e_throughput",), rotate=False)


def run_planted(suite_name: str, display=None, checkpoint=None):
    """A planted suite over the cluster through the API the CLI uses: the merged run report."""
    suite = registry.get(suite_name)
    problems = [p.name for p in suite.make_problems()]
    expected = {p.name: [{"id": f"{p.name}/{i.name}", "problem": p.describe(), "impl": i.name, "status": "failed",
                          "reason": None} for i in suite.impls] for p in suite.make_problems()}
    plan = cluster.Plan(trees={"candidate": ROOT}, rounds=1, device="cpu",
                        request={"suite": suite_name, "config": CONFIG.to_json(), "cases": None, "impls": None})
    sides = cluster.run_plan(cluster.connect("auto"), plan, problems, expected, checkpoint, display)
    side = sides["candidate"]
    side["revision"] = {"revision": "working tree"}
    return report_io.seal(assemble.run_report(suite, CONFIG.to_json(), side)), plan


def test_wall_time_falls_with_workers(local_cluster):
    """Two fixed-duration problems: one worker runs them one after the other, two side by side, so two workers
    save about one problem's sleep. Read as time saved, not as a ratio of wall times: a loaded machine adds
    seconds of worker start-up to both runs, which a ratio would count against the cluster."""
    from rayplant_suites import SLEEP_S

    walls = {}
    for n in (1, 2):
        local_cluster(n)
        t0 = time.monotonic()
        report, _ = run_planted("ray-sleepy")
        walls[n] = time.monotonic() - t0
        assert all(c["status"] == "ok" for c in report["cases"]), report["cases"]
        assert len({c["device"]["node_id"] for c in report["cases"]}) == n
    assert walls[1] - walls[2] >= 0.5 * SLEEP_S, walls


def test_a_problem_whose_worker_dies_is_retried_then_failed_while_the_rest_completes(local_cluster):
    local_cluster(2)
    seen = []

    class Watch(cluster.Display):
        def set(self, problem, state, node=None):
            seen.append((problem, state))
            super().set(problem, state, node)

    report, _ = run_planted("ray-crashy", display=Watch(3, enabled=False))
    by_id = {c["id"]: c for c in report["cases"]}
    boom = "affine_4x3_fp32"
    assert sorted(by_id) == sorted(f"affine_4x{n}_fp32/{i}" for n in (2, 3, 5) for i in ("torch", "crasher"))
    for impl in ("torch", "crasher"):
        case = by_id[f"{boom}/{impl}"]
        assert case["status"] == "failed" and "died during 'setup'" in case["reason"], case
        assert case["validations"] == [] and case["modes"] == {}
    assert [s for p, s in seen if p == boom].count("queued") == 1  # sent back once: one retry, no more
    assert report["provenance"]["cluster"]["failed_problems"][boom]
    first, second = report["provenance"]["cluster"]["retried_problems"][boom]
    assert "died during 'setup'" in first and "died during 'setup'" in second
    assert first.rsplit(" (on ", 1)[1] != second.rsplit(" (on ", 1)[1]  # the retry ran on the other node
    for n in (2, 5):
        assert all(by_id[f"affine_4x{n}_fp32/{i}"]["status"] == "ok" for i in ("torch", "crasher"))
    assert consistency.check(report) == []


def test_a_run_killed_midway_leaves_no_report_and_resume_finishes_it(local_cluster, tmp_path, monkeypatch):
    """cpu-ops by the CLI over two workers: Ctrl-C after the first problem leaves a checkpoint and no
    report; --resume runs only the other problem; the report has the same cases and fields as a run
    in one process."""
    local_cluster(2)
    real_set = cluster.Display.set

    def interrupt_after_first(self, problem, state, node=None):
        real_set(self, problem, state, node)
        if state == "done":
            raise KeyboardInterrupt

    monkeypatch.setattr(cluster.Display, "set", interrupt_after_first)
    out = tmp_path / "ray"
    assert cli.main(["--ray", "auto", "--suite", "cpu-ops", "--cases", CPU_CASES, *QUICK, "--out", str(out)]) == 130
    [checkpoint] = out.glob("*.checkpoint.jsonl")
    assert not list(out.glob("*.json"))  # no partial report
    first = [json.loads(line)["problem"] for line in checkpoint.read_text().splitlines()[1:]]
    assert len(first) >= 1

    monkeypatch.setattr(cluster.Display, "set", real_set)
    started = []
    monkeypatch.setattr(cluster.Display, "set", lambda self, p, s, node=None: (started.append((p, s)),
                                                                               real_set(self, p, s, node)))
    assert cli.main(["--ray", "auto", "--resume", str(checkpoint), "--cases", CPU_CASES, *QUICK,
                     "--out", str(out)]) == 0
    assert not [p for p, s in started if s == "running" and p in first]  # the completed problem is not redone
    [ray_report] = out.glob("*.json")
    assert not checkpoint.exists()

    single = tmp_path / "single.json"
    assert cli.main(["--suite", "cpu-ops", "--cases", CPU_CASES, *QUICK, "--out", str(single)]) == 0
    merged, alone = report_io.load(ray_report), report_io.load(single)
    assert [c["id"] for c in merged["cases"]] == [c["id"] for c in alone["cases"]]
    assert sorted(merged) == sorted(alone)
    assert [sorted(set(c) - {"device"}) for c in merged["cases"]] == [sorted(c) for c in alone["cases"]]
    assert all(c["status"] == "ok" and c["device"]["kind"] == "cpu" for c in merged["cases"])
    assert merged["provenance"]["git"]["commit"] == alone["provenance"]["git"]["commit"]
    assert consistency.check(merged) == []
