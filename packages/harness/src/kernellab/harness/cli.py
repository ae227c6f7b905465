"""``kernellab-bench``: run suites, write reports, print tables, draw plots, compare revisions."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib
import json
import os
import sys
import tempfile
from pathlib import Path

from tabulate import tabulate_formats

from . import assemble, cluster, consistency, gate, plot, provenance, registry, signing, stats, table
from . import report as report_io
from .revision import Extension, RevisionError, catalog, materialize, run_sides, terminate_as_interrupt
from .runner import Config, match
from .timing import ALL_MODES

EXIT_OK, EXIT_FAILED_VALIDATION, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_REGRESSION, EXIT_INCONCLUSIVE = 3, 4  # --fail-on-regression: a significant slowdown; control drift
SUBCOMMANDS = {"history": "history", "site": "site", "tables": "readme"}  # command -> module with its main(argv)
STAMP = "%Y%m%dT%H%M%S"
NAME_MAX = 255  # bytes in one path component on Linux's file systems
TAGS = {"run": "", "comparison": "-ab", "before_after": "-before-after", "partial": "-partial"}


class Interrupted(Exception):
    """Ctrl-C during a run; carries the report of the rounds that completed (None if none did)."""

    def __init__(self, partial: dict | None):
        super().__init__("interrupted")
        self.partial = partial


def _bounded(convert, ok, expected: str):
    """An argparse type: ``convert`` the text, and refuse it unless ``ok``, saying what was ``expected``."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text}")
        return value
    return parse


positive_int = _bounded(int, lambda v: v >= 1, "a positive integer")
non_negative_int = _bounded(int, lambda v: v >= 0, "an integer >= 0")
positive_float = _bounded(float, lambda v: 0 < v < float("inf"), "a number of seconds > 0")
percentage = _bounded(float, lambda v: 0 <= v < float("inf"), "a percentage >= 0")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kernellab-bench", description=__doc__,
                                epilog="subcommands (each with --help): kernellab-bench history {index,list}: the run "
                                "history; kernellab-bench site: the results page; kernellab-bench tables: the READMEs' "
                                f"generated tables. Exit codes: {EXIT_OK} ok, {EXIT_FAILED_VALIDATION} a validation "
                                f"failed, {EXIT_USAGE} usage, {EXIT_REGRESSION} regression, {EXIT_INCONCLUSIVE} "
                                "inconclusive (--fail-on-regression).")
    p.add_argument("--suite", action="append", help="suite to run (repeatable); default: every suite this "
                   "machine can run (GPU suites only where CUDA is present)")
    p.add_argument("--cases", help="comma-separated shell patterns over case names, e.g. 'softmax_*,*bf16'")
    p.add_argument("--impls", help="comma-separated patterns over impl names (torch, the control, always runs)")
    p.add_argument("--modes", help="comma-separated modes; default: all the device has")
    p.add_argument("--rounds", type=positive_int, help="rounds (suite default if omitted)")
    p.add_argument("--samples", type=positive_int, help="samples per round per mode")
    p.add_argument("--warmup", type=non_negative_int,
                   help="warmup batches of --iterations calls before each mode (at least 20 ms of them)")
    p.add_argument("--iterations", type=positive_int, help="calls per throughput sample")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed of every input")
    p.add_argument("--rotation-limit", type=positive_int, metavar="MIB", help="memory for the rotated input sets "
                   "(default 4096 MiB; fewer sets than twice the cache read some inputs from cache). One set a call "
                   "of a checked batch (2 x --iterations) is made past it: lower --iterations to need fewer")
    p.add_argument("--fresh-workers", action="store_true", help="a new worker process a side every round: what one "
                   "process fixes (code layout, allocator state, a JIT's choices) varies between rounds, so the gain "
                   "interval holds it; each round pays a worker's start and setup")
    p.add_argument("--baseline", metavar="REV", help="compare against a git revision or a source .zip")
    p.add_argument("--max-rounds", type=positive_int, help="with --baseline: run more rounds (up to this many) for the "
                   "pairs whose gain interval is wider than --target-width, until --time-limit")
    p.add_argument("--target-width", type=float, default=1.10, help="gain interval width (hi/lo) that stops the "
                   "extra rounds (default 1.10)")
    p.add_argument("--time-limit", type=float, default=600.0, help="seconds after which no extra round starts "
                   "(default 600)")
    p.add_argument("--against", metavar="REPORT_OR_REV", help="compare this run with a committed run report "
                   "(a .json file) or a revision (as --baseline); writes the comparison report")
    p.add_argument("--fail-on-regression", metavar="PCT", type=percentage, help="with --against or --baseline: "
                   f"exit {EXIT_REGRESSION} when any case's gain interval lies wholly below 1/(1+PCT/100), "
                   f"{EXIT_INCONCLUSIVE} when the control drifted beyond the flag instead")
    p.add_argument("--summary", metavar="FILE", help="append a markdown summary (verdict, per-case table) to FILE, "
                   "e.g. $GITHUB_STEP_SUMMARY")
    p.add_argument("--out", default="reports/runs", help="output directory, or a .json file for one suite")
    p.add_argument("--no-plot", action="store_true", help="do not draw the PNG plot")
    p.add_argument("--list", action="store_true", help="list suites, impls and cases, then exit")
    p.add_argument("--show", metavar="REPORT", help="verify a report's hash and print its table, then exit")
    p.add_argument("--format", default="simple", help="table format for --show (tabulate's; 'github' for READMEs)")
    p.add_argument("--pivot", metavar="MODE", nargs="?", const="", help="with --show: one row per problem, one "
                   "column per impl, in MODE (default: the primary mode)")
    p.add_argument("--ray", metavar="ADDRESS", nargs="?", const="", help="run the suites as Ray tasks, one problem "
                   "per task (one GPU, or a node's cores, each): on the cluster at ADDRESS ('auto': the one running "
                   "on this host), or without ADDRESS on a local cluster started for this run")
    p.add_argument("--resume", metavar="CHECKPOINT", help="with --ray: finish the run whose checkpoint this is "
                   "(printed at its start), without redoing its completed problems")
    p.add_argument("--case-timeout", metavar="SECONDS", type=positive_float, default=3600.0,
                   help="with --ray: a case running longer (a hung kernel) kills its task, which is retried once, "
                   "then recorded failed (default 3600)")
    p.add_argument("--ray-cpus", metavar="N", type=positive_int, help="with --ray: CPUs per task (default: a CPU "
                   "suite takes the smallest node's cores, a GPU suite one CPU beside its GPU)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--sign", metavar="KEYFILE", help="sign the reports written with this Ed25519 private key (PEM)")
    p.add_argument("--trusted-keys", metavar="PATH", help="with --against REPORT: Ed25519 public keys (a PEM file, "
                   "or a directory of .pem/.pub files) one of which must have signed the report (a consistent "
                   "forgery passes every other check)")
    p.add_argument("--keygen", metavar="PATH", help="write a new Ed25519 key pair (PATH, PATH.pub), then exit")
    return p


