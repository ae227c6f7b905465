"""Contenders that cheat the measurement, each planted and each caught by the bench itself: every
timed batch is checked, inputs change between batches, host threads are waited for, and the
harness's own code is checked unpatched around every case. Deterministic: no timing is asserted."""

import time

import pytest
from fakes import (
    affine_suite,
    finishes_in_a_thread,
    memoizes_on_fingerprint,
    patches_the_clock,
    patches_the_comparison,
    works_when_poisoned,
)

from kernellab.harness import validate
from kernellab.harness.case import Impl
from kernellab.harness.runner import Bench, Config

FAST = Config(rounds=1, samples=4, warmup=1, iterations=3)


def _run(impl_factory, config=FAST):
    bench = Bench(affine_suite(Impl("cheat", bind=impl_factory), shapes=((8, 16),)), config)
    return bench.run_case("affine_8x16_fp32/cheat", 0)


def test_timed_batches_catch_work_done_only_on_poisoned_outputs():
    result = _run(works_when_poisoned)
    assert not result["passed"]
    timed = {v["mode"]: v for v in result["validations"] if v.get("timed_batches")}
    # a batch of several calls sees poisoned outputs at its first call only, and fresh inputs at every one
    assert not timed["e2e_throughput"]["passed"] and timed["e2e_throughput"]["failed_batches"] > 0, timed
    assert "timed batches gave wrong results" in timed["e2e_throughput"]["error"]


def test_a_memo_of_earlier_inputs_never_matches_a_timed_call():
    stale = []
    result = _run(memoizes_on_fingerprint(stale))
    assert result["passed"]
    # every timed batch reads contents written just before it, one set per call: no memo key survives them
    assert stale == [], f"{len(stale)} calls were served from a memo of contents since overwritten"


def test_work_finished_in_a_thread_is_inside_the_clock():
    one_call = Config(rounds=1, samples=4, warmup=1, iterations=1)  # one thread per sample: no race of its own
    result = _run(finishes_in_a_thread, one_call)
    assert result["passed"], result  # the thread is joined before the outputs are read, whatever the load
    for mode in ("e2e_throughput", "e2e_latency"):  # and its 2 ms of work are inside every sample
        assert min(result["samples_us"][mode]) >= 2000, result["samples_us"]


def test_work_a_hidden_thread_finishes_after_the_clock_stopped_fails():
    """No synchronization reaches a native thread; the outputs are held the moment the clock stops, so
    work that ends later fails, here even though it ends before the check begins comparing."""
    from fakes import Checked, Gate, finishes_in_a_hidden_thread

    gate = Gate()
    suite = affine_suite(Impl("cheat", bind=finishes_in_a_hidden_thread(gate)))
    suite.make_problems = lambda: [Checked((8, 16), "fp32", "cpu", gate)]
    bench = Bench(suite, Config(rounds=1, samples=3, warmup=0, iterations=1, rotate=False))
    result = bench.run_case("affine_8x16_fp32/cheat", 0)
    gate.release()
    timed = {v["mode"]: v for v in result["validations"] if v.get("timed_batches")}
    for mode in ("e2e_throughput", "e2e_latency"):
        assert not timed[mode]["passed"] and timed[mode]["failed_batches"] == 3, timed[mode]
        assert "unwritten or NaN" in timed[mode]["error"], timed[mode]["error"]


def test_a_thread_left_running_is_an_error():
    import threading

    stop = threading.Event()

    def bind(problem):
        threading.Thread(target=stop.wait, name="planted-pool", daemon=True).start()  # started at bind
        return lambda i, o: o

    from kernellab.harness import threads
    old = threads.JOIN_TIMEOUT_S
    threads.JOIN_TIMEOUT_S = 0.05
    try:
        bench = Bench(affine_suite(Impl("cheat", bind=bind), shapes=((8, 16),)), FAST)
        result = bench.run_case("affine_8x16_fp32/cheat", 0)
    finally:
        threads.JOIN_TIMEOUT_S = old
        stop.set()
    assert not result["passed"] and "planted-pool" in result["error"], result.get("error")


def test_a_thread_started_by_the_availability_check_is_the_impls():
    """``available()`` is contender code too: a thread it starts is waited for like one started at bind."""
    import threading

    stop = threading.Event()

    def available():
        threading.Thread(target=stop.wait, name="planted-at-check", daemon=True).start()
        return None

    from kernellab.harness import threads
    old = threads.JOIN_TIMEOUT_S
    threads.JOIN_TIMEOUT_S = 0.05
    try:
        impl = Impl("cheat", bind=lambda problem: lambda i, o: o, available=available)
        bench = Bench(affine_suite(impl, shapes=((8, 16),)), FAST)
        result = bench.run_case("affine_8x16_fp32/cheat", 0)
    finally:
        threads.JOIN_TIMEOUT_S = old
        stop.set()
    assert not result["passed"] and "planted-at-check" in result["error"], result.get("error")


@pytest.mark.parametrize("cheat, restore", [
    (patches_the_comparison, lambda: setattr(validate, "compare", ORIGINAL_COMPARE)),
    (patches_the_clock, lambda: setattr(time, "perf_counter_ns", ORIGINAL_CLOCK)),
])
def test_a_contender_that_patches_the_harness_is_refused(cheat, restore):
    try:
        result = _run(cheat)
    finally:
        restore()
    assert not result["passed"]
    assert "harness's own code was replaced" in result["error"], result.get("error")


ORIGINAL_COMPARE = validate.compare
ORIGINAL_CLOCK = time.perf_counter_ns
