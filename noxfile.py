"""KernelLab's sessions. Nox adds the environment; the logic lives in console scripts and
``python -m`` commands that also run on their own (an offline GPU host, a cluster node).

torch: ``$KERNELLAB_TORCH`` (default ``torch==2.13.0``) is installed once, into
``.nox/_torch/<requirement>-py<version>``, and every session's venv sees it through a ``.pth`` file: one
torch (about 0.8 GB on the CPU, several GB with CUDA) instead of one per venv. On a machine whose pip
finds the CPU build on disk that is what it takes; on a GPU machine the same pin resolves to PyPI's CUDA
build. Set KERNELLAB_TORCH to another requirement (a version, a local wheel) to override, or
KERNELLAB_TORCH_PER_VENV=1 to install torch into each venv as before (a venv whose packages must not see
anything outside it).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import nox

ROOT = Path(__file__).parent
nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True

# pip in every session: a dropped connection resumes rather than failing it (a CI run lost ray's wheel at 27 of
# 79 MB); pip versions without --resume-retries ignore it; the caller's own settings win
PIP_PATIENCE = {"PIP_RETRIES": "10", "PIP_RESUME_RETRIES": "20"}
os.environ.update({name: value for name, value in PIP_PATIENCE.items() if name not in os.environ})

TORCH = os.environ.get("KERNELLAB_TORCH", "torch==2.13.0")
TORCH_PER_VENV = os.environ.get("KERNELLAB_TORCH_PER_VENV", "").strip().lower() in ("1", "true", "yes", "on")

# package -> (local packages it needs, extras its tests need)
PACKAGES = {
    "harness": ((), ("test", "plot")),
    "kernels": (("harness",), ("test", "bench", "gpu")),
    "megakernel": (("harness",), ("test", "bench", "gpu", "plot")),
    "audit": (("harness",), ("test",)),
}
PACKAGES = {name: spec for name, spec in PACKAGES.items() if (ROOT / "packages" / name / "pyproject.toml").exists()}
GPU_PACKAGES = [p for p in ("kernels", "megakernel") if p in PACKAGES]
PYTHON = "3.11"


def shared_torch(session: nox.Session) -> Path:
    """The one torch install every session shares (see above), made on first use; returns its directory."""
    target = ROOT / ".nox" / "_torch" / f"{re.sub(r'[^A-Za-z0-9.=+-]+', '_', TORCH)}-py{PYTHON}"
    done = target / ".kernellab-complete"
    if not done.exists():
        shutil.rmtree(target, ignore_errors=True)  # a half-finished install (interrupted) starts over
        session.log(f"installing {TORCH} once into {target.relative_to(ROOT)}, shared by every session "
                    "(first time only: 1-3 min on the CPU, longer for the CUDA build)")
        t0 = time.monotonic()
        session.run("python", "-m", "pip", "install", "--quiet", "--target", str(target), TORCH)
        done.write_text(f"{TORCH}\n")
        session.log(f"torch installed in {time.monotonic() - t0:.0f} s")
    return target


def attach_torch(session: nox.Session) -> None:
    """torch into the session's venv: the shared install through a .pth file, or its own copy."""
    if TORCH_PER_VENV:
        session.log(f"installing {TORCH} into this venv (KERNELLAB_TORCH_PER_VENV is set; 1-3 min)")
        session.install(TORCH)
        return
    target = shared_torch(session)
    purelib = session.run("python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                          silent=True).strip()
    Path(purelib, "kernellab-shared-torch.pth").write_text(f"{target}\n")


def install(session: nox.Session, *names: str, extras: tuple[str, ...] = ("test",)) -> None:
    """torch first (pinned, shared, see above), then the local packages editable with their extras."""
    attach_torch(session)
    wanted: list[str] = []
    for name in names:
        for dep in (*PACKAGES[name][0], name):
            if dep not in wanted:
                wanted.append(dep)
    args: list[str] = []
    for name in wanted:
        args += ["-e", f"packages/{name}[{','.join(extras)}]"]
    session.log(f"installing {', '.join(wanted)} editable with [{','.join(extras)}] (20-60 s the first time)")
    session.install("--quiet", *args)


def test_workers() -> list[str]:
    """pytest-xdist options for the tests session: ``$KERNELLAB_TEST_WORKERS`` processes, by default 2 on a
    machine without a GPU (each test file in one process, so a file's module fixtures are made once; on a
    loaded machine two processes also get a larger share of the cores) and 1 where ``nvidia-smi`` is found
    (GPU tests time kernels: they must not share the device)."""
    workers = os.environ.get("KERNELLAB_TEST_WORKERS") or ("1" if shutil.which("nvidia-smi") else "2")
    if not workers.isdigit():
        raise SystemExit(f"KERNELLAB_TEST_WORKERS: expected a whole number of processes, got {workers!r}")
    return [] if int(workers) <= 1 else ["-n", workers, "--dist", "loadfile"]


@nox.session(python=PYTHON)
@nox.parametrize("package", [*PACKAGES, "integration"])
def tests(session: nox.Session, package: str) -> None:
    """Unit and property tests (hypothesis profile 'ci'); GPU tests skip without CUDA."""
    if package == "integration":
        install(session, *PACKAGES, extras=("test", "bench", "plot"))
        path = "tests"
    else:
        install(session, package, extras=PACKAGES[package][1])
        path = f"packages/{package}/tests"
    # the ten slowest tests are listed at the end: where the session's time goes, in every CI log
    session.run("pytest", path, *test_workers(), "--durations=10", *session.posargs, env={"HYPOTHESIS_PROFILE": "ci"})


@nox.session(python=PYTHON)
@nox.parametrize("profile", ["ci", "thorough"])
def property(session: nox.Session, profile: str) -> None:
    """Every hypothesis property test of every package, under one profile."""
    install(session, *PACKAGES, extras=("test", "bench", "gpu"))
    session.run("pytest", "-m", "property", "packages", "tests", *session.posargs,
                env={"HYPOTHESIS_PROFILE": profile})


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "noxfile.py", "conftest.py", "packages", "tests", "tools", *session.posargs)


