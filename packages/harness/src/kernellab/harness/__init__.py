"""KernelLab's timing harness: cases, clocks, the four modes, rounds, statistics, provenance, reports.

The public names below are imported on first use, so that a process that needs one module (a Ray task
importing ``kernellab.harness.cluster``, a report reader) does not load torch and the timing code."""

import importlib

__version__ = "0.12.1"

_EXPORTS = {"Impl": "case", "Problem": "case", "Suite": "case", "Tolerance": "case", "Unsupported": "case",
            "ReportError": "report", "load": "report", "seal": "report", "write": "report",
            "Bench": "runner", "Config": "runner"}

__all__ = [*sorted(_EXPORTS), "__version__"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
