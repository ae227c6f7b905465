"""Each package on its own, as a user gets it: build every wheel and sdist, then per package a fresh
venv holding that package alone (installed from the local wheels, the only index for KernelLab's own
packages), its console scripts run, and its sdist's tests run from the unpacked sdist, outside the
repository.

    python tools/install_check.py [--dist DIST] [--torch-dir DIR | --torch REQ] [--no-tests]
                                  [--test-extras PACKAGE=EXTRA,...] [PACKAGE ...]

torch: ``--torch-dir`` names a directory holding an installed torch (nox's shared one) that each venv
sees through a ``.pth`` file, so torch is installed once; otherwise each venv pip-installs ``--torch``
(default ``torch==2.13.0``). Third-party dependencies come from the configured index.
Exit 0 when every package installed, ran its scripts and passed its tests; the failures are listed.
"""

from __future__ import annotations

import argparse
import email.parser
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("harness", "kernels", "megakernel", "audit")
OWN = "kernellab-"
# Beyond --help: a command per console script that shows it works without a GPU.
SMOKE = {"kernellab-bench": ["--list"]}


def log(text: str) -> None:
    print(f"install-check: {text}", file=sys.stderr, flush=True)


def run(cmd: list, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)


def build(packages: list[str], dist: Path) -> dict[str, dict[str, Path]]:
    """Wheel and sdist of each package into ``dist``; returns package -> {"wheel", "sdist"}."""
    built = {}
    for k, name in enumerate(packages, 1):
        log(f"[{k}/{len(packages)}] building the wheel and sdist of {name}")
        res = run([sys.executable, "-m", "build", "--outdir", dist, ROOT / "packages" / name])
        if res.returncode:
            raise SystemExit(f"install-check: building {name} failed:\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}")
        project = f"kernellab_{name}"
        built[name] = {"wheel": max(dist.glob(f"{project}-*.whl"), key=os.path.getmtime),
                       "sdist": max(dist.glob(f"{project}-*.tar.gz"), key=os.path.getmtime)}
    return built


