"""kernellab-bench on a user's mistakes and interruptions: a clear one-line error (exit 2) before
anything is measured, never a traceback, never a lost or overwritten report."""

from __future__ import annotations

import datetime
import json
import threading
import types
from pathlib import Path

import pytest
from fakes import affine_suite, honest

from kernellab.harness import cli, registry, revision
from kernellab.harness import report as report_io
from kernellab.harness.case import Impl, Suite

QUICK = ["--rounds", "2", "--samples", "2", "--warmup", "0", "--iterations", "1", "--no-plot", "--quiet"]
# a real run (measured in a worker process, which sees the installed suites only): torch's softmax alone
REAL = ["--suite", "cpu-ops", "--cases", "softmax_128x512_fp32", "--impls", "torch", "--rotation-limit", "8", *QUICK]


@pytest.fixture
def affine(monkeypatch):
    """The fake suite 'affine' (torch and 'ours') and a GPU suite, as the only installed suites."""
    gpu = Suite(name="gpu-fake", device="cuda", description="a GPU suite", make_problems=lambda: [],
                impls=[Impl("torch", bind=lambda p: p.control)])
    suites = {"affine": affine_suite(Impl("ours", bind=honest), shapes=((4, 8),)), "gpu-fake": gpu}
    for s in suites.values():
        s.unavailable = {}
    monkeypatch.setattr(registry, "discover", lambda root=None, impls=True, names=None: (suites, {}))
    # the contenders' names, which a worker of the working tree would give the driver
    monkeypatch.setattr(cli, "catalog", lambda root: {"broken": {}, "suites": [
        registry.catalog_entry(s) for s in suites.values()]})
    return suites


@pytest.fixture
def no_run(monkeypatch):
    """Fails the test if a suite starts running: the options must be refused first."""
    def run_single(*args):
        raise AssertionError("the suite ran before its options were checked")
    monkeypatch.setattr(cli, "run_single", run_single)


