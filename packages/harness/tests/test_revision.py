import subprocess
import zipfile

import pytest

from kernellab.harness.revision import RevisionError, materialize


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "repo"
    (repo / "packages" / "harness").mkdir(parents=True)
    (repo / "packages" / "harness" / "version.txt").write_text("one\n")
    _git(repo, "init", "-q")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "empty")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    (repo / "packages" / "harness" / "version.txt").write_text("two\n")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "two")
    return repo


def test_materializes_an_older_revision(repo, tmp_path):
    info = materialize("HEAD~1", repo, tmp_path / "old")
    assert info["kind"] == "git" and len(info["commit"]) == 40
    assert (tmp_path / "old" / "packages" / "harness" / "version.txt").read_text() == "one\n"
    assert (repo / "packages" / "harness" / "version.txt").read_text() == "two\n"


def test_materializes_head_by_commit_hash(repo, tmp_path):
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    info = materialize(head, repo, tmp_path / "head")
    assert info["commit"] == head
    assert (tmp_path / "head" / "packages" / "harness" / "version.txt").read_text() == "two\n"


def test_materializes_a_source_zip(tmp_path):
    z = tmp_path / "src.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("kernellab-1.0/packages/harness/version.txt", "zip\n")
    info = materialize(str(z), tmp_path, tmp_path / "unzipped")
    assert info["kind"] == "zip" and len(info["zip_sha256"]) == 64
    assert (tmp_path / "unzipped" / "kernellab-1.0" / "packages" / "harness" / "version.txt").exists()
    assert info["root"].endswith("kernellab-1.0")


def test_unknown_revision_is_a_clear_error(repo, tmp_path):
    with pytest.raises(RevisionError, match="'nope' is neither a commit"):
        materialize("nope", repo, tmp_path / "x")


def test_a_revision_without_the_harness_is_refused(repo, tmp_path):
    with pytest.raises(RevisionError, match="no packages/harness"):
        materialize("HEAD~2", repo, tmp_path / "empty")


def test_a_zip_with_escaping_paths_is_refused(tmp_path):
    z = tmp_path / "evil.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("../escape.txt", "x")
    with pytest.raises(RevisionError, match="unsafe path"):
        materialize(str(z), tmp_path, tmp_path / "out")


def test_a_worker_keeps_the_callers_pythonpath_after_its_tree(tmp_path):
    """Dependencies reachable only through PYTHONPATH (CuTe DSL on an offline GPU host) stay importable in
    the worker, behind the tree's own package sources."""
    import os

    from kernellab.harness.revision import worker_pythonpath

    for name in ("harness", "kernels"):
        (tmp_path / "packages" / name / "src").mkdir(parents=True)
    inherited = os.pathsep.join(["/opt/site", "/opt/site/dsl"])
    parts = worker_pythonpath(tmp_path, inherited).split(os.pathsep)
    assert parts == [str(tmp_path / "packages" / "harness" / "src"), str(tmp_path / "packages" / "kernels" / "src"),
                     "/opt/site", "/opt/site/dsl"]
    assert worker_pythonpath(tmp_path, None).split(os.pathsep) == parts[:2]
    assert worker_pythonpath(tmp_path, "").split(os.pathsep) == parts[:2]


def test_extra_rounds_go_to_whole_problems_whose_interval_is_wide_and_never_to_failed_cases():
    from kernellab.harness.revision import _wide_pairs

    def side(spread):
        def data(k, passed=True):
            return {"passed": passed, "samples_us": {"e2e_throughput": [10.0 + spread * ((k * 7) % 5) for _ in [0]]
                                                    + [10.0 + spread * ((k * 3) % 4)] * 5}}
        return {"rounds": [{"p/torch": data(r), "p/ours": data(r + 1), "q/torch": data(r),
                            "q/ours": data(r, passed=False), "s/torch": data(r), "s/ours": data(r)}
                           for r in range(3)]}
    quiet, loud = side(0.0), side(8.0)
    sides = {"reference": quiet, "candidate": {"rounds": [dict(r) for r in quiet["rounds"]]}}
    for r in range(3):  # only p/ours is noisy on the candidate side
        sides["candidate"]["rounds"][r]["p/ours"] = loud["rounds"][r]["p/ours"]
        sides["candidate"]["rounds"][r]["q/ours"] = loud["rounds"][r]["q/ours"]
    ids = ["p/torch", "p/ours", "q/torch", "q/ours", "s/torch", "s/ours"]
    assert _wide_pairs(sides, ids, 1.10, 100) == ["p/torch", "p/ours"]  # its control too; q failed; s is quiet


