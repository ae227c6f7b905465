"""Suites and audits on a Ray cluster (``--ray``): one problem per Ray task.

A task holds one problem: its torch control and every impl, and for an A/B comparison both revisions'
workers alternating round by round, all on the one device Ray gave the task (``num_gpus=1``; a CPU
suite takes a whole node's cores), in a fresh worker process (``max_calls=1``). Inside the task the
problem runs exactly as a run on one machine does (``revision.run_sides``: a worker subprocess per
revision, its results checked outside it), on copies of the trees that the driver ships through Ray's
object store, so a host needs KernelLab's dependencies but not the checkout. The driver merges the
problems' results into one report of the usual schema, each case with the device it ran on.

A task that dies (a segfault, a CUDA error, the out-of-memory killer, a case past its timeout) is run
once more in a fresh worker, then recorded as failed with the reason; every completed problem is
appended to a checkpoint file, so ``--resume CHECKPOINT`` finishes a killed run without redoing them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import io
import json
import os
import platform
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import provenance
from .revision import Extension, run_sides

RAY_MISSING = ("--ray needs Ray, which is not installed here: pip install 'kernellab-harness[ray]' "
               "(on every host of the cluster)")
ATTEMPTS = 2  # a problem whose task dies is run once more, then recorded as failed
CHECKPOINT_FORMAT = "kernellab.checkpoint/1"
WAKE_S = 2.0  # the longest the driver blocks on the cluster (so that Ctrl-C is seen); it polls nothing


class ClusterError(RuntimeError):
    """A cluster that cannot be reached or used, or a checkpoint that does not belong to this run."""


class ClusterInterrupted(KeyboardInterrupt):
    """Ctrl-C during a cluster run: its tasks were cancelled; the checkpoint keeps what completed."""

    def __init__(self, checkpoint: Path | None, done: int, total: int):
        super().__init__("interrupted")
        self.checkpoint, self.done, self.total = checkpoint, done, total


def import_ray():
    try:
        import ray
    except ImportError:
        raise ClusterError(RAY_MISSING) from None
    return ray


# ---- the connection ---------------------------------------------------------------------------------

@dataclasses.dataclass
class Session:
    """A connection to a cluster: ``address`` as given (None: a local cluster this process started), how
    long connecting took (Ray's start-up, reported apart from the run), and whether to shut it down."""

    address: str | None
    startup_s: float
    owned: bool

    def nodes(self) -> list[dict]:
        """The alive nodes: id, host and resources."""
        ray = import_ray()
        return [{"node_id": n["NodeID"], "host": n.get("NodeManagerHostname") or n.get("NodeManagerAddress"),
                 "resources": n.get("Resources", {})} for n in ray.nodes() if n.get("Alive")]

    def close(self) -> None:
        if self.owned:
            import_ray().shutdown()


def connect(address: str | None, **init: Any) -> Session:
    """Join the cluster at ``address`` ('auto': the one running on this host), or start a local one
    (None). A process already connected (a test's cluster) keeps its connection."""
    ray = import_ray()
    if ray.is_initialized():
        return Session(address, 0.0, owned=False)
    started = time.monotonic()
    try:
        if address:
            ray.init(address=address, **init)
        else:
            os.environ.setdefault("RAY_worker_niceness", "0")  # the local raylet starts its workers un-niced
            # "local": a cluster of this run's own, never one that happens to run on the host already (a plain
            # ray.init() would join that one, and another run's shutdown would take the tasks with it)
            ray.init(address="local", include_dashboard=False, **init)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ClusterError(f"--ray {address or '(a local cluster)'}: cannot connect: {e}") from None
    return Session(address, time.monotonic() - started, owned=True)


# ---- shipping trees -------------------------------------------------------------------------------

def _shipped(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    parts = Path(info.name).parts
    if "__pycache__" in parts or any(p.endswith(".egg-info") for p in parts) or info.name.endswith(".pyc"):
        return None
    return info


def pack_tree(root: str | os.PathLike) -> tuple[bytes, str]:
    """A tree's package sources and pyproject files (all a worker imports from a tree) as a tar, and
    a fingerprint of their contents (sha256 over each file's path and sha256)."""
    root = Path(root)
    buf, listing = io.BytesIO(), []
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for pkg in sorted(root.glob("packages/*")):
            for part in ("pyproject.toml", "src"):
                if (pkg / part).exists():
                    tf.add(pkg / part, arcname=(pkg / part).relative_to(root).as_posix(), filter=_shipped)
        for member in tf.getmembers():
            if member.isfile():
                listing.append(f"{member.name} {provenance.sha256_file(root / member.name)}")
    return buf.getvalue(), hashlib.sha256("\n".join(sorted(listing)).encode()).hexdigest()


def unpack_tree(blob: bytes, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(blob)) as tf:
        tf.extractall(dest, filter="data")
    return dest


# ---- the task -----------------------------------------------------------------------------------

class Board:
    """Where tasks say they started (an async Ray actor), so that the driver can show what runs where.
    The driver waits on ``after`` beside the tasks' results rather than polling it, so that nothing of
    the driver's runs beside a task's timing loop between results."""

    def __init__(self):
        self.started: list[tuple[str, int, dict]] = []
        self.changed = asyncio.Event()

    async def start(self, problem: str, attempt: int, node: dict) -> None:
        self.started.append((problem, attempt, node))
        self.changed.set()

    async def after(self, since: int) -> list[tuple[str, int, dict]]:
        """The starts after the first ``since``, once there is one."""
        while len(self.started) <= since:
            self.changed.clear()
            await self.changed.wait()
        return self.started[since:]


def normal_priority() -> int:
    """Ray starts its workers niced (15 by default): on a busy host they then get the cores last, and
    a timing measures the scheduler. The task's process (and so the harness worker it starts) takes
    back normal priority where it may (root, or an RLIMIT_NICE that allows it); the niceness it runs
    at is returned and recorded with the case."""
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) > 0:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
    except OSError:
        pass
    return os.getpriority(os.PRIO_PROCESS, 0)


def run_problem(trees: dict[str, bytes], request: dict, rounds: int, extension: Extension | None,
                case_timeout_s: float | None, board, attempt: int) -> dict:
    """One problem in this task's worker: the trees unpacked, ``run_sides`` as on one machine, and where
    it ran. Its exceptions go back to the driver, which retries or records them."""
    ray = import_ray()
    node = {"node_id": ray.get_runtime_context().get_node_id(), "host": platform.node(),
            "niceness": normal_priority()}
    if board is not None:
        board.start.remote(request["problem"], attempt, node)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kernellab-ray-") as tmp:
        roots = {name: unpack_tree(blob, Path(tmp) / name) for name, blob in trees.items()}
        sides = run_sides(roots, request, rounds, progress=False, extension=extension, case_timeout_s=case_timeout_s)
    return {"problem": request["problem"], "node": node, "sides": sides, "seconds": time.monotonic() - started}


def device_of(result: dict, side: str) -> dict:
    """What a case of ``side`` ran on: the task's node and the device its worker recorded (for a GPU
    its UUID, name, driver, clocks at the start and the end of the problem)."""
    prov = result["sides"][side]["provenance"]
    return {**result["node"], **(prov.get("device") or {}), "clocks_start": prov.get("clocks_start"),
            "clocks_end": prov.get("clocks_end")}


def failure_reason(error: BaseException) -> str:
    """One line saying why a task failed: the exception raised inside it, or how its worker died."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}".splitlines()[0]
    lines = [ln for ln in str(error).splitlines() if ln.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}".strip()


def describe_nodes() -> dict:
    """This node's devices, for matching a report's recorded devices (run on each node)."""
    ray = import_ray()
    gpus = []
    try:
        import pynvml

        pynvml.nvmlInit()
        for i in range(pynvml.nvmlDeviceGetCount()):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            gpus.append(name.decode() if isinstance(name, bytes) else str(name))
        pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no nvidia-ml-py or no driver: ask nvidia-smi, else none
        gpus = [q["name"] for q in [provenance.smi_query(None)] if q.get("name")] if not gpus else gpus
    return {"node_id": ray.get_runtime_context().get_node_id(), "host": platform.node(),
            "cpu": provenance.cpu_name(), "gpus": gpus}


def node_devices(session: Session) -> list[dict]:
    """Every alive node's CPU and GPU names (``describe_nodes`` run on each)."""
    ray = import_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(num_cpus=0, max_retries=0)(describe_nodes)
    return ray.get([probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["node_id"], soft=False)).remote()
                    for n in session.nodes()])


