"""KernelLab's audit/replay verifier: checks two reports and everything they claim by re-running it."""

from .audit import FAIL, INCONCLUSIVE, PASS, Audit, Options

__version__ = "0.6.3"

__all__ = ["FAIL", "INCONCLUSIVE", "PASS", "Audit", "Options", "__version__"]
