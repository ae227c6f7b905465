"""Host threads a contender starts. A call is over when its outputs are final, so a thread the call
started, or one its impl started at import or bind time, is waited for inside the clock; one that
outlives ``JOIN_TIMEOUT_S`` is an error of that case, never a faster time.

The runner names the case being measured (``measuring``); every synchronization of the harness
(``Device.sync`` and the validations') then calls ``settle``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

JOIN_TIMEOUT_S = 30.0

_owned: dict[str, set[threading.Thread]] = {}  # impl name -> threads its import or bind started
_active: tuple[str, frozenset[threading.Thread]] | None = None  # (impl, threads alive when its case began)


class ThreadLeft(RuntimeError):
    """A contender left a host thread running after its call returned."""


def alive() -> frozenset[threading.Thread]:
    return frozenset(t for t in threading.enumerate() if t.is_alive())


def own(impl: str, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` (an import or a bind of ``impl``) and make the threads it leaves alive ``impl``'s."""
    before = alive()
    try:
        return fn()
    finally:
        started = alive() - before
        if started:
            _owned.setdefault(impl, set()).update(started)


@contextlib.contextmanager
def measuring(impl: str) -> Iterator[None]:
    """While a case of ``impl`` is measured, ``settle`` waits for the threads it starts."""
    global _active
    previous, _active = _active, (impl, alive())
    try:
        yield
    finally:
        _active = previous


def measured() -> str | None:
    """The impl whose case is being measured (``measuring``), or None."""
    return None if _active is None else _active[0]


def settle(timeout: float | None = None) -> None:
    """Join the threads the measured impl owns or started during its case; raise ``ThreadLeft`` naming
    any still running after ``timeout`` seconds (``JOIN_TIMEOUT_S`` as it is at the call)."""
    if _active is None:
        return
    timeout = JOIN_TIMEOUT_S if timeout is None else timeout
    impl, before = _active
    me = threading.current_thread()
    waiting = [t for t in (alive() - before) | _owned.get(impl, set()) if t is not me and t.is_alive()]
    for t in waiting:
        t.join(timeout)
    left = [t.name for t in waiting if t.is_alive()]
    if left:
        raise ThreadLeft(f"impl {impl!r} left host thread(s) {left} running after its call returned: a call is "
                         f"over when its outputs are final (waited {timeout:g} s)")
