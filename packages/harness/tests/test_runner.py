import pytest
from fakes import affine_suite, honest, leaves_tail_unwritten

from kernellab.harness import assemble, timing
from kernellab.harness.case import Impl, Unsupported
from kernellab.harness.runner import Bench, Config, match

FAST = Config(rounds=2, samples=3, warmup=1, iterations=2)


def test_config_rejects_bad_values():
    for field, value in (("rounds", 0), ("samples", -1), ("iterations", 0), ("warmup", -1)):
        with pytest.raises(ValueError, match=field):
            Config(**{field: value})
    with pytest.raises(ValueError, match="unknown modes"):
        Config(modes=("fastest",))


def test_bench_measures_every_case_in_every_mode():
    suite = affine_suite(Impl("ours", bind=honest))
    bench = Bench(suite, FAST)
    data = bench.run_round(0)
    assert set(data) == {"affine_8x16_fp32/torch", "affine_8x16_fp32/ours", "affine_3x5_fp32/torch",
                         "affine_3x5_fp32/ours"}
    for result in data.values():
        assert result["passed"]
        assert set(result["samples_us"]) == set(timing.CPU_MODES)
        for mode, kept in result["samples_us"].items():  # disturbed samples dropped, and said so
            record = result["disturbance"][mode]
            assert record["samples"] == 3 and len(kept) + len(record["dropped_us"]) == 3
            assert kept and all(x > 0 for x in kept)
        timed = [v for v in result["validations"] if v.get("timed_batches")]
        assert [v["mode"] for v in timed] == list(timing.CPU_MODES) and all(v["checked"] == 3 for v in timed)


def test_impl_order_alternates_between_rounds():
    suite = affine_suite(Impl("ours", bind=honest), shapes=((4, 4),))
    bench = Bench(suite, FAST)
    assert bench.schedule(0) == ["affine_4x4_fp32/torch", "affine_4x4_fp32/ours"]
    assert bench.schedule(1) == ["affine_4x4_fp32/ours", "affine_4x4_fp32/torch"]


def test_revision_order_alternates_abba():
    from kernellab.harness.revision import revision_order

    assert [revision_order(r) for r in range(4)] == [
        ["reference", "candidate"], ["candidate", "reference"], ["reference", "candidate"], ["candidate", "reference"]]


def test_failed_validation_and_unsupported_are_reported():
    def refuses(problem):
        raise Unsupported("too small")

    suite = affine_suite(Impl("broken", bind=leaves_tail_unwritten), Impl("picky", bind=refuses))
    bench = Bench(suite, FAST)
    statuses = {c.id: c.status for c in bench.cases}
    assert statuses["affine_8x16_fp32/picky"] == "unsupported"
    side = {"cases": bench.describe(), "rounds": [bench.run_round(r) for r in range(2)],
            "provenance": {"device": {"name": "cpu"}}}
    report = assemble.run_report(suite, FAST.to_json(), side)
    by_id = {c["id"]: c for c in report["cases"]}
    assert by_id["affine_8x16_fp32/broken"]["status"] == "failed"
    assert by_id["affine_8x16_fp32/torch"]["status"] == "ok"
    assert by_id["affine_8x16_fp32/picky"]["reason"] == "too small"


def test_case_and_impl_filters():
    assert match("softmax_128x512_fp32", "softmax_*") and not match("rmsnorm_1x1_fp32", "softmax_*,*bf16")
    assert match("anything", None)
    with pytest.raises(ValueError, match="no case of suite"):
        Bench(affine_suite(), FAST, cases="nothing*")


def test_rotation_count_exceeds_twice_the_cache():
    n = timing.rotation_count(1_000_000, 32_000_000, limit_bytes=1 << 40)
    assert n * 1_000_000 > 2 * 32_000_000
    assert timing.rotation_count(10**9, 32_000_000, limit_bytes=1 << 40) >= 1
    assert timing.rotation_count(1_000_000, 32_000_000, limit_bytes=3_000_000) == 3
    # a batch's calls each read a set of their own, whatever the memory limit or the cache
    assert timing.rotation_count(1_000_000, 32_000_000, limit_bytes=3_000_000, least=10) == 10
    assert timing.rotation_count(1_000, 0, limit_bytes=1 << 40, least=10) == 10
    assert timing.rotation_count(0, 32_000_000, limit_bytes=1 << 40, least=10) == 10


def test_bandwidth_is_read_against_the_suites_ceiling_problem():
    suite = affine_suite(Impl("ours", bind=honest), shapes=((64, 64),))
    bench = Bench(suite, FAST)
    side = {"cases": bench.describe(), "rounds": [bench.run_round(0)], "provenance": {}}
    plain = {c["id"]: c for c in assemble.run_report(suite, FAST.to_json(), side)["cases"]}
    assert all("gbps" in m and "ceiling_fraction" not in m for c in plain.values() for m in c["modes"].values())
    suite.ceiling_op = "affine"  # the control's own run of this problem is then the ceiling
    ceiled = {c["id"]: c for c in assemble.run_report(suite, FAST.to_json(), side)["cases"]}
    for mode in ("e2e_latency",):
        assert ceiled["affine_64x64_fp32/torch"]["modes"][mode]["ceiling_fraction"] == pytest.approx(1.0)
        assert ceiled["affine_64x64_fp32/ours"]["modes"][mode]["ceiling_fraction"] > 0


