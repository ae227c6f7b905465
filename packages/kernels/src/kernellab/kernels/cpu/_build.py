"""Build-on-first-use of the native library, cached per (sources, flags, CPU, toolchain) hash.

The key covers everything that changes the binary: the C++ sources, the compile flags, the CPU's
feature flags (a ``-march=native`` build is only valid on a CPU like the one that built it), the
torch version and the Python ABI. Each key gets its own directory,
``$KERNELLAB_CACHE_DIR/cpu/<key>`` (default ``~/.cache/kernellab/cpu/<key>``), and its own module
name, so builds with different keys never share files. Processes building the same key at once
are serialized by an OS file lock on ``<key>/build.lock`` (``flock``: the kernel releases it when
its holder dies, so a killed build never blocks the next one); the holder first deletes the file
baton that cpp_extension leaves at ``<key>/lock`` when a build is killed, since no live build can
own it then. A ``complete`` marker, written atomically after a successful build, lets later
processes import the library directly, without a compiler or ninja. A build says on stderr that
it started (it takes 10-40 s) and whom it waits for.

``-march=native`` is tried first; ``KERNELLAB_CPU_PORTABLE=1`` asks for the portable build
(no ISA flags) from the start, and a native build that fails falls back to it with a warning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import importlib.util
import os
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
import threading
import warnings
from pathlib import Path
from types import ModuleType

CSRC = Path(__file__).with_name("csrc")
SOURCES = ("bindings.cpp", "gemm.cpp", "rows.cpp")
HEADERS = ("kernels.h", "simd.h")

# -ffp-contract=fast: -std=c++20 (which cpp_extension passes) would otherwise forbid FMA contraction.
COMMON_FLAGS = ("-O3", "-ffp-contract=fast", "-fopenmp", "-Wall")
VARIANT_FLAGS = {"native": ("-march=native",), "portable": ()}
# torch ships libgomp with the same soname, so the loader resolves ours to torch's runtime: one
# OpenMP thread pool in the process, sized by torch.set_num_threads.
LINK_FLAGS = ("-fopenmp",)

_lock = threading.Lock()
_module: ModuleType | None = None


class BuildError(RuntimeError):
    """The native library could not be built or loaded; the message says why and what to do."""


class ToolchainMissing(BuildError):
    """No working compiler, no ninja or no usable cache directory: no variant can be built, so there is
    nothing to fall back to."""


@dataclasses.dataclass(frozen=True)
class Spec:
    variant: str
    key: str
    directory: Path

    @property
    def name(self) -> str:
        return f"kernellab_cpu_{self.key[:16]}"

    @property
    def library(self) -> Path:
        return self.directory / f"{self.name}.so"

    @property
    def marker(self) -> Path:
        return self.directory / "complete"

    @property
    def build_lock(self) -> Path:
        return self.directory / "build.lock"

    @property
    def baton(self) -> Path:
        """cpp_extension's own lock file, which it waits on forever when a killed build left it."""
        return self.directory / "lock"


def portable_requested() -> bool:
    return os.environ.get("KERNELLAB_CPU_PORTABLE", "").strip().lower() in ("1", "true", "yes", "on")


def cache_root() -> Path:
    base = os.environ.get("KERNELLAB_CACHE_DIR")
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "kernellab") / "cpu"


