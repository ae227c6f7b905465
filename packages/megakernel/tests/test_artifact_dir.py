"""Where compiled cubins are kept: ``<root>/<arch>/<fingerprint of the kernel sources>/<variant>``, so that
two source trees compiling a variant of the same name (a revision A/B's two workers, alive at once) never
write one file, and a replay of the same sources finds the recorded path. CPU only; no CuTe DSL."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from kernellab.harness.provenance import cubin_dir, source_fingerprint
from kernellab.megakernel.engines import cache

PACKAGE = Path(cache.__file__).resolve().parent.parent


@pytest.fixture
def tree(tmp_path):
    """A copy of the package's sources."""
    shutil.copytree(PACKAGE, tmp_path / "pkg", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "pkg"


def fingerprint(root: Path) -> str:
    return source_fingerprint(root, cache.KERNEL_SOURCES)


def copy_cache(root: Path, monkeypatch):
    """The copy's cache module, loaded from its own file: its fingerprint is of the copy's sources."""
    name = f"copied_cache_{root.parent.name}"
    spec = importlib.util.spec_from_file_location(name, root / "engines" / "cache.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def test_every_kernel_source_is_there():
    for member in cache.KERNEL_SOURCES:
        assert (PACKAGE / member).exists(), member
    assert (PACKAGE / "engines" / "persistent_tc.py").is_file() and (PACKAGE / "planning" / "stack.py").is_file()


def test_the_fingerprint_is_the_package_s_and_stable(tree, tmp_path):
    first = fingerprint(tree)
    assert len(first) == 12 and int(first, 16) >= 0
    assert first == cache.sources_fingerprint(), "the copy's sources are the package's"
    assert fingerprint(tree) == first
    shutil.copytree(tree, tmp_path / "elsewhere")
    assert fingerprint(tmp_path / "elsewhere") == first, "the same sources under another root"
    (tree / "engines" / "notes.txt").write_text("not a source")
    (tree / "planning" / "__pycache__").mkdir()
    (tree / "planning" / "__pycache__" / "stack.cpython-311.pyc").write_bytes(b"\0")
    report = tree / "report.py"  # not a kernel source: it reads reports
    report.write_text(report.read_text() + "\n# edit\n")
    assert fingerprint(tree) == first


@pytest.mark.parametrize("source", ["engines/persistent_tc.py", "planning/tensorcore.py", "model.py"])
def test_the_fingerprint_changes_with_a_byte_of_any_kernel_source(tree, source):
    first = fingerprint(tree)
    path = tree / source
    text = path.read_bytes()
    path.write_bytes(text.replace(b"def ", b"def  ", 1))
    assert fingerprint(tree) != first
    path.write_bytes(text)
    assert fingerprint(tree) == first


def test_artifact_dir_is_the_package_s_cubin_dir(tmp_path, monkeypatch):
    """The root $KERNELLAB_MEGAKERNEL_CACHE, the name "megakernel" and this package's fingerprint
    (``provenance.cubin_dir`` is the layout)."""
    monkeypatch.setenv("KERNELLAB_MEGAKERNEL_CACHE", str(tmp_path / "cache"))
    assert cache.artifact_dir("sm_90a") == tmp_path / "cache" / "sm_90a" / cache.sources_fingerprint()
    monkeypatch.delenv("KERNELLAB_MEGAKERNEL_CACHE")
    fp = cache.sources_fingerprint()
    for arch in ("sm_90a", None):
        assert cache.artifact_dir(arch) == cubin_dir("KERNELLAB_MEGAKERNEL_CACHE", "megakernel", arch, fp)


def test_two_source_trees_keep_their_cubins_apart(tree, tmp_path, monkeypatch):
    """The defect this level fixes: the baseline's and the candidate's workers wrote one path per variant
    name, and the last writer's cubin was hashed into both sides' provenance."""
    monkeypatch.setenv("KERNELLAB_MEGAKERNEL_CACHE", str(tmp_path / "cache"))
    same = copy_cache(tree, monkeypatch)
    assert same.artifact_dir("sm_90a") == cache.artifact_dir("sm_90a"), "unchanged sources: the recorded path"
    other = tmp_path / "candidate" / "pkg"
    shutil.copytree(tree, other)
    kernel = other / "engines" / "persistent_tc.py"
    kernel.write_text(kernel.read_text() + "\n# edit\n")
    candidate = copy_cache(other, monkeypatch)
    assert candidate.artifact_dir("sm_90a") != same.artifact_dir("sm_90a")
    assert candidate.artifact_dir("sm_90a").parent == same.artifact_dir("sm_90a").parent
