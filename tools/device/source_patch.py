"""Rewriting a kernel module's source for the GPU-host trace tools (``megakernel_trace``, ``stack_trace``): edits
anchored on lines of the source that stop the tool with the anchor's text when the kernel moved one, and the
rewritten copy imported as a module of its own beside the original (CuTe DSL reads a kernel's source from its
file), removed afterwards."""

from __future__ import annotations

import contextlib
import importlib
from pathlib import Path


def _the_one(tool: str, source: str, anchor: str) -> int:
    """Where ``anchor`` starts; it must occur exactly once."""
    if source.count(anchor) != 1:
        raise SystemExit(f"{tool}: the kernel's source has {source.count(anchor)} of {anchor.strip()!r}, not one: "
                         "update the anchors with the kernel")
    return source.index(anchor)


def replace_once(tool: str, source: str, old: str, new: str) -> str:
    _the_one(tool, source, old)
    return source.replace(old, new)


def _indent(line: str) -> str:
    return line[:len(line) - len(line.lstrip())]


def line_after(tool: str, source: str, anchor: str, line: str) -> str:
    """``line`` after the whole line the anchor ends on, at that line's indentation."""
    end = source.index("\n", _the_one(tool, source, anchor) + len(anchor.rstrip("\n")))
    last = source[source.rfind("\n", 0, end) + 1:end]
    return source[:end + 1] + _indent(last) + line + "\n" + source[end + 1:]


def line_before(tool: str, source: str, anchor: str, line: str) -> str:
    """``line`` before the line the anchor starts on, at that line's indentation."""
    start = source.rfind("\n", 0, _the_one(tool, source, anchor)) + 1
    first = source[start:source.index("\n", start)]
    return source[:start] + _indent(first) + line + "\n" + source[start:]


@contextlib.contextmanager
def traced_module(module, rewrite):
    """``rewrite(source of module)`` imported as ``_traced_<name>`` beside ``module`` for the ``with`` block."""
    path = Path(module.__file__)
    traced = path.with_name(f"_traced_{path.name}")
    traced.write_text(rewrite(path.read_text()))
    try:
        yield importlib.import_module(f"{module.__package__}._traced_{path.stem}")
    finally:
        traced.unlink(missing_ok=True)