def has_device(node: dict, kind: str, name: str) -> bool:
    return name in node["gpus"] if kind == "cuda" else node["cpu"] == name


def nodes_with(wanted: dict[str, tuple[str, str]], nodes: list[dict]) -> tuple[dict[str, list[str]], dict[str, str]]:
    """For each problem's wanted (kind, device name), the node ids that have such a device, and for the
    problems no node can take, why not."""
    found, missing = {}, {}
    for problem, (kind, name) in wanted.items():
        ids = [n["node_id"] for n in nodes if has_device(n, kind, name)]
        if ids:
            found[problem] = ids
        else:
            have = sorted({g for n in nodes for g in (n["gpus"] if kind == "cuda" else [n["cpu"]])})
            missing[problem] = f"no node of the cluster has a {kind} device named {name!r} (it has {have})"
    return found, missing


# ---- the checkpoint -------------------------------------------------------------------------------

class Checkpoint:
    """Completed problems of a cluster run, one JSON line each after a header that says which run it
    is; a line cut short by a kill is ignored."""

    def __init__(self, path: Path, header: dict, done: dict[str, dict]):
        self.path, self.header, self.done = path, header, done

    @classmethod
    def start(cls, path: str | os.PathLike, header: dict) -> Checkpoint:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"format": CHECKPOINT_FORMAT, **header}) + "\n")
        return cls(path, header, {})

    @classmethod
    def resume(cls, path: str | os.PathLike, header: dict) -> Checkpoint:
        path = Path(path)
        try:
            lines = path.read_text().splitlines()
            first = json.loads(lines[0]) if lines else {}
        except (OSError, ValueError) as e:
            raise ClusterError(f"--resume {path}: not a readable checkpoint ({e})") from None
        if first.get("format") != CHECKPOINT_FORMAT:
            raise ClusterError(f"--resume {path}: not a kernellab checkpoint (expected format {CHECKPOINT_FORMAT})")
        differ = sorted(k for k in header if first.get(k) != header[k])
        if differ:
            raise ClusterError(f"--resume {path}: the checkpoint belongs to another run; it differs in {differ} "
                               f"(give the same suite, options and sources, or start afresh without --resume)")
        done = {}
        for line in lines[1:]:
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # the line a kill cut short: that problem runs again
            done[entry["problem"]] = entry
        return cls(path, header, done)

    def record(self, entry: dict) -> None:
        self.done[entry["problem"]] = entry
        with self.path.open("a") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