def config_for(suite, args) -> Config:
    base = dict(suite.defaults)
    for field in ("rounds", "samples", "warmup", "iterations"):
        value = getattr(args, field)
        if value is not None:
            base[field] = value
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip()) if args.modes else None
    if args.rotation_limit:
        base["rotation_limit_bytes"] = args.rotation_limit * 2**20
    if getattr(args, "fresh_workers", False):
        base["fresh_workers"] = True
    return Config(seed=args.seed, modes=modes, **base)


def cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def choose_suites(args, suites, broken) -> list:
    if args.suite:
        chosen = []
        for name in args.suite:
            if name in broken:
                raise SystemExit(_usage(f"suite {name!r} failed to load: {broken[name]}"))
            if name not in suites:
                raise SystemExit(_usage(f"unknown suite {name!r}; known suites: {registry.suite_names()}"))
            if suites[name].device == "cuda" and not cuda_available():
                raise SystemExit(_usage(f"suite {name!r} needs a CUDA device and this machine has none"))
            chosen.append(suites[name])
        return chosen
    gpu = cuda_available()
    return [s for s in suites.values() if s.device == "cpu" or gpu]


def _usage(msg: str) -> int:
    print(f"kernellab-bench: error: {msg}", file=sys.stderr)
    return EXIT_USAGE


def out_path(args, suite_name: str, kind: str) -> Path:
    out = Path(args.out)
    if out.suffix == ".json":
        return out if kind in ("run", "comparison") else out.with_name(f"{out.stem}.{kind}.json")
    return out / f"{suite_name}{TAGS[kind]}-{datetime.datetime.now().strftime(STAMP)}.json"


