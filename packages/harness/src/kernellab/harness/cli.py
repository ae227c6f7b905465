"""``kernellab-bench``: run suites, write reports, print tables, draw plots, compare revisions."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import sys
import tempfile
from pathlib import Path

from tabulate import tabulate_formats

from . import assemble, plot, provenance, registry, table
from . import report as report_io
from .revision import RevisionError, materialize, run_sides
from .runner import Bench, Config, Progress, match
from .timing import ALL_MODES

EXIT_OK, EXIT_FAILED_VALIDATION, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
STAMP = "%Y%m%dT%H%M%S"
NAME_MAX = 255  # bytes in one path component on Linux's file systems
TAGS = {"run": "", "comparison": "-ab", "before_after": "-before-after", "partial": "-partial"}


class Interrupted(Exception):
    """Ctrl-C during a run; carries the report of the rounds that completed (None if none did)."""

    def __init__(self, partial: dict | None):
        super().__init__("interrupted")
        self.partial = partial


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kernellab-bench", description=__doc__)
    p.add_argument("--suite", action="append", help="suite to run (repeatable); default: every suite this "
                   "machine can run (GPU suites only where CUDA is present)")
    p.add_argument("--cases", help="comma-separated shell patterns over case names, e.g. 'softmax_*,*bf16'")
    p.add_argument("--impls", help="comma-separated patterns over impl names (torch, the control, always runs)")
    p.add_argument("--modes", help="comma-separated modes; default: all the device has")
    p.add_argument("--rounds", type=positive_int, help="rounds (suite default if omitted)")
    p.add_argument("--samples", type=positive_int, help="samples per round per mode")
    p.add_argument("--warmup", type=non_negative_int,
                   help="warmup passes over the rotated calls before each mode (at least 20 ms of them)")
    p.add_argument("--iterations", type=positive_int, help="calls per throughput sample")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed of every input")
    p.add_argument("--baseline", metavar="REV", help="compare against a git revision or a source .zip")
    p.add_argument("--out", default="reports/runs", help="output directory, or a .json file for one suite")
    p.add_argument("--no-plot", action="store_true", help="do not draw the PNG plot")
    p.add_argument("--list", action="store_true", help="list suites, impls and cases, then exit")
    p.add_argument("--show", metavar="REPORT", help="verify a report's hash and print its table, then exit")
    p.add_argument("--format", default="simple", help="table format for --show (tabulate's; 'github' for READMEs)")
    p.add_argument("--pivot", metavar="MODE", nargs="?", const="", help="with --show: one row per problem, one "
                   "column per impl, in MODE (default: the primary mode)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def config_for(suite, args) -> Config:
    base = dict(suite.defaults)
    for field in ("rounds", "samples", "warmup", "iterations"):
        value = getattr(args, field)
        if value is not None:
            base[field] = value
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip()) if args.modes else None
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
                raise SystemExit(_usage(f"unknown suite {name!r}; known suites: {sorted(suites)}"))
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


def run_single(suite, config: Config, args) -> dict:
    bench = Bench(suite, config, cases=args.cases, impls=args.impls)
    root = provenance.find_repo_root(Path(__file__))
    prov = provenance.collect(suite.device, root, bench.artifacts(), bench.measured_packages())
    runnable = sum(1 for c in bench.cases if c.call is not None)
    progress = Progress(runnable * config.rounds, enabled=not args.quiet)
    rounds = []
    try:
        for r in range(config.rounds):
            rounds.append(bench.run_round(r, progress))
    except KeyboardInterrupt:
        if not rounds:
            raise Interrupted(None) from None
        partial = _run_report(suite, dataclasses.replace(config, rounds=len(rounds)), bench, prov, rounds)
        partial["interrupted"] = {"rounds_completed": len(rounds), "rounds_planned": config.rounds}
        raise Interrupted(report_io.seal(partial)) from None
    return _run_report(suite, config, bench, prov, rounds)


def _run_report(suite, config: Config, bench: Bench, prov: dict, rounds: list) -> dict:
    prov["clocks_end"] = provenance.clocks(suite.device)
    prov["artifacts_sha256"] = provenance.artifact_hashes(bench.artifacts())
    side = {"cases": bench.describe(), "rounds": rounds, "provenance": prov,
            "revision": {"revision": "working tree", "kind": "local", "commit": prov["git"]["commit"],
                         "dirty": prov["git"]["dirty"]}}
    return assemble.run_report(suite, config.to_json(), side)


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
        sides = run_sides({"reference": base["root"], "candidate": repo}, request, config.rounds,
                          progress=not args.quiet)
        sides["reference"]["revision"], sides["candidate"]["revision"] = base, cand
    comparison = report_io.seal(assemble.comparison_report(suite, config.to_json(), sides["reference"],
                                                           sides["candidate"]))
    before_after = report_io.seal(assemble.before_after_report(comparison)) if suite.device == "cpu" else None
    return comparison, before_after


def save(report: dict, path: Path, args) -> Path:
    """An --out file is replaced; in an --out directory a report never replaces another one (two runs
    finishing in the same second get two names). Returns the path written."""
    return report_io.write(report, path) if Path(args.out).suffix == ".json" else report_io.write_new(report, path)


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
        return all(c["status"] in ("ok", "unsupported", "unavailable") for c in report["cases"])
    if report["kind"] == "comparison":
        return all(r["passed"] and r.get("replay_changed_input", True) for r in report["records"])
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
    try:
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
        suites, broken = registry.discover()
    except registry.SuiteError as e:
        return _usage(str(e))
    for name, why in broken.items():
        print(f"kernellab-bench: warning: suite {name!r} failed to load: {why}", file=sys.stderr)
    if args.list:
        gpu = cuda_available()
        for s in suites.values():
            runnable = "" if s.device == "cpu" or gpu else " [cannot run here: no CUDA device]"
            print(f"{s.name} ({s.device}): {s.description}{runnable}")
            print(f"  impls: {', '.join(i.name for i in s.impls)}"
                  + (f"; unavailable: {s.unavailable}" if getattr(s, "unavailable", None) else ""))
            for p in s.make_problems():
                print(f"  {p.name}")
        return EXIT_OK
    try:
        chosen = choose_suites(args, suites, broken)
    except SystemExit as e:
        return int(e.code)
    if not chosen:
        return _usage("no suite can run on this machine")
    problem = (out_problem(args, [s.name for s in chosen])
               or unmatched("--impls", args.impls, [i.name for s in chosen for i in s.impls])
               or unmatched("--cases", args.cases, [p.name for s in chosen for p in s.make_problems()]))
    if problem:
        return _usage(problem)
    ok = True
    for suite in chosen:
        try:
            config = config_for(suite, args)
            if args.baseline:
                comparison, before_after = run_ab(suite, config, args)
                ok &= emit(comparison, out_path(args, suite.name, "comparison"), args)
                if before_after is not None:
                    print()
                    emit(before_after, out_path(args, suite.name, "before_after"), args)
            else:
                report = report_io.seal(run_single(suite, config, args))
                ok &= emit(report, out_path(args, suite.name, "run"), args)
        except (ValueError, RevisionError, registry.SuiteError) as e:
            return _usage(str(e))
        except Interrupted as e:
            return interrupted(e.partial, suite, args)
        except KeyboardInterrupt:  # outside the rounds (an A/B's workers hold theirs): nothing to keep
            print(f"\nkernellab-bench: interrupted during suite {suite.name!r}; nothing saved", file=sys.stderr)
            return EXIT_INTERRUPTED
    if not ok:
        print("kernellab-bench: some validations failed; see the report's status fields", file=sys.stderr)
    return EXIT_OK if ok else EXIT_FAILED_VALIDATION


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