def error_of(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("make_out, message", [
    (lambda tmp: tmp / "a-file" / "runs", r"a-file is a file, so the directory"),
    (lambda tmp: tmp / "a-file", r"is a file, not a directory"),
    (lambda tmp: tmp / "dir.json", r"is a directory; give a directory name"),
    (lambda tmp: tmp / ("x" * 300 + ".json"), r"is longer than this file system's"),
    (lambda tmp: tmp / ("d" * 300), r"is longer than this file system's"),
])
def test_a_bad_out_is_refused_before_the_run(affine, no_run, tmp_path, capsys, make_out, message):
    (tmp_path / "a-file").write_text("")
    (tmp_path / "dir.json").mkdir()
    assert cli.main(["--suite", "affine", *QUICK, "--out", str(make_out(tmp_path))]) == 2
    assert message.replace("\\", "") in error_of(capsys) or pytest.fail(capsys.readouterr().err)


def test_a_bad_out_message_names_the_file(affine, no_run, tmp_path, capsys):
    (tmp_path / "a-file").write_text("")
    assert cli.main(["--suite", "affine", *QUICK, "--out", str(tmp_path / "a-file" / "r.json")]) == 2
    assert f"{tmp_path / 'a-file'} is a file" in error_of(capsys)


@pytest.mark.parametrize("argv, message", [
    (["--impls", "nope"], "--impls pattern 'nope' matches none of ['ours', 'torch']"),
    (["--impls", "ours,nope*"], "--impls pattern 'nope*' matches none of"),
    (["--cases", "affine_*,nope"], "--cases pattern 'nope' matches none of ['affine_4x8_fp32']"),
    (["--format", "nope"], "--format 'nope' is not a table format; formats: "),
    (["--show", "r.json", "--pivot", "nope"], "--pivot 'nope' is not a mode; modes: "),
    (["--pivot", "e2e_latency"], "--pivot only applies with --show REPORT"),
])
def test_misspelt_options_are_refused(affine, no_run, tmp_path, capsys, argv, message):
    assert cli.main(["--suite", "affine", *QUICK, "--out", str(tmp_path), *argv]) == 2
    assert message in error_of(capsys)


def test_list_marks_gpu_suites_that_cannot_run_here(affine, monkeypatch, capsys):
    monkeypatch.setattr(cli, "cuda_available", lambda: False)
    assert cli.main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "gpu-fake (cuda): a GPU suite [cannot run here: no CUDA device]" in lines
    assert "affine (cpu): test suite" in lines


@pytest.fixture(scope="module")
def real_report(tmp_path_factory) -> Path:
    """One real report, benched once for the tests below, which read it or write damaged copies."""
    out = tmp_path_factory.mktemp("real") / "r.json"
    assert cli.main([*REAL, "--out", str(out)]) == 0
    return out


def test_show_refuses_what_is_not_a_report(tmp_path, capsys):
    (tmp_path / "binary.json").write_bytes(bytes(range(256)))
    (tmp_path / "folder").mkdir()
    for path, message in ((tmp_path / "binary.json", "is not a text file"), (tmp_path / "folder", "is a directory")):
        assert cli.main(["--show", str(path)]) == 2
        assert message in error_of(capsys)


@pytest.mark.parametrize("damage, message", [
    (lambda r: r.update(cases="none"), "field 'cases' must be a list"),
    (lambda r: r["cases"].__setitem__(0, 7), r"cases[0] must be an object"),
    (lambda r: r["cases"][0].pop("modes"), r"cases[0] lacks ['modes']"),
    (lambda r: r["cases"][0].update(modes=[1]), r"cases[0].modes must map each mode"),
])
def test_show_refuses_a_validly_hashed_report_with_a_wrong_inside(real_report, tmp_path, capsys, damage, message):
    data = json.loads(real_report.read_text())
    damage(data)
    data.pop(report_io.HASH_FIELD)
    data[report_io.HASH_FIELD] = report_io.report_hash(data)  # rehashed: the hash is fine, the inside is not
    (tmp_path / "bad.json").write_text(json.dumps(data))
    assert cli.main(["--show", str(tmp_path / "bad.json")]) == 2
    assert message in error_of(capsys)


def test_pivot_on_a_mode_the_report_lacks_is_refused(real_report, capsys):
    path = str(real_report)
    assert cli.main(["--show", path, "--pivot", "graph_throughput"]) == 2
    assert "has no graph_throughput measurements; it has ['e2e_throughput', 'e2e_latency']" in error_of(capsys)
    assert cli.main(["--show", path, "--pivot", "e2e_latency", "--format", "github"]) == 0


def _ctrl_c_at(monkeypatch, round_index: int) -> None:
    """Ctrl-C in the driver when it asks its worker for a case of round ``round_index``."""
    request = revision.Worker.request

    def interrupted(self, cmd, **args):
        if cmd == "case" and args.get("round") == round_index:
            raise KeyboardInterrupt
        return request(self, cmd, **args)
    monkeypatch.setattr(revision.Worker, "request", interrupted)


def test_ctrl_c_exits_130_keeping_the_completed_rounds(monkeypatch, tmp_path, capsys):
    _ctrl_c_at(monkeypatch, 1)
    assert cli.main([*REAL, "--rounds", "3", "--out", str(tmp_path)]) == 130
    err = error_of(capsys)
    [partial] = tmp_path.glob("cpu-ops-partial-*.json")
    assert f"the 1 of 3 rounds that completed are in {partial}" in err
    kept = report_io.load(partial)
    assert kept["interrupted"] == {"rounds_completed": 1, "rounds_planned": 3}
    assert kept["config"]["rounds"] == 1
    assert all(len(c["modes"]["e2e_throughput"]["round_medians_us"]) == 1 for c in kept["cases"]
               if c["status"] == "ok")


def test_ctrl_c_before_any_round_completes_saves_nothing(monkeypatch, tmp_path, capsys):
    _ctrl_c_at(monkeypatch, 0)
    assert cli.main([*REAL, "--out", str(tmp_path)]) == 130
    assert "no round had completed, nothing saved" in error_of(capsys)
    assert not list(tmp_path.iterdir())


def test_sigterm_is_taken_as_ctrl_c_keeping_the_completed_rounds(monkeypatch, tmp_path, capsys):
    """SIGTERM (a ``timeout``'s, a scheduler's) had ended the driver with nothing written, however many rounds had
    completed; it is now Ctrl-C: exit 130, the completed rounds in a partial report, the worker told too."""
    import os
    import signal

    request = revision.Worker.request
    told = []

    def terminated(self, cmd, **args):
        if cmd == "case" and args.get("round") == 1:
            told.extend(revision.Worker.live)
            os.kill(os.getpid(), signal.SIGTERM)
        return request(self, cmd, **args)
    monkeypatch.setattr(revision.Worker, "request", terminated)

    def untaken(signum, frame):  # where the driver took no SIGTERM of its own, it would end this test's process
        raise AssertionError("SIGTERM reached the test: the driver does not take it")
    before = signal.signal(signal.SIGTERM, untaken)
    try:
        assert cli.main([*REAL, "--rounds", "3", "--out", str(tmp_path)]) == 130
        assert signal.getsignal(signal.SIGTERM) is untaken  # restored after the run
    finally:
        signal.signal(signal.SIGTERM, before)
    [partial] = tmp_path.glob("cpu-ops-partial-*.json")
    assert f"the 1 of 3 rounds that completed are in {partial}" in error_of(capsys)
    assert report_io.load(partial)["interrupted"] == {"rounds_completed": 1, "rounds_planned": 3}
    assert told and not set(told) & revision.Worker.live  # the worker got SIGINT and was closed


def test_an_interrupted_ab_keeps_the_rounds_both_sides_completed_as_a_partial_comparison(affine, monkeypatch,
                                                                                           tmp_path, capsys):
    """An A/B stopped after two of three rounds (``run_sides`` keeps the rounds completed before Ctrl-C or SIGTERM)
    had been written as a whole comparison; it is a partial one now, exit 130, and none before a round completes."""
    import planted

    for kept in (2, 0):
        def run_sides(roots, request, rounds, kept=kept, **kw):
            sides = {"reference": planted.side(rounds=kept), "candidate": planted.side(110.0, seed=1, rounds=kept)}
            for side in sides.values():
                side["interrupted"] = {"rounds_completed": kept, "rounds_planned": 3}
            return sides
        monkeypatch.setattr(cli, "run_sides", run_sides)
        monkeypatch.setattr(registry, "discover", lambda root=None, impls=True, names=None: (
            {"affine": planted.suite()}, {}))
        monkeypatch.setattr(cli, "materialize", lambda rev, repo, dest: {
            "revision": rev, "kind": "git", "commit": "b" * 40, "root": str(dest)})
        out = tmp_path / str(kept)
        assert cli.main(["--suite", "affine", "--baseline", "HEAD", "--rounds", "3", "--out", str(out),
                         "--no-plot", "--quiet"]) == 130
        err = error_of(capsys)
        if not kept:
            assert "no round had completed, nothing saved" in err and not list(out.glob("*.json"))
            continue
        [partial] = out.glob("affine-partial-*.json")
        report = report_io.load(partial)
        assert report["kind"] == "comparison" and report["interrupted"]["rounds_completed"] == 2
        assert report["config"]["rounds"] == 2 and not list(out.glob("affine-ab-*.json"))
        assert all(len(r["e2e_latency"]["reference_rounds_us"]) == 2 for r in report["records"])
        assert cli.main(["--show", str(partial)]) == 0  # it verifies as any report does


def test_fresh_workers_is_asked_for_by_an_option_and_recorded_in_the_config(tmp_path, capsys):
    assert cli.main([*REAL, "--fresh-workers", "--out", str(tmp_path / "r.json")]) == 0
    report = report_io.load(tmp_path / "r.json")
    assert report["config"]["fresh_workers"] is True
    assert all(len(c["validations"]) == 2 for c in report["cases"] if c["status"] == "ok")


def test_runs_finishing_in_the_same_second_keep_both_reports(monkeypatch, tmp_path, capsys):
    frozen = datetime.datetime(2026, 12, 5, 3, 0, 0)
    monkeypatch.setattr(cli, "datetime", types.SimpleNamespace(datetime=types.SimpleNamespace(now=lambda: frozen)))
    for _ in range(2):
        assert cli.main([*REAL, "--out", str(tmp_path)]) == 0
    printed = [line.split(": ", 1)[1] for line in capsys.readouterr().out.splitlines() if line.startswith("report: ")]
    assert printed == [str(tmp_path / "cpu-ops-20261205T030000.json"),
                       str(tmp_path / "cpu-ops-20261205T030000-2.json")]
    hashes = {report_io.load(p)[report_io.HASH_FIELD] for p in printed}
    assert len(hashes) == 2


def test_concurrent_writers_of_one_name_each_keep_their_report(tmp_path):
    reports = [{"schema": report_io.SCHEMA, "kind": "before_after", "suite": "s", "metadata": {"n": n},
                "records": []} for n in range(8)]
    written = []
    threads = [threading.Thread(target=lambda r=r: written.append(report_io.write_new(r, tmp_path / "x.json")))
               for r in reports]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(written)) == 8
    assert sorted(report_io.load(p)["metadata"]["n"] for p in written) == list(range(8))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in written)  # no temporary left


