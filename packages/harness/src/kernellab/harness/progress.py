"""Progress lines of a run on stderr: the cases done, the time taken and an estimate of what is left.
Kept apart from the runner so that a driver (an A/B run, a Ray task) shows progress without importing
the timing code and torch before it needs them."""

from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    """One line per case and round on stderr, with elapsed time and an estimate of what is left."""

    def __init__(self, total: int, enabled: bool = True, prefix: str = ""):
        self.total, self.done, self.enabled, self.prefix = total, 0, enabled, prefix
        self.t0 = time.monotonic()

    def step(self, text: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.t0
        left = elapsed / self.done * (self.total - self.done)
        print(f"{self.prefix}[{self.done}/{self.total} {elapsed:5.0f}s, ~{left:4.0f}s left] {text}",
              file=sys.stderr, flush=True)


def describe_samples(result: dict[str, Any]) -> str:
    """A progress line's summary of one case: p50 per mode, or what went wrong."""
    from .stats import median

    if "error" in result:
        return f"ERROR {result['error']}"
    text = "  ".join(f"{m} {median(v):.2f}us" for m, v in result["samples_us"].items())
    return text if result["passed"] else f"{text}  VALIDATION FAILED"
