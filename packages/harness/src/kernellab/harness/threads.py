"""Host threads and child processes a contender starts. A call is over when its outputs are final, so a thread the
call started, or one its impl started at import or bind time, is waited for inside the clock; one that
outlives ``JOIN_TIMEOUT_S`` is an error of that case, never a faster time. A child process contender code starts
(at import, bind, its availability check or in a case) is waited for before and after every case, outside the
clock: one still running then, which could load the CPU or GPU under another contender's case, is killed and
fails the case (``ProcessLeft``, naming the impl that started it).

The runner names the case being measured (``measuring``); every synchronization of the harness
(``Device.sync`` and the validations') then calls ``settle``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

JOIN_TIMEOUT_S = 30.0

_owned: dict[str, set[threading.Thread]] = {}  # impl name -> threads its import or bind started
_active: tuple[str, frozenset[threading.Thread], frozenset[int]] | None = None
"""(impl, threads alive and child processes running when its case began)."""
_processes: dict[int, str] = {}  # pid of a child process contender code started -> the impl whose code did
_known: tuple[frozenset[threading.Thread], frozenset[int]] | None = None
"""Threads alive when the harness began measuring, and the Python threads outside ``threading`` then (``begin``)."""


class ThreadLeft(RuntimeError):
    """A contender left a host thread running after its call returned."""


class ProcessLeft(ThreadLeft):
    """A contender left a child process running past a case's start or end."""


def alive() -> frozenset[threading.Thread]:
    return frozenset(t for t in threading.enumerate() if t.is_alive())


def children() -> frozenset[int]:
    """The pids of this process's running children, from Linux's /proc (none where it has no such files: there
    child processes are not followed)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return frozenset()
    pids: set[int] = set()
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                pids.update(int(p) for p in f.read().split())
        except OSError:
            continue
    return frozenset(p for p in pids if running(p))


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not ended (a zombie, ended but not yet reaped, has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X", "x")


def adopt_orphans() -> None:
    """Make this process the reaper of its descendants' orphans (Linux's PR_SET_CHILD_SUBREAPER), so that a
    process a contender starts and leaves by a double fork stays this process's child, and followed."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def _outside_threading() -> frozenset[int]:
    """Idents of the Python threads ``threading`` does not list (started by ``_thread`` or by foreign code): the
    interpreter's frames show them."""
    return frozenset(sys._current_frames()) - {t.ident for t in threading.enumerate()}


def begin() -> None:
    """Record the threads alive now, before any contender of a run is bound: every later one must be an impl's
    (``own``) or a case's (``measuring``), else it is a stray (``strays``)."""
    global _known
    _known = (alive(), _outside_threading())


def strays() -> list[str]:
    """Threads no one accounts for: a Python thread outside ``threading`` that was not there at ``begin``, and one
    alive now that was neither alive at ``begin``, nor an impl's from its import or bind, nor started during the
    case being measured (``settle`` waits for those). A thread that an owned thread starts after bind is one: it
    could slow the control's cases, or write to the worker's reply channel, unwaited."""
    if _known is None:  # nothing measured in this process
        return []
    hidden = sorted(_outside_threading() - _known[1])
    owned = set().union(*_owned.values())
    loose = alive() - _known[0] - owned - {threading.current_thread()}
    if _active is not None:
        loose &= _active[1]
    return [f"thread {ident} outside threading" for ident in hidden] + sorted(t.name for t in loose)


def own(impl: str, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` (an import or a bind of ``impl``) and make the threads and child processes it leaves alive
    ``impl``'s."""
    before, kids = alive(), children()
    try:
        return fn()
    finally:
        started = alive() - before
        if started:
            _owned.setdefault(impl, set()).update(started)
        for pid in children() - kids:
            _processes[pid] = impl


@contextlib.contextmanager
def measuring(impl: str) -> Iterator[None]:
    """While a case of ``impl`` is measured, ``settle`` waits for the threads it starts; the child processes it
    leaves running are ``impl``'s for ``settle_processes``."""
    global _active
    current = (impl, alive(), children())
    previous, _active = _active, current
    try:
        yield
    finally:
        for pid in children() - current[2]:
            _processes.setdefault(pid, impl)
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
    impl, before, _ = _active
    me = threading.current_thread()
    waiting = [t for t in (alive() - before) | _owned.get(impl, set()) if t is not me and t.is_alive()]
    for t in waiting:
        t.join(timeout)
    left = [t.name for t in waiting if t.is_alive()]
    if left:
        raise ThreadLeft(f"impl {impl!r} left host thread(s) {left} running after its call returned: a call is "
                         f"over when its outputs are final (waited {timeout:g} s)")


def kill_children(what: str) -> None:
    """Kill every child this process has (an orphan it adopted included) and raise ``ProcessLeft`` naming them:
    where no case runs (a worker that only imports contenders) any child is contender code's."""
    left = sorted(children())
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if left:
        raise ProcessLeft(f"child process(es) {left} still running after {what}, killed: contender code that leaves a "
                          "process loads the machine under every case after it")


def settle_processes(timeout: float | None = None) -> None:
    """Wait up to ``timeout`` seconds (``JOIN_TIMEOUT_S`` as it is at the call) for every child process that
    contender code started, the measured case's included, to end; kill those still running and raise
    ``ProcessLeft`` naming them and the impls that started them."""
    started, kids = dict(_processes), children()
    if _active is not None:
        for pid in kids - _active[2]:
            started.setdefault(pid, _active[0])
    deadline = time.monotonic() + (JOIN_TIMEOUT_S if timeout is None else timeout)
    while started.keys() & kids and time.monotonic() < deadline:  # still this process's children: a pid reused by
        time.sleep(0.01)  # another process after ours ended is never waited for, nor killed
        kids = children()
    left = {pid: impl for pid, impl in started.items() if pid in kids}
    for pid in started:
        _processes.pop(pid, None)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if left:
        named = ", ".join(f"{pid} (started by impl {impl!r})" for pid, impl in sorted(left.items()))
        raise ProcessLeft(f"child process(es) {named} still running, killed: a contender's work ends with its "
                          f"call, and a process left running loads the machine under the next case")
