"""Reports on disk: a versioned schema, canonical JSON and a sha256 that any edit breaks."""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
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


# What the tables and the audit read inside each kind: list field -> fields every entry has.
CONTENTS = {
    "run": {"cases": ("name", "impl", "status", "modes"), "versus_control": ("name", "impl")},
    "comparison": {"records": ("name",)},
    "before_after": {"records": ("operation", "impl", "before_ms", "after_ms", "speedup")},
}


def check_contents(report: dict) -> None:
    """Beyond ``check_shape``: the entries the tables and the audit read are there with the right types,
    so a report whose hash is valid but whose inside is not a report's fails here, naming the field."""
    check_shape(report)
    kind = report["kind"]
    for field, keys in CONTENTS[kind].items():
        entries = report.get(field, [])
        if not isinstance(entries, list):
            raise ReportError(f"{kind} report field {field!r} must be a list, got {type(entries).__name__}")
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                raise ReportError(f"{kind} report {field}[{i}] must be an object, got {type(entry).__name__}")
            missing = [k for k in keys if k not in entry]
            if missing:
                raise ReportError(f"{kind} report {field}[{i}] lacks {missing}")
    if kind == "run":
        for i, case in enumerate(report["cases"]):
            if not isinstance(case["modes"], dict) or not all(isinstance(m, dict) for m in case["modes"].values()):
                raise ReportError(f"run report cases[{i}].modes must map each mode to an object")
    if kind == "comparison" and not isinstance(report["summaries"], dict):
        raise ReportError(f"comparison report field 'summaries' must be an object, got "
                          f"{type(report['summaries']).__name__}")


def _write_temporary(report: dict, directory: Path, name: str) -> Path:
    """The sealed report in a temporary file of its own (a unique name: concurrent writers never share one)."""
    if HASH_FIELD not in report:
        report = seal(report)
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp's 0600 would make the report private
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(report, indent=1, sort_keys=True, allow_nan=False) + "\n")
    except BaseException:
        os.unlink(tmp)
        raise
    return Path(tmp)


def write(report: dict, path: str | os.PathLike) -> Path:
    """Seal (if not sealed) and write atomically with a trailing newline, replacing ``path``; returns it."""
    path = Path(path)
    tmp = _write_temporary(report, path.parent, path.name)
    os.replace(tmp, path)
    return path


def write_new(report: dict, path: str | os.PathLike) -> Path:
    """Like ``write``, but never replaces a file: where ``path`` exists (another run finished in the same
    second) the report goes to ``<stem>-2<suffix>``, ``-3``, ..., claimed atomically; returns the path used."""
    path = Path(path)
    tmp = _write_temporary(report, path.parent, path.name)
    try:
        for n in range(1, 10_000):
            target = path if n == 1 else path.with_name(f"{path.stem}-{n}{path.suffix}")
            try:
                os.link(tmp, target)  # fails if target exists: the claim and the write are one step
                return target
            except FileExistsError:
                continue
        raise FileExistsError(f"no free report name next to {path}")
    finally:
        os.unlink(tmp)


def load(path: str | os.PathLike) -> dict:
    """Read a report and verify its schema and hash; a hand edit fails here, naming both hashes."""
    path = Path(path)
    try:
        report = json.loads(path.read_text())
    except FileNotFoundError:
        raise ReportError(f"report {path} does not exist") from None
    except IsADirectoryError:
        raise ReportError(f"report {path} is a directory, not a report file") from None
    except OSError as e:
        raise ReportError(f"report {path} cannot be read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ReportError(f"report {path} is not a text file (a report is JSON)") from None
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
