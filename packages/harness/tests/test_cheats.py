"""Contenders that cheat the measurement, each planted and each caught by the bench itself: every
timed batch is checked, inputs change between batches, host threads are waited for, and the
harness's own code is checked unpatched around every case. Deterministic: no timing is asserted."""

import os
import time

import pytest
from fakes import (
    Affine,
    affine_suite,
    answers_for_its_artifacts,
    finishes_in_a_thread,
    hands_the_interpreter_over_often,
    harness_constant,
    memoizes_on_fingerprint,
    patches_a_tensor_method,
    patches_isnan_for_one_read,
    patches_its_bench,
    patches_the_clock,
    patches_the_clock_once,
    patches_the_comparison,
    patches_the_comparison_once,
    patches_the_encoder,
    pins_the_process_to_one_cpu,
    predicts_batch_inputs,
    pushes_a_torch_function_mode,
    raises_the_ship_limit,
    replaces_its_problems_truth,
    returns_its_input,
    shadows_a_builtin_in_the_harness,
    skips_the_calls_it_counts_unchecked,
    slows_the_control,
    starts_a_thread_outside_threading,
    starts_a_thread_through_its_thread,
    starves_the_control_of_threads,
    stops_the_thread_join,
    works_when_poisoned,
    works_when_read,
)

from kernellab.harness import validate
from kernellab.harness.case import Impl
from kernellab.harness.runner import Bench, Config

FAST = Config(rounds=1, samples=4, warmup=1, iterations=3)


def _run(impl_factory, config=FAST):
    bench = Bench(affine_suite(Impl("cheat", bind=impl_factory), shapes=((8, 16),)), config)
    return bench.run_case("affine_8x16_fp32/cheat", 0)


def _run_restoring(impl_factory, module, name: str):
    """``_run`` of a cheat that replaces ``module.name``: put back whatever happens."""
    real = getattr(module, name)
    try:
        return _run(impl_factory)
    finally:
        setattr(module, name, real)


def _run_and_restore(cheat):
    """``_run`` of a cheat whose call patches torch and carries ``restore``: the patch is undone whatever happens."""
    made = []

    def bind(problem):
        made.append(cheat(problem))
        return made[-1]
    try:
        return _run(bind)
    finally:
        for call in made:
            call.restore()


def test_timed_batches_catch_work_done_only_on_poisoned_outputs():
    """A batch's length is drawn (1 in 3 ends after its first call, the one that sees poisoned outputs): over 60
    batches all of them ending there is about 1 in 10^28, where the 4 of ``FAST`` let the cheat through about once
    in 80 runs."""
    config = Config(rounds=1, samples=60, warmup=1, iterations=3, modes=("e2e_throughput",))
    result = _run(works_when_poisoned, config)
    assert not result["passed"]
    timed = {v["mode"]: v for v in result["validations"] if v.get("timed_batches")}
    # a batch of several calls sees poisoned outputs at its first call only, and fresh inputs at every one
    assert not timed["e2e_throughput"]["passed"] and timed["e2e_throughput"]["failed_batches"] > 0, timed
    assert "timed batches gave wrong results" in timed["e2e_throughput"]["error"]


@pytest.mark.parametrize("setting", [{"rotate": False}, {"rotation_limit_bytes": 1}])
def test_work_done_only_on_poisoned_outputs_is_caught_without_rotation_or_memory(setting):
    """Without rotation, or with a memory limit that holds one input set, a batch's later calls had read its first
    call's inputs: the cheat computed there (on poisoned outputs), returned at once from the rest with the right
    answer in place, and passed while timed several times faster. Every call of a batch now reads a set of its
    own whatever the settings."""
    config = Config(rounds=1, samples=60, warmup=1, iterations=3, modes=("e2e_throughput",), **setting)
    result = _run(works_when_poisoned, config)
    timed = {v["mode"]: v for v in result["validations"] if v.get("timed_batches")}
    assert not result["passed"] and timed["e2e_throughput"]["failed_batches"] > 0, timed


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
    try:
        with harness_constant(threads, "JOIN_TIMEOUT_S", 0.05):
            bench = Bench(affine_suite(Impl("cheat", bind=bind), shapes=((8, 16),)), FAST)
            result = bench.run_case("affine_8x16_fp32/cheat", 0)
    finally:
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
    try:
        with harness_constant(threads, "JOIN_TIMEOUT_S", 0.05):
            impl = Impl("cheat", bind=lambda problem: lambda i, o: o, available=available)
            bench = Bench(affine_suite(impl, shapes=((8, 16),)), FAST)
            result = bench.run_case("affine_8x16_fp32/cheat", 0)
    finally:
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


