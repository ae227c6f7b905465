"""The harness's own timing and validation code, checked unpatched around every case.

Contender code runs in the same process as the timing loop, so it could replace a function of the
harness (the comparison, a timing mode, a clock), one of its constants (a limit, a timeout) or a method the
harness relies on. ``seal`` records every function, method and constant of the harness modules that time and
validate, the clocks and torch functions they call, and every attribute of ``torch.Tensor`` and its bases
(the harness reads each result through them: a patched ``detach`` or ``__sub__`` could do the call's work
while the harness reads), when this module is first imported (before any contender is imported); ``verify``
names whatever has been replaced since, by object or by code, and on the objects the run uses (the
bench, its device and probes, the batch checks) any method hidden by an attribute of the object itself, a
class that is not the harness's, or a module swapped for another (``read_path_changes`` is the part a read of a
result goes through). It also records what the torch control's ops go through, so that contender code cannot slow
the control it is compared with: every attribute of torch's op namespaces and the process's speed settings,
checked around every case (``control_path_changes``). ``guard`` binds ``verify`` before contender code runs, to be
called right after it returns, before the harness reads anything, while a patch meant to undo itself at its first
use is still there.
The comparison against the truth is also repeated outside this process (``validate.check_shipped``), which no
patch here can reach.
"""

from __future__ import annotations

import builtins
import copy
import functools
import importlib
import inspect
import json
import json.encoder
import os
import resource
import sys
import threading
import time
import types

REPLACED = "the harness's own code was replaced"  # how every refusal for a patch begins (runner, worker)
MODULES = ("case", "integrity", "noise", "provenance", "runner", "stats", "threads", "timing", "validate", "worker")


def _external() -> dict[str, object]:
    """Objects outside the harness that its clocks and checks call."""
    import torch

    found = {
        "time.perf_counter_ns": time.perf_counter_ns, "time.perf_counter": time.perf_counter,
        "time.monotonic": time.monotonic, "resource.getrusage": resource.getrusage,
        "threading.enumerate": threading.enumerate, "threading.Thread.join": threading.Thread.join,
        "torch.equal": torch.equal, "torch.isnan": torch.isnan, "torch.where": torch.where,
        "torch.isinf": torch.isinf, "torch.nan_to_num": torch.nan_to_num, "torch.zeros_like": torch.zeros_like,
        "torch.sign": torch.sign, "torch.save": torch.save, "torch.load": torch.load, "torch.iinfo": torch.iinfo,
        "os.urandom": os.urandom,  # the batches' seeds (``validate.fresh_seed``)
        "os.fstat": os.fstat, "os._exit": os._exit,  # the worker's check of its reply channel (``worker.send``)
        "torch.Tensor.copy_": torch.Tensor.copy_, "torch.Tensor.fill_": torch.Tensor.fill_,
        "torch.Tensor.to": torch.Tensor.to, "torch.Tensor.clone": torch.Tensor.clone,
        "torch.randn": torch.randn, "torch.cuda.synchronize": torch.cuda.synchronize,
        "torch.cuda.Event": torch.cuda.Event,
        # the worker's replies carry every result to the driver
        "json.dumps": json.dumps, "json.loads": json.loads, "json.JSONEncoder.encode": json.JSONEncoder.encode,
        "json.JSONEncoder.iterencode": json.JSONEncoder.iterencode,
        "json.encoder.c_make_encoder": json.encoder.c_make_encoder,
        "json.encoder.encode_basestring": json.encoder.encode_basestring,
        "json.encoder.encode_basestring_ascii": json.encoder.encode_basestring_ascii,
    }
    for name in ("record", "synchronize", "elapsed_time", "query"):
        found[f"torch.cuda.Event.{name}"] = getattr(torch.cuda.Event, name)
    found["torch.cuda.CUDAGraph.replay"] = torch.cuda.CUDAGraph.replay
    return found


def _harness() -> dict[str, object]:
    found: dict[str, object] = {}
    for short in MODULES:
        module = importlib.import_module(f"kernellab.harness.{short}")
        for name, obj in vars(module).items():
            if name.isupper() and name[0] != "_" and not isinstance(obj, (types.ModuleType, type)):  # a constant
                found[f"{short}.{name}"] = obj
            elif isinstance(obj, types.FunctionType) and obj.__module__ == module.__name__:
                found[f"{short}.{name}"] = obj
            elif isinstance(obj, types.MethodType):  # a method bound at import (the worker's encoder)
                found[f"{short}.{name}"] = obj
            elif inspect.isclass(obj) and obj.__module__ == module.__name__:
                for attr, member in vars(obj).items():
                    if isinstance(member, (types.FunctionType, staticmethod, classmethod, property)):
                        found[f"{short}.{name}.{attr}"] = member
    return found


