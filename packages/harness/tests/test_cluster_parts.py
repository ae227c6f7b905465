"""The cluster run's parts that need no cluster: checkpoint, patterns, failure reasons, the display."""

import asyncio
import io
import json
import types

import pytest

from kernellab.harness import cluster
from kernellab.harness.runner import match


def test_a_checkpoint_of_another_run_is_refused(tmp_path):
    path = tmp_path / "c.checkpoint.jsonl"
    cluster.Checkpoint.start(path, {"suite": "cpu-ops", "trees": {"candidate": "a"}})
    with pytest.raises(cluster.ClusterError, match=r"belongs to another run; it differs in \['trees'\]"):
        cluster.Checkpoint.resume(path, {"suite": "cpu-ops", "trees": {"candidate": "b"}})
    with path.open("a") as f:
        f.write(json.dumps({"problem": "p1", "result": {}}) + "\n" + '{"problem": "p2", "res')  # killed mid-line
    done = cluster.Checkpoint.resume(path, {"suite": "cpu-ops", "trees": {"candidate": "a"}}).done
    assert list(done) == ["p1"]


def test_exact_pattern_matches_only_its_name():
    name = "op_[1]x*_fp32"
    assert match(name, cluster.exact(name))
    assert not match("op_1x2_fp32", cluster.exact(name))


def test_failure_reason_names_the_exception_inside_the_task():
    err = types.SimpleNamespace(cause=RuntimeError("worker candidate died during 'setup'\nmore"))
    assert cluster.failure_reason(err) == "RuntimeError: worker candidate died during 'setup'"


def test_the_display_counts_problems_in_all_and_per_node():
    out = io.StringIO()
    display = cluster.Display(4, out=out)
    a, b = {"host": "gpu1", "node_id": "aaaaaa99"}, {"host": "gpu2", "node_id": "bbbbbb99"}
    for p in "pqrs":
        display.state[p] = ("queued", "?")
    display.set("p", "running", a)
    display.set("q", "running", b)
    display.set("p", "done")
    display.set("r", "running", a)
    display.set("q", "failed")
    assert display.line() == ("cluster: 2/4 problems finished (1 done, 1 failed), 1 running | gpu1:aaaaaa: 1 done, "
                              "1 running | gpu2:bbbbbb: 1 failed")
    lines = out.getvalue().splitlines()
    assert len(lines) == 5 and lines[0].endswith("0/4 problems finished (0 done, 0 failed), 1 running | "
                                                 "gpu1:aaaaaa: 1 running")
    display.set("r", "running", a)  # no change: no line
    assert len(out.getvalue().splitlines()) == 5


@pytest.mark.parametrize("device, cpus, want", [
    ("cuda", None, {"num_gpus": 1, "num_cpus": 1}),
    ("cuda", 4, {"num_gpus": 1, "num_cpus": 4}),
    ("cpu", None, {"num_gpus": 0, "num_cpus": 16}),  # the smallest node's cores: a node to itself anywhere
    ("cpu", 2, {"num_gpus": 0, "num_cpus": 2}),
])
def test_a_task_takes_one_gpu_or_a_whole_nodes_cores(device, cpus, want):
    session = types.SimpleNamespace(nodes=lambda: [{"resources": {"CPU": 32.0, "GPU": 8.0}},
                                                   {"resources": {"CPU": 16.0, "GPU": 2.0}}])
    plan = cluster.Plan(trees={}, request={}, rounds=1, device=device, cpus=cpus)
    assert cluster.task_resources(session, plan) == want


def test_a_cpu_suite_on_a_cluster_without_cpus_is_a_clear_error():
    plan = cluster.Plan(trees={}, request={}, rounds=1, device="cpu")
    with pytest.raises(cluster.ClusterError, match="no node with CPUs"):
        cluster.task_resources(types.SimpleNamespace(nodes=lambda: []), plan)


def test_cluster_options_without_ray_are_refused(capsys, tmp_path):
    from kernellab.harness import cli

    assert cli.main(["--suite", "cpu-ops", "--resume", str(tmp_path / "x.jsonl"), "--out", str(tmp_path)]) == 2
    assert "--resume applies to a cluster run only: add --ray [ADDRESS]" in capsys.readouterr().err
    path = tmp_path / "not-a-checkpoint.jsonl"
    path.write_text('{"format": "something else"}\n')
    assert cli.main(["--ray", "--resume", str(path), "--out", str(tmp_path)]) == 2
    assert "not a kernellab checkpoint" in capsys.readouterr().err