def metadata(wheel: Path) -> tuple[list[Requirement], list[str]]:
    """A wheel's requirements and its console scripts."""
    with zipfile.ZipFile(wheel) as zf:
        info = next(n.split("/")[0] for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(zf.read(f"{info}/METADATA").decode())
        try:
            points = zf.read(f"{info}/entry_points.txt").decode()
        except KeyError:
            points = ""
    scripts, section = [], None
    for line in points.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "console_scripts" and "=" in line:
            scripts.append(line.split("=")[0].strip())
    return [Requirement(r) for r in meta.get_all("Requires-Dist") or []], scripts


def third_party(name: str, extras: set[str], wheels: dict[str, Path], seen: set | None = None) -> list[str]:
    """The non-KernelLab requirements of ``name[extras]`` and of the KernelLab packages it pulls in."""
    seen = set() if seen is None else seen
    if (name, frozenset(extras)) in seen:
        return []
    seen.add((name, frozenset(extras)))
    found = []
    for req in metadata(wheels[name])[0]:
        env = default_environment()
        if req.marker and not any(req.marker.evaluate({**env, "extra": e}) for e in extras | {""}):
            continue
        own = canonicalize_name(req.name)
        if own.startswith(OWN):
            if own not in wheels:
                raise SystemExit(f"install-check: {name} needs {req}, which is not built here")
            found += third_party(own, set(req.extras), wheels, seen)
        else:  # torch too: pip finds it satisfied where the shared one is attached
            found.append(f"{req.name}{req.specifier}")
    return found


class Venv:
    def __init__(self, path: Path, torch_dir: Path | None, torch: str):
        self.path = path
        res = run([sys.executable, "-m", "venv", path])
        if res.returncode:
            raise SystemExit(f"install-check: python -m venv {path} failed: {res.stderr}")
        self.python = path / "bin" / "python"
        if torch_dir:
            purelib = run([self.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout
            Path(purelib.strip(), "kernellab-shared-torch.pth").write_text(f"{torch_dir}\n")
        else:
            self.pip("install", torch)

    def pip(self, *args: str) -> None:
        res = run([self.python, "-m", "pip", "install", "--quiet", *args])
        if res.returncode:
            raise RuntimeError(f"pip install {' '.join(args)} failed:\n{res.stdout[-3000:]}{res.stderr[-3000:]}")

    def install(self, name: str, extras: set[str], wheels: dict[str, Path], dist: Path) -> None:
        """Third-party requirements from the index, then the package from the local wheels only."""
        deps = third_party(name, extras, wheels)
        if deps:
            self.pip(*deps)
        spec = f"{name}[{','.join(sorted(extras))}]" if extras else name
        self.pip("--no-index", "--find-links", str(dist), spec)


def check(package: str, built: dict, dist: Path, work: Path, torch_dir: Path | None, torch: str,
          test_extras: set[str] | None) -> list[str]:
    """One package alone: its problems, empty when none."""
    name = f"{OWN}{package}"
    wheels = {f"{OWN}{p}": b["wheel"] for p, b in built.items()}
    problems = []
    t0 = time.monotonic()
    venv = Venv(work / package / "venv", torch_dir, torch)
    try:
        venv.install(name, set(), wheels, dist)
    except RuntimeError as e:
        return [f"{name}: {e}"]
    listed = run([venv.python, "-m", "pip", "list", "--format=freeze"]).stdout
    others = sorted(line.split("==")[0] for line in listed.splitlines()
                    if canonicalize_name(line.split("==")[0]).startswith(OWN))
    log(f"{name} installed from its wheel with {others} ({time.monotonic() - t0:.0f} s)")
    res = run([venv.python, "-c", f"import kernellab.{package}"])
    if res.returncode:
        problems.append(f"{name}: import kernellab.{package} failed: {res.stderr.strip()[-2000:]}")
    for script in metadata(wheels[name])[1]:
        for args in (["--help"], SMOKE.get(script)):
            if args is None:
                continue
            res = run([venv.path / "bin" / script, *args], cwd=work, timeout=600)
            shown = f"{script} {' '.join(args)}"
            if res.returncode:
                problems.append(f"{name}: `{shown}` exited {res.returncode}: {(res.stderr or res.stdout)[-2000:]}")
            else:
                log(f"{name}: `{shown}` ok")
    if test_extras is not None:
        problems += sdist_tests(package, built[package]["sdist"], venv, wheels, dist, work, test_extras)
    return problems


def sdist_tests(package: str, sdist: Path, venv: Venv, wheels: dict, dist: Path, work: Path,
                extras: set[str]) -> list[str]:
    """The sdist's own tests, from the unpacked sdist (no monorepo around it), with the extras its tests
    take (nox's tests session takes the same)."""
    name = f"{OWN}{package}"
    try:
        venv.install(name, extras, wheels, dist)
    except RuntimeError as e:
        return [f"{name}[{','.join(sorted(extras))}]: {e}"]
    unpacked = work / package / "sdist"
    with tarfile.open(sdist) as tf:
        tf.extractall(unpacked, filter="data")
    [tree] = list(unpacked.iterdir())
    env = dict(os.environ, HYPOTHESIS_PROFILE="ci", KERNELLAB_CACHE_DIR=str(work / package / "cache"))
    env.pop("PYTHONPATH", None)
    log(f"{name}: running the sdist's tests in {tree}")
    t0 = time.monotonic()
    res = run([venv.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=tree, env=env, timeout=3600)
    tail = (res.stdout or res.stderr).strip().splitlines()[-1:] or ["no output"]
    log(f"{name}: sdist tests: {tail[0]} ({time.monotonic() - t0:.0f} s)")
    if res.returncode:
        return [f"{name}: the sdist's tests failed:\n{res.stdout[-4000:]}{res.stderr[-2000:]}"]
    return []


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="install_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("packages", nargs="*", metavar="PACKAGE",
                   help=f"packages to check (default: all of {', '.join(PACKAGES)})")
    p.add_argument("--dist", default=str(ROOT / "dist" / "install-check"), help="where the wheels and sdists go")
    p.add_argument("--torch-dir", help="a directory holding an installed torch, shared by every venv")
    p.add_argument("--torch", default=os.environ.get("KERNELLAB_TORCH", "torch==2.13.0"),
                   help="the torch each venv installs without --torch-dir (default $KERNELLAB_TORCH or torch==2.13.0)")
    p.add_argument("--no-tests", action="store_true", help="install and run the scripts only")
    p.add_argument("--test-extras", action="append", default=[], metavar="PACKAGE=EXTRA,...",
                   help="the extras a package's tests need (repeatable; default: test)")
    args = p.parse_args(argv)
    test_extras = {}
    for given in args.test_extras:
        package, _, extras = given.partition("=")
        if package not in PACKAGES or not extras:
            p.error(f"--test-extras expects PACKAGE=EXTRA,... with a package of {', '.join(PACKAGES)}, got {given!r}")
        test_extras[package] = set(extras.split(","))
    packages = args.packages or list(PACKAGES)
    unknown = sorted(set(packages) - set(PACKAGES))
    if unknown:
        p.error(f"unknown packages {unknown}; packages: {', '.join(PACKAGES)}")
    dist = Path(args.dist)
    shutil.rmtree(dist, ignore_errors=True)
    dist.mkdir(parents=True)
    torch_dir = Path(args.torch_dir).resolve() if args.torch_dir else None
    if torch_dir and not (torch_dir / "torch").is_dir():
        p.error(f"--torch-dir {torch_dir} holds no torch")
    built = build(list(PACKAGES), dist)  # every wheel: a package's KernelLab dependencies come from here
    problems: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="kernellab-install-check-") as tmp:
        for k, package in enumerate(packages, 1):
            log(f"[{k}/{len(packages)}] {OWN}{package} alone in a fresh venv")
            extras = None if args.no_tests else test_extras.get(package, {"test"})
            problems[package] = check(package, built, dist, Path(tmp), torch_dir, args.torch, extras)
    for problem in sum(problems.values(), []):
        print(f"FAILED {problem}", file=sys.stderr)
    failed = [p for p, found in problems.items() if found]
    log(f"{len(packages) - len(failed)} of {len(packages)} packages install and run alone"
        + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