def test_an_out_file_is_replaced_atomically(tmp_path):
    base = {"schema": report_io.SCHEMA, "kind": "before_after", "suite": "s", "records": []}
    report_io.write({**base, "metadata": {"n": 1}}, tmp_path / "x.json")
    report_io.write({**base, "metadata": {"n": 2}}, tmp_path / "x.json")
    assert report_io.load(tmp_path / "x.json")["metadata"] == {"n": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


PLANTED_IN_DRIVER = '''
import os


def impls():
    import torch
    from kernellab.harness.case import Impl, Unsupported

    with open(os.environ["PLANTED_MARKS"], "a") as f:  # where its factory ran: a worker, or the driver
        f.write(f"{os.getpid()} {os.environ.get('KERNELLAB_WORKER_LABEL', 'driver')}\\n")

    def bind(problem):
        if problem.op != "softmax":
            raise Unsupported("softmax only")
        return lambda i, o: (torch.softmax(i["x"], dim=-1, out=o["y"]), o)[1]

    return [Impl("outsider", bind=bind)]
'''


def test_no_contender_code_runs_in_the_driver(monkeypatch, tmp_path, capsys):
    """A contender's factory run in the driver (every suite's impls were loaded there to list and match them) could
    rewrite the samples its workers reply, the report or the gate's verdict, unseen by any worker's seal: the driver
    loads the suites without their impls and takes the impls' names from a worker."""
    marks = tmp_path / "marks"
    _planted_distribution(tmp_path, monkeypatch, "outsider", PLANTED_IN_DRIVER)
    monkeypatch.setenv("PLANTED_MARKS", str(marks))
    assert cli.main(["--list"]) == 0
    assert "impls: torch, native, outsider" in capsys.readouterr().out
    assert cli.main(["--impls", "nope"]) == 2
    assert "matches none of ['native', 'outsider', 'torch']" in capsys.readouterr().err
    out = tmp_path / "r.json"
    assert cli.main([*REAL, "--impls", "torch,outsider", "--out", str(out)]) == 0
    assert {c["impl"]: c["status"] for c in json.loads(out.read_text())["cases"]} == {"torch": "ok", "outsider": "ok"}
    ran = [line.split() for line in marks.read_text().splitlines()]
    assert ran and all(label != "driver" and int(pid) != __import__("os").getpid() for pid, label in ran), ran


PLANTED_PROCESS = '''
import os
import subprocess


def impls():
    if os.environ.get("KERNELLAB_WORKER_LABEL") == "catalog":  # a process left running beside every later case
        child = subprocess.Popen(["sh", "-c", "sleep 60 & echo $! > \\"$PLANTED_PID\\""])
        child.wait()  # a double fork: the sleep is an orphan
    return []
'''


def test_a_process_a_contender_leaves_in_the_listing_worker_is_killed(monkeypatch, tmp_path, capsys):
    """The driver's listing worker imports every contender and measures nothing; a process one leaves there (an
    orphan by a double fork) had outlived it, loading the machine under every case measured after it."""
    _planted_distribution(tmp_path, monkeypatch, "lingerer", PLANTED_PROCESS)
    assert cli.main(["--list"]) == 2
    err = error_of(capsys)
    assert "ProcessLeft" in err and "after the contenders' imports, killed" in err, err
    assert _gone(int((tmp_path / "pid").read_text())), "the planted process outlived the listing worker"


def test_a_cluster_runs_cases_expect_the_control_whatever_the_listing_says(affine, monkeypatch, tmp_path):
    """The cluster's expected cases of a problem (what a failed task leaves as failed) came from the listing worker,
    which has imported contender code: a listing forged empty let a problem whose task a contender killed vanish
    from the report, and the gate pass. The control, from this process's suite, is always expected."""
    import argparse

    from kernellab.harness import cluster

    seen = {}

    def run_plan(client, plan, problems, expected, checkpoint, display):
        seen.update(expected)
        info = {"run_s": 0.0, "nodes": [], "ray_startup_s": 0.0}
        return {"candidate": {"provenance": {"cluster": info}}}

    monkeypatch.setattr(cli, "catalog", lambda root: {"broken": {}, "suites": [
        {**registry.catalog_entry(affine["affine"]), "impls": []}]})  # a forged listing: no impl at all
    monkeypatch.setattr(cluster, "run_plan", run_plan)
    args = argparse.Namespace(cases=None, impls=None, ray_cpus=None, case_timeout=None, resume=None, quiet=True,
                              out=str(tmp_path / "r.json"), checkpoints=[], cluster=None)
    config = cli.config_for(affine["affine"], argparse.Namespace(
        rounds=1, samples=1, warmup=0, iterations=1, modes=None, rotation_limit=None, seed=0))
    cli.cluster_sides(affine["affine"], config, args, {"candidate": tmp_path})
    assert seen and all([c["impl"] for c in cases] == ["torch"] for cases in seen.values()), seen


PLANTED_UNKILL = '''
import os
import subprocess


def impls():
    if os.environ.get("KERNELLAB_WORKER_LABEL") == "catalog":
        from kernellab.harness import threads
        threads.kill_children = lambda what: None  # so that the process below lives on
        child = subprocess.Popen(["sh", "-c", "sleep 60 & echo $! > \\"$PLANTED_PID\\""])
        child.wait()
    return []
'''

PLANTED_CLONE_PARENT = '''
import ctypes
import os
import sys


def impls():
    if os.environ.get("KERNELLAB_WORKER_LABEL") not in (None, "catalog"):  # a measuring worker's setup
        libc = ctypes.CDLL(None, use_errno=True)
        pid = libc.syscall(56, 0x00008000 | 17, 0, 0, 0, 0)  # clone(CLONE_PARENT | SIGCHLD): the driver's child
        if pid == 0:
            os.execv("/bin/sleep", ["sleep", "60"])
        with open(os.environ["PLANTED_PID"], "w") as f:
            f.write(str(pid))
    return []
'''


def _planted_distribution(tmp_path, monkeypatch, module: str, text: str):
    site = tmp_path / "site"
    info = site / f"{module}-1.0.dist-info"
    info.mkdir(parents=True)
    (site / f"{module}.py").write_text(text)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[kernellab.suites]\ncpu-ops.{module} = {module}:impls\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setenv("PLANTED_PID", str(tmp_path / "pid"))


def _gone(pid: int) -> bool:
    import os
    import time

    from kernellab.harness import threads

    for _ in range(100):
        if not threads.running(pid):
            return True
        time.sleep(0.05)
    os.kill(pid, 9)
    return False


def test_a_listing_worker_whose_contender_disarmed_its_kill_is_refused(monkeypatch, tmp_path, capsys):
    """The listing worker's kill of the processes left, replaced by a contender's import with one that does
    nothing: the kill is the one bound before any contender ran, and the replacement is named."""
    _planted_distribution(tmp_path, monkeypatch, "unkill", PLANTED_UNKILL)
    assert cli.main(["--list"]) == 2
    err = error_of(capsys)
    assert "replaced during the contenders' imports: ['threads.kill_children']" in err, err
    assert _gone(int((tmp_path / "pid").read_text())), "the planted process outlived the listing worker"


@pytest.mark.skipif(__import__("platform").machine() != "x86_64", reason="the planted clone is x86-64's syscall")
def test_a_process_a_worker_makes_the_drivers_child_fails_the_run(monkeypatch, tmp_path, capsys):
    """clone(CLONE_PARENT) from contender code makes the new process the driver's child, outside every check the
    worker makes of its own children: the driver counts its own children around each request."""
    _planted_distribution(tmp_path, monkeypatch, "cloner", PLANTED_CLONE_PARENT)
    assert cli.main([*REAL, "--out", str(tmp_path / "r.json")]) == 2
    err = error_of(capsys)
    assert "became this driver's children during worker candidate's 'setup'" in err, err
    assert _gone(int((tmp_path / "pid").read_text())), "the planted process outlived the run"


def test_a_reply_cut_short_is_held_to_its_deadline(tmp_path):
    """A worker that writes half a reply line and stops had held the driver past any timeout (the deadline was for
    the first byte): the whole line must come within it."""
    import os
    import time
    import types

    r, w = os.pipe()
    worker = object.__new__(revision.Worker)
    worker.proc, worker._pending = types.SimpleNamespace(stdout=os.fdopen(r, "rb")), b""
    os.write(w, b'{"ok": true')
    started = time.monotonic()
    assert worker._read_line(0.3) is None and time.monotonic() - started < 5
    os.write(w, b', "n": 1}\n{"next"')
    assert worker._read_line(0.3) == '{"ok": true, "n": 1}\n' and worker._pending == b'{"next"'
    os.close(w)
    assert worker._read_line(None) == ""