def test_ray_missing_is_a_clear_error(monkeypatch, capsys, tmp_path):
    import sys

    from kernellab.harness import cli

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails
    assert cli.main(["--ray", "--suite", "cpu-ops", "--out", str(tmp_path)]) == 2
    assert "pip install 'kernellab-harness[ray]'" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing measured, nothing written


def test_a_task_takes_back_normal_priority_where_it_may():
    """Ray starts workers at niceness 15; a task run at that niceness on a busy host measures the scheduler."""
    import os
    import subprocess
    import sys

    code = ("import os; os.nice(7); from kernellab.harness import cluster; "
            "print(cluster.normal_priority(), os.getpriority(os.PRIO_PROCESS, 0))")
    got, now = map(int, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                       check=True).stdout.split())
    assert got == now  # what it reports is what it runs at
    if os.geteuid() == 0:
        assert got == 0
    else:
        assert got in (0, 7)  # lowering niceness needs root or an RLIMIT_NICE allowing it


def _outcome(problem: str, host: str, sources: dict, impls: dict, packages: list[str]) -> dict:
    case = {"id": f"{problem}/torch", "impl": "torch", "status": "ok"}
    prov = {"device": {"kind": "cpu"}, "sources_sha256": sources, "impl_sources": impls,
            "measured_packages": packages, "artifacts_sha256": {}}
    side = {"cases": [case], "rounds": [{case["id"]: {"passed": True}}], "provenance": prov}
    return {"problem": problem, "result": {"problem": problem, "node": {"node_id": host, "host": host},
                                           "sides": {"candidate": side}}}


def test_problems_measuring_different_packages_merge_into_their_union():
    """A copy problem measures torch alone, a softmax problem the kernels too: both are the same code,
    so both are ok and the report holds every file either measured; a file recorded otherwise fails
    that problem, naming it."""
    kernels = {"kernels/bench.py": "k1"}
    outcomes = {
        "copy": _outcome("copy", "a", {"harness/case.py": "h1"}, {}, ["harness"]),
        "softmax": _outcome("softmax", "b", {"harness/case.py": "h1", **kernels},
                            {"native": {"files": {"bench.py": "k1"}}}, ["harness", "kernels"]),
        "rmsnorm": _outcome("rmsnorm", "c", {"harness/case.py": "h1", "kernels/bench.py": "OTHER"},
                            {"native": {"files": {"bench.py": "OTHER"}}}, ["harness", "kernels"]),
    }
    expected = {p: [{"id": f"{p}/torch", "impl": "torch", "status": "failed", "reason": None}] for p in outcomes}
    merged = cluster.merge(outcomes, expected, ["candidate"], {"candidate": {}}, {"tasks": 3})["candidate"]
    status = {c["id"]: c for c in merged["cases"]}
    assert status["copy/torch"]["status"] == "ok" and status["softmax/torch"]["status"] == "ok"
    bad = status["rmsnorm/torch"]
    assert bad["status"] == "failed" and "differs from earlier problems'" in bad["reason"], bad
    assert "sources_sha256['kernels/bench.py']" in bad["reason"] and "impl_sources['native']" in bad["reason"]
    prov = merged["provenance"]
    assert prov["sources_sha256"] == {"harness/case.py": "h1", **kernels}
    assert prov["impl_sources"] == {"native": {"files": {"bench.py": "k1"}}}
    assert prov["measured_packages"] == ["harness", "kernels"]


def test_the_board_answers_a_wait_once_a_task_has_started():
    """The driver waits on the board instead of polling it: ``after(n)`` returns the starts past the first n,
    and only once there is one."""

    async def scenario():
        board = cluster.Board()
        await board.start("a", 1, {"host": "h"})
        assert await board.after(0) == [("a", 1, {"host": "h"})]
        waiting = asyncio.ensure_future(board.after(1))
        await asyncio.sleep(0)
        assert not waiting.done()  # nothing new yet: the call waits
        await board.start("b", 1, {"host": "h"})
        assert await asyncio.wait_for(waiting, 5) == [("b", 1, {"host": "h"})]

    asyncio.run(scenario())
