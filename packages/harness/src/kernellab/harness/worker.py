"""The worker side of revision A/B: ``worker.main()`` in a fresh interpreter in one revision's tree.

Requests and replies are JSON lines on the original stdout; everything else the process prints
(compilers, extension builds, progress) goes to stderr so it cannot corrupt the protocol.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import os
import re
import sys
import traceback
from pathlib import Path

from . import integrity, provenance, registry, threads
from .revision import CHANNEL_TAKEN, PROTOCOL
from .runner import Bench, Config

_ENCODE = json.JSONEncoder(allow_nan=True).encode  # bound before any contender is imported (sealed: integrity)


def _patched_line(patched: list[str]) -> str:
    """The reply that replaces any other once the harness or its encoder was patched: built without the
    encoder, whose output can no longer be trusted (names reduced to characters JSON needs no escape for)."""
    names = ", ".join(re.sub(r"[^A-Za-z0-9_.() ]", "?", n) for n in patched)
    return f'{{"ok": false, "error": "HarnessPatched: {integrity.REPLACED}: {names}"}}\n'


def _foreign_modules(root: Path, harness: Path) -> list[str]:
    """kernellab modules this worker imported from outside its tree (the harness: from outside the driver's
    ``harness`` package, the one it measures with): a contaminated comparison."""
    bad = []
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        home = harness if name == "kernellab.harness" or name.startswith("kernellab.harness.") else root
        if name.startswith("kernellab.") and f and home not in Path(f).resolve().parents:
            bad.append(f"{name} ({f})")
    return sorted(bad)


def channel_identity(out) -> tuple[int, int] | None:
    """(device, inode) of the file a reply stream writes to, or None for one with no descriptor (a test's)."""
    try:
        st = os.fstat(out.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        return None
    return st.st_dev, st.st_ino


def send(out, line: str, identity: tuple[int, int] | None) -> None:
    """Write one reply line, if ``out`` still writes where it did when the worker started and no thread that no
    impl owns is running (``threads.strays``): contender code that pointed the descriptor elsewhere (a pipe of its
    own, forwarding edited replies) would read and rewrite every reply, and a stray thread could write replies of
    its own to it. Else the worker leaves at once with ``CHANNEL_TAKEN``, writing nothing, and says why on stderr."""
    why = "its reply channel now writes elsewhere" if channel_identity(out) != identity else None
    strays = threads.strays()
    if why or strays:
        sys.stderr.write(f"worker: {why or f'thread(s) {strays} that no impl owns are running'}: contender code "
                         "could write or rewrite its replies; leaving\n")
        sys.stderr.flush()
        os._exit(CHANNEL_TAKEN)
    out.write(line)
    out.flush()


def serve(inp, out) -> None:
    source_root = os.environ.get("KERNELLAB_SOURCE_ROOT")
    root = Path(source_root).resolve() if source_root else None
    label = os.environ.get("KERNELLAB_WORKER_LABEL", "worker")
    harness = Path(os.environ.get("KERNELLAB_HARNESS_DIR") or Path(__file__).parent).resolve()
    identity = channel_identity(out)  # before any request: no contender code has run yet
    bench: Bench | None = None
    catalog_only = False  # a listing worker: it measures nothing, so any process left at its exit is contender code's
    kill_children = threads.kill_children  # bound before any contender code ran

    def reply(**data):  # a patch elsewhere fails its case (runner._unpatched); one of the encoder, every reply
        patched = [n for n in integrity.verify() if n.startswith(("json.", "worker."))]
        send(out, _patched_line(patched) if patched else _ENCODE({"ok": True, "protocol": PROTOCOL, **data}) + "\n",
             identity)

    for line in inp:
        req = json.loads(line)
        cmd = req.get("cmd")
        try:
            if cmd == "exit":
                reply()
                if catalog_only:
                    with contextlib.suppress(threads.ProcessLeft):
                        kill_children("the listing")
                return
            if cmd == "setup":
                suite = registry.get(req["suite"], root)
                config = Config(**req["config"])
                bench = Bench(suite, config, cases=req.get("cases"), impls=req.get("impls"))
                foreign = _foreign_modules(root, harness) if root is not None else []
                if foreign:
                    raise RuntimeError(f"modules imported from outside {root}: {foreign}")
                bench.device.warm_up()
                reply(cases=bench.describe(), modes=list(bench.modes), label=label,
                      schedule=[bench.schedule(r) for r in range(config.rounds)], artifacts=bench.artifacts(),
                      provenance=provenance.collect(suite.device, root, [], bench.measured_packages(),
                                                    bench.runnable_impls()))
            elif cmd == "catalog":  # what the driver lists and matches, without importing a contender itself
                catalog_only = True
                # bound before any contender is imported: one that replaced them (to let a process live) is named
                after_contender = integrity.guard()
                suites, broken = registry.discover(root)
                listing = [registry.catalog_entry(s) for s in suites.values()]
                after_contender("the contenders' imports")
                kill_children("the contenders' imports")  # the listing refused; again at exit, for one started later
                reply(broken=broken, suites=listing)
            elif cmd == "case":
                if bench is None:
                    raise RuntimeError("case before setup")
                reply(data=bench.run_case(req["id"], int(req["round"]), req.get("ship_dir")))
            elif cmd == "finish":
                if bench is None:
                    raise RuntimeError("finish before setup")
                reply(clocks_end=provenance.clocks(bench.suite.device), artifacts=bench.artifacts())
            else:
                raise ValueError(f"unknown request {cmd!r}")
        except Exception as e:  # noqa: BLE001 - every failure goes back to the driver with its reason
            traceback.print_exc(file=sys.stderr)
            send(out, json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"}) + "\n", identity)


def main() -> None:
    threads.adopt_orphans()
    protocol_fd = os.dup(1)
    os.dup2(2, 1)  # anything printed, even by C code, goes to stderr
    sys.stdout = sys.stderr
    with os.fdopen(protocol_fd, "w", buffering=1) as out:
        serve(sys.stdin, out)
    quick_exit()


def quick_exit() -> None:
    """Leave without the interpreter's teardown once the driver has every reply: unloading torch and
    freeing the rotated inputs takes a few hundred ms that the driver would wait for, once per problem on
    a cluster. Every stream is flushed first, C's included, so that nothing printed is lost."""
    sys.stderr.flush()
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass
    os._exit(0)
