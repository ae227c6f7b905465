"""Which commit a report names: git's, or the sender's for a copied tree (no .git, or a stale one)."""

import shutil
import subprocess
import sys

import pytest

from kernellab.harness import provenance


def _git(root, *args):
    subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
                   check=True, capture_output=True)


@pytest.fixture
def checkout(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "one")
    return tmp_path


def test_clean_checkout_names_its_own_commit_whatever_the_environment_says(checkout, monkeypatch):
    monkeypatch.setenv("KERNELLAB_GIT_COMMIT", "f" * 40)
    state = provenance.git_state(checkout)
    assert state["dirty"] is False and state["commit"] != "f" * 40 and "from_environment" not in state


def test_stale_git_of_a_copied_tree_gives_way_to_the_stated_commit(checkout, monkeypatch):
    local = provenance.git_state(checkout)["commit"]
    (checkout / "a.py").write_text("x = 2\n")  # the copy brought newer files over an old .git
    monkeypatch.setenv("KERNELLAB_GIT_COMMIT", "e" * 40)
    monkeypatch.setenv("KERNELLAB_GIT_DIRTY", "0")
    state = provenance.git_state(checkout)
    assert state["commit"] == "e" * 40 and state["dirty"] is False and state["from_environment"]
    assert state["local_git"] == {"commit": local, "dirty": True}


def test_without_a_stated_commit_a_dirty_checkout_says_so(checkout, monkeypatch):
    monkeypatch.delenv("KERNELLAB_GIT_COMMIT", raising=False)
    (checkout / "a.py").write_text("x = 3\n")
    state = provenance.git_state(checkout)
    assert state["dirty"] is True and "from_environment" not in state


def test_tree_without_git_takes_the_stated_commit(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELLAB_GIT_COMMIT", "d" * 40)
    monkeypatch.delenv("KERNELLAB_GIT_DIRTY", raising=False)
    state = provenance.git_state(tmp_path)
    assert state["commit"] == "d" * 40 and state["dirty"] is None


def test_the_gpu_is_looked_up_by_its_uuid_not_by_torchs_index(monkeypatch):
    """Under CUDA_VISIBLE_DEVICES=3 torch's device 0 is the host's GPU 3: NVML is asked for the UUID
    torch gives, never for index 0."""
    import types

    asked = []

    class FakeNvml(types.ModuleType):
        NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 0, 1, 0

        def nvmlInit(self):
            pass

        def nvmlShutdown(self):
            pass

        def nvmlDeviceGetHandleByUUID(self, uuid):
            asked.append(uuid)
            return uuid

        def nvmlDeviceGetHandleByIndex(self, index):
            raise AssertionError("looked up by index")

        def nvmlDeviceGetName(self, h):
            return b"NVIDIA H100 80GB HBM3"

        def nvmlDeviceGetUUID(self, h):
            return h

        def nvmlSystemGetDriverVersion(self):
            return "570.1"

        def nvmlDeviceGetClockInfo(self, h, which):
            return 1980 if which == self.NVML_CLOCK_SM else 2619

        def nvmlDeviceGetMaxClockInfo(self, h, which):
            return 1980

        def nvmlDeviceGetTemperature(self, h, which):
            return 41

        def nvmlDeviceGetPowerUsage(self, h):
            return 123456

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml("pynvml"))
    monkeypatch.setattr(provenance, "current_gpu_uuid", lambda: "GPU-3333")
    q = provenance.gpu_query()
    assert asked == ["GPU-3333"]
    assert q["uuid"] == "GPU-3333" and q["name"] == "NVIDIA H100 80GB HBM3" and q["driver_version"] == "570.1"
    assert q["clocks.sm"] == "1980" and q["clocks.mem"] == "2619" and q["power.draw"] == "123.46"


