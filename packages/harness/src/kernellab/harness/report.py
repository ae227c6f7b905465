"""Reports on disk: a versioned schema, canonical JSON and a sha256 that any edit breaks."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

SCHEMA = "kernellab.report/1"
KINDS = ("run", "comparison", "before_after")
HASH_FIELD = "sha256"
REQUIRED = {
    "run": ("schema", "kind", "suite", "created_at", "config", "provenance", "cases"),
    "comparison": ("schema", "kind", "suite", "created_at", "config", "sides", "records", "summaries",
                   "torch_probe_control_ratio_range"),
    "before_after": ("schema", "kind", "suite", "metadata", "records"),
}


class ReportError(ValueError):
    """A report that cannot be trusted: wrong schema, missing fields, or a hash that does not match."""


def clean(value: Any) -> Any:
    """JSON has no NaN or infinity: they become null, so a canonical form always exists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def canonical_json(report: dict, hash_field: str = HASH_FIELD) -> bytes:
    """Sorted keys, no whitespace, the hash field left out."""
    body = {k: v for k, v in report.items() if k != hash_field}
    return json.dumps(clean(body), sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def report_hash(report: dict, hash_field: str = HASH_FIELD) -> str:
    return hashlib.sha256(canonical_json(report, hash_field)).hexdigest()


def seal(report: dict) -> dict:
    """Validate the shape, then stamp the canonical hash into the report."""
    report = clean(report)
    check_shape(report)
    report[HASH_FIELD] = report_hash(report)
    return report


def check_shape(report: dict) -> None:
    if not isinstance(report, dict):
        raise ReportError(f"a report is a JSON object, got {type(report).__name__}")
    if report.get("schema") != SCHEMA:
        raise ReportError(f"unknown report schema {report.get('schema')!r}; this harness reads {SCHEMA!r}")
    kind = report.get("kind")
    if kind not in KINDS:
        raise ReportError(f"unknown report kind {kind!r}; expected one of {KINDS}")
    missing = [f for f in REQUIRED[kind] if f not in report]
    if missing:
        raise ReportError(f"{kind} report lacks required fields {missing}")


def write(report: dict, path: str | os.PathLike) -> Path:
    """Seal (if not sealed) and write with a trailing newline; returns the path."""
    if HASH_FIELD not in report:
        report = seal(report)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(report, indent=1, sort_keys=True, allow_nan=False) + "\n")
    tmp.replace(path)
    return path


def load(path: str | os.PathLike) -> dict:
    """Read a report and verify its schema and hash; a hand edit fails here, naming both hashes."""
    path = Path(path)
    try:
        report = json.loads(path.read_text())
    except FileNotFoundError:
        raise ReportError(f"report {path} does not exist") from None
    except json.JSONDecodeError as e:
        raise ReportError(f"report {path} is not valid JSON: {e}") from None
    check_shape(report)
    recorded = report.get(HASH_FIELD)
    if not recorded:
        raise ReportError(f"report {path} carries no {HASH_FIELD!r} field")
    actual = report_hash(report)
    if actual != recorded:
        raise ReportError(
            f"report {path}: sha256 mismatch: recorded {recorded}, content hashes to {actual}; "
            "the report was changed after it was written"
        )
    return report
