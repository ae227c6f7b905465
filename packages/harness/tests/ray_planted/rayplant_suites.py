"""Planted suites for the cluster tests (test_cluster.py), installed outside the checkout (a
contender from elsewhere, as the tree's worker sees it): fixed-duration cases whose time is a sleep,
so that a run's wall time falls with workers however loaded the machine is, and a contender that
kills its worker on one problem, and one that never returns (test_revision.py); and contenders whose
call, in a case, ends their worker: a crash, a worker leaving as on an untrusted reply channel, a
crash at every problem, and a quick honest one (test_revision.py)."""

import importlib.util
import os
import signal
import time
from pathlib import Path

from kernellab.harness.case import Impl, Suite

SLEEP_S = 28.0  # each ray-sleepy problem's fixed duration
CRASH_ON = "affine_4x3_fp32"  # the ray-crashy problem whose crasher kills its worker, and where the case enders end it


def _fakes():
    """The harness tests' own Affine problem (fakes.py, one folder up), loaded by path: this module is
    installed outside the checkout, where the tests folder is not importable."""
    path = Path(__file__).resolve().parents[1] / "fakes.py"
    spec = importlib.util.spec_from_file_location("kernellab_test_fakes", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


Affine = _fakes().Affine


def honest(i, o):
    o["y"].copy_(i["x"]).mul_(2).add_(1)
    return o


def sleeper(problem):
    time.sleep(SLEEP_S)
    return honest


def _segfault():
    os.kill(os.getpid(), signal.SIGSEGV)


def crasher(problem):
    if problem.name == CRASH_ON:
        _segfault()  # at bind, in its worker's setup
    return honest


def _suite(name, impl, widths):
    return Suite(name=name, device="cpu", description=f"planted for the cluster tests: {impl.name}",
                 make_problems=lambda: [Affine((4, n), "fp32", "cpu") for n in widths],
                 impls=[Impl("torch", bind=lambda p: p.control), impl])


def sleepy():
    return _suite("ray-sleepy", Impl("sleeper", bind=sleeper), (1, 2))


def crashy():
    return _suite("ray-crashy", Impl("crasher", bind=crasher), (2, 3, 5))


def hangs(problem):
    def call(i, o):
        time.sleep(3600)  # a kernel that never returns
        return o
    return call


def hung():
    return _suite("ray-hung", Impl("hangs", bind=hangs), (2,))


def _ends_worker_in_case(end, everywhere=False):
    """A contender whose call, once its case runs, ends its worker by ``end`` (at CRASH_ON, or ``everywhere``)."""
    def bind(problem):
        def call(i, o):
            if everywhere or problem.name == CRASH_ON:
                end()
            return honest(i, o)
        return call
    return bind


def _leave():
    from kernellab.harness.revision import CHANNEL_TAKEN

    os._exit(CHANNEL_TAKEN)  # as the worker leaves when a stray thread could write its replies


def case_crash():
    return _suite("ray-case-crash", Impl("crashes", bind=_ends_worker_in_case(_segfault)), (2, 3, 5))


def case_leave():
    return _suite("ray-case-leave", Impl("leaves", bind=_ends_worker_in_case(_leave)), (2, 3, 5))


def case_crash_everywhere():
    return _suite("ray-case-crash-everywhere", Impl("crashes", bind=_ends_worker_in_case(_segfault, True)),
                  (2, 3, 5, 7, 11))


def quick():
    return _suite("ray-quick", Impl("honest", bind=lambda problem: honest), (2,))