def test_without_nvidia_ml_py_nvidia_smi_is_asked_for_the_uuid(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    monkeypatch.setattr(provenance, "current_gpu_uuid", lambda: "GPU-3333")
    monkeypatch.setattr(provenance.shutil, "which", lambda exe: "/usr/bin/nvidia-smi")
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "NVIDIA H200, GPU-3333, 570.1, 1980, 3201, 1980, 40, 100\n", "")

    monkeypatch.setattr(provenance.subprocess, "run", fake_run)
    q = provenance.gpu_query()
    assert calls[0][-2:] == ["-i", "GPU-3333"]
    assert q["name"] == "NVIDIA H200" and q["uuid"] == "GPU-3333"


def test_the_source_fingerprint_changes_with_a_byte_a_new_file_and_a_rename_of_a_member(tmp_path):
    """What names the kernel packages' cubin directories: any change to a member's .py files moves it, and
    nothing else does (the same files under another root, other files, files outside the members)."""
    root = tmp_path / "pkg"
    (root / "engines" / "sub").mkdir(parents=True)
    (root / "engines" / "a.py").write_text("def a():\n    return 1\n")
    (root / "engines" / "sub" / "b.py").write_text("B = 2\n")
    (root / "model.py").write_text("M = 3\n")
    members = ("engines", "model.py", "absent")

    def fingerprint(r=root):
        return provenance.source_fingerprint(r, members)

    first = fingerprint()
    assert len(first) == 12 and int(first, 16) >= 0 and fingerprint() == first
    shutil.copytree(root, tmp_path / "elsewhere")
    assert fingerprint(tmp_path / "elsewhere") == first
    (root / "engines" / "notes.txt").write_text("not a source")
    (root / "report.py").write_text("# not a member\n")
    assert fingerprint() == first
    seen = {first}
    for change in (lambda: (root / "engines" / "a.py").write_text("def a():\n    return 1 \n"),
                   lambda: (root / "model.py").write_text("M = 4\n"),
                   lambda: (root / "engines" / "sub" / "c.py").write_text(""),
                   lambda: (root / "engines" / "sub" / "b.py").rename(root / "engines" / "sub" / "b2.py")):
        change()
        assert fingerprint() not in seen
        seen.add(fingerprint())


def test_cubin_dir_is_per_arch_and_fingerprint_under_the_override(tmp_path, monkeypatch):
    """The kernel packages' cubin directories: ``$env`` or ~/.cache/kernellab/<name>, then the arch ("device" for
    the GPU's own) and the sources' fingerprint."""
    fp = "f" * 12
    monkeypatch.setenv("KERNELLAB_X_CACHE", str(tmp_path / "cache"))
    assert provenance.cubin_dir("KERNELLAB_X_CACHE", "x", "sm_90a", fp) == tmp_path / "cache" / "sm_90a" / fp
    assert provenance.cubin_dir("KERNELLAB_X_CACHE", "x", None, fp) == tmp_path / "cache" / "device" / fp
    monkeypatch.delenv("KERNELLAB_X_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert provenance.cubin_dir("KERNELLAB_X_CACHE", "x", "sm_90a", fp) == (
        tmp_path / "xdg" / "kernellab" / "x" / "sm_90a" / fp)
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert provenance.cubin_dir("KERNELLAB_X_CACHE", "x", None, fp) == (
        tmp_path / "home" / ".cache" / "kernellab" / "x" / "device" / fp)


SPOOFING_CONTENDER = '''
import json

from kernellab.harness.case import Impl


def named(problem):
    return problem.control


named.__module__ = "json"  # "my code is the json package"
_code = {}
exec(compile("def compiled(problem):\\n    return problem.control\\n", json.__file__, "exec"), _code)


class Binder:  # a callable object: no code object of its own, its class names its module
    __module__ = "json"

    def __call__(self, problem):
        return problem.control


def impls():
    return [Impl("named", bind=named), Impl("compiled", bind=_code["compiled"]), Impl("object", bind=Binder())]
'''