def test_a_contender_that_patches_its_bench_instance_is_refused():
    """A method replaced on the bench object, not on its class, is caught as a class's would be; the
    control's case, run first by the same bench, already fails the check: nothing the bench measures after the
    patch is trusted."""
    bench = Bench(affine_suite(Impl("cheat", bind=patches_its_bench), shapes=((8, 16),)), FAST)
    result = bench.run_case("affine_8x16_fp32/cheat", 0)
    assert not result["passed"] and "Bench._measure" in result["error"], result.get("error")


def test_a_contender_that_rewrites_the_workers_replies_is_refused(monkeypatch, tmp_path):
    """Every result reaches the driver as a line the worker encodes: an encoder wrapped at bind time could
    rewrite the samples (or the verdict) in it. Every reply after the patch is the fixed refusal instead."""
    import io
    import json

    from kernellab.harness import registry, worker

    real = json.dumps
    suite = affine_suite(Impl("cheat", bind=patches_the_encoder), shapes=((8, 16),))
    monkeypatch.setattr(registry, "get", lambda name, root=None, impls=True: suite)
    monkeypatch.delenv("KERNELLAB_SOURCE_ROOT", raising=False)
    config = {"rounds": 1, "samples": 4, "warmup": 1, "iterations": 3, "modes": ["e2e_throughput"]}
    requests = [{"cmd": "setup", "suite": "affine", "config": config, "cases": "*", "impls": "cheat"},
                {"cmd": "case", "id": "affine_8x16_fp32/cheat", "round": 0, "ship_dir": str(tmp_path)},
                {"cmd": "exit"}]
    out = io.StringIO()
    try:
        worker.serve(io.StringIO("".join(real(r) + "\n" for r in requests)), out)
        patched = json.dumps is not real
    finally:
        json.dumps = real
    assert patched
    replies = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(replies) == 3 and not any(r["ok"] for r in replies), replies
    assert all("json.dumps" in r["error"] for r in replies), replies


def test_a_contender_that_answers_for_its_artifacts_is_refused_and_never_asked(tmp_path):
    """The audit compares the built files' hashes with the report's: a contender that replaced the hashing in its
    worker could vouch for a rebuilt file. The patch fails its case, and the worker only names the files: the
    driver, which runs no contender code, hashes them (``provenance.artifact_hashes`` in ``revision.run_sides``)."""
    from kernellab.harness import provenance

    result = _run_restoring(answers_for_its_artifacts, provenance, "artifact_hashes")
    assert not result["passed"] and "provenance.artifact_hashes" in result["error"], result.get("error")
    built = tmp_path / "kernel.so"
    built.write_bytes(b"a rebuilt kernel")
    assert provenance.artifact_hashes(["kernel.so", str(built), "gone.so"], tmp_path) == {  # as the driver reads them
        "kernel.so": provenance.sha256_file(built), str(built): provenance.sha256_file(built)}


@pytest.mark.parametrize(("cheat", "named"), [(slows_the_control, "torch.add"),
                                              (starves_the_control_of_threads, "setting num_threads"),
                                              (pushes_a_torch_function_mode, "setting torch_function_modes"),
                                              (hands_the_interpreter_over_often, "setting switch_interval"),
                                              (pins_the_process_to_one_cpu, "setting cpu_affinity")])
