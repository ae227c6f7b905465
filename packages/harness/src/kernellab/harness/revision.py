"""Revision A/B: materialize a git revision (or a source zip) into a temporary tree, and drive one
worker subprocess per revision so that two versions of the same package never share a process."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import selectors
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

from . import stats, threads, validate
from .progress import Progress, describe_samples
from .provenance import artifact_hashes, sha256_file

PROTOCOL = 3  # 3: a worker names its built artifacts, the driver hashes them
CHANNEL_TAKEN = 86
"""A worker's exit code when its reply channel no longer writes where it did at its start (``worker.send``)."""


class RevisionError(RuntimeError):
    """A revision that cannot be materialized or run; the message says which and why."""


class WorkerLost(RevisionError):
    """A worker ended while it answered a request: it crashed (a contender's segfault, say) or left a reply channel
    it could no longer trust. During a case, ``run_sides`` fails that case on that side and starts a fresh worker."""


MAX_WORKER_LOSSES = 3
"""Cases a side may lose its worker to in one run; past that the run stops: a tree whose worker keeps dying is
broken as a whole, and each fresh worker costs a setup."""


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


BUILD_METADATA = (".egg-info", ".dist-info", "__pycache__")


def foreign_sources(root: str | os.PathLike) -> list[str]:
    """What in a tree's package sources is not a portion of the ``kernellab`` namespace: a worker puts those
    folders ahead of the installed packages, so a top-level module there (``torch``, ``sitecustomize``) would shadow
    or run before what the harness relies on, and a ``kernellab/__init__.py`` would make the namespace that one
    folder's and bring the tree's own harness back."""
    bad = []
    for src in map(Path, source_paths(root)):
        bad += [str(p) for p in sorted(src.iterdir()) if p.name != "kernellab" and not p.name.endswith(BUILD_METADATA)]
        bad += [str(p) for p in [src / "kernellab" / "__init__.py"] if p.exists()]
    return bad


HARNESS_DIR = Path(__file__).resolve().parent
"""This process's own harness package: the one every worker times and validates with (``harness_shim``)."""


def harness_shim(dest: str | os.PathLike) -> Path:
    """A folder holding only a link to this process's own harness package (``dest/kernellab/harness``), put first
    on a worker's path: a worker of either revision then measures with the driver's harness, never with the
    harness of the tree it measures. A revision whose harness scaled its own samples had its claim replayed by
    that same harness (the audit's replay imported each tree whole)."""
    package = Path(dest) / "kernellab"
    package.mkdir(parents=True, exist_ok=True)  # no __init__.py: a portion of the kernellab namespace
    (package / "harness").symlink_to(HARNESS_DIR, target_is_directory=True)
    return Path(dest)


def worker_pythonpath(root: str | os.PathLike, inherited: str | None, shim: str | os.PathLike | None = None) -> str:
    """The driver's harness (``shim``) first, then the tree's package sources (so that its kernellab wins over
    any installed one), then whatever PYTHONPATH the caller had: dependencies installed there (CuTe DSL on a
    host without an index) must stay importable."""
    return os.pathsep.join([*([str(shim)] if shim else []), *source_paths(root), *([inherited] if inherited else [])])