# ---- the display --------------------------------------------------------------------------------

class Display:
    """Problems done / running / failed, in all and per node: one line on stderr whenever they change."""

    def __init__(self, total: int, enabled: bool = True, out=None):
        self.total, self.enabled, self.out = total, enabled, out or sys.stderr
        self.state: dict[str, tuple[str, str]] = {}  # problem -> (queued|running|done|failed, node label)
        self.t0 = time.monotonic()
        self.last = ""

    @staticmethod
    def label(node: dict | None) -> str:
        return f"{node['host']}:{node['node_id'][:6]}" if node else "?"

    def set(self, problem: str, state: str, node: dict | None = None) -> None:
        where = self.label(node) if node else self.state.get(problem, ("", "?"))[1]
        self.state[problem] = (state, where)
        self.show()

    def line(self) -> str:
        counts = {s: sum(1 for v in self.state.values() if v[0] == s) for s in ("done", "running", "failed")}
        per_node: dict[str, dict[str, int]] = {}
        for state, where in self.state.values():
            if state != "queued":
                per_node.setdefault(where, {}).setdefault(state, 0)
                per_node[where][state] += 1
        nodes = " | ".join(f"{n}: " + ", ".join(f"{c} {s}" for s, c in sorted(v.items()))
                           for n, v in sorted(per_node.items()))
        return (f"cluster: {counts['done'] + counts['failed']}/{self.total} problems finished ({counts['done']} "
                f"done, {counts['failed']} failed), {counts['running']} running" + (f" | {nodes}" if nodes else ""))

    def show(self) -> None:
        text = self.line()
        if self.enabled and text != self.last:
            print(f"[{time.monotonic() - self.t0:6.0f}s] {text}", file=self.out, flush=True)
        self.last = text


