"""KernelLab's sessions. Nox adds the environment; the logic lives in console scripts and
``python -m`` commands that also run on their own (an offline GPU host, a cluster node).

torch: every venv gets ``$KERNELLAB_TORCH`` (default ``torch==2.13.0``). On a machine whose pip finds
the CPU build on disk that is what it takes; on a GPU machine the same pin resolves to PyPI's CUDA
build. Set KERNELLAB_TORCH to another requirement (a version, a local wheel) to override.
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

ROOT = Path(__file__).parent
nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True

TORCH = os.environ.get("KERNELLAB_TORCH", "torch==2.13.0")

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


def install(session: nox.Session, *names: str, extras: tuple[str, ...] = ("test",)) -> None:
    """torch first (pinned, see above), then the local packages editable with their extras."""
    session.install(TORCH)
    wanted: list[str] = []
    for name in names:
        for dep in (*PACKAGES[name][0], name):
            if dep not in wanted:
                wanted.append(dep)
    args: list[str] = []
    for name in wanted:
        args += ["-e", f"packages/{name}[{','.join(extras)}]"]
    session.install(*args)


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
    session.run("pytest", path, *session.posargs, env={"HYPOTHESIS_PROFILE": "ci"})


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
    """Wheel and sdist of every package into dist/, then an sm_90a compile of every CuTe DSL kernel."""
    session.install("build")
    for name in PACKAGES:
        session.run("python", "-m", "build", "--outdir", "dist", f"packages/{name}")
    if GPU_PACKAGES:
        install(session, *GPU_PACKAGES, extras=("gpu",))
        for name in GPU_PACKAGES:
            session.run("python", "-m", f"kernellab.{name}.aot", "--arch", "sm_90a", env={"CUTE_DSL_ARCH": "sm_90a"})


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
