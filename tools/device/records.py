"""Where a device tool writes its record: under ``$OUT`` (the folder whose files come back from the GPU host), never
over an earlier record of the same call. Two commands of one call that write the same name keep both: the second
takes ``NAME-2.json``, the next ``NAME-3.json``."""

from __future__ import annotations

import os


def record_path(name: str) -> str:
    """A path under ``$OUT`` (the working folder without it) for ``name``, numbered past any file already there."""
    out = os.environ.get("OUT", ".")
    stem, ext = os.path.splitext(name)
    path, n = os.path.join(out, name), 2
    while os.path.exists(path):
        path, n = os.path.join(out, f"{stem}-{n}{ext}"), n + 1
    return path