# ---- the driver ---------------------------------------------------------------------------------

@dataclasses.dataclass
class Plan:
    """What a cluster run measures: ``trees`` (side -> root), the request every task gets (its problem
    added), the rounds, and the resources of each task."""

    trees: dict[str, Path]
    request: dict
    rounds: int
    device: str  # the suite's: "cuda" tasks take one GPU, "cpu" tasks a node's cores
    cpus: int | None = None  # CPUs per task (None: the smallest node's count for a CPU suite, 1 for a GPU one)
    extension: Extension | None = None
    case_timeout_s: float | None = None
    nodes_for: dict[str, list[str]] | None = None  # problem -> node ids it may run on (an audit's device match)

    @functools.cached_property
    def packed(self) -> dict[str, tuple[bytes, str]]:
        """Each tree packed once: side -> (tar, fingerprint)."""
        return {name: pack_tree(root) for name, root in self.trees.items()}

    def fingerprints(self) -> dict[str, str]:
        return {name: fp for name, (_, fp) in self.packed.items()}


def exact(name: str) -> str:
    """A ``--cases`` pattern that matches ``name`` only (shell pattern characters taken literally)."""
    return "".join(f"[{c}]" if c in "*?[]" else c for c in name)


def task_resources(session: Session, plan: Plan) -> dict[str, int]:
    """What one task takes: a GPU suite one GPU (and one CPU beside it), a CPU suite the cores of the
    smallest node (so that it has a node to itself wherever it lands); ``plan.cpus`` overrides the CPUs."""
    if plan.device == "cuda":
        return {"num_gpus": 1, "num_cpus": plan.cpus or 1}
    if plan.cpus:
        return {"num_gpus": 0, "num_cpus": plan.cpus}
    counts = [int(n["resources"].get("CPU", 0)) for n in session.nodes() if n["resources"].get("CPU")]
    if not counts:
        raise ClusterError("the cluster has no node with CPUs to run a CPU suite")
    return {"num_gpus": 0, "num_cpus": min(counts)}