_CONSTANTS = (dict, list, set, tuple, frozenset, int, float, str, bytes, bool, type(None))


def _value(obj: object) -> object:
    """What a sealed object must still equal: a constant's contents (a dict of tolerances can be edited in
    place), a function's code."""
    if isinstance(obj, _CONSTANTS):
        return obj
    fn = obj.__func__ if isinstance(obj, (staticmethod, classmethod)) else obj
    return getattr(fn, "__code__", None)


def _objects() -> dict[str, object]:
    return {**_external(), **_harness()}


TORCH_NAMESPACES = ("torch", "torch.nn.functional", "torch._C._VariableFunctions", "torch._C._nn", "torch.linalg",
                    "torch.special", "torch.fft")
"""Where the suites' torch controls (and contenders) find the ops they call: every attribute there is sealed by
identity (a module, which an import may set later, aside), so that contender code cannot slow the control it is
compared with (``torch.softmax`` wrapped to run three times made an honest contender look 2.4x faster)."""


def _members(dotted: str):
    """The attributes of a namespace of ``TORCH_NAMESPACES`` (of its class where it has no ``__dict__``: torch's
    ``_VariableFunctions`` is an instance whose functions are its class's)."""
    import torch

    space = _resolve(torch, dotted)
    return vars(space) if hasattr(space, "__dict__") else vars(type(space))


TORCH_SELF_PATCHED = frozenset({"torch.manual_seed"})
"""Attributes torch replaces itself after import: ``torch._dynamo``'s first import (any ``torch.compile``) wraps
``torch.manual_seed``. No op a control times."""


def _torch_namespaces() -> dict[str, dict[str, object]]:
    return {dotted: {k: v for k, v in _members(dotted).items()
                     if not isinstance(v, types.ModuleType) and f"{dotted}.{k}" not in TORCH_SELF_PATCHED}
            for dotted in TORCH_NAMESPACES}


def _affinities() -> frozenset[tuple[int, ...]]:
    """The CPU sets this process's threads may run on (Linux's /proc: the process's own where it has none)."""
    try:
        tasks = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tasks = [0]
    found = set()
    for tid in tasks:
        try:
            found.add(tuple(sorted(os.sched_getaffinity(tid))))
        except OSError:  # a thread that ended meanwhile
            continue
    return frozenset(found)


def speed_settings() -> dict[str, object]:
    """The process-wide settings that change how fast torch's ops (the control's) run: torch's threads, TF32 and
    reduced-precision math, cuDNN's choices and default dtype, a torch function or dispatch mode on its stacks
    (every op of the control would go through Python), its profiler, and the interpreter's thread switch interval,
    trace and profile functions and the CPUs the threads may run on. One changed at bind would slow or speed the
    control for the run."""
    import torch

    matmul = torch.backends.cuda.matmul
    cudnn = torch.backends.cudnn
    return {"num_threads": torch.get_num_threads(), "num_interop_threads": torch.get_num_interop_threads(),
            "torch_function_modes": torch._C._len_torch_function_stack(),
            "torch_dispatch_modes": torch._C._len_torch_dispatch_stack(),
            "profiler": torch.autograd.profiler._is_profiler_enabled,
            "switch_interval": sys.getswitchinterval(), "trace": sys.gettrace(), "profile": sys.getprofile(),
            "cpu_affinity": _affinities(),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "default_dtype": torch.get_default_dtype(), "cuda.matmul.allow_tf32": matmul.allow_tf32,
            "cuda.matmul.allow_fp16_reduced_precision_reduction": matmul.allow_fp16_reduced_precision_reduction,
            "cuda.matmul.allow_bf16_reduced_precision_reduction": matmul.allow_bf16_reduced_precision_reduction,
            "cudnn.enabled": cudnn.enabled, "cudnn.benchmark": cudnn.benchmark,
            "cudnn.deterministic": cudnn.deterministic, "cudnn.allow_tf32": cudnn.allow_tf32}


INTEROP = "dlpack"
"""Attributes of ``torch.Tensor`` named with this are left out of the seal: tensor libraries imported with a
contender (TVM FFI, CuTe DSL) install their zero-copy exchange hooks there, and the harness reads none."""