def _planted_sides(monkeypatch, suite: str, rounds: int, sides=("candidate",), *, case_timeout_s=None,
                   **config) -> dict:
    """``run_sides`` of one planted suite (``ray_planted``, found through its entry points) with every side in this
    checkout, ``rounds`` rounds of a short config (``config`` overrides its fields)."""
    from pathlib import Path

    from kernellab.harness.revision import run_sides
    from kernellab.harness.runner import Config

    planted = Path(__file__).parent / "ray_planted"
    monkeypatch.setenv("PYTHONPATH", str(planted))
    monkeypatch.syspath_prepend(str(planted))
    config = Config(**{"rounds": rounds, "samples": 2, "warmup": 0, "iterations": 1, "modes": ("e2e_throughput",),
                       "rotate": False, **config})
    request = {"suite": suite, "config": config.to_json(), "cases": None, "impls": None}
    root = Path(__file__).resolve().parents[3]
    return run_sides({side: root for side in sides}, request, rounds, progress=False, case_timeout_s=case_timeout_s)


def test_a_case_past_its_timeout_kills_its_worker(monkeypatch):
    """A kernel that never returns: its worker is killed once the case runs past the timeout, and the
    error says so (a cluster task then retries it, then records it failed)."""
    import time

    t0 = time.monotonic()
    with pytest.raises(RevisionError, match=r"gave no answer to 'case' within 10 s \(a hung kernel\?\); it was killed"):
        _planted_sides(monkeypatch, "ray-hung", 1, case_timeout_s=10)
    assert time.monotonic() - t0 < 120


@pytest.mark.parametrize("suite, how", [("ray-case-crash", "died during 'case' with exit code -11"),
                                        ("ray-case-leave", "left during 'case': its reply channel")])
def test_a_case_that_ends_its_worker_fails_alone_and_the_run_goes_on(monkeypatch, suite, how):
    """A contender that crashes its worker (or makes it leave, as a stray thread at a reply does) in one case had
    ended the whole run, every case measured before it lost: that case now fails on its side with the reason, is
    not run again, and the side goes on in a fresh worker, so every other case of every round is measured."""
    from kernellab.harness import assemble

    side = _planted_sides(monkeypatch, suite, 2)["candidate"]
    impl = "crashes" if "crash" in suite else "leaves"
    ender = f"affine_4x3_fp32/{impl}"
    for r, measured in enumerate(side["rounds"]):
        assert measured[ender]["passed"] is False and "samples_us" not in measured[ender]
        assert measured[ender]["error"].startswith("WorkerLost: worker candidate") and how in measured[ender]["error"]
        assert "(round 1; not run again" in measured[ender]["error"], r  # lost once, in round 1, skipped after
        others = [cid for cid in measured if cid != ender]
        assert len(others) == 5 and all(measured[cid]["passed"] and measured[cid]["samples_us"] for cid in others)
    cases = {c["id"]: c for c in assemble.case_table(side["cases"], side["rounds"])}
    assert cases[ender]["status"] == "failed" and "WorkerLost" in cases[ender]["reason"]
    assert all(c["status"] == "ok" for cid, c in cases.items() if cid != ender)


def test_a_side_that_keeps_losing_its_worker_stops_the_run(monkeypatch):
    """Past ``MAX_WORKER_LOSSES`` lost cases the tree, not a case, is broken: the run stops and says so."""
    from kernellab.harness import revision

    with pytest.raises(RevisionError, match=rf"worker candidate was lost in {revision.MAX_WORKER_LOSSES + 1} cases"):
        _planted_sides(monkeypatch, "ray-case-crash-everywhere", 1)


def test_an_ab_runs_an_even_count_of_rounds_so_neither_order_leads_the_median(monkeypatch):
    """The per-round gain's median over 3 alternating rounds (A B, B A, A B) is a round of the majority order, so a
    cost of running first (or a drift) goes into the gain whole; over 4 it cancels. An A/B asked for 3 rounds runs
    4 (both sides: the same tree here), and its stopping reason says why."""
    from kernellab.harness import stats

    first_costs = [[1.03], [0.97], [1.03], [0.97]]  # ref/cand per round where the side run first is 3% slower
    ones = [[1.0]] * 4
    assert stats.ratio_stats(first_costs[:3], ones[:3])["value"] == 1.03
    assert abs(stats.ratio_stats(first_costs, ones)["value"] - 1.0) < 1e-3
    sides = _planted_sides(monkeypatch, "ray-quick", 3, ("reference", "candidate"))
    for side in sides.values():
        assert len(side["rounds"]) == 4 and all(len(r) == 2 for r in side["rounds"])
        assert side["stopping"]["rounds"] == 4 and "one more so that each side ran first" in side["stopping"]["reason"]
    one_side = _planted_sides(monkeypatch, "ray-quick", 3)["candidate"]
    assert len(one_side["rounds"]) == 3  # a plain run has no order to balance