def cpu_flags() -> str:
    """The CPU's feature flags as the kernel reports them (x86 ``flags``, Arm ``Features``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            field, _, value = line.partition(":")
            if field.strip() in ("flags", "Features"):
                return " ".join(sorted(value.split()))
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def compiler() -> str:
    """The compiler cpp_extension will run (``$CXX`` or ``c++``)."""
    return os.environ.get("CXX", "c++")


def spec(variant: str) -> Spec:
    import torch

    h = hashlib.sha256()

    def part(label: str, value: str | bytes) -> None:
        data = value.encode() if isinstance(value, str) else value
        h.update(f"{label}:{len(data)}:".encode())
        h.update(data)

    for name in SOURCES + HEADERS:
        part(name, (CSRC / name).read_bytes())
    part("flags", " ".join(COMMON_FLAGS + VARIANT_FLAGS[variant] + LINK_FLAGS))
    part("cpu", cpu_flags() if variant == "native" else platform.machine())
    part("torch", torch.__version__)
    part("python", f"{sys.implementation.cache_tag} {sysconfig.get_config_var('EXT_SUFFIX')}")
    part("compiler", compiler())
    key = h.hexdigest()
    return Spec(variant=variant, key=key, directory=cache_root() / key)


def _import(s: Spec) -> ModuleType:
    try:
        loader_spec = importlib.util.spec_from_file_location(s.name, s.library)
        module = importlib.util.module_from_spec(loader_spec)
        loader_spec.loader.exec_module(module)
    except (ImportError, OSError) as e:
        raise BuildError(f"the cached kernellab CPU library {s.library} does not load ({e}); delete {s.directory} "
                         "to rebuild it") from e
    return module


def _require_toolchain() -> None:
    from torch.utils import cpp_extension

    cxx = shlex.split(compiler())[:1]
    if not cxx or shutil.which(cxx[0]) is None:
        raise ToolchainMissing(
            f"kernellab.kernels.cpu builds its native library on first use and needs a C++ compiler, but "
            f"{compiler()!r} was not found on PATH. Install g++ (or clang++) or point $CXX at one.")
    try:
        probe = subprocess.run([*shlex.split(compiler()), "--version"], capture_output=True, timeout=60)
        failed = f"exited with code {probe.returncode}" if probe.returncode else None
    except (OSError, subprocess.SubprocessError) as e:
        failed = str(e)
    if failed:
        raise ToolchainMissing(
            f"kernellab.kernels.cpu builds its native library on first use, but the C++ compiler {compiler()!r} "
            f"(from $CXX, default c++) does not run: '{compiler()} --version' {failed}. Point $CXX at a working "
            "g++ or clang++ (no build variant can work without one).")
    if not cpp_extension.is_ninja_available():
        raise ToolchainMissing(
            "kernellab.kernels.cpu builds its native library with ninja, which was not found: pip install ninja")


def _make_directory(s: Spec) -> None:
    try:
        s.directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ToolchainMissing(
            f"kernellab.kernels.cpu cannot create its build cache directory {s.directory} ({e.strerror or e}); "
            f"$KERNELLAB_CACHE_DIR ({os.environ.get('KERNELLAB_CACHE_DIR', 'unset')}) must name a writable "
            "directory, or be unset for ~/.cache/kernellab") from None


@contextlib.contextmanager
def _exclusive(s: Spec):
    """Holds the key's OS file lock, saying on stderr whom it waits for when another process builds."""
    with open(s.build_lock, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            print(f"kernellab: waiting for {holder} to finish building the CPU library in {s.directory}",
                  file=sys.stderr, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        f.truncate()
        f.write(f"process {os.getpid()}")
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _build(s: Spec) -> ModuleType:
    _require_toolchain()
    _make_directory(s)
    with _exclusive(s):
        if s.marker.exists() and s.library.exists():  # built by the process this one waited for
            return _import(s)
        s.baton.unlink(missing_ok=True)  # left by a killed build: a live one would hold our lock
        print(f"kernellab: building the {s.variant} CPU library in {s.directory} (first use, 10-40 s)",
              file=sys.stderr, flush=True)
        module = _compile(s)
        tmp = s.marker.with_name(f"{s.marker.name}.{os.getpid()}")
        tmp.write_text(f"{s.variant}\n")
        os.replace(tmp, s.marker)
    return module


def _compile(s: Spec) -> ModuleType:
    from torch.utils import cpp_extension

    try:
        return cpp_extension.load(
            name=s.name,
            sources=[str(CSRC / name) for name in SOURCES],
            extra_cflags=list(COMMON_FLAGS + VARIANT_FLAGS[s.variant]),
            extra_ldflags=list(LINK_FLAGS),
            extra_include_paths=[str(CSRC)],
            build_directory=str(s.directory),
            with_cuda=False,
            verbose=False,
        )
    except (RuntimeError, OSError, ImportError, subprocess.SubprocessError) as e:
        raise BuildError(f"building the {s.variant} kernellab CPU library in {s.directory} failed: {e}") from e


def load_variant(variant: str) -> ModuleType:
    """The library of one variant ("native" or "portable"), built if its cache entry is missing."""
    s = spec(variant)
    if s.marker.exists() and s.library.exists():
        return _import(s)
    return _build(s)


def library() -> ModuleType:
    """The process-wide library: native unless KERNELLAB_CPU_PORTABLE=1 or the native build fails."""
    global _module
    if _module is not None:
        return _module
    with _lock:
        if _module is None:
            if portable_requested():
                _module = load_variant("portable")
            else:
                try:
                    _module = load_variant("native")
                except ToolchainMissing:
                    raise
                except BuildError as native_error:
                    try:
                        _module = load_variant("portable")
                    except BuildError as portable_error:
                        raise BuildError(f"{portable_error}\n\n(the native build failed first: {native_error})") \
                            from portable_error
                    warnings.warn(f"native (-march=native) build failed, using the portable build: {native_error}",
                                  RuntimeWarning, stacklevel=3)
    return _module


def library_path() -> str:
    """Path of the built shared object (building it if needed); its sha256 goes into reports."""
    return str(Path(library().__file__).resolve())