def out_problem(args, suite_names: list[str]) -> str | None:
    """Why ``--out`` cannot take this run's files, or None; checked before anything is measured."""
    out = Path(args.out)
    single = out.suffix == ".json"
    if single and len(suite_names) > 1:
        return "--out names a single file but several suites run; give a directory"
    directory = out.parent if single else out
    if single:
        names = [out.name, out.with_suffix(".png").name, *(f"{out.stem}.{k}.json" for k in ("before_after", "partial"))]
    else:
        stamp = datetime.datetime.now().strftime(STAMP)
        names = [f"{name}{tag}-{stamp}-9999.json" for name in suite_names for tag in TAGS.values()]
    too_long = [n for n in (*directory.parts, *names) if len(os.fsencode(n)) > NAME_MAX]
    if too_long:
        return f"--out {out}: the name {too_long[0][:40]}... is longer than this file system's {NAME_MAX} bytes"
    if single and out.is_dir():
        return f"--out {out} is a directory; give a directory name without .json, or a file inside it"
    if not single and out.exists() and not out.is_dir():
        return f"--out {out} is a file, not a directory (a single report's file name ends in .json)"
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"--out {out}: {existing} is a file, so the directory {directory} cannot be made"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"--out {out}: {existing} is not writable"
    return None


def unmatched(option: str, patterns: str | None, names: list[str]) -> str | None:
    """A pattern of ``--cases``/``--impls`` that matches nothing: a typo, not a filter."""
    for pattern in (p.strip() for p in (patterns or "").split(",")):
        if pattern and not any(match(n, pattern) for n in names):
            return f"{option} pattern {pattern!r} matches none of {sorted(set(names))}"
    return None


def working_tree() -> Path | None:
    """The checkout this harness runs from, whose packages its workers import (None: the installed packages)."""
    return provenance.find_repo_root(Path(__file__))


def list_suites() -> int:
    """--list: every suite as a worker of the working tree loads it, its impls included (none loaded here)."""
    try:
        listing = catalog(working_tree())
    except RevisionError as e:
        return _usage(str(e))
    for name, why in listing["broken"].items():
        print(f"kernellab-bench: warning: suite {name!r} failed to load: {why}", file=sys.stderr)
    gpu = cuda_available()
    for s in listing["suites"]:
        runnable = "" if s["device"] == "cpu" or gpu else " [cannot run here: no CUDA device]"
        print(f"{s['name']} ({s['device']}): {s['description']}{runnable}")
        unavailable = f"; unavailable: {s['unavailable']}" if s["unavailable"] else ""
        print(f"  impls: {', '.join(s['impls'])}{unavailable}")
        for name in s["problems"]:
            print(f"  {name}")
    return EXIT_OK


def contenders(suites) -> list[dict]:
    """The given suites (a dict or list of them, loaded without their impls) as a worker of the working tree loads
    them, each with its impls' names (``revision.catalog``), in the given order."""
    names = [s.name for s in (suites.values() if isinstance(suites, dict) else suites)]
    found = {s["name"]: s for s in catalog(working_tree())["suites"]}
    return [found[n] for n in names if n in found]


def measure_side(suite, config: Config, args) -> dict:
    """One revision's measured rounds, in the working tree, measured in a worker process: this process
    checks the results the worker ships without importing any contender code (``revision.run_sides``).
    After Ctrl-C the completed rounds are raised as a partial report (``Interrupted``)."""
    root = working_tree()
    if getattr(args, "cluster", None) is not None:
        side = cluster_sides(suite, config, args, {"candidate": root})["candidate"]
    else:
        request = {"suite": suite.name, "config": config.to_json(), "cases": args.cases, "impls": args.impls}
        side = run_sides({"candidate": root}, request, config.rounds, progress=not args.quiet)["candidate"]
    git = side["provenance"]["git"]
    side["revision"] = {"revision": "working tree", "kind": "local", "commit": git["commit"], "dirty": git["dirty"]}
    if side.get("interrupted"):
        done = side["interrupted"]["rounds_completed"]
        if not done:
            raise Interrupted(None)
        partial = assemble.run_report(suite, dataclasses.replace(config, rounds=done).to_json(), side)
        partial["interrupted"] = side["interrupted"]
        raise Interrupted(report_io.seal(partial))
    return side