class Worker:
    """A subprocess that imports the code of one tree, measured by this process's harness, and answers JSON
    requests line by line."""

    live: set[int] = set()  # the pids of this process's workers not yet closed: no stray among its children

    def __init__(self, root: str | os.PathLike | None, label: str):
        """``root``: the tree whose packages the worker imports (all but the harness: ``harness_shim``); None: the
        installed packages."""
        self.root = Path(root).resolve() if root is not None else None
        self.label = label
        self._shim = None
        self._pending = b""  # read from the reply pipe past the last line
        env = dict(os.environ)
        env["KERNELLAB_WORKER_LABEL"] = label
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["KERNELLAB_HARNESS_DIR"] = str(HARNESS_DIR)
        if self.root is not None:
            foreign = foreign_sources(self.root)
            if foreign:
                raise RevisionError(f"{self.root} holds package sources outside the kernellab namespace, which a "
                                    f"worker would import ahead of the installed packages: {foreign}")
            self._shim = tempfile.TemporaryDirectory(prefix="kernellab-harness-")
            env["PYTHONPATH"] = worker_pythonpath(self.root, os.environ.get("PYTHONPATH"),
                                                  harness_shim(self._shim.name))
            env["KERNELLAB_SOURCE_ROOT"] = str(self.root)
        else:
            env.pop("KERNELLAB_SOURCE_ROOT", None)
        # imported, not run with -m: one copy of the worker module, the one integrity.verify checks; -P: the tree it
        # runs in (its working directory) is not put first on its path, where a json.py there would be json
        program = "from kernellab.harness import worker; worker.main()"
        self.proc = subprocess.Popen([sys.executable, "-P", "-c", program], cwd=self.root, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        Worker.live.add(self.proc.pid)

    def request(self, cmd: str, *, timeout_s: float | None = None, **args: Any) -> dict:
        """Send one request and read its reply; past ``timeout_s`` (a hung kernel) the worker is killed."""
        if self.proc.poll() is not None:
            raise RevisionError(f"worker {self.label} ({self.root}) exited with code {self.proc.returncode}")
        before = threads.children()
        self.proc.stdin.write(json.dumps({"cmd": cmd, **args}) + "\n")
        self.proc.stdin.flush()
        line = self._read_line(timeout_s)
        if line is None:
            self.proc.kill()
            self.proc.wait()
            raise RevisionError(f"worker {self.label} ({self.root}) gave no answer to {cmd!r} within {timeout_s:g} s "
                                f"(a hung kernel?); it was killed")
        if not line:
            code = self.proc.wait()
            if code == CHANNEL_TAKEN:
                raise WorkerLost(f"worker {self.label} ({self.root}) left during {cmd!r}: its reply channel could "
                                 "no longer be trusted (contender code pointed it elsewhere, or a thread no impl "
                                 "owns was running; its message above says which)")
            raise WorkerLost(f"worker {self.label} ({self.root}) died during {cmd!r} with exit code {code}; "
                             "its error is printed above")
        adopted = sorted(threads.children() - before - Worker.live)
        if adopted:  # clone(CLONE_PARENT) makes a worker's child this process's, outside the worker's checks
            for pid in adopted:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.kill()
            self.proc.wait()
            raise RevisionError(f"process(es) {adopted} became this driver's children during worker {self.label}'s "
                                f"{cmd!r} (started by its contender code as its parent's, past its own checks); "
                                "killed, with the worker")
        holders = self.channel_holders()
        if holders is not None and holders > 1:
            self.proc.kill()
            self.proc.wait()
            raise RevisionError(f"worker {self.label} ({self.root}) holds {holders} descriptors of this driver's reply "
                                f"pipe after {cmd!r}, where it opened one: contender code kept a copy, through which "
                                "it could write replies of its own; the worker was killed")
        try:
            reply = json.loads(line)
        except ValueError as e:
            raise RevisionError(f"worker {self.label} ({self.root}) answered {cmd!r} with a line that is not JSON "
                                f"({e}): {line[:200]!r}") from e
        if not isinstance(reply, dict):
            raise RevisionError(f"worker {self.label} ({self.root}) answered {cmd!r} with {type(reply).__name__}")
        if not reply.get("ok"):
            raise RevisionError(f"worker {self.label} failed on {cmd!r}: {reply.get('error')}")
        if reply.get("protocol", PROTOCOL) != PROTOCOL:
            raise RevisionError(f"worker {self.label} speaks protocol {reply.get('protocol')}, this driver {PROTOCOL}")
        return reply

    def channel_holders(self) -> int | None:
        """How many of the worker's descriptors write to this driver's reply pipe (one: its protocol channel), read
        from Linux's /proc; None where it has none, or the worker has left."""
        pipe = f"pipe:[{os.fstat(self.proc.stdout.fileno()).st_ino}]"
        folder = f"/proc/{self.proc.pid}/fd"
        try:
            fds = os.listdir(folder)
        except OSError:
            return None
        held = 0
        for fd in fds:
            with contextlib.suppress(OSError):
                held += os.readlink(f"{folder}/{fd}") == pipe
        return held

    def _read_line(self, timeout_s: float | None) -> str | None:
        """One reply line ('' where the worker closed its end), read from the pipe's descriptor into this object's
        own buffer; None where the whole line did not come within ``timeout_s``: the deadline holds for the line,
        not its first byte (a worker that wrote half a line and stopped had held the driver past any timeout)."""
        fd = self.proc.stdout.fileno()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._pending:
                if deadline is not None and not sel.select(max(0.0, deadline - time.monotonic())):
                    return None
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return ""
                self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line.decode("utf-8", "replace") + "\n"

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
        self.proc.wait()
        Worker.live.discard(self.proc.pid)
        if self._shim is not None:
            self._shim.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@contextlib.contextmanager
def terminate_as_interrupt():
    """SIGTERM (``timeout``, a job scheduler, ``kill``) taken as Ctrl-C while the block runs: the live workers get
    SIGINT, as a terminal's Ctrl-C gives them, and this process ``KeyboardInterrupt``, so that the rounds completed
    before it are kept (``run_sides``) instead of the process ending with nothing written."""
    def interrupt(signum, frame):
        for pid in list(Worker.live):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGINT)
        raise KeyboardInterrupt
    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread (a test's, a Ray task's): signals stay as they were
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def revision_order(round_index: int) -> list[str]:
    """A B, B A, A B, ...: drift over the run favours neither side."""
    return ["reference", "candidate"] if round_index % 2 == 0 else ["candidate", "reference"]