def run_problems(session: Session, plan: Plan, problems: list[str], checkpoint: Checkpoint | None = None,
                 display: Display | None = None) -> dict[str, dict]:
    """Every problem's outcome (problem -> checkpoint entry): ``{"problem", "result"}`` or ``{"problem",
    "failed", "attempts"}``. Problems in ``checkpoint`` are taken from it; the others run as tasks, a
    failed one once more; each finished one is checkpointed. Ctrl-C cancels the tasks and raises
    ``ClusterInterrupted``."""
    ray = import_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    done = dict(checkpoint.done) if checkpoint else {}
    todo = [p for p in problems if p not in done]
    display = display or Display(len(problems), enabled=False)
    for p in problems:
        entry = done.get(p)
        display.state[p] = ("queued", "?") if entry is None else \
            ("failed" if "failed" in entry else "done", display.label(entry.get("result", {}).get("node")))
    display.show()
    if not todo:
        return {p: done[p] for p in problems}
    trees_ref = ray.put({name: blob for name, (blob, _) in plan.packed.items()})
    board = ray.remote(num_cpus=0)(Board).remote()
    task = ray.remote(**task_resources(session, plan), max_calls=1, max_retries=0)(run_problem)
    pending: dict[Any, tuple[str, int]] = {}
    errors: dict[str, list[str]] = {}
    attempts: dict[str, int] = {}
    ran_on: dict[tuple[str, int], dict] = {}  # (problem, attempt) -> the node its task started on

    def submit(problem: str, attempt: int) -> None:
        options = {}
        nodes = (plan.nodes_for or {}).get(problem)
        if nodes:  # the audit's device match: one of the nodes that have it, in turn (a retry takes the next)
            node = nodes[(problems.index(problem) + attempt - 1) % len(nodes)]
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        elif attempt > 1 and (problem, attempt - 1) in ran_on:  # a retry: another node where there is one
            failed_on = ran_on[(problem, attempt - 1)]["node_id"]
            others = [n["node_id"] for n in session.nodes() if n["node_id"] != failed_on]
            if others:
                options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                    others[problems.index(problem) % len(others)], soft=True)
        attempts[problem] = attempt
        request = {**plan.request, "problem": problem, "cases": exact(problem)}
        ref = task.options(**options).remote(trees_ref, request, plan.rounds, plan.extension, plan.case_timeout_s,
                                             board, attempt)
        pending[ref] = (problem, attempt)

    seen = 0
    try:
        for p in todo:
            submit(p, 1)
        news = board.after.remote(seen)
        while pending:
            ready, _ = ray.wait([news, *pending], num_returns=1, timeout=WAKE_S)
            if news in ready:
                for started in ray.get(news):
                    seen += 1
                    problem, attempt, node = started
                    ran_on[(problem, attempt)] = node
                    if attempt == attempts.get(problem) and display.state.get(problem, ("",))[0] == "queued":
                        display.set(problem, "running", node)
                news = board.after.remote(seen)
            for ref in [r for r in ready if r in pending]:
                problem, attempt = pending.pop(ref)
                try:
                    entry = {"problem": problem, "result": ray.get(ref),
                             **({"attempts": errors[problem]} if problem in errors else {})}
                except ray.exceptions.RayError as e:
                    where = ran_on.get((problem, attempt))
                    errors.setdefault(problem, []).append(failure_reason(e) +
                                                          (f" (on {Display.label(where)})" if where else ""))
                    if attempt < ATTEMPTS:
                        display.set(problem, "queued")
                        submit(problem, attempt + 1)
                        continue
                    entry = {"problem": problem, "failed": errors[problem][-1], "attempts": errors[problem]}
                if checkpoint is not None:
                    checkpoint.record(entry)
                done[problem] = entry
                display.set(problem, "failed" if "failed" in entry else "done",
                            entry.get("result", {}).get("node"))
    except KeyboardInterrupt:
        for ref in pending:
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - a local cluster that the same Ctrl-C already stopped
                pass
        raise ClusterInterrupted(checkpoint.path if checkpoint else None, len(done), len(problems)) from None
    finally:
        ray.kill(board)
    return {p: done[p] for p in problems}


# ---- merging ------------------------------------------------------------------------------------