def cluster_sides(suite, config: Config, args, trees: dict) -> dict:
    """``run_sides`` on the Ray cluster: one task per problem, checkpointed (``--resume``), merged."""
    problems = [p for p in suite.make_problems() if match(p.name, args.cases)]
    listed = [i for i in contenders([suite])[0]["impls"] if i != suite.control and match(i, args.impls)]
    impls = [suite.control, *listed]  # the control from this process's suite: a failed problem's cases stay failed
    expected = {p.name: [{"id": f"{p.name}/{i}", "problem": p.describe(), "impl": i, "status": "failed",
                          "reason": None} for i in impls] for p in problems}
    request = {"suite": suite.name, "config": config.to_json(), "cases": None, "impls": args.impls}
    plan = cluster.Plan(trees={k: Path(v) for k, v in trees.items()}, request=request, rounds=config.rounds,
                        device=suite.device, cpus=args.ray_cpus, case_timeout_s=args.case_timeout,
                        extension=extension_for(args) if len(trees) == 2 else None)
    header = {"suite": suite.name, "config": config.to_json(), "cases": args.cases, "impls": args.impls,
              "sides": sorted(trees), "trees": plan.fingerprints(),
              "extension": dataclasses.asdict(plan.extension) if plan.extension else None}
    if args.resume:
        checkpoint = cluster.Checkpoint.resume(args.resume, header)
        print(f"resuming {args.resume}: {len(checkpoint.done)} of {len(problems)} problems done", file=sys.stderr)
    else:
        path = out_path(args, suite.name, "run")
        path = path.with_name(f"{path.stem}.checkpoint.jsonl")
        checkpoint = cluster.Checkpoint.start(path, header)
        print(f"checkpoint: {path} (after a kill, finish the run with --resume {path})", file=sys.stderr)
    sides = cluster.run_plan(args.cluster, plan, [p.name for p in problems], expected, checkpoint,
                             cluster.Display(len(problems), enabled=not args.quiet))
    info = sides[next(iter(sides))]["provenance"]["cluster"]
    print(f"cluster: {len(problems)} problems in {info['run_s']:.1f} s on {len(info['nodes'])} node(s); "
          f"Ray start-up {info['ray_startup_s']:.1f} s apart", file=sys.stderr)
    args.checkpoints.append(checkpoint)
    return sides


def run_single(suite, config: Config, args) -> dict:
    return assemble.run_report(suite, config.to_json(), measure_side(suite, config, args))


def against_report(args) -> dict | None:
    """The run report named by --against, or None where --against names a revision; one whose derived numbers
    do not follow from its raw data (edited and re-hashed) is refused."""
    if not args.against or not args.against.endswith(".json"):
        return None
    report = report_io.load(args.against)
    if getattr(args, "trusted_keys", None):
        try:
            signing.verify(report, signing.load_trusted(args.trusted_keys))
        except signing.SigningError as e:
            raise report_io.ReportError(f"{args.against} is not signed by a trusted key: {e}") from e
    found = consistency.check(report)
    if found:
        raise report_io.ReportError(f"{args.against} does not follow from its own raw data ({len(found)} "
                                    f"inconsistencies, first: {found[0]}): edited after it was written, it cannot "
                                    "be a reference")
    return report


def check_gate_args(args) -> str | None:
    """What is wrong with the combination of --against, --baseline and --fail-on-regression, if anything."""
    if args.against and args.baseline:
        return "give either --against or --baseline, not both"
    if args.fail_on_regression is not None and not (args.against or args.baseline):
        return "--fail-on-regression needs a reference: --against REPORT_OR_REV or --baseline REV"
    if getattr(args, "trusted_keys", None) and not (args.against or "").endswith(".json"):
        return "--trusted-keys checks the report given to --against: give --against REPORT.json"
    if args.fail_on_regression is not None and args.rounds is not None and args.rounds < stats.MIN_ROUNDS:
        return (f"--fail-on-regression decides nothing over fewer than {stats.MIN_ROUNDS} rounds (stats.MIN_ROUNDS): "
                f"give --rounds {stats.MIN_ROUNDS} or more, not {args.rounds}")
    return None


