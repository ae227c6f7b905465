"""Where a measurement came from: device, driver, clocks, packages, git state, source and artifact hashes."""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import inspect
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE_SUFFIXES = {".py", ".cpp", ".cc", ".c", ".h", ".hpp", ".cu", ".cuh", ".toml", ".json"}
PACKAGES_OF_INTEREST = (
    "torch", "numpy", "nvidia-cutlass-dsl", "apache-tvm-ffi", "quack-kernels", "triton",
    "kernellab-harness", "kernellab-kernels", "kernellab-megakernel", "kernellab-audit",
)


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def kernellab_roots() -> dict[str, Path]:
    """Each importable ``kernellab.<package>`` directory (the namespace's portions, first one wins)."""
    import kernellab

    roots: dict[str, Path] = {}
    for portion in kernellab.__path__:
        for child in sorted(Path(portion).iterdir()):
            if child.is_dir() and (child / "__init__.py").exists() and child.name not in roots:
                roots[child.name] = child
    return roots


def tree_roots(root: str | os.PathLike) -> dict[str, Path]:
    """Each ``kernellab.<package>`` directory of a source tree (``packages/*/src/kernellab/*``)."""
    roots: dict[str, Path] = {}
    for pkg in sorted(Path(root).glob("packages/*/src/kernellab/*")):
        if pkg.is_dir() and (pkg / "__init__.py").exists():
            roots.setdefault(pkg.name, pkg)
    return roots


def source_hashes(roots: dict[str, Path] | None = None) -> dict[str, str]:
    """sha256 of every source file of the measured packages, keyed ``<package>/<relative path>``."""
    roots = kernellab_roots() if roots is None else roots
    out: dict[str, str] = {}
    for name, root in sorted(roots.items()):
        for path in sorted(root.rglob("*")):
            if path.is_file() and path.suffix in SOURCE_SUFFIXES and "__pycache__" not in path.parts:
                out[f"{name}/{path.relative_to(root).as_posix()}"] = sha256_file(path)
    return out


def source_fingerprint(root: str | os.PathLike, members: tuple[str, ...]) -> str:
    """12 hex digits of a sha256 over the ``.py`` files of ``members`` of ``root`` (each a directory, searched
    recursively, or a file): per file in path order, its path relative to ``root`` and its bytes, each
    length-prefixed. A changed byte, an added, removed or renamed file changes it. The kernel packages name
    their cubin directories by it, so that two source trees never write one cubin path."""
    root = Path(root)
    files = set()
    for member in members:
        path = root / member
        files.update(path.rglob("*.py") if path.is_dir() else [path] if path.is_file() else [])
    h = hashlib.sha256()
    for rel, path in sorted((p.relative_to(root).as_posix(), p) for p in files):
        data = path.read_bytes()
        h.update(f"{len(rel.encode())}:{rel}{len(data)}:".encode())
        h.update(data)
    return h.hexdigest()[:12]


def cubin_dir(env: str, name: str, arch: str | None, fingerprint: str) -> Path:
    """Where a kernel package keeps the cubins it compiles: ``<root>/<arch or "device">/<fingerprint>``, the root
    ``$env`` or ~/.cache/kernellab/<name> ($XDG_CACHE_HOME for ~/.cache). The fingerprint (``source_fingerprint``
    of the sources that determine the cubins) keeps two source trees apart (a revision A/B runs a worker per tree
    at once, each hashing its own cubins for provenance), and puts a replay of the same sources at the recorded
    path."""
    home = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    root = os.environ.get(env) or os.path.join(home, "kernellab", name)
    return Path(root) / (arch or "device") / fingerprint


def artifact_hashes(paths: list[str], base: str | os.PathLike | None = None) -> dict[str, str]:
    """sha256 of each built file, keyed as named; a relative name read from ``base`` (default: here)."""
    files = {str(p): Path(base or ".") / p for p in set(paths)}
    return {name: sha256_file(f) for name, f in sorted(files.items()) if f.is_file()}


def package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES_OF_INTEREST:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    try:  # the running torch may differ from its metadata on hosts with vendored builds
        import torch

        out["torch"] = torch.__version__
    except ImportError:
        pass
    return out


