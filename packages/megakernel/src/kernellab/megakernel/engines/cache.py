"""Where the engines keep their compiled cubins, named by the sources that produced them.

Imported by ``common`` (and by the CPU tests): pure Python, no CuTe DSL.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

KERNEL_SOURCES = ("engines", "planning", "model.py")
"""What the generated kernels depend on, relative to the package: the engines (device code, the compile-time
values in each variant's name, the fake signatures and compile options in ``common``) and the modules they
import, ``planning`` (the tile and thread constants and the helpers that size a kernel) and ``model``
(the activation codes and GELU constants compiled into the device code). The compiler (frontend, passes,
codegen, runner) and ``stack`` only choose which variants to compile and with what plan: every value they
hand to a kernel at compile time is part of its variant's name, so they do not change the cubin at a given
path."""


def source_fingerprint(root: Path, members: tuple[str, ...]) -> str:
    """12 hex digits of a sha256 over the ``.py`` files of ``members`` of ``root`` (each a directory,
    searched recursively, or a file): per file in path order, its path relative to ``root`` and its
    bytes, each length-prefixed. A changed byte, an added, removed or renamed file changes it.
    (``kernellab.kernels.gpu.compiler`` holds the same function: the two packages share no kernellab
    package that could hold one copy: the kernels need only torch and ninja.)"""
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


@functools.cache
def sources_fingerprint() -> str:
    """The fingerprint of this package's ``KERNEL_SOURCES``, once per process."""
    return source_fingerprint(Path(__file__).resolve().parent.parent, KERNEL_SOURCES)


def artifact_dir(arch: str | None = None) -> Path:
    """Where compiled cubins are kept: ``<root>/<arch or "device">/<sources_fingerprint()>``, one dump
    directory per variant below it, the root $KERNELLAB_MEGAKERNEL_CACHE or ~/.cache/kernellab/megakernel
    ($XDG_CACHE_HOME for ~/.cache). The fingerprint level keeps the cubins of two source trees apart (a
    revision A/B runs a worker per tree at once, each hashing its own cubins for provenance), and puts a
    replay of the same sources at the recorded path."""
    home = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    root = os.environ.get("KERNELLAB_MEGAKERNEL_CACHE") or os.path.join(home, "kernellab", "megakernel")
    return Path(root) / (arch or "device") / sources_fingerprint()