def gate_exit(comparisons: list[dict], runs: list[dict], args) -> int:
    """Print the gate's verdict over every comparison of this invocation, append the markdown summary
    (plain runs: their table), and return the exit code the verdicts call for."""
    code = EXIT_OK
    parts = [f"## kernellab-bench: {r['suite']}\n\n{table.pivot_table(r, None, 'github')}\n" for r in runs]
    for comparison in comparisons:
        verdict = None
        if args.fail_on_regression is not None:
            verdict = gate.evaluate(comparison, args.fail_on_regression, args.cases, args.impls)
            print(gate.describe(verdict))
            if verdict.status == gate.REGRESSION:
                code = EXIT_REGRESSION
            elif verdict.status == gate.INCONCLUSIVE and code == EXIT_OK:
                code = EXIT_INCONCLUSIVE
        parts.append(gate.markdown(comparison, verdict))
    if args.summary:
        with open(args.summary, "a", encoding="utf-8") as fh:
            fh.write("\n".join(parts))
    return code


def extension_for(args) -> Extension:
    return Extension(target_width=args.target_width, max_rounds=args.max_rounds or 0, time_limit_s=args.time_limit)


def run_ab(suite, config: Config, args) -> tuple[dict, dict | None]:
    repo = provenance.find_repo_root(Path.cwd()) or provenance.find_repo_root(Path(__file__))
    if repo is None:
        raise RevisionError("--baseline needs a KernelLab checkout (run from inside one)")
    with tempfile.TemporaryDirectory(prefix="kernellab-baseline-") as tmp:
        base = materialize(args.baseline, repo, tmp)
        git = provenance.git_state(repo)
        cand = {"revision": "working tree", "kind": "local", "commit": git["commit"], "dirty": git["dirty"],
                "root": str(repo)}
        request = {"suite": suite.name, "config": config.to_json(), "cases": args.cases, "impls": args.impls}
        if getattr(args, "cluster", None) is not None:
            sides = cluster_sides(suite, config, args, {"reference": base["root"], "candidate": repo})
        else:
            sides = run_sides({"reference": base["root"], "candidate": repo}, request, config.rounds,
                              progress=not args.quiet, extension=extension_for(args))
        sides["reference"]["revision"], sides["candidate"]["revision"] = base, cand
    stopped = sides["candidate"].get("interrupted")
    if stopped:  # Ctrl-C or SIGTERM: the comparison of the rounds both sides completed, as a partial report
        if not stopped["rounds_completed"]:
            raise Interrupted(None)
        done = dataclasses.replace(config, rounds=stopped["rounds_completed"]).to_json()
        partial = assemble.comparison_report(suite, done, sides["reference"], sides["candidate"])
        partial["interrupted"] = stopped
        raise Interrupted(seal(partial, args))
    comparison = seal(assemble.comparison_report(suite, config.to_json(), sides["reference"], sides["candidate"]),
                      args)
    before_after = seal(assemble.before_after_report(comparison), args) if suite.device == "cpu" else None
    return comparison, before_after


def seal(report: dict, args) -> dict:
    """Seal a report, signed first where ``--sign`` gave a key (the hash then covers the signature)."""
    sealed = report_io.seal(report)
    key = getattr(args, "signing_key", None)
    return signing.sign(sealed, key) if key is not None else sealed


def save(report: dict, path: Path, args) -> Path:
    """An --out file is replaced; in an --out directory a report never replaces another one (two runs
    finishing in the same second get two names). Returns the path written."""
    return report_io.write(report, path) if Path(args.out).suffix == ".json" else report_io.write_new(report, path)


UNFAILED_STATUSES = frozenset({"ok", "unsupported", "unavailable"})  # a case's statuses that fail no run


def emit(report: dict, path: Path, args) -> bool:
    """Write, print the table, draw the plot; returns whether every validation passed."""
    path = save(report, path, args)
    print(table.render(report))
    print(f"report: {path}")
    if not args.no_plot and report["kind"] in ("run", "comparison"):
        why = plot.available()
        if why:
            print(f"plot: skipped, {why}")
        else:
            png = plot.draw(report, path.with_suffix(".png"))
            if png:
                print(f"plot: {png}")
    if report["kind"] == "run":
        return {c["status"] for c in report["cases"]} <= UNFAILED_STATUSES
    if report["kind"] == "comparison":  # a case unsupported or unavailable on a side failed nothing (the gate asks)
        return all({r["reference_status"], r["candidate_status"]} <= UNFAILED_STATUSES
                   and r.get("replay_changed_input", True) for r in report["records"])
    return True


