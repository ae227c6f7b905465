"""Build-on-first-use of the native CPU library: cache keys, cache directory, fallbacks, errors."""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path

import pytest
from torch.utils import cpp_extension

from kernellab.kernels import cpu
from kernellab.kernels.cpu import _build


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELLAB_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_cache_key_covers_variant_sources_and_cpu(cache_dir, tmp_path, monkeypatch):
    native, portable = _build.spec("native"), _build.spec("portable")
    assert native.key != portable.key
    assert native.directory == cache_dir / "cpu" / native.key
    assert native.key[:16] in native.name and native.key[:16] in native.library.name
    assert native.key in str(native.directory / "lock")  # cpp_extension's file baton lives there

    monkeypatch.setattr(_build, "cpu_flags", lambda: "sse2 avx2")
    assert _build.spec("native").key != native.key  # a -march=native binary belongs to its CPU
    assert _build.spec("portable").key == portable.key  # the portable one does not

    edited = tmp_path / "csrc"
    shutil.copytree(_build.CSRC, edited)
    with (edited / "rows.cpp").open("a") as f:
        f.write("\n// edited\n")
    monkeypatch.setattr(_build, "CSRC", edited)
    assert _build.spec("portable").key != portable.key


def test_cache_root_defaults_under_home(monkeypatch, tmp_path):
    monkeypatch.delenv("KERNELLAB_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert _build.cache_root() == tmp_path / ".cache" / "kernellab" / "cpu"


def test_missing_compiler_is_a_clear_error(cache_dir, monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/bin/c++")
    with pytest.raises(_build.ToolchainMissing, match=r"needs a C\+\+ compiler.*/nonexistent/bin/c\+\+"):
        _build.load_variant("portable")


def test_missing_ninja_is_a_clear_error(cache_dir, monkeypatch):
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: False)
    with pytest.raises(_build.ToolchainMissing, match=r"ninja.*pip install ninja"):
        _build.load_variant("portable")


def test_a_compiler_that_does_not_run_is_a_clear_error(cache_dir, monkeypatch):
    monkeypatch.setenv("CXX", "false")  # on PATH, but exits 1 for anything
    with pytest.raises(_build.ToolchainMissing, match=r"compiler 'false' .*does not run.*exited with code 1"):
        _build.load_variant("portable")


def test_a_cache_dir_that_is_a_file_is_a_clear_error(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("KERNELLAB_CACHE_DIR", str(tmp_path / "a-file"))
    with pytest.raises(_build.ToolchainMissing, match=r"cannot create its build cache directory.*KERNELLAB_CACHE_DIR"):
        _build.load_variant("portable")


class FakeCompile:
    """Stands in for cpp_extension.load: records whether cpp_extension's baton was there when called
    (it would wait on it forever) and gives a module-like object."""

    def __init__(self):
        self.batons = []

    def __call__(self, *, name, build_directory, **_):
        self.batons.append((Path(build_directory) / "lock").exists())
        (Path(build_directory) / f"{name}.so").write_bytes(b"fake")
        return types.SimpleNamespace(__file__=str(Path(build_directory) / f"{name}.so"))


def test_a_killed_builds_lock_is_broken_and_the_build_says_it_runs(cache_dir, monkeypatch, capsys):
    fake = FakeCompile()
    monkeypatch.setattr(cpp_extension, "load", fake)
    s = _build.spec("portable")
    s.directory.mkdir(parents=True)
    s.baton.write_text("")  # what a build killed half-way leaves behind
    _build._build(s)
    assert fake.batons == [False]
    assert s.marker.read_text() == "portable\n"
    assert f"building the portable CPU library in {s.directory}" in capsys.readouterr().err


def test_a_live_build_is_waited_for_and_its_result_reused(cache_dir, monkeypatch, capsys):
    fake = FakeCompile()
    monkeypatch.setattr(cpp_extension, "load", fake)
    s = _build.spec("portable")
    s.directory.mkdir(parents=True)
    with open(s.build_lock, "w") as held:  # another builder, alive: it holds the OS lock
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("process 4242")
        held.flush()
        waiter = threading.Thread(target=_build._build, args=(s,))
        waiter.start()
        seen = ""
        deadline = time.monotonic() + 60
        while "waiting for process 4242" not in seen and time.monotonic() < deadline:
            time.sleep(0.05)
            seen += capsys.readouterr().err
        assert "waiting for process 4242 to finish building" in seen
        s.library.write_bytes(b"built by 4242")
        s.marker.write_text("portable\n")
        monkeypatch.setattr(_build, "_import", lambda spec: "imported")
    waiter.join(timeout=60)
    assert not waiter.is_alive()
    assert fake.batons == []  # it imported the other process's library instead of compiling


def test_a_corrupt_cache_entry_is_a_clear_error(cache_dir):
    s = _build.spec("portable")
    s.directory.mkdir(parents=True)
    s.library.write_bytes(b"not a shared object")
    s.marker.write_text("portable\n")
    with pytest.raises(_build.BuildError, match=r"does not load.*delete .* to rebuild"):
        _build.load_variant("portable")


def test_failed_native_build_falls_back_to_portable(monkeypatch):
    asked = []
    portable_library = object()

    def load_variant(variant):
        asked.append(variant)
        if variant == "native":
            raise _build.BuildError("-march=native rejected")
        return portable_library

    monkeypatch.delenv("KERNELLAB_CPU_PORTABLE", raising=False)
    monkeypatch.setattr(_build, "_module", None)
    monkeypatch.setattr(_build, "load_variant", load_variant)
    with pytest.warns(RuntimeWarning, match="using the portable build.*-march=native rejected"):
        assert _build.library() is portable_library
    assert asked == ["native", "portable"]


def test_missing_toolchain_does_not_retry_portable(monkeypatch):
    asked = []

    def load_variant(variant):
        asked.append(variant)
        raise _build.ToolchainMissing("no compiler")

    monkeypatch.delenv("KERNELLAB_CPU_PORTABLE", raising=False)
    monkeypatch.setattr(_build, "_module", None)
    monkeypatch.setattr(_build, "load_variant", load_variant)
    with pytest.raises(_build.ToolchainMissing, match="no compiler"):
        _build.library()
    assert asked == ["native"]


@pytest.mark.parametrize("value", ["1", "true", "YES"])
def test_portable_env_var_skips_the_native_build(monkeypatch, value):
    asked = []
    monkeypatch.setenv("KERNELLAB_CPU_PORTABLE", value)
    monkeypatch.setattr(_build, "_module", None)
    monkeypatch.setattr(_build, "load_variant", lambda variant: asked.append(variant) or variant)
    assert _build.library() == "portable"
    assert asked == ["portable"]


def test_library_path_is_the_loaded_cached_shared_object():
    path = Path(cpu.library_path())
    assert path.is_file() and path.suffix == ".so"
    assert path == Path(_build.library().__file__).resolve()
    assert (path.parent / "complete").is_file()
    assert path.parent.parent == _build.cache_root().resolve()
    assert len(hashlib.sha256(path.read_bytes()).hexdigest()) == 64


CHECK_SCRIPT = textwrap.dedent("""
    import math, torch
    from kernellab.harness.suites import reference
    from kernellab.kernels import cpu
    from kernellab.kernels.cpu import _build

    def close(got, want, atol=1e-5):
        torch.testing.assert_close(got.double(), want.double(), rtol=1e-5, atol=atol, equal_nan=True)

    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(37, 1537, generator=g), torch.randn(1537, generator=g), torch.randn(1537, generator=g)
    close(cpu.softmax(x), reference.softmax(x))
    close(cpu.rmsnorm(x, w), reference.rmsnorm(x, w)[0])
    close(cpu.layernorm(x, w, b), reference.layernorm(x, w, b))
    a, lw, dy = torch.randn(67, 129, generator=g), torch.randn(45, 129, generator=g), torch.randn(67, 45, generator=g)
    close(cpu.linear_forward(a, lw), reference.linear_forward(a, lw), 1e-5 * math.sqrt(129) * 10)
    for got, want in zip(cpu.linear_backward(a, lw, dy), reference.linear_backward(a, lw, dy)):
        close(got, want, 1e-5 * math.sqrt(129) * 10)
    print(cpu.library_path(), _build.library().isa)
""")


@pytest.mark.skipif(not os.environ.get("KERNELLAB_TEST_BUILD"),
                    reason="builds the portable library from scratch (~20 s on 2 cores); set KERNELLAB_TEST_BUILD=1")
def test_parallel_portable_builds_share_one_cache_entry(tmp_path):
    env = dict(os.environ, KERNELLAB_CACHE_DIR=str(tmp_path), KERNELLAB_CPU_PORTABLE="1")
    procs = [subprocess.Popen([sys.executable, "-c", CHECK_SCRIPT], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
        outputs.append(out.split())
    assert outputs[0] == outputs[1]
    path, isa = outputs[0]
    assert Path(path).parent.parent == tmp_path / "cpu"
    if platform.machine() in ("x86_64", "AMD64"):
        assert isa == "baseline"
    assert not (Path(path).parent / "lock").exists()
    # a cached entry loads without a compiler (none on PATH)
    (tmp_path / "empty").mkdir()
    cached = subprocess.run([sys.executable, "-c", CHECK_SCRIPT], env=dict(env, PATH=str(tmp_path / "empty")),
                            capture_output=True, text=True, timeout=600)
    assert cached.returncode == 0, cached.stderr
    assert cached.stdout.split() == outputs[0]