def test_a_contender_that_slows_the_control_is_refused(cheat, named):
    """Contender code shares its process with the torch control it is compared with: a torch op the control calls
    wrapped to run three times, torch's thread pool shrunk, a torch function mode pushed (5x on the control), the
    interpreter's switch interval cut or every thread pinned to one CPU, at bind, made an honest contender look
    faster than torch. Every attribute of torch's op namespaces and the speed settings are sealed."""
    if cheat is pins_the_process_to_one_cpu and len(os.sched_getaffinity(0)) < 2:
        pytest.skip("pinning to one CPU changes nothing on a machine of one")
    result = _run_and_restore(cheat)
    assert not result["passed"] and named in result.get("error", ""), result.get("error")


def worker_of(tmp_path, monkeypatch, bind: str, impl: str):
    """A real worker process (``revision.Worker``) whose affine suite holds one impl bound by ``bind``, a function of
    ``fakes``, set up through a ``sitecustomize`` on its path; skipped where Linux's /proc, which the driver's count
    of the worker's descriptors reads, is absent."""
    from pathlib import Path

    from kernellab.harness import revision

    if not os.path.isdir(f"/proc/{os.getpid()}/fd"):
        pytest.skip("the driver's count of the worker's descriptors reads Linux's /proc")
    (tmp_path / "sitecustomize.py").write_text(
        f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        f"from fakes import affine_suite, {bind}\n"
        "from kernellab.harness import registry\nfrom kernellab.harness.case import Impl\n"
        f"suite = affine_suite(Impl({impl!r}, bind={bind}), shapes=((8, 16),))\n"
        "registry.get = lambda name, root=None, impls=True: suite\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]))
    return revision.Worker(None, "candidate")


WORKER_CONFIG = {"rounds": 1, "samples": 4, "warmup": 1, "iterations": 3, "modes": ["e2e_throughput"]}


@pytest.mark.parametrize(("cheat", "named"), [("takes_over_the_reply_channel", "could no longer be trusted"),
                                              ("keeps_a_copy_of_the_reply_channel", "descriptors of this driver's")])
def test_a_contender_that_takes_the_workers_reply_channel_is_refused(cheat, named, tmp_path, monkeypatch):
    """A real worker process whose contender, at bind, either points the worker's reply descriptor at a pipe of its
    own and forwards every reply edited (the worker checks where its descriptor writes before each reply, and
    leaves) or keeps a copy of it to write replies of its own (the driver counts the worker's descriptors of its
    pipe after each reply, from /proc, and kills it)."""
    from kernellab.harness import revision

    with worker_of(tmp_path, monkeypatch, cheat, "cheat") as worker, pytest.raises(revision.RevisionError,
                                                                                    match=named):
        worker.request("setup", suite="affine", config=WORKER_CONFIG, cases="*", impls="cheat", timeout_s=120)
        worker.request("case", id="affine_8x16_fp32/cheat", round=0, timeout_s=120)


def test_an_honest_workers_reply_channel_is_its_one_descriptor(tmp_path, monkeypatch):
    """No false alarm: an honest worker holds one descriptor of the driver's pipe through setup, a case and exit."""
    with worker_of(tmp_path, monkeypatch, "honest", "ours") as worker:
        worker.request("setup", suite="affine", config=WORKER_CONFIG, cases="*", impls="ours", timeout_s=120)
        assert worker.channel_holders() == 1
        got = worker.request("case", id="affine_8x16_fp32/ours", round=0, timeout_s=120)
        assert got["data"]["passed"], got["data"]


@pytest.mark.parametrize(("cheat", "named"), [(starts_a_thread_through_its_thread, "started-by-an-owned-thread"),
                                              (starts_a_thread_outside_threading, "outside threading")])
def test_a_thread_no_impl_owns_fails_the_case(cheat, named):
    """A thread started by an impl's thread after its bind, or one outside ``threading`` (``_thread``), belongs to
    no impl and no case: nothing waited for it while it could slow the control or write the worker's replies."""
    import time

    made = []

    def bind(problem):
        made.append(cheat(problem))
        return made[-1]
    try:
        bench = Bench(affine_suite(Impl("cheat", bind=bind), shapes=((8, 16),)), FAST)
        time.sleep(0.2)  # the owned thread has started its own
        result = bench.run_case("affine_8x16_fp32/torch", 0)
    finally:
        for call in made:
            call.restore()
    assert not result["passed"] and "no impl owns" in result["error"] and named in result["error"], result["error"]


def test_a_result_that_does_its_work_when_read_fails_unread():
    done = []
    result = _run(works_when_read(done))
    assert not result["passed"] and done == [], done  # refused before anything of it is read
    assert all("not a dict of tensors" in v["error"] for v in result["validations"]), result["validations"]


def copy_cheat_fails(bind, named: str) -> None:
    """A copy suite with ``bind`` beside torch's: torch's case passes, the cheat's fails every validation naming
    ``named``."""
    from kernellab.harness.case import Suite
    from kernellab.harness.suites.problems import Copy

    suite = Suite(name="copy", device="cpu", description="", make_problems=lambda: [Copy((64, 128), "fp32", "cpu")],
                  impls=[Impl("torch", bind=lambda p: p.control), Impl("cheat", bind=bind)])
    bench = Bench(suite, Config(rounds=1, samples=4, warmup=1, iterations=3, modes=("e2e_throughput",)))
    assert bench.run_case("copy_64x128_fp32/torch", 0)["passed"]
    result = bench.run_case("copy_64x128_fp32/cheat", 0)
    assert not result["passed"]
    assert all(named in v["error"] for v in result["validations"]), result["validations"]


def test_a_result_that_aliases_its_input_fails():
    """For a copy the input is exactly the truth: returning it moves no byte and must still fail."""
    copy_cheat_fails(returns_its_input, "shares memory with an input")


def test_a_result_that_records_autograd_fails():
    """A baseline run with grad (weights that require it) is timed with autograd's work, and through an in-place
    copy into its output chains every call's graph to the last: a handicap that would read as the other side's gain.
    Its result is refused unread, as a result that is no plain tensor is."""
    import torch

    def with_grad(problem):
        scale = torch.ones((), requires_grad=True)

        def call(inputs, outputs):
            for out in outputs.values():
                out.copy_(inputs["x"] * scale)
            return outputs
        return call

    copy_cheat_fails(with_grad, "records autograd")


ORIGINAL_COMPARE = validate.compare
ORIGINAL_CLOCK = time.perf_counter_ns


def test_a_contender_that_patches_a_tensor_method_mid_case_is_refused():
    """The harness reads every result through tensor methods: one replaced from inside a call (after the case's
    first integrity check) would compute the answer while the harness reads it. Every read checks them first."""
    result = _run_and_restore(patches_a_tensor_method)
    assert not result["passed"]
    assert "harness's own code was replaced" in result["error"] and "torch.Tensor.detach" in result["error"], \
        result.get("error")


def test_a_contender_that_changes_a_harness_constant_is_refused():
    from kernellab.harness import validate

    result = _run_restoring(raises_the_ship_limit, validate, "SHIP_LIMIT_BYTES")
    assert not result["passed"] and "validate.SHIP_LIMIT_BYTES" in result["error"], result.get("error")


def test_a_contender_that_replaces_its_problems_truth_is_refused():
    """The problem is handed to the contender at bind: a truth set on it would agree with any output."""
    result = _run(replaces_its_problems_truth)
    assert not result["passed"] and "Affine.reference (on the instance)" in result["error"], result.get("error")


def test_a_contender_that_stops_the_thread_join_is_refused():
    result = _run(stops_the_thread_join)
    assert not result["passed"] and "threads._active" in result["error"], result.get("error")


def test_timed_batch_inputs_cannot_be_computed_from_the_configuration():
    """A batch's inputs are written from a seed drawn just before it: no memo made from the run's configuration
    (its seed, the case, the mode, the round) holds any of them."""
    hits = []
    result = _run(predicts_batch_inputs(hits))
    assert result["passed"], result
    timed = sum(v["checked"] for v in result["validations"] if v.get("timed_batches"))
    assert timed > 0 and hits == [], f"{len(hits)} timed calls read inputs known before their batch"


def test_a_patch_that_undoes_itself_after_one_read_is_caught_at_that_read():
    result = _run_and_restore(patches_isnan_for_one_read)
    assert not result["passed"] and "torch.isnan" in result["error"], result.get("error")


def test_a_clock_patched_for_its_first_use_only_is_never_used():
    """The timing loop takes its clock, synchronize and event methods once, checked against the seal, when a
    timing starts: a patch that would undo itself at the batch's end stamp is never called, so it stays in
    place and the case is refused (before, every sample of this contender came out 10 ms short)."""
    result = _run_and_restore(patches_the_clock_once)
    assert not result["passed"] and "time.perf_counter_ns" in result["error"], result.get("error")
    assert all(v > 0 for samples in result["samples_us"].values() for v in samples)


def test_a_contender_that_counts_its_calls_cannot_skip_the_unchecked_ones():
    """A checked batch ends where a draw made after each call returns says, so a contender that knows the run's
    batch length and counts its calls still meets batches that end on a call it skipped. Each batch of this one
    ends on a skipped call about half the time; over 60 batches all escaping is about 1 in 10^19."""
    config = Config(rounds=1, samples=60, warmup=1, iterations=3, modes=("e2e_throughput",))
    result = _run(skips_the_calls_it_counts_unchecked(config.iterations), config)
    assert not result["passed"], result
    (timed,) = [v for v in result["validations"] if v.get("timed_batches")]
    assert timed["failed_batches"] > 0 and "timed batches gave wrong results" in timed["error"], timed


def test_a_check_patched_for_its_first_use_only_is_seen_before_it_is_used():
    """Right after contender code returns (a validation, the warmup, each timed batch, a graph's capture), before
    the harness looks anything up, the whole seal is verified through a check bound before the contender ran: a
    patch meant to undo itself at its first use is still in place there (before, this contender passed)."""
    result = _run_and_restore(patches_the_comparison_once)
    assert not result["passed"] and "validate.compare" in result["error"], result.get("error")


def test_a_sample_of_no_time_is_refused():
    from kernellab.harness import timing

    for us in (0.0, -3.5, float("nan")):
        with pytest.raises(RuntimeError, match="cannot take no time"):
            timing._positive(us, "e2e_throughput")
    assert timing._positive(0.25, "e2e_throughput") == 0.25


def test_a_global_that_shadows_a_builtin_in_the_harness_is_refused():
    from kernellab.harness import validate

    try:
        result = _run(shadows_a_builtin_in_the_harness)
    finally:
        vars(validate).pop("int", None)
    assert not result["passed"] and "validate.int (a global shadowing the builtin)" in result["error"], \
        result.get("error")


def test_a_problems_cached_property_made_after_bind_is_its_own_not_a_patch():
    """A problem may make part of itself on first use (``functools.cached_property``: the megakernel's models make
    their weights so); that first use after bind is the class's own recorded code, not a contender's change."""
    import functools

    from kernellab.harness.case import Suite

    class Lazy(Affine):
        @functools.cached_property
        def scale(self):
            return 2.0

        def reference(self, inputs):
            return {"y": inputs["x"].double() * self.scale + 1}

    suite = Suite(name="lazy", device="cpu", description="", make_problems=lambda: [Lazy((8, 16), "fp32", "cpu")],
                  impls=[Impl("torch", bind=lambda p: p.control)])
    result = Bench(suite, FAST).run_case("affine_8x16_fp32/torch", 0)
    assert result["passed"], result.get("error")


FOLLOWS_PROCESSES = os.path.exists(f"/proc/self/task/{os.getpid()}/children")
needs_proc_children = pytest.mark.skipif(not FOLLOWS_PROCESSES, reason="child processes are followed through "
                                         "Linux's /proc/<pid>/task/<tid>/children, absent here")


def _sleeper():
    """A child process that would run for a minute: a contender's work going on after its call."""
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


@needs_proc_children
def test_a_child_process_left_running_by_a_call_is_killed_and_fails_the_case():
    """A process the call starts and leaves (it could go on loading the machine under the next contender's case)
    is waited for at the case's end, then killed, and the case fails naming it and its impl."""
    from kernellab.harness import threads

    started = []

    def bind(problem):
        def call(i, o):
            if not started:
                started.append(_sleeper())
            problem.control(i, o)
            return o
        return call

    try:
        with harness_constant(threads, "JOIN_TIMEOUT_S", 0.05):
            result = _run(bind)
        assert started and started[0].wait(timeout=10) == -9, "the process was killed"
    finally:
        for p in started:
            p.kill()
    assert not result["passed"] and "ProcessLeft" in result["error"], result.get("error")
    assert f"{started[0].pid} (started by impl 'cheat')" in result["error"], result["error"]


@needs_proc_children
def test_a_child_process_started_at_bind_is_the_impls_and_stopped_before_a_case():
    """A process started by the bind, outside any case, is the impl's: the next case to start (whoever's) waits
    for it, kills it and fails naming the impl that started it."""
    from kernellab.harness import threads

    started = []

    def bind(problem):
        started.append(_sleeper())
        return lambda i, o: (problem.control(i, o), o)[1]

    try:
        with harness_constant(threads, "JOIN_TIMEOUT_S", 0.05):
            result = _run(bind)
        assert started[0].wait(timeout=10) == -9, "the process was killed"
    finally:
        for p in started:
            p.kill()
    assert not result["passed"] and f"{started[0].pid} (started by impl 'cheat')" in result["error"], result
    assert not threads.children() & {p.pid for p in started}


def test_a_child_process_a_call_waits_for_is_its_work_and_passes():
    """No false alarm: a call that starts a process and waits for it to end is an honest (slow) contender."""
    import subprocess
    import sys

    def bind(problem):
        def call(i, o):
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            problem.control(i, o)
            return o
        return call

    result = _run(bind, Config(rounds=1, samples=2, warmup=0, iterations=1))
    assert result["passed"], result.get("error")


@needs_proc_children
def test_an_orphan_of_a_double_fork_stays_the_workers_child():
    """The worker adopts its descendants' orphans (``threads.adopt_orphans``), so a process a contender leaves by
    forking twice is still a child there, and followed (Linux)."""
    import subprocess
    import sys

    script = (
        "import os, sys, time\n"
        "from kernellab.harness import threads\n"
        "threads.adopt_orphans()\n"
        "r, w = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        time.sleep(30)\n"
        "        os._exit(0)\n"
        "    os.write(w, str(pid).encode())\n"
        "    os._exit(0)\n"
        "grandchild = int(os.read(r, 32))\n"
        "for _ in range(500):\n"
        "    if grandchild in threads.children():\n"
        "        break\n"
        "    time.sleep(0.01)\n"
        "print(grandchild in threads.children())\n"
        "os.kill(grandchild, 9)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "True", out.stderr


@needs_proc_children
def test_a_case_that_fails_early_leaves_no_process_of_its_contender():
    """A case that ends on an error before its last check still stops what its contender started."""
    from kernellab.harness import threads

    started = []

    def bind(problem):
        def call(i, o):
            if not started:
                started.append(_sleeper())
            raise RuntimeError("planted crash")
        return call

    try:
        result = _run(bind)
        assert started[0].wait(timeout=10) == -9, "the process was killed"
    finally:
        for p in started:
            p.kill()
    assert not result["passed"] and "planted crash" in result["error"], result.get("error")
    assert not threads._processes, "nothing left on the record for the next case"


@needs_proc_children
def test_a_recorded_pid_that_is_no_longer_a_child_is_neither_waited_for_nor_killed():
    """A pid on the record whose process ended, and which the system gave to a process that is not this one's
    child, is left alone: only this process's children are waited for and killed."""
    import signal
    import subprocess
    import sys

    from kernellab.harness import threads

    script = ("import os, subprocess, sys, time\n"
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True,\n"
              "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
              "print(p.pid, flush=True)\n"
              "os._exit(0)\n")  # the grandchild is orphaned: no longer a child of anyone here
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    stranger = int(out.stdout.split()[0])
    try:
        threads._processes[stranger] = "cheat"
        threads.settle_processes(0.05)
        assert threads.running(stranger), "a process that is not this one's child is not killed"
    finally:
        threads._processes.pop(stranger, None)
        os.kill(stranger, signal.SIGKILL)