def show(args) -> int:
    """--show: verify a report, then print its table (or with --pivot, its pivot table)."""
    try:
        shown = report_io.load(args.show)
        report_io.check_contents(shown)
    except report_io.ReportError as e:
        return _usage(str(e))
    if args.pivot is None:
        print(table.render(shown, args.format))
        return EXIT_OK
    if shown["kind"] != "run":
        return _usage(f"--pivot needs a run report; {args.show} is a {shown['kind']} report")
    measured = [m for m in ALL_MODES if any(m in c["modes"] for c in shown["cases"])]
    if args.pivot and args.pivot not in measured:
        return _usage(f"--pivot {args.pivot}: {args.show} has no {args.pivot} measurements; it has {measured}")
    print(table.pivot_table(shown, args.pivot or None, args.format))
    return EXIT_OK


def check_options(args) -> str | None:
    """Options whose mistakes need no suite to see: a misspelt format or mode is refused, not ignored."""
    if args.format not in tabulate_formats:
        return f"--format {args.format!r} is not a table format; formats: {', '.join(sorted(tabulate_formats))}"
    if args.pivot is not None:
        if not args.show:
            return "--pivot only applies with --show REPORT"
        if args.pivot and args.pivot not in ALL_MODES:
            return f"--pivot {args.pivot!r} is not a mode; modes: {', '.join(ALL_MODES)}"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in SUBCOMMANDS:
        return importlib.import_module(f".{SUBCOMMANDS[argv[0]]}", __package__).main(argv[1:])
    try:
        with terminate_as_interrupt():  # SIGTERM (timeout, a scheduler) keeps the completed rounds, as Ctrl-C does
            return run(argv)
    except KeyboardInterrupt:  # outside a suite's rounds: nothing measured to keep
        print("\nkernellab-bench: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def run(argv: list[str] | None) -> int:
    args = parser().parse_args(argv)
    problem = check_options(args)
    if problem:
        return _usage(problem)
    if args.show:
        return show(args)
    try:
        if args.keygen:
            private, public = signing.generate_keypair(args.keygen)
            print(f"private key: {private} (keep it secret)\npublic key: {public} (give it to auditors)")
            return EXIT_OK
        args.signing_key = signing.load_private_key(args.sign) if args.sign else None
    except signing.SigningError as e:
        return _usage(f"{'--keygen' if args.keygen else '--sign'}: {e}")
    if args.list:
        return list_suites()
    problem = check_gate_args(args)
    if problem:
        return _usage(problem)
    try:
        reference = against_report(args)
    except report_io.ReportError as e:
        return _usage(f"--against: {e}")
    if reference is not None and args.fail_on_regression is not None \
            and reference["config"]["rounds"] < stats.MIN_ROUNDS:
        return _usage(f"--against {args.against} ran {reference['config']['rounds']} round(s): --fail-on-regression "
                      f"decides nothing over fewer than {stats.MIN_ROUNDS} (stats.MIN_ROUNDS); measure a reference "
                      f"with --rounds {stats.MIN_ROUNDS} or more")
    if reference is not None and not args.suite:
        args.suite = [reference["suite"]]
    problem = check_cluster_args(args)
    if problem:
        return _usage(problem)
    try:  # the chosen suites' problems and controls only: contenders are imported in the workers, never here
        suites, broken = registry.discover(impls=False, names=set(args.suite) if args.suite else None)
    except registry.SuiteError as e:
        return _usage(str(e))
    for name, why in broken.items():
        print(f"kernellab-bench: warning: suite {name!r} failed to load: {why}", file=sys.stderr)
    try:
        chosen = choose_suites(args, suites, broken)
    except SystemExit as e:
        return int(e.code)
    if not chosen:
        return _usage("no suite can run on this machine")
    if args.resume and len(chosen) != 1:
        return _usage(f"--resume finishes one suite's run; {len(chosen)} suites were chosen")
    problem = (out_problem(args, [s.name for s in chosen])
               or (args.impls and unmatched("--impls", args.impls,
                                             [i for s in contenders(chosen) for i in s["impls"]]))
               or unmatched("--cases", args.cases, [p.name for s in chosen for p in s.make_problems()]))
    if problem:
        return _usage(problem)
    args.cluster, args.checkpoints = None, []
    if args.ray is not None:
        try:
            args.cluster = cluster.connect(args.ray or None)
        except cluster.ClusterError as e:
            return _usage(str(e))
        how = ("joined " + args.ray if args.ray else "started a local cluster") if args.cluster.owned else \
            "kept this process's connection"
        print(f"ray: {how} in {args.cluster.startup_s:.1f} s (Ray start-up, not counted in the run)", file=sys.stderr)
    try:
        code = run_chosen(chosen, reference, args)
    finally:
        if args.cluster is not None:
            args.cluster.close()
    return code


def check_cluster_args(args) -> str | None:
    """--resume and the cluster options need --ray; --resume names a checkpoint whose suite is the one run."""
    given = [o for o, v in (("--resume", args.resume), ("--ray-cpus", args.ray_cpus)) if v is not None]
    if args.ray is None and given:
        return f"{given[0]} applies to a cluster run only: add --ray [ADDRESS]"
    if args.resume:
        try:
            header = json.loads(Path(args.resume).read_text().splitlines()[0])
        except (OSError, ValueError, IndexError) as e:
            return f"--resume {args.resume}: not a readable checkpoint ({e})"
        if not isinstance(header, dict) or header.get("format") != cluster.CHECKPOINT_FORMAT:
            return f"--resume {args.resume}: not a kernellab checkpoint (expected format {cluster.CHECKPOINT_FORMAT})"
        if not args.suite:
            args.suite = [header.get("suite")]
    return None


def run_chosen(chosen: list, reference: dict | None, args) -> int:
    """Measure, write and gate every chosen suite (in this process's workers, or on the cluster)."""
    ok = True
    comparisons, runs = [], []
    for suite in chosen:
        try:
            config = config_for(suite, args)
            if reference is not None:
                side = measure_side(suite, config, args)
                ok &= emit(seal(assemble.run_report(suite, config.to_json(), side), args),
                           out_path(args, suite.name, "run"), args)
                print()
                comparison = seal(gate.compare_with_report(suite, config.to_json(), reference, side, args.against),
                                  args)
                comparisons.append(comparison)
                ok &= emit(comparison, out_path(args, suite.name, "comparison"), args)
            elif args.baseline or args.against:
                args.baseline = args.baseline or args.against
                comparison, before_after = run_ab(suite, config, args)
                comparisons.append(comparison)
                ok &= emit(comparison, out_path(args, suite.name, "comparison"), args)
                if before_after is not None:
                    print()
                    emit(before_after, out_path(args, suite.name, "before_after"), args)
            else:
                report = seal(run_single(suite, config, args), args)
                runs.append(report)
                ok &= emit(report, out_path(args, suite.name, "run"), args)
        except (ValueError, RevisionError, registry.SuiteError, cluster.ClusterError) as e:
            return _usage(str(e))
        except Interrupted as e:
            return interrupted(e.partial, suite, args)
        except cluster.ClusterInterrupted as e:
            where = f"; the {e.done} of {e.total} problems that completed are in {e.checkpoint}, which --resume " \
                    "finishes" if e.checkpoint and e.done else ""
            print(f"\nkernellab-bench: interrupted during suite {suite.name!r}; the cluster's tasks were cancelled, "
                  f"no report written{where}", file=sys.stderr)
            return EXIT_INTERRUPTED
        except KeyboardInterrupt:  # outside the rounds (an A/B's workers hold theirs): nothing to keep
            print(f"\nkernellab-bench: interrupted during suite {suite.name!r}; nothing saved", file=sys.stderr)
            return EXIT_INTERRUPTED
    for checkpoint in args.checkpoints:  # their reports are written: nothing left to resume
        checkpoint.remove()
    gated = gate_exit(comparisons, runs, args)
    if not ok:
        print("kernellab-bench: some cases failed (a validation, or a cluster task); see the report's status and "
              "reason fields", file=sys.stderr)
        return EXIT_FAILED_VALIDATION
    return gated


def interrupted(partial: dict | None, suite, args) -> int:
    """Ctrl-C: one line instead of a traceback, and the completed rounds kept in a partial report."""
    print(file=sys.stderr)
    if partial is None:
        print(f"kernellab-bench: interrupted during suite {suite.name!r}; no round had completed, nothing saved",
              file=sys.stderr)
    else:
        path = save(partial, out_path(args, suite.name, "partial"), args)
        done = partial["interrupted"]
        print(f"kernellab-bench: interrupted during suite {suite.name!r}; the {done['rounds_completed']} of "
              f"{done['rounds_planned']} rounds that completed are in {path}", file=sys.stderr)
    return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