def test_fresh_workers_start_a_worker_a_side_every_round(monkeypatch):
    """With ``fresh_workers`` what one process fixes varies between rounds: each round of each side is measured by
    a worker of its own (counted as the driver starts them), and every round still measures every case."""
    from kernellab.harness import revision

    started = []
    init = revision.Worker.__init__

    def counted(self, root, label):
        started.append(label)
        init(self, root, label)
    monkeypatch.setattr(revision.Worker, "__init__", counted)
    for fresh, workers in ((True, ["reference", "candidate"] * 2), (False, ["reference", "candidate"])):
        started.clear()
        sides = _planted_sides(monkeypatch, "ray-quick", 2, ("reference", "candidate"), fresh_workers=fresh)
        assert sorted(started) == sorted(workers), (fresh, started)
        assert all(len(r) == 2 and all(d["samples_us"] for d in r.values()) for s in sides.values()
                   for r in s["rounds"])
    assert not revision.Worker.live  # every worker closed


def test_a_worker_leaving_quickly_loses_nothing_printed():
    """``worker.quick_exit`` skips the interpreter's teardown; what Python and C printed before it still
    arrives, C's buffered stdout included (a pipe buffers it fully)."""
    import os
    import sys

    code = ("import ctypes, sys\n"
            "from kernellab.harness.worker import quick_exit\n"
            "libc = ctypes.CDLL(None)\n"
            "libc.printf(b'from C\\n')\n"
            "sys.stderr.write('from Python')\n"
            "quick_exit()\n"
            "raise SystemExit(3)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # which would unbuffer C's stdout
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 0
    assert res.stdout == "from C\n"
    assert res.stderr == "from Python"


def test_a_workers_path_puts_the_drivers_harness_before_the_trees(tmp_path):
    """A tree's own harness (here one that fails at import) never measures: a worker's path starts with a folder
    linking this process's harness, and the tree's other packages follow it (its kernellab wins over any other)."""
    import os
    import sys

    from kernellab.harness import revision

    tree = tmp_path / "tree"
    for package in ("harness", "kernels"):
        (tree / "packages" / package / "src" / "kernellab" / package).mkdir(parents=True)
    (tree / "packages" / "harness" / "src" / "kernellab" / "harness" / "__init__.py").write_text(
        "raise ImportError('the tree\\'s own harness')\n")
    (tree / "packages" / "kernels" / "src" / "kernellab" / "kernels" / "__init__.py").write_text("TREE = True\n")
    shim = revision.harness_shim(tmp_path / "shim")
    path = revision.worker_pythonpath(tree, "/elsewhere", shim)
    assert path.split(os.pathsep) == [str(shim), *revision.source_paths(tree), "/elsewhere"]
    probe = ("import pathlib, kernellab.harness as h, kernellab.kernels as k; "
             "print(pathlib.Path(h.__file__).resolve().parent, k.TREE)")
    got = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": path}, capture_output=True,
                         text=True, check=True).stdout.split()
    assert got == [str(revision.HARNESS_DIR), "True"]


@pytest.mark.parametrize("planted", ["packages/kernels/src/torch/__init__.py", "packages/kernels/src/sitecustomize.py",
                                     "packages/kernels/src/kernellab/__init__.py"])
def test_a_tree_with_sources_outside_the_kernellab_namespace_gets_no_worker(tmp_path, planted):
    """A worker puts a tree's package sources ahead of the installed packages: a top-level module there would shadow
    one the harness relies on (torch) or run first (sitecustomize), and a ``kernellab/__init__.py`` would make the
    namespace that folder's and bring the tree's own harness back. Refused before any process starts."""
    from kernellab.harness import revision

    (tmp_path / "packages" / "kernels" / "src" / "kernellab" / "kernels").mkdir(parents=True)
    (tmp_path / "packages" / "kernels" / "src" / "kernellab_kernels.egg-info").mkdir()  # build metadata: allowed
    assert revision.foreign_sources(tmp_path) == []
    (tmp_path / planted).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / planted).write_text("")
    with pytest.raises(RevisionError, match="outside the kernellab namespace") as got:
        revision.Worker(tmp_path, "candidate")
    assert planted.split("/")[-1 if planted.endswith("sitecustomize.py") else -2] in str(got.value)


def test_a_module_at_a_trees_root_is_not_imported_by_its_worker(tmp_path):
    """A worker runs in its tree, and ``python -c`` puts its working directory first on the path: a json.py at the
    root of a candidate tree was the worker's json (its replies' encoder). Workers start with -P."""
    from kernellab.harness import revision

    marker = tmp_path / "imported"
    (tmp_path / "json.py").write_text(f"open({str(marker)!r}, 'w').close()\nfrom _json import *\n")
    with revision.Worker(tmp_path, "candidate") as worker, pytest.raises(RevisionError, match="no-such-suite"):
        worker.request("setup", suite="no-such-suite", config={}, cases=None, impls=None, timeout_s=120)
    assert not marker.exists()