@dataclasses.dataclass
class Extension:
    """More rounds for the pairs whose gain interval is still wide: until every interval is at most
    ``target_width`` (hi / lo), ``max_rounds`` rounds were run, or ``time_limit_s`` has passed; the
    report says which stopped it."""

    target_width: float = 1.10
    max_rounds: int = 0  # 0: no extension
    time_limit_s: float = 600.0
    resamples: int = 200


def _wide_pairs(sides: dict, ids: list[str], width: float, resamples: int) -> list[str]:
    """Case ids of the problems (every impl of one, so that each stays paired with its control round by
    round) of which some passing case's gain interval between the two sides is wider than ``width``, allowing for
    the pair's correlated samples as the comparison's intervals do."""
    wide = set()
    for cid in ids:
        per_side = []
        results = [r[cid] for name in ("reference", "candidate") for r in sides[name]["rounds"] if cid in r]
        if not all(r.get("passed") for r in results):
            continue  # a failed case is failed: more rounds decide nothing
        for name in ("reference", "candidate"):
            rounds = [r[cid] for r in sides[name]["rounds"] if cid in r]
            per_side.append({m: [r["samples_us"][m] for r in rounds if m in r.get("samples_us", {})]
                             for m in (rounds[0].get("samples_us", {}) if rounds else {})})
        for mode, ref in per_side[0].items():
            cand = per_side[1].get(mode)
            if not cand or len(cand) != len(ref) or not all(ref) or not all(cand):
                continue
            lo, hi = stats.bootstrap_gain_ci(ref, cand, resamples=resamples,
                                             correlation=stats.sample_correlation(ref + cand))
            if hi / lo > width:
                wide.add(cid.rsplit("/", 1)[0])
                break
    return [cid for cid in ids if cid.rsplit("/", 1)[0] in wide]


CATALOG_TIMEOUT_S = 600.0  # importing every suite's contenders (CuTe DSL, Triton, ...) takes seconds, not minutes


def catalog(root: str | os.PathLike | None) -> dict:
    """Every suite of ``root`` (None: the installed packages) as a worker loads it, with its impls' names: the
    driver lists and matches contenders without importing them (a contender's factory run in the driver could
    rewrite what the workers reply)."""
    with Worker(root, "catalog") as w:
        return w.request("catalog", timeout_s=CATALOG_TIMEOUT_S)