def test_warmup_is_batches_of_calls_not_passes_over_every_rotated_set(monkeypatch):
    """A one-row problem rotates thousands of input sets: warming up over all of them, ten times, cost a host-bound
    contender minutes a case. The warmup is ``warmup`` batches of ``iterations`` calls, cycling the sets."""
    from kernellab.harness import runner

    monkeypatch.setattr(runner, "WARM_MS", 0.0)
    bench = Bench(affine_suite(Impl("ours", bind=honest), shapes=((4, 4),)), Config(warmup=3, iterations=4))
    made = []
    calls = [lambda k=k: made.append(k) for k in range(4096)]
    bench._warm(calls)
    assert made == list(range(12))
    few = [lambda k=k: made.append(k) for k in range(5)]
    made.clear()
    bench._warm(few)
    assert made == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1]  # fewer sets than calls: they cycle
    made.clear()
    Bench(affine_suite(Impl("ours", bind=honest), shapes=((4, 4),)), Config(warmup=0, iterations=4))._warm(calls)
    assert made == []


class _Recorded:
    """A ``timing.Batch`` that records each batch's first call, its last (as ``after`` is told) and the calls made."""

    def __init__(self, made: list):
        self.made, self.batches = made, []

    def before(self, first, count):
        self.batches.append({"first": first, "room": count, "from": len(self.made)})

    def stopped(self, result):
        pass

    def after(self, last, result):
        self.batches[-1]["last"], self.batches[-1]["calls"] = last, self.made[self.batches[-1]["from"]:]


def test_checked_batches_end_on_a_draw_and_unchecked_ones_do_not():
    """A checked batch's calls are consecutive from its first, its last is the one checked, and its length is drawn
    (1 in ``iterations`` after each call, ``LONGEST_BATCH`` times ``iterations`` at most, inputs written for that
    many); a timing with no check (a tool's) runs batches of exactly ``iterations``."""
    made: list[int] = []
    calls = [(lambda k=k: made.append(k)) for k in range(7)]
    device, iterations = timing.Device("cpu"), 4
    batch = _Recorded(made)
    samples = timing.measure("e2e_throughput", calls, device, samples=400, iterations=iterations, batch=batch)
    assert len(samples) == 400 and all(v > 0 for v in samples)
    lengths = []
    for b in batch.batches:
        n = len(b["calls"])
        lengths.append(n)
        assert b["calls"] == [(b["first"] + i) % 7 for i in range(n)] and b["last"] == b["first"] + n - 1
        assert b["room"] == timing.LONGEST_BATCH * iterations
    assert min(lengths) == 1 and max(lengths) == timing.LONGEST_BATCH * iterations
    assert 3.0 < sum(lengths) / len(lengths) < 4.2  # (1 - (3/4)^8) * 4 = 3.6 expected
    made.clear()
    plain = timing.measure("e2e_throughput", calls, device, samples=50, iterations=iterations)
    assert len(plain) == 50 and len(made) == 50 * iterations


def test_a_case_leaves_none_of_its_input_sets_alive_when_the_device_releases_memory():
    """The device's release (``Device.release``: a collection, then on a GPU ``empty_cache``) ends every case; an
    input set still referenced then stays cached in the worker, out of reach of an A/B's other worker on the same
    GPU (the H100 ran out of memory so). Every input tensor the problem makes is watched through a weak reference,
    and the last full collection of the case, the release's, must find none alive."""
    import gc
    import weakref

    from fakes import Affine

    made: list[weakref.ref] = []

    class Watched(Affine):
        def make_inputs(self, seed):
            inputs = super().make_inputs(seed)
            made.extend(weakref.ref(t) for t in inputs.values())
            return inputs

    alive_at_full_collection: list[int] = []

    def watch(phase, info):
        if phase == "start" and info["generation"] == 2:
            alive_at_full_collection.append(sum(r() is not None for r in made))

    suite = affine_suite(Impl("ours", bind=honest), shapes=((64, 256),))
    suite.make_problems = lambda: [Watched((64, 256), "fp32", "cpu")]
    bench = Bench(suite, FAST)
    gc.callbacks.append(watch)
    try:
        result = bench.run_case("affine_64x256_fp32/ours", 0)
    finally:
        gc.callbacks.remove(watch)
    assert result["passed"], result
    assert len(made) > 2 and alive_at_full_collection, (len(made), alive_at_full_collection)
    assert alive_at_full_collection[-1] == 0, alive_at_full_collection
