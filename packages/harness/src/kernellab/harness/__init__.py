"""KernelLab's timing harness: cases, clocks, the four modes, rounds, statistics, provenance, reports."""

from .case import Impl, Problem, Suite, Tolerance, Unsupported
from .report import ReportError, load, seal, write
from .runner import Bench, Config

__version__ = "0.5.1"

__all__ = ["Bench", "Config", "Impl", "Problem", "ReportError", "Suite", "Tolerance", "Unsupported", "load",
           "seal", "write", "__version__"]
