"""noxfile.py's own logic, with nox faked: every session shares one torch install, and the long steps
say what they do and how long they take."""

import importlib.util
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


class FakeSession:
    """Records what a session asks of nox; ``python -c ...sysconfig...`` answers the venv's purelib."""

    def __init__(self, purelib: Path):
        self.purelib = purelib
        self.installs: list[tuple] = []
        self.runs: list[tuple] = []
        self.logs: list[str] = []
        self.posargs: list[str] = []

    def install(self, *args):
        self.installs.append(args)

    def run(self, *args, **kwargs):
        self.runs.append(args)
        if "--target" in args:
            target = Path(args[args.index("--target") + 1])
            (target / "torch").mkdir(parents=True)
        if args[:2] == ("python", "-c") and "sysconfig" in args[2]:
            return f"{self.purelib}\n"
        return ""

    def log(self, text):
        self.logs.append(text)


@pytest.fixture
def noxfile(monkeypatch, tmp_path):
    fake = types.ModuleType("nox")
    fake.options = types.SimpleNamespace()
    fake.Session = FakeSession
    fake.session = lambda *a, **k: (lambda f: f)
    fake.parametrize = lambda *a, **k: (lambda f: f)
    monkeypatch.setitem(sys.modules, "nox", fake)
    monkeypatch.delenv("KERNELLAB_TORCH_PER_VENV", raising=False)
    monkeypatch.delenv("KERNELLAB_TORCH", raising=False)
    monkeypatch.delenv("PIP_RESUME_RETRIES", raising=False)  # restored after: the import sets it
    monkeypatch.setenv("PIP_RETRIES", "3")  # a caller's own setting
    spec = importlib.util.spec_from_file_location("kernellab_noxfile", ROOT / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "ROOT", tmp_path)
    return module


def session(tmp_path, name: str) -> FakeSession:
    purelib = tmp_path / "venvs" / name / "site-packages"
    purelib.mkdir(parents=True)
    return FakeSession(purelib)


def test_every_session_shares_one_torch_install(noxfile, tmp_path):
    sessions = [session(tmp_path, n) for n in ("tests-harness", "tests-kernels", "lint-free")]
    noxfile.install(sessions[0], "harness", extras=("test",))
    noxfile.install(sessions[1], "kernels", extras=("test",))
    noxfile.install(sessions[2], "audit", extras=("test",))
    torch_installs = [r for s in sessions for r in s.runs if "--target" in r]
    assert len(torch_installs) == 1 and torch_installs[0][-1] == "torch==2.13.0"
    target = Path(torch_installs[0][torch_installs[0].index("--target") + 1])
    assert target.parent == tmp_path / ".nox" / "_torch"
    for s in sessions:
        assert not any("torch==2.13.0" in args for args in s.installs)  # no venv installs its own torch
        assert (s.purelib / "kernellab-shared-torch.pth").read_text() == f"{target}\n"
    assert any("installing torch==2.13.0 once into" in line for line in sessions[0].logs)
    assert all(any("editable with [test]" in line for line in s.logs) for s in sessions)


def test_an_interrupted_shared_install_starts_over(noxfile, tmp_path):
    first = session(tmp_path, "a")
    target = noxfile.shared_torch(first)
    (target / ".kernellab-complete").unlink()  # as if killed before it finished
    (target / "torch" / "half-written").write_text("")
    noxfile.shared_torch(session(tmp_path, "b"))
    assert not (target / "torch" / "half-written").exists()
    assert (target / ".kernellab-complete").is_file()


def test_per_venv_torch_is_still_available(noxfile, tmp_path, monkeypatch):
    monkeypatch.setattr(noxfile, "TORCH_PER_VENV", True)
    s = session(tmp_path, "isolated")
    noxfile.install(s, "harness", extras=("test",))
    assert ("torch==2.13.0",) in s.installs
    assert not (s.purelib / "kernellab-shared-torch.pth").exists()


def test_build_counts_its_steps(noxfile, tmp_path, monkeypatch):
    monkeypatch.setattr(noxfile, "GPU_PACKAGES", [])
    s = session(tmp_path, "build")
    noxfile.build(s)
    assert [line.split(" (")[0] for line in s.logs] == [
        f"[{k}/{len(noxfile.PACKAGES)}] wheel and sdist of {name} into dist/" for k, name in
        enumerate(noxfile.PACKAGES, 1)]


def test_the_wheels_session_runs_the_install_check_with_the_shared_torch(noxfile, tmp_path):
    s = session(tmp_path, "wheels")
    noxfile.wheels(s)
    [check] = [r for r in s.runs if "tools/install_check.py" in r]
    assert check[check.index("--torch-dir") + 1] == str(noxfile.shared_torch(s))
    # the sdists' tests get the extras the tests session gives them
    assert [a for a in check if a.startswith("--test-extras=")] == [
        f"--test-extras={name}={','.join(spec[1])}" for name, spec in noxfile.PACKAGES.items()]
    assert "--test-extras=megakernel=test,bench,gpu,plot" in check


def test_ci_runs_the_wheels_session():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "nox -s wheels" in ci


def test_every_session_pip_resumes_a_dropped_download_and_keeps_the_callers_settings(noxfile):
    import os

    assert os.environ["PIP_RESUME_RETRIES"] == noxfile.PIP_PATIENCE["PIP_RESUME_RETRIES"]
    assert os.environ["PIP_RETRIES"] == "3"
