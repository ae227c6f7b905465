"""Where compiled cubins are kept: ``<root>/<arch>/<fingerprint of the gpu subpackage's sources>``, so that
two source trees compiling a variant of the same name (a revision A/B's two workers, alive at once) never
write one file, and a replay of the same sources finds the recorded path. CPU only; no CuTe DSL."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from kernellab.harness.provenance import cubin_dir, source_fingerprint
from kernellab.kernels.gpu import compiler

GPU = Path(compiler.__file__).resolve().parent


@pytest.fixture
def tree(tmp_path):
    """A copy of the gpu subpackage's sources under a package root of its own."""
    shutil.copytree(GPU, tmp_path / "pkg" / "gpu", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "pkg"


def fingerprint(root: Path) -> str:
    return source_fingerprint(root, ("gpu",))


def copy_compiler(root: Path, monkeypatch):
    """The copy's compiler module, loaded from its own file: its fingerprint is of the copy's sources."""
    name = f"copied_compiler_{root.parent.name}"
    spec = importlib.util.spec_from_file_location(name, root / "gpu" / "compiler.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def test_the_fingerprint_is_the_package_s_and_stable(tree, tmp_path):
    first = fingerprint(tree)
    assert len(first) == 12 and int(first, 16) >= 0
    assert first == compiler.sources_fingerprint(), "the copy's sources are the package's"
    assert fingerprint(tree) == first
    shutil.copytree(tree, tmp_path / "elsewhere")
    assert fingerprint(tmp_path / "elsewhere") == first, "the same sources under another root"
    (tree / "gpu" / "notes.txt").write_text("not a source")
    (tree / "gpu" / "__pycache__").mkdir()
    (tree / "gpu" / "__pycache__" / "base.cpython-311.pyc").write_bytes(b"\0")
    (tree / "checks.py").write_text("# outside the gpu subpackage\n")
    assert fingerprint(tree) == first


def test_artifact_dir_is_the_package_s_cubin_dir(tmp_path, monkeypatch):
    """The root $KERNELLAB_CUTE_CACHE, the name "cute" and this package's fingerprint
    (``provenance.cubin_dir`` is the layout)."""
    monkeypatch.setenv("KERNELLAB_CUTE_CACHE", str(tmp_path / "cache"))
    assert compiler.artifact_dir("sm_90a") == tmp_path / "cache" / "sm_90a" / compiler.sources_fingerprint()
    monkeypatch.delenv("KERNELLAB_CUTE_CACHE")
    fp = compiler.sources_fingerprint()
    for arch in ("sm_90a", None):
        assert compiler.artifact_dir(arch) == cubin_dir("KERNELLAB_CUTE_CACHE", "cute", arch, fp)


def test_two_source_trees_keep_their_cubins_apart(tree, tmp_path, monkeypatch):
    """The defect this level fixes: the baseline's and the candidate's workers wrote one path per variant
    name, and the last writer's cubin was hashed into both sides' provenance."""
    monkeypatch.setenv("KERNELLAB_CUTE_CACHE", str(tmp_path / "cache"))
    same = copy_compiler(tree, monkeypatch)
    assert same.artifact_dir("sm_90a") == compiler.artifact_dir("sm_90a"), "unchanged sources: the recorded path"
    other = tmp_path / "candidate" / "pkg"
    shutil.copytree(tree, other)
    (other / "gpu" / "rmsnorm_kernel.py").write_text((other / "gpu" / "rmsnorm_kernel.py").read_text() + "\n# edit\n")
    candidate = copy_compiler(other, monkeypatch)
    assert candidate.artifact_dir("sm_90a") != same.artifact_dir("sm_90a")
    assert candidate.artifact_dir("sm_90a").parent == same.artifact_dir("sm_90a").parent