def run_sides(roots: dict[str, str | os.PathLike | None], request: dict, rounds: int, *, progress: bool = True,
              extension: Extension | None = None, case_timeout_s: float | None = None) -> dict:
    """Run one suite in one or two trees, one worker each: every case by each side back to back, the
    side order alternating by round (A B, B A, ...), in an even count of rounds (an odd ``rounds`` runs one more,
    and extra rounds come in pairs): with more rounds of one order, a cost of running first, or a drift over the
    run, would lean the median of the per-round gains toward that order whole. Returns per side its cases,
    provenance and per-round measurements, and how the rounds stopped; after Ctrl-C, the rounds completed before
    it, with ``interrupted`` saying how many.

    Each worker writes a result of every validation and of each mode's last timed batch to a folder of
    this process's; this process, which imports no contender code, checks them against the float64
    truth of inputs it remakes from their seeds (``validate.check_shipped``), so that a contender that
    patched the harness inside its worker cannot pass its own results. A case that runs past
    ``case_timeout_s`` kills its worker and raises ``RevisionError``. A case whose worker crashed or left
    (``WorkerLost``) fails on that side with the reason, in this round and every later one (it is not run
    again), and the side goes on in a fresh worker: a long run keeps every other case (up to
    ``MAX_WORKER_LOSSES`` a side). With the config's ``fresh_workers`` every round after the first starts a fresh
    worker a side: what one process fixes (code layout, allocator state) then varies between rounds, where the
    interval sees it, instead of staying one constant offset it cannot."""
    names = [n for n in ("reference", "candidate") if n in roots]
    with tempfile.TemporaryDirectory(prefix="kernellab-shipped-") as ship_dir, contextlib.ExitStack() as stack:
        workers = {n: stack.enter_context(Worker(roots[n], n)) for n in names}
        checker = ShippedChecker(request["suite"])  # loads torch here while the workers start
        sides: dict[str, dict] = {}
        schedules = {}
        for name, w in workers.items():
            setup = w.request("setup", **request)
            schedules[name] = setup["schedule"]
            sides[name] = {"cases": setup["cases"], "provenance": setup["provenance"], "rounds": []}
            # the built files the worker names, hashed here: in the worker, contender code could answer for them
            sides[name]["provenance"]["artifacts_sha256"] = artifact_hashes(setup["artifacts"], w.root)
        common = [[cid for cid in schedules[names[-1]][r] if all(cid in set(schedules[n][r]) for n in names)]
                  for r in range(rounds)]
        bar = Progress(len(names) * sum(map(len, common)), enabled=progress)
        started = time.monotonic()
        lost: dict[str, dict[str, str]] = {n: {} for n in names}  # side -> case -> why it lost that side's worker
        fresh = bool(request["config"].get("fresh_workers"))

        def restart(name: str) -> None:
            workers[name].close()
            workers[name] = stack.enter_context(Worker(roots[name], name))
            workers[name].request("setup", **request)  # the same tree and request: the same cases and schedule

        def measure(name: str, cid: str, r: int) -> dict:
            if cid in lost[name]:
                return {"passed": False, "validations": [], "error": lost[name][cid]}
            try:
                data = workers[name].request("case", id=cid, round=r, ship_dir=ship_dir,
                                             timeout_s=case_timeout_s)["data"]
            except WorkerLost as e:
                lost[name][cid] = (f"WorkerLost: {str(e).splitlines()[0]} (round {r + 1}; "
                                   "not run again, the side went on in a fresh worker)")
                if len(lost[name]) > MAX_WORKER_LOSSES:
                    raise RevisionError(f"worker {name} was lost in {len(lost[name])} cases "
                                        f"({', '.join(lost[name])}), more than {MAX_WORKER_LOSSES}: the tree, not a "
                                        f"case, is broken; the last: {e}") from e
                restart(name)
                return {"passed": False, "validations": [], "error": lost[name][cid]}
            checker.check(cid, data)
            return data

        def one_round(r: int, ids: list[str]) -> None:
            for name in names:
                sides[name]["rounds"].append({})  # first: an interrupt in a restart drops this round alone
                if fresh and r > 0:
                    restart(name)
            for cid in ids:
                for name in [n for n in revision_order(r) if n in workers]:
                    data = sides[name]["rounds"][r][cid] = measure(name, cid, r)
                    bar.step(f"round {r + 1} {name}: {cid}  {describe_samples(data)}")

        balance = len(names) == 2 and rounds % 2  # each side first in as many rounds as it is second
        planned = rounds + balance
        if balance:
            bar.total += len(names) * len(common[0])
        try:
            for r, ids in enumerate(common):
                one_round(r, ids)
            if balance:
                one_round(rounds, common[0])
        except KeyboardInterrupt:  # the rounds completed before Ctrl-C are kept; the workers got it too
            done = len(sides[names[0]]["rounds"]) - 1
            for name in names:
                del sides[name]["rounds"][done:]
                sides[name]["interrupted"] = {"rounds_completed": done, "rounds_planned": planned}
                sides[name]["provenance"]["clocks_end"] = None
            return sides
        stop = {"rounds": planned, "reason": "the configured rounds" + (
            f" ({rounds}), and one more so that each side ran first in half of them" if balance else "")}
        ext = extension or Extension()
        if len(names) == 2 and ext.max_rounds >= planned + 2:
            r = planned
            while True:
                wide = _wide_pairs(sides, common[-1], ext.target_width, ext.resamples)
                if not wide:
                    stop = {"rounds": r, "reason": f"every gain interval is at most {ext.target_width}x wide"}
                    break
                if r + 2 > ext.max_rounds:  # extra rounds come in pairs, one of each order
                    stop = {"rounds": r, "reason": f"max rounds {ext.max_rounds} reached with {len(wide)} wide pairs",
                            "wide": wide}
                    break
                if time.monotonic() - started > ext.time_limit_s:
                    stop = {"rounds": r, "reason": f"time limit {ext.time_limit_s:.0f} s reached with {len(wide)} "
                                                   "wide pairs", "wide": wide}
                    break
                bar.total += 4 * len(wide)
                one_round(r, wide)
                one_round(r + 1, wide)
                r += 2
        for name, w in workers.items():
            fin = w.request("finish")
            sides[name]["provenance"]["clocks_end"] = fin["clocks_end"]
            sides[name]["provenance"]["artifacts_sha256"] = artifact_hashes(fin["artifacts"], w.root)
            sides[name]["stopping"] = stop
    return sides