def merge(outcomes: dict[str, dict], expected: dict[str, list[dict]], sides: list[str], git: dict[str, dict],
          cluster: dict) -> dict[str, dict]:
    """The problems' results as ``run_sides`` gives them for the whole suite, per side: cases in problem
    order, each with the device it ran on, rounds joined, one provenance. A failed problem's cases
    (``expected``: problem -> the driver's case descriptions) are ``failed`` with the task's reason. Each
    task records the code of what its problem measured (a copy problem: torch's alone): the merged
    report holds their union, and a problem that records a file or contender otherwise than an earlier
    one (hosts with different code installed) is failed too."""
    ok = [o for o in outcomes.values() if "result" in o]
    if not ok:
        first = next(iter(outcomes.values()), {})
        raise ClusterError(f"every problem failed on the cluster, first: {first.get('problem')}: "
                           f"{first.get('failed')}")
    base = {s: ok[0]["result"]["sides"][s]["provenance"] for s in sides}
    merged = {s: {"cases": [], "rounds": [], "nodes": set(),
                  "provenance": dict(base[s], git=git[s], artifacts_sha256={}, measured_packages=[],
                                     **{f: {} for f in CODE_FIELDS})} for s in sides}
    stops = []
    for problem, outcome in outcomes.items():
        reason = outcome.get("failed")
        result = outcome.get("result")
        if result is not None:
            differ = {s: _code_conflicts(merged[s]["provenance"], result["sides"][s]["provenance"]) for s in sides}
            differ = {s: c for s, c in differ.items() if c}
            if differ:
                reason = (f"the code measured on {result['node']['host']} differs from earlier problems' ("
                          + "; ".join(f"{s}: {', '.join(c[:3])}" for s, c in differ.items())
                          + "): hosts must install the same contenders")
            else:
                for s in sides:
                    _add_code(merged[s]["provenance"], result["sides"][s]["provenance"])
        for s in sides:
            side = merged[s]
            if reason is not None:
                side["cases"].extend(dict(c, status="failed", reason=f"cluster task failed: {reason}", device=None)
                                     for c in expected[problem])
                continue
            got = result["sides"][s]
            device = device_of(result, s)
            side["cases"].extend(dict(c, device=device) for c in got["cases"])
            for r, data in enumerate(got["rounds"]):
                while len(side["rounds"]) <= r:
                    side["rounds"].append({})
                side["rounds"][r].update(data)
            side["provenance"]["artifacts_sha256"].update(got["provenance"].get("artifacts_sha256", {}))
            side["provenance"]["clocks_end"] = got["provenance"].get("clocks_end")
            side["nodes"].add(Display.label(result["node"]))
            if got.get("stopping"):
                stops.append(got["stopping"])
    for s in sides:
        side = merged[s]
        side["provenance"]["cluster"] = {**cluster, "nodes": sorted(side.pop("nodes")),
                                         "failed_problems": {p: o["failed"] for p, o in outcomes.items()
                                                             if "failed" in o},
                                         "retried_problems": retried(outcomes)}
        if stops:
            side["stopping"] = {"rounds": max(st["rounds"] for st in stops),
                                "reason": "; ".join(sorted({st["reason"] for st in stops}))}
    return merged


CODE_FIELDS = ("sources_sha256", "impl_sources")  # path -> sha256, and impl -> its distribution's files


def _code_conflicts(merged: dict, prov: dict) -> list[str]:
    """The entries of a problem's code fields that earlier problems recorded otherwise."""
    return [f"{field}[{key!r}]" for field in CODE_FIELDS for key, value in (prov.get(field) or {}).items()
            if key in merged[field] and merged[field][key] != value]


def _add_code(merged: dict, prov: dict) -> None:
    for field in CODE_FIELDS:
        merged[field].update(prov.get(field) or {})
    merged["measured_packages"] = sorted({*merged["measured_packages"], *(prov.get("measured_packages") or [])})


def retried(outcomes: dict[str, dict]) -> dict[str, list[str]]:
    """Per problem whose task failed at least once, why each failed attempt did."""
    return {p: o["attempts"] for p, o in outcomes.items() if o.get("attempts")}


def run_plan(session: Session, plan: Plan, problems: list[str], expected: dict[str, list[dict]],
             checkpoint: Checkpoint | None = None, display: Display | None = None,
             on_outcomes: Callable[[dict], None] | None = None) -> dict[str, dict]:
    """Run and merge: the sides of the whole plan, as ``run_sides`` returns them."""
    started = time.monotonic()
    git = {s: provenance.git_state(root) for s, root in plan.trees.items()}  # as the trees are shipped
    plan.fingerprints()
    outcomes = run_problems(session, plan, problems, checkpoint, display)
    if on_outcomes is not None:
        on_outcomes(outcomes)
    cluster = {"address": session.address or "local", "tasks": len(problems), "ray_startup_s": session.startup_s,
               "run_s": time.monotonic() - started}
    return merge(outcomes, expected, list(plan.trees), git, cluster)
