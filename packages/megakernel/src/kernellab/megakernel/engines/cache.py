"""Where the engines keep their compiled cubins, named by the sources that produced them.

Imported by ``common`` (and by the CPU tests): pure Python, no CuTe DSL.
"""

from __future__ import annotations

import functools
from pathlib import Path

from kernellab.harness.provenance import cubin_dir, source_fingerprint

KERNEL_SOURCES = ("engines", "planning", "model.py")
"""What the generated kernels depend on, relative to the package: the engines (device code, the compile-time
values in each variant's name, the fake signatures and compile options in ``common``) and the modules they
import, ``planning`` (the tile and thread constants and the helpers that size a kernel) and ``model``
(the activation codes and GELU constants compiled into the device code). The compiler (frontend, passes,
codegen, runner) and ``stack`` only choose which variants to compile and with what plan: every value they
hand to a kernel at compile time is part of its variant's name, so they do not change the cubin at a given
path."""


@functools.cache
def sources_fingerprint() -> str:
    """The fingerprint of this package's ``KERNEL_SOURCES``, once per process."""
    return source_fingerprint(Path(__file__).resolve().parent.parent, KERNEL_SOURCES)


def artifact_dir(arch: str | None = None) -> Path:
    """Where compiled cubins are kept (``provenance.cubin_dir``): the root $KERNELLAB_MEGAKERNEL_CACHE or
    ~/.cache/kernellab/megakernel, then the arch and ``sources_fingerprint()``; one dump directory per variant
    below it."""
    return cubin_dir("KERNELLAB_MEGAKERNEL_CACHE", "megakernel", arch, sources_fingerprint())