def _tensor_dicts() -> dict[type, dict[str, object]]:
    import torch

    return {base: {k: v for k, v in vars(base).items() if INTEROP not in k} for base in torch.Tensor.__mro__}


_ABSENT = object()  # what a lookup of a name that is not there gives, unlike any value
_SEALED: dict[str, tuple[object, object]] = {}
_TORCH_READS: dict[str, object] = {}  # the sealed torch functions a comparison calls
_TENSOR: dict[type, dict[str, object]] = {}
_BUILTINS: dict[str, object] = {}
_NAMESPACES: dict[str, dict[str, object]] = {}
_SETTINGS: dict[str, object] = {}
CONSOLE_BUILTINS = frozenset({"_", "print", "input", "help", "breakpoint", "exit", "quit", "copyright", "credits",
                              "license"})
"""Builtins left out of the seal: the console's, which tools replace in-process (Ray redirects ``print``), and
which no read of a result goes through."""


def seal() -> None:
    """Record the harness as it is now (first call only: a later call cannot bless a patch)."""
    if not _SEALED:
        _SEALED.update((name, (obj, copy.deepcopy(_value(obj)))) for name, obj in _objects().items())
        _TORCH_READS.update((name, obj) for name, (obj, _) in _SEALED.items()
                            if name.startswith("torch.") and not name.startswith("torch.cuda"))
        _TENSOR.update(_tensor_dicts())
        _BUILTINS.update((k, v) for k, v in vars(builtins).items() if k not in CONSOLE_BUILTINS)
        _NAMESPACES.update(_torch_namespaces())
        _SETTINGS.update(speed_settings())


def control_path_changes() -> list[str]:
    """What the torch ops the controls call go through, changed since ``seal``: an attribute of a namespace of
    ``TORCH_NAMESPACES`` replaced or removed, or a setting of ``speed_settings`` changed. Checked around every case
    (``runner.Bench._unpatched``), not after every return of contender code as ``verify`` is: a change slows or
    speeds a case only while it stands through one, the control's included, and its ~3000 lookups and a system call
    a thread would add up over every timed batch."""
    if not _NAMESPACES:
        return []
    bad = []
    for dotted, sealed in _NAMESPACES.items():
        bad += [f"{dotted}.{name}" for name in _replaced(sealed, _members(dotted))]
    now = speed_settings()
    bad += [f"setting {k} ({_SETTINGS[k]!r} -> {now[k]!r})" for k in _SETTINGS if now[k] != _SETTINGS[k]]
    return bad


def _replaced(sealed: dict[str, object], now, names=None) -> list[str]:
    """The names (of ``names``, default every sealed one) whose object in ``now`` is not the sealed one."""
    return [k for k in (sealed if names is None else names) if now.get(k, _ABSENT) is not sealed.get(k, _ABSENT)]


def read_path_changes() -> list[str]:
    """What the harness's reads of a result go through, changed since ``seal``: an attribute of
    ``torch.Tensor`` or its bases replaced, removed or shadowed (set on a class ahead of the base that defines
    it), a sealed torch function replaced, a builtin replaced, or shadowed by a global of a harness module (none
    defines one: ``int`` set on ``validate`` would count its wrong elements). Part of ``verify``, which ``guard``
    runs after every return of contender code, before any read. None where nothing was sealed: a process that
    runs no contender."""
    import torch

    if not _TENSOR:
        return []
    bad = [name for name, obj in _TORCH_READS.items() if _resolve(torch, name) is not obj]
    bad += [f"builtins.{k}" for k in _replaced(_BUILTINS, vars(builtins))]
    for short in MODULES:
        module = sys.modules.get(f"kernellab.harness.{short}")
        shadows = vars(module).keys() & _BUILTINS.keys() if module else ()
        bad += [f"{short}.{k} (a global shadowing the builtin)" for k in sorted(shadows) if not k.startswith("__")]
    mro = torch.Tensor.__mro__
    if tuple(_TENSOR) != mro:
        return [*bad, "torch.Tensor's bases"]
    for at, base in enumerate(mro):
        sealed, now = _TENSOR[base], vars(base)
        bad.extend(f"torch.Tensor.{name}" for name in _replaced(sealed, now))
        bad.extend(f"torch.Tensor.{name} (shadows {later.__qualname__}'s)" for name in now.keys() - sealed.keys()
                   for later in mro[at + 1:] if INTEROP not in name and name in _TENSOR[later])
    return bad