@pytest.mark.parametrize("spoof", ["named", "compiled", "object"])
def test_a_contender_cannot_choose_which_code_is_hashed_as_its_own(tmp_path, monkeypatch, spoof):
    """A bind naming another module (here the standard library's ``json``: through its ``__module__``, a code
    object compiled with json's file name, or a callable object whose class names json) still has its own file
    hashed, the module its entry point names, and a change to that file after the report is found."""
    import importlib
    import sys

    site = tmp_path / "site"
    site.mkdir()
    module = site / "sneaky_contender.py"
    module.write_text(SPOOFING_CONTENDER)
    monkeypatch.syspath_prepend(str(site))
    impl = next(i for i in importlib.import_module("sneaky_contender").impls() if i.name == spoof)
    impl.origin = {"entry_point": "cpu-ops.sneaky = sneaky_contender:impls", "distribution": "sneaky"}  # registry's
    try:
        recorded = provenance.impl_sources([impl], tmp_path / "checkout")[spoof]
        module.write_text(SPOOFING_CONTENDER + "\n# the contender's code, changed after the report was written\n")
        changes = provenance.impl_source_changes({spoof: recorded}, tmp_path / "checkout")[spoof]
    finally:
        sys.modules.pop("sneaky_contender", None)
    assert recorded["module"] == "sneaky_contender" and list(recorded["files"]) == ["sneaky_contender.py"], recorded
    assert changes["changed"] == ["sneaky_contender.py"], changes


def test_code_an_entry_points_module_imports_from_another_package_is_hashed_too(tmp_path, monkeypatch):
    """An entry point whose module only imports its impls from another package (a thin shim): the shim alone had
    been hashed, and an edit of the code that runs went unseen."""
    import importlib
    import sys

    site = tmp_path / "site"
    site.mkdir()
    (site / "shim_contender.py").write_text("from real_contender import impls  # noqa: F401\n")
    real = site / "real_contender.py"
    real.write_text(SPOOFING_CONTENDER.replace('named.__module__ = "json"', "pass"))
    monkeypatch.syspath_prepend(str(site))
    impl = next(i for i in importlib.import_module("shim_contender").impls() if i.name == "named")
    impl.origin = {"entry_point": "cpu-ops.shim = shim_contender:impls", "distribution": "shim"}
    try:
        recorded = provenance.impl_sources([impl], tmp_path / "checkout")
        real.write_text(real.read_text() + "\n# the code that runs, changed after the report was written\n")
        changes = provenance.impl_source_changes(recorded, tmp_path / "checkout")
    finally:
        sys.modules.pop("shim_contender", None)
        sys.modules.pop("real_contender", None)
    bound = provenance.BIND_CODE.format("named")
    assert list(recorded) == ["named", bound] and list(recorded[bound]["files"]) == ["real_contender.py"], recorded
    assert changes["named"]["changed"] == [] and changes[bound]["changed"] == ["real_contender.py"], changes


def test_a_bind_a_torch_decorator_wraps_is_hashed_as_its_own_not_torchs(tmp_path, monkeypatch):
    """``@torch.no_grad()`` makes a bind whose code is torch's: torch's whole package (thousands of files) had been
    hashed into every report as the bind's code, a record an audit elsewhere could not find or match."""
    import importlib
    import sys

    site = tmp_path / "site"
    site.mkdir()
    (site / "decorated_contender.py").write_text(
        "import torch\nfrom kernellab.harness.case import Impl\n\n\n@torch.no_grad()\ndef bind(problem):\n"
        "    return problem.control\n\n\ndef impls():\n    return [Impl('decorated', bind=bind)]\n")
    monkeypatch.syspath_prepend(str(site))
    impl = importlib.import_module("decorated_contender").impls()[0]
    impl.origin = {"entry_point": "cpu-ops.decorated = decorated_contender:impls", "distribution": "decorated"}
    try:
        recorded = provenance.impl_sources([impl], tmp_path / "checkout")
    finally:
        sys.modules.pop("decorated_contender", None)
    assert provenance.bind_module(impl) == "decorated_contender"
    assert list(recorded) == ["decorated"] and list(recorded["decorated"]["files"]) == ["decorated_contender.py"]