@nox.session(python=PYTHON)
def build(session: nox.Session) -> None:
    """Wheel and sdist of every package into dist/, then an sm_90a compile of every CuTe DSL kernel.
    Each step prints one line with its count; the tools' own output is shown only when a step fails."""
    session.install("--quiet", "build")
    for k, name in enumerate(PACKAGES, 1):
        session.log(f"[{k}/{len(PACKAGES)}] wheel and sdist of {name} into dist/ (~10 s)")
        session.run("python", "-m", "build", "--outdir", "dist", f"packages/{name}", silent=True)
    if GPU_PACKAGES:
        install(session, *GPU_PACKAGES, extras=("gpu",))
        for k, name in enumerate(GPU_PACKAGES, 1):
            session.log(f"[{k}/{len(GPU_PACKAGES)}] sm_90a compile of every {name} CuTe DSL kernel "
                        "(several minutes on 2 cores; the compiler's output follows only on failure)")
            t0 = time.monotonic()
            session.run("python", "-m", f"kernellab.{name}.aot", "--arch", "sm_90a", env={"CUTE_DSL_ARCH": "sm_90a"},
                        silent=True)
            session.log(f"{name}: compiled in {time.monotonic() - t0:.0f} s")


@nox.session(python=PYTHON)
def wheels(session: nox.Session) -> None:
    """Every wheel built, then each package alone in a fresh venv (local wheels the only index for
    KernelLab's packages, the shared torch attached): its console scripts run and its sdist's tests pass
    outside the repository. ``nox -s wheels -- --no-tests`` installs and runs the scripts only."""
    session.install("--quiet", "build", "packaging")
    torch_dir = None if TORCH_PER_VENV else shared_torch(session)
    extras = [f"--test-extras={name}={','.join(spec[1])}" for name, spec in PACKAGES.items()]
    session.run("python", "tools/install_check.py", *(["--torch-dir", str(torch_dir)] if torch_dir else []),
                "--torch", TORCH, *extras, *session.posargs)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """The main job: every suite this machine can run; posargs go to kernellab-bench."""
    install(session, *PACKAGES, extras=("bench", "plot", *(("gpu",) if _has_cuda_driver() else ())))
    session.run("kernellab-bench", *session.posargs)


@nox.session(python=PYTHON)
def sanitize(session: nox.Session) -> None:
    """compute-sanitizer's memcheck, racecheck, synccheck and initcheck over every GPU kernel variant;
    a JSON summary per package under reports/runs/. Exits non-zero without a GPU, saying so."""
    install(session, *GPU_PACKAGES, extras=("gpu",))
    for name in GPU_PACKAGES:
        session.run("python", "-m", f"kernellab.{name}.sanitize", "--out", f"reports/runs/sanitize-{name}",
                    *session.posargs)


@nox.session(python=PYTHON)
def audit(session: nox.Session) -> None:
    """Verify two reports by replaying them: nox -s audit -- REFERENCE.json CANDIDATE.json (or none:
    the two newest run reports of one suite under reports/)."""
    install(session, *PACKAGES, extras=("bench", *(("gpu",) if _has_cuda_driver() else ())))
    session.run("kernellab-audit", *session.posargs)


@nox.session(python=PYTHON)
def wheelhouse(session: nox.Session) -> None:
    """Runtime wheels for an offline host: nox -s wheelhouse -- --platform manylinux_2_28_x86_64 --python 3.12"""
    session.install("build")
    session.run("python", "tools/wheelhouse.py", *session.posargs)


def _has_cuda_driver() -> bool:
    return any(Path(p).exists() for p in ("/dev/nvidia0", "/dev/nvidiactl"))
