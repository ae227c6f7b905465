"""``kernellab-bench``: run suites, write reports, print tables, draw plots, compare revisions."""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
from pathlib import Path

from . import assemble, plot, provenance, registry, signing, table
from . import report as report_io
from .revision import Extension, RevisionError, materialize, run_sides
from .runner import Config

EXIT_OK, EXIT_FAILED_VALIDATION, EXIT_USAGE = 0, 1, 2


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
    p.add_argument("--rotation-limit", type=positive_int, metavar="MIB", help="memory for the rotated input sets "
                   "(default 4096 MiB; fewer sets than twice the cache read some inputs from cache)")
    p.add_argument("--baseline", metavar="REV", help="compare against a git revision or a source .zip")
    p.add_argument("--max-rounds", type=positive_int, help="with --baseline: run more rounds (up to this many) for the "
                   "pairs whose gain interval is wider than --target-width, until --time-limit")
    p.add_argument("--target-width", type=float, default=1.10, help="gain interval width (hi/lo) that stops the "
                   "extra rounds (default 1.10)")
    p.add_argument("--time-limit", type=float, default=600.0, help="seconds after which no extra round starts "
                   "(default 600)")
    p.add_argument("--out", default="reports/runs", help="output directory, or a .json file for one suite")
    p.add_argument("--no-plot", action="store_true", help="do not draw the PNG plot")
    p.add_argument("--list", action="store_true", help="list suites, impls and cases, then exit")
    p.add_argument("--show", metavar="REPORT", help="verify a report's hash and print its table, then exit")
    p.add_argument("--format", default="simple", help="table format for --show (tabulate's; 'github' for READMEs)")
    p.add_argument("--pivot", metavar="MODE", nargs="?", const="", help="with --show: one row per problem, one "
                   "column per impl, in MODE (default: the primary mode)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--sign", metavar="KEYFILE", help="sign the reports written with this Ed25519 private key (PEM)")
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


def out_path(args, suite_name: str, kind: str, multiple: bool) -> Path:
    out = Path(args.out)
    if out.suffix == ".json":
        if multiple:
            raise SystemExit(_usage("--out names a single file but several suites run; give a directory"))
        return out if kind in ("run", "comparison") else out.with_name(f"{out.stem}.{kind}.json")
    stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M%S")
    tag = {"run": "", "comparison": "-ab", "before_after": "-before-after"}[kind]
    return out / f"{suite_name}{tag}-{stamp}.json"


def run_single(suite, config: Config, args) -> dict:
    """One revision, measured in a worker process: this process checks the results the worker ships
    without importing any contender code (``revision.run_sides``)."""
    root = provenance.find_repo_root(Path(__file__))
    request = {"suite": suite.name, "config": config.to_json(), "cases": args.cases, "impls": args.impls}
    side = run_sides({"candidate": root}, request, config.rounds, progress=not args.quiet)["candidate"]
    git = side["provenance"]["git"]
    side["revision"] = {"revision": "working tree", "kind": "local", "commit": git["commit"], "dirty": git["dirty"]}
    return assemble.run_report(suite, config.to_json(), side)


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
        sides = run_sides({"reference": base["root"], "candidate": repo}, request, config.rounds,
                          progress=not args.quiet, extension=extension_for(args))
        sides["reference"]["revision"], sides["candidate"]["revision"] = base, cand
    comparison = seal(assemble.comparison_report(suite, config.to_json(), sides["reference"], sides["candidate"]),
                      args)
    before_after = seal(assemble.before_after_report(comparison), args) if suite.device == "cpu" else None
    return comparison, before_after


def seal(report: dict, args) -> dict:
    """Seal a report, signed first where ``--sign`` gave a key (the hash then covers the signature)."""
    sealed = report_io.seal(report)
    key = getattr(args, "signing_key", None)
    return signing.sign(sealed, key) if key is not None else sealed


def emit(report: dict, path: Path, args) -> bool:
    """Write, print the table, draw the plot; returns whether every validation passed."""
    report_io.write(report, path)
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


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.show:
        try:
            shown = report_io.load(args.show)
            if args.pivot is not None and shown["kind"] == "run":
                print(table.pivot_table(shown, args.pivot or None, args.format))
            else:
                print(table.render(shown, args.format))
        except report_io.ReportError as e:
            return _usage(str(e))
        return EXIT_OK
    try:
        if args.keygen:
            private, public = signing.generate_keypair(args.keygen)
            print(f"private key: {private} (keep it secret)\npublic key: {public} (give it to auditors)")
            return EXIT_OK
        args.signing_key = signing.load_private_key(args.sign) if args.sign else None
    except signing.SigningError as e:
        return _usage(f"{'--keygen' if args.keygen else '--sign'}: {e}")
    try:
        suites, broken = registry.discover()
    except registry.SuiteError as e:
        return _usage(str(e))
    for name, why in broken.items():
        print(f"kernellab-bench: warning: suite {name!r} failed to load: {why}", file=sys.stderr)
    if args.list:
        for s in suites.values():
            print(f"{s.name} ({s.device}): {s.description}")
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
    ok = True
    for suite in chosen:
        try:
            config = config_for(suite, args)
            if args.baseline:
                comparison, before_after = run_ab(suite, config, args)
                ok &= emit(comparison, out_path(args, suite.name, "comparison", len(chosen) > 1), args)
                if before_after is not None:
                    print()
                    emit(before_after, out_path(args, suite.name, "before_after", len(chosen) > 1), args)
            else:
                report = seal(run_single(suite, config, args), args)
                ok &= emit(report, out_path(args, suite.name, "run", len(chosen) > 1), args)
        except (ValueError, RevisionError, registry.SuiteError) as e:
            return _usage(str(e))
        except SystemExit as e:
            return int(e.code)
    if not ok:
        print("kernellab-bench: some validations failed; see the report's status fields", file=sys.stderr)
    return EXIT_OK if ok else EXIT_FAILED_VALIDATION


if __name__ == "__main__":
    sys.exit(main())