def git_state(root: str | os.PathLike | None) -> dict:
    """Commit and dirty flag of the tree the code came from, or nulls where it is not a git checkout."""
    if root is None or shutil.which("git") is None:
        return {"commit": None, "dirty": None, "root": None if root is None else str(root)}

    def git(*args: str) -> str | None:
        try:
            res = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return res.stdout.strip() if res.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain")
    dirty = None if status is None else bool(status)
    stated = os.environ.get("KERNELLAB_GIT_COMMIT")
    if stated and (commit is None or dirty):
        # a copied tree (an offline GPU host) without .git, or with a stale one under which every copied
        # change shows as dirty: the sender states the commit it copied; what git saw here is kept beside it
        said = os.environ.get("KERNELLAB_GIT_DIRTY", "")
        return {"commit": stated, "dirty": said.lower() in ("1", "true", "yes") if said else None, "root": str(root),
                "from_environment": True, "local_git": {"commit": commit, "dirty": dirty}}
    return {"commit": commit, "dirty": dirty, "root": str(root)}


def find_repo_root(start: str | os.PathLike) -> Path | None:
    """The directory holding ``packages/`` above ``start`` (a checkout or a materialized revision)."""
    p = Path(start).resolve()
    for candidate in [p, *p.parents]:
        if (candidate / "packages").is_dir() and (candidate / "packages" / "harness").is_dir():
            return candidate
    return None


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_clocks_mhz() -> list[float]:
    """Current core clocks where the OS exposes them (cpufreq, else /proc/cpuinfo)."""
    clocks = []
    for f in sorted(Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_cur_freq")):
        try:
            clocks.append(int(f.read_text()) / 1000.0)
        except (OSError, ValueError):
            pass
    if not clocks:
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("cpu MHz"):
                    clocks.append(float(line.split(":", 1)[1]))
        except (OSError, ValueError):
            pass
    return clocks


def gpu_query() -> dict:
    """Driver, clocks, temperature and power of the GPU torch uses: from nvidia-ml-py where installed,
    else nvidia-smi; both look the device up by its UUID, which names the same GPU under any
    CUDA_VISIBLE_DEVICES (torch's index 0 may be the host's GPU 3)."""
    uuid = current_gpu_uuid()
    return nvml_query(uuid) or smi_query(uuid)


def current_gpu_uuid() -> str | None:
    """``GPU-<uuid>`` of torch's current device, or None where torch cannot say."""
    try:
        import torch

        uuid = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", None)
    except Exception:  # noqa: BLE001 - no CUDA, or a torch without device UUIDs
        return None
    if uuid is None:
        return None
    text = str(uuid)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def nvml_query(uuid: str | None) -> dict:
    """The GPU ``uuid`` (None: NVML's first) through nvidia-ml-py, in nvidia-smi's field names, or {}
    where nvidia-ml-py or the driver is missing."""
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver: nothing to read
        return {}
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid) if uuid else pynvml.nvmlDeviceGetHandleByIndex(0)

        def text(value) -> str:
            return value.decode() if isinstance(value, bytes) else str(value)

        return {
            "name": text(pynvml.nvmlDeviceGetName(handle)),
            "uuid": text(pynvml.nvmlDeviceGetUUID(handle)),
            "driver_version": text(pynvml.nvmlSystemGetDriverVersion()),
            "clocks.sm": str(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
            "clocks.mem": str(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)),
            "clocks.max.sm": str(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)),
            "temperature.gpu": str(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
            "power.draw": f"{pynvml.nvmlDeviceGetPowerUsage(handle) / 1000:.2f}",
        }
    except Exception:  # noqa: BLE001 - a field this GPU does not report: fall back to nvidia-smi
        return {}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def smi_query(uuid: str | None) -> dict:
    """The same fields from nvidia-smi, for the GPU ``uuid`` (None: the first)."""
    fields = ["name", "uuid", "driver_version", "clocks.sm", "clocks.mem", "clocks.max.sm", "temperature.gpu",
              "power.draw"]
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    try:
        res = subprocess.run([exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                              "-i", uuid or "0"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if res.returncode != 0 or not res.stdout.strip():
        return {}
    values = [v.strip() for v in res.stdout.strip().splitlines()[0].split(",")]
    return dict(zip(fields, values, strict=False))


def clocks(device: str) -> dict:
    """A snapshot of the clocks, taken at the start and the end of a run."""
    now = datetime.datetime.now(datetime.UTC).isoformat()
    if device == "cuda":
        q = gpu_query()
        return {"at": now, **{k: v for k, v in q.items() if k not in ("name", "uuid", "driver_version")}}
    mhz = cpu_clocks_mhz()
    return {"at": now, "cpu_mhz_min": min(mhz) if mhz else None, "cpu_mhz_max": max(mhz) if mhz else None}


def device_info(device: str) -> dict:
    import torch

    info = {
        "kind": device,
        "host": platform.node(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        q = gpu_query()
        info.update({
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count,
            "memory_bytes": props.total_memory,
            "l2_bytes": getattr(props, "L2_cache_size", None),
            "uuid": q.get("uuid"),
            "driver": q.get("driver_version"),
            "cuda_runtime": torch.version.cuda,
        })
    else:
        info["name"] = info["cpu"]
    return info


def _defining_file(fn) -> Path | None:
    """The file whose code a callable runs (a function's, a partial's or a bound method's function)."""
    for _ in range(8):
        code = getattr(fn, "__code__", None)
        if code is not None:
            return Path(code.co_filename).resolve()
        fn = getattr(fn, "func", None) or getattr(fn, "__func__", None)
        if fn is None:
            return None
    return None


def impl_module(impl) -> str:
    """The module whose package holds an impl's code. For a contender given by an entry point, the module the
    registry imported for it (``origin``): the contender's code objects and ``__module__`` are its own to set (a bind
    compiled with json's file name, or a class saying ``__module__ = "json"``, got the standard library hashed in
    its place). For an impl the suite gives, its bind's module (``bind_module``)."""
    entry = (getattr(impl, "origin", None) or {}).get("entry_point", "")
    if "=" in entry:
        return entry.partition("=")[2].partition(":")[0].strip()
    return bind_module(impl)


def bind_module(impl) -> str:
    """The module of the file an impl's ``bind``'s code came from (``__module__`` only where that code has no file
    among the imported modules): where an entry point's module only imports its code from another package, the
    code is there."""
    try:
        fn = inspect.unwrap(impl.bind)  # a decorated bind's own function (``__wrapped__``)
    except ValueError:  # a cycle of __wrapped__
        fn = impl.bind
    where = _defining_file(fn)
    if where is not None:
        for name, mod in list(sys.modules.items()):
            path = getattr(mod, "__file__", None)  # resolved only where the name matches: a resolve is a syscall
            if path and os.path.basename(path) == where.name and Path(path).resolve() == where:
                return name
    return getattr(impl.bind, "__module__", None) or ""


def impl_code_root(impl) -> Path | None:
    """The package directory (or single module file) that holds an impl's code (``impl_module``): for
    ``kernellab.<x>`` the ``<x>`` directory, for any other module its top-level package, wherever it is
    installed; the file itself where its code is in no imported module."""
    return _code_root(impl_module(impl), impl.bind)


def _code_root(module: str, bind) -> Path | None:
    """``impl_code_root`` of an impl whose ``impl_module`` is ``module``."""
    if not module:
        return _defining_file(bind)
    top = ".".join(module.split(".")[:2]) if module.startswith("kernellab.") else module.split(".")[0]
    mod = sys.modules.get(top)
    path = getattr(mod, "__file__", None)
    if not path:
        return None
    path = Path(path).resolve()
    return path.parent if path.name == "__init__.py" else path


BIND_CODE = "{} (its bind's code)"  # the record of an impl's bind's package where it is not its entry point's
# packages a bind's code may come from that are not a contender's: the standard library's and torch's (a decorator
# there, torch.no_grad's say, wraps the bind), each hashed by the environment's record, not as a contender's code
NOT_BIND_CODE = frozenset(sys.stdlib_module_names) | {"torch"}


def impl_sources(impls: list, root: str | os.PathLike | None) -> dict[str, dict]:
    """Per impl: its entry point and distribution, where its code lies (relative to the tree ``root`` when
    inside it, else absolute) and the sha256 of each of its source files, whatever its module name; where its
    bind's code lies in another package than its entry point's module (a module that imports its code from
    elsewhere), that package too, under ``BIND_CODE``."""
    out: dict[str, dict] = {}
    tree = Path(root).resolve() if root else None
    for impl in impls:
        module, bound = impl_module(impl), bind_module(impl)
        code = _code_root(module, impl.bind)
        where = [(impl.name, module, code)]
        bound_code = _code_root(bound, impl.bind)
        if bound_code is not None and bound_code != code and bound.split(".")[0] not in NOT_BIND_CODE:
            where.append((BIND_CODE.format(impl.name), bound, bound_code))
        for name, module, code in where:
            out[name] = _code_record({**getattr(impl, "origin", {}), "module": module or None}, code, tree)
    return out


def _code_record(record: dict, code: Path | None, tree: Path | None) -> dict:
    """``record`` with where ``code`` lies and the sha256 of each of its source files."""
    if code is None:
        return record | {"code": None, "files": {}}
    inside = tree is not None and tree in code.parents
    files = [code] if code.is_file() else [f for f in sorted(code.rglob("*")) if f.is_file()
                                              and f.suffix in SOURCE_SUFFIXES and "__pycache__" not in f.parts]
    base = code.parent if code.is_file() else code
    return record | {
        "code": code.relative_to(tree).as_posix() if inside else str(code),
        "in_tree": inside,
        "files": {f.relative_to(base).as_posix(): sha256_file(f) for f in files},
    }


def impl_source_changes(recorded: dict[str, dict], root: str | os.PathLike) -> dict[str, dict[str, list[str]]]:
    """Per recorded impl, its files changed, missing or added since the record (``code`` read relative
    to the tree ``root`` where the record says it was in the tree); an impl whose code is absent here
    has every file missing."""
    out = {}
    for name, rec in recorded.items():
        if not rec.get("code"):
            continue
        code = Path(root) / rec["code"] if rec.get("in_tree") else Path(rec["code"])
        base = code.parent if code.is_file() else code
        present = {}
        if code.is_file():
            present = {code.name: sha256_file(code)}
        elif code.is_dir():
            present = {f.relative_to(base).as_posix(): sha256_file(f) for f in sorted(code.rglob("*"))
                       if f.is_file() and f.suffix in SOURCE_SUFFIXES and "__pycache__" not in f.parts}
        files = rec.get("files", {})
        out[name] = {
            "changed": sorted(k for k in files if k in present and present[k] != files[k]),
            "missing": sorted(k for k in files if k not in present),
            "added": sorted(k for k in present if k not in files),
        }
    return out


TIMING_ENVIRONMENT = ("OMP_", "KMP_", "MKL_", "OPENBLAS_", "GOMP_", "CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING",
                      "KERNELLAB_")


def timing_environment() -> dict[str, str]:
    """The environment variables that change how the measured code runs (thread pools, their wait
    policies, visible devices): a run made with OMP_WAIT_POLICY=PASSIVE says so."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(TIMING_ENVIRONMENT)}


def collect(device: str, root: str | os.PathLike | None, artifacts: list[str],
            packages: list[str] | None = None, impls: list | None = None) -> dict:
    """Everything but the end clocks, which the runner adds when the run is over.

    Sources are those of the measured ``packages`` (all where None), taken from the tree ``root`` the
    running code came from, or, for installed packages with no tree, from the importable ones."""
    roots = tree_roots(root) if root else kernellab_roots()
    if packages is not None:
        roots = {name: path for name, path in roots.items() if name in packages}
    return {
        "device": device_info(device),
        "packages": package_versions(),
        "git": git_state(root),
        "measured_packages": sorted(roots),
        "sources_sha256": source_hashes(roots),
        "artifacts_sha256": artifact_hashes(artifacts),
        "impl_sources": impl_sources(impls or [], root),
        "environment": timing_environment(),
        "clocks_start": clocks(device),
    }


def of_check(device: str, start: str | os.PathLike, packages: list[str]) -> dict:
    """Provenance of a check that times nothing (a compute-sanitizer run): the device, package versions,
    the commit and the checked packages' source hashes, from the tree above ``start`` (or the installed
    packages where there is none)."""
    record = collect(device, find_repo_root(start), [], packages)
    record.pop("clocks_start")
    return record