class ShippedChecker:
    """The driver's check of the results its workers shipped (see ``run_sides``). It loads the suite's
    problems only, never its contenders."""

    def __init__(self, suite: str):
        import torch  # noqa: F401 - every check needs it: loaded now, not at the first result

        from . import registry

        try:
            self.problems = {p.name: p for p in registry.get(suite, impls=False).make_problems()}
            self.why = None
        except Exception as e:  # noqa: BLE001 - the records say why nothing could be checked
            self.problems, self.why = {}, f"{type(e).__name__}: {e}"

    def check(self, case_id: str, data: dict) -> None:
        """Append each shipped result's check to the case's validations (``external: True``)."""
        shipped = data.pop("shipped", None)
        if shipped is None:
            data["external_checks"] = "the worker shipped no results (a tree older than this driver)"
            return
        problem = self.problems.get(case_id.rsplit("/", 1)[0])
        for item in shipped:
            if "file" not in item:
                data.setdefault("unshipped", []).append(item)
                continue
            if problem is None:
                report = {"passed": False, "error": f"the driver cannot check {case_id}: "
                                                    f"{self.why or 'its suite here has no such problem'}"}
            else:
                try:
                    report = validate.check_shipped(problem, item)
                except Exception as e:  # noqa: BLE001 - an unreadable result fails its case
                    report = {"passed": False, "error": f"shipped result unreadable: {type(e).__name__}: {e}"}
            Path(item["file"]).unlink(missing_ok=True)
            data.setdefault("validations", []).append(report | {"external": True, "tag": item["tag"]})
            if not report["passed"]:
                data["passed"] = False
