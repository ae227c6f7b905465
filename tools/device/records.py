"""Where a device tool writes its record: under ``$OUT`` (the folder whose files come back from the GPU host), never
over an earlier record of the same call. Two commands of one call that write the same name keep both: the second
takes ``NAME-2.json``, the next ``NAME-3.json``. Every tool takes the same two options for it (``add_arguments``):
``--name NAME`` (``$OUT/NAME.json``) or ``--out PATH``, as ``kernellab-bench`` does."""

from __future__ import annotations

import argparse
import os


def record_path(name: str) -> str:
    """A path under ``$OUT`` (the working folder without it) for ``name``, numbered past any file already there."""
    out = os.environ.get("OUT", ".")
    stem, ext = os.path.splitext(name)
    path, n = os.path.join(out, name), 2
    while os.path.exists(path):
        path, n = os.path.join(out, f"{stem}-{n}{ext}"), n + 1
    return path


def add_arguments(ap: argparse.ArgumentParser, default: str) -> None:
    """``--name`` and ``--out``, one of them: where the record goes (default ``$OUT/<default>.json``)."""
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--name", default=default, help=f"the record's name under $OUT (default {default})")
    where.add_argument("--out", help="the record's path (a file; its folder must exist)")


def path_of(args: argparse.Namespace) -> str:
    """The record's path from ``add_arguments``'s options, checked writable before any GPU work."""
    if args.out:
        folder = os.path.dirname(os.path.abspath(args.out))
        if not os.path.isdir(folder) or os.path.isdir(args.out):
            raise SystemExit(f"--out {args.out!r}: expected a file path in an existing folder")
        return args.out
    return record_path(f"{args.name}.json")
