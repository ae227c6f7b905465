"""Revision A/B: materialize a git revision (or a source zip) into a temporary tree, and drive one
worker subprocess per revision so that two versions of the same package never share a process."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

from .provenance import sha256_file
from .runner import Progress, describe_samples

PROTOCOL = 2


class RevisionError(RuntimeError):
    """A revision that cannot be materialized or run; the message says which and why."""


def materialize(rev: str, repo: str | os.PathLike, dest: str | os.PathLike) -> dict[str, Any]:
    """Write revision ``rev`` of ``repo`` (a commit-ish, or a path to a source zip) into ``dest``.

    Returns what the reports record about it: the revision as given, the commit or zip sha256, and
    the root of the tree (the directory holding ``packages/``).
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    if rev.endswith(".zip") and Path(rev).is_file():
        with zipfile.ZipFile(rev) as zf:
            _safe_members([i.filename for i in zf.infolist()], rev)
            zf.extractall(dest)
        root = _tree_root(dest, rev)
        return {"revision": rev, "kind": "zip", "zip_sha256": sha256_file(rev), "commit": None, "root": str(root)}
    repo = Path(repo)
    res = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise RevisionError(f"--baseline {rev!r} is neither a commit of the repository at {repo} "
                            "nor an existing .zip file")
    commit = res.stdout.strip()
    archive = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", commit], capture_output=True)
    if archive.returncode != 0:
        raise RevisionError(f"git archive {commit} failed: {archive.stderr.decode(errors='replace').strip()}")
    try:
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tf:
            _safe_members(tf.getnames(), rev)
            tf.extractall(dest, filter="data")
    except tarfile.ReadError:  # an empty tree archives to a header and padding only
        pass
    root = _tree_root(dest, rev)
    return {"revision": rev, "kind": "git", "commit": commit, "zip_sha256": None, "root": str(root)}


def _safe_members(names: list[str], what: str) -> None:
    for n in names:
        if n.startswith("/") or ".." in Path(n).parts:
            raise RevisionError(f"{what} holds an unsafe path {n!r}")


def _tree_root(dest: Path, what: str) -> Path:
    if (dest / "packages" / "harness").is_dir():
        return dest
    subdirs = [d for d in dest.iterdir() if d.is_dir()]
    if len(subdirs) == 1 and (subdirs[0] / "packages" / "harness").is_dir():
        return subdirs[0]
    raise RevisionError(f"{what} has no packages/harness: it predates the harness or is not a KernelLab tree")


def source_paths(root: str | os.PathLike) -> list[str]:
    return [str(p) for p in sorted(Path(root).glob("packages/*/src")) if p.is_dir()]


def worker_pythonpath(root: str | os.PathLike, inherited: str | None) -> str:
    """The tree's package sources first (so its kernellab wins), then whatever PYTHONPATH the caller had:
    dependencies installed there (CuTe DSL on a host without an index) must stay importable."""
    return os.pathsep.join([*source_paths(root), *([inherited] if inherited else [])])


class Worker:
    """A subprocess that imports only the code of one tree and answers JSON requests line by line."""

    def __init__(self, root: str | os.PathLike, label: str):
        self.root = Path(root).resolve()
        self.label = label
        env = dict(os.environ)
        env["PYTHONPATH"] = worker_pythonpath(self.root, os.environ.get("PYTHONPATH"))
        env["KERNELLAB_SOURCE_ROOT"] = str(self.root)
        env["KERNELLAB_WORKER_LABEL"] = label
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        self.proc = subprocess.Popen([sys.executable, "-m", "kernellab.harness.worker"], cwd=self.root, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def request(self, cmd: str, **args: Any) -> dict:
        if self.proc.poll() is not None:
            raise RevisionError(f"worker {self.label} ({self.root}) exited with code {self.proc.returncode}")
        self.proc.stdin.write(json.dumps({"cmd": cmd, **args}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise RevisionError(f"worker {self.label} ({self.root}) died during {cmd!r} with exit code {code}; "
                                "its error is printed above")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise RevisionError(f"worker {self.label} failed on {cmd!r}: {reply.get('error')}")
        if reply.get("protocol", PROTOCOL) != PROTOCOL:
            raise RevisionError(f"worker {self.label} speaks protocol {reply.get('protocol')}, this driver {PROTOCOL}")
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def revision_order(round_index: int) -> list[str]:
    """A B, B A, A B, ...: drift over the run favours neither side."""
    return ["reference", "candidate"] if round_index % 2 == 0 else ["candidate", "reference"]


def run_sides(roots: dict[str, str | os.PathLike], request: dict, rounds: int, *, progress: bool = True) -> dict:
    """Run one suite in two trees, one worker each: every case by both sides back to back, the side
    order alternating by round. Returns per side its cases, provenance and per-round measurements."""
    with Worker(roots["reference"], "reference") as ref_w, Worker(roots["candidate"], "candidate") as cand_w:
        workers = {"reference": ref_w, "candidate": cand_w}
        sides: dict[str, dict] = {}
        schedules = {}
        for name, w in workers.items():
            setup = w.request("setup", **request)
            schedules[name] = setup["schedule"]
            sides[name] = {"cases": setup["cases"], "provenance": setup["provenance"],
                           "rounds": [{} for _ in range(rounds)]}
        plan = [[cid for cid in schedules["candidate"][r] if cid in set(schedules["reference"][r])]
                for r in range(rounds)]
        bar = Progress(2 * sum(map(len, plan)), enabled=progress)
        for r, ids in enumerate(plan):
            for cid in ids:
                for name in revision_order(r):
                    data = workers[name].request("case", id=cid, round=r)["data"]
                    sides[name]["rounds"][r][cid] = data
                    bar.step(f"round {r + 1} {name}: {cid}  {describe_samples(data)}")
        for name, w in workers.items():
            fin = w.request("finish")
            sides[name]["provenance"]["clocks_end"] = fin["clocks_end"]
            sides[name]["provenance"]["artifacts_sha256"] = fin["artifacts_sha256"]
    return sides