def _resolve(root: object, dotted: str) -> object:
    obj = root
    for part in dotted.split(".")[1:]:
        obj = getattr(obj, part, None)
    return obj


class Patched(RuntimeError):
    """A part of the harness was found replaced where it was about to be used."""


def guard():
    """``verify`` bound now, to be called through the returned function right after contender code returns and
    before the harness looks anything else up: a patch the contender made to be undone at its first use (the
    comparison, a check's method) is then still in place, and named. Bind it before the contender runs; it raises
    ``Patched`` itself if ``verify`` was already replaced."""
    check = verify
    if _SEALED and check is not _SEALED["integrity.verify"][0]:
        raise Patched(f"{REPLACED} before a contender ran: ['integrity.verify']")

    def after_contender(where: str) -> None:
        replaced = check()
        if replaced:
            raise Patched(f"{REPLACED} during {where}: {replaced}")
    return after_contender


def verify(objects=()) -> list[str]:
    """Names of the sealed functions, methods, constants, clocks and tensor attributes replaced since ``seal``
    (by object, code or contents), and what was changed on ``objects``, the harness's instances a run goes
    through (``tampered``)."""
    now = _objects()
    bad = read_path_changes()
    for name, (obj, value) in _SEALED.items():
        got = now.get(name, _ABSENT)
        if got is not obj or not _same_value(_value(got), value):
            bad.append(name)
    for obj in objects:
        bad.extend(tampered(obj))
    return sorted(bad)


def _same_value(a: object, b: object) -> bool:
    try:
        return a is b or bool(a == b)
    except Exception:  # noqa: BLE001 - a value that cannot even be compared has changed
        return False


_METHODS = (types.FunctionType, staticmethod, classmethod, property)


def tampered(obj: object) -> list[str]:
    """What was done to one harness object: its class is not the harness module's own (a stand-in), an
    attribute set on the object hides a method of its class (the class's method is sealed, the object's is
    not), or an attribute holding a module holds another object under that module's name."""
    cls = type(obj)
    module = sys.modules.get(cls.__module__)
    short = cls.__module__.rsplit(".", 1)[-1]
    if not cls.__module__.startswith("kernellab.harness.") or getattr(module, cls.__name__, None) is not cls:
        return [f"{cls.__module__}.{cls.__qualname__} (an object standing in for the harness's)"]
    bad = []
    for attr, value in vars(obj).items():
        if any(isinstance(vars(base).get(attr), _METHODS) for base in cls.__mro__):
            bad.append(f"{short}.{cls.__name__}.{attr} (set on its instance)")
        elif isinstance(value, types.ModuleType) and sys.modules.get(value.__name__) is not value:
            bad.append(f"{short}.{cls.__name__}.{attr} (a module replaced)")
    return bad


def state_of(obj: object) -> tuple[type, dict[str, object], dict[str, object]]:
    """What a contender could change on an object it is handed (a problem, at bind): its class, its own
    attributes, and every attribute its classes define (a method replaced on the class, a tolerance on the
    instance). Taken before the object reaches contender code; ``changed_since`` compares by identity."""
    cls = type(obj)
    defined = {f"{base.__qualname__}.{k}": v for base in cls.__mro__[:-1] for k, v in vars(base).items()}
    return cls, dict(getattr(obj, "__dict__", {})), defined


def changed_since(obj: object, state: tuple[type, dict[str, object], dict[str, object]]) -> list[str]:
    """Names of what differs on ``obj`` from ``state`` (``state_of``)."""
    cls, own, defined = state
    now_cls, now_own, now_defined = state_of(obj)
    name = cls.__qualname__
    if now_cls is not cls:
        return [f"{name} (its class replaced)"]
    bad = [f"{name}.{k} (on the instance)" for k in _replaced(own, now_own, own.keys() | now_own.keys())
           if k in own or not _cached(cls, k)]
    bad += [f"{k} (on its class)" for k in _replaced(defined, now_defined, defined.keys() | now_defined.keys())]
    return bad


def _cached(cls: type, name: str) -> bool:
    """Whether ``name`` is a ``functools.cached_property`` of ``cls``: its first use stores its value on the
    instance by the class's own (recorded) code, as the megakernel's models make their weights on first use."""
    return isinstance(inspect.getattr_static(cls, name, None), functools.cached_property)

