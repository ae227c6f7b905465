"""The harness's own timing and validation code, checked unpatched around every case.

Contender code runs in the same process as the timing loop, so it could replace a function of the
harness (the comparison, a timing mode, a clock) or a method the harness relies on. ``seal`` records
every function and method of the harness modules that time and validate, and the clocks and tensor
methods they call, when this module is first imported (before any contender is imported); ``verify``
names whatever has been replaced since, by object or by code, and on the objects the run uses (the
bench, its device and probes, the batch checks) any method hidden by an attribute of the object itself, a
class that is not the harness's, or a module swapped for another. The comparison against the truth is
also repeated outside this process (``validate.check_shipped``), which no patch here can reach.
"""

from __future__ import annotations

import importlib
import inspect
import json
import json.encoder
import resource
import sys
import threading
import time
import types

REPLACED = "the harness's own code was replaced"  # how every refusal for a patch begins (runner, worker)
MODULES = ("case", "integrity", "noise", "runner", "stats", "threads", "timing", "validate", "worker")


def _external() -> dict[str, object]:
    """Objects outside the harness that its clocks and checks call."""
    import torch

    found = {
        "time.perf_counter_ns": time.perf_counter_ns, "time.perf_counter": time.perf_counter,
        "time.monotonic": time.monotonic, "resource.getrusage": resource.getrusage,
        "threading.enumerate": threading.enumerate, "threading.Thread.join": threading.Thread.join,
        "torch.equal": torch.equal, "torch.isnan": torch.isnan, "torch.where": torch.where,
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
    return found


def _harness() -> dict[str, object]:
    found: dict[str, object] = {}
    for short in MODULES:
        module = importlib.import_module(f"kernellab.harness.{short}")
        for name, obj in vars(module).items():
            if isinstance(obj, types.FunctionType) and obj.__module__ == module.__name__:
                found[f"{short}.{name}"] = obj
            elif isinstance(obj, types.MethodType):  # a method bound at import (the worker's encoder)
                found[f"{short}.{name}"] = obj
            elif inspect.isclass(obj) and obj.__module__ == module.__name__:
                for attr, member in vars(obj).items():
                    if isinstance(member, (types.FunctionType, staticmethod, classmethod, property)):
                        found[f"{short}.{name}.{attr}"] = member
    return found


def _snapshot() -> dict[str, tuple[object, object]]:
    out = {}
    for name, obj in {**_external(), **_harness()}.items():
        fn = obj.__func__ if isinstance(obj, (staticmethod, classmethod)) else obj
        out[name] = (obj, getattr(fn, "__code__", None))
    return out


_SEALED: dict[str, tuple[object, object]] = {}


def seal() -> None:
    """Record the harness as it is now (first call only: a later call cannot bless a patch)."""
    if not _SEALED:
        _SEALED.update(_snapshot())


def verify(objects=()) -> list[str]:
    """Names of the sealed functions, methods and clocks replaced since ``seal`` (by object or code), and
    what was changed on ``objects``, the harness's instances a run goes through (``tampered``)."""
    now = _snapshot()
    bad = []
    for name, (obj, code) in _SEALED.items():
        got = now.get(name)
        if got is None or got[0] is not obj or got[1] is not code:
            bad.append(name)
    for obj in objects:
        bad.extend(tampered(obj))
    return sorted(bad)


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
