"""Clocks and the timing modes.

- ``gpu_throughput``: CUDA events around K back-to-back calls; per call = elapsed / K. The calls are
  queued behind a hold (a spin kernel, as nvbench's blocking kernel) that outlasts their queueing, so
  that the GPU runs them back to back even where the host takes longer to issue a call than the GPU
  to run it; a sample whose hold ended before the last call was queued is taken again with a longer
  hold.
- ``gpu_latency``: CUDA events around one call, after a synchronize and an L2 flush.
- ``e2e_throughput``: host ``perf_counter_ns`` around K back-to-back calls plus one synchronize.
- ``e2e_latency``: host clock around one call plus synchronize, after a cache flush.
- ``graph_throughput``: CUDA events around one replay of a graph of K captured calls (K at least the
  number of rotated sets, and enough calls for 2 ms of work per replay).

Calls cycle through rotated input sets so that repeated calls do not read from cache; they write one
output set, as a torch op writes the block its allocator recycles. Around every sample, outside the
clock, a ``Batch`` writes fresh contents into the inputs the sample's calls use and poisons the outputs,
then checks the last call's outputs; host counters around it record what disturbed it (``noise``).
Where a ``Batch`` checks, K is drawn: the batch (the graph's capture) ends where a draw from the operating
system after each call says, 1 in ``iterations`` (on average ``iterations`` calls, the graph's target length),
so that no call can tell the checked last one from the others and skip their work. The clock, the synchronize
and the event and graph methods a sample goes through are taken once when a timing starts, and the whole seal is
verified then and right after every return of contender code (``integrity.guard``). Every mode returns
microseconds per call, one value per sample.
"""

from __future__ import annotations

import gc
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from . import integrity, noise, threads

GPU_MODES = ("gpu_throughput", "gpu_latency", "e2e_throughput", "e2e_latency", "graph_throughput")
CPU_MODES = ("e2e_throughput", "e2e_latency")
ALL_MODES = GPU_MODES
THROUGHPUT_MODES = ("gpu_throughput", "graph_throughput", "e2e_throughput")
GRAPH_REPLAY_US = 2000.0  # least work per timed graph replay
LONGEST_BATCH = 2  # a checked batch ends at this many times ``iterations`` calls if no draw ended it before
ENDS_OF = 2**32  # the range of a batch's end draws (four bytes from the operating system)
HOLD_MIN_US = 50.0  # shortest hold before a gpu_throughput sample
HOLD_TRIES = 6  # holds, each twice as long, before a sample is declared unmeasurable
MAX_GRAPH_CALLS = 8192


class Device:
    """What the modes need of a device: synchronize, flush the cache, and the cache size."""

    def __init__(self, kind: str):
        if kind not in ("cpu", "cuda"):
            raise ValueError(f"device kind must be 'cpu' or 'cuda', got {kind!r}")
        import torch

        self.kind = kind
        self.torch = torch
        if kind == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("this suite needs a CUDA device and torch sees none")
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            self.cache_bytes = int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)
            self.modes = GPU_MODES
        else:
            self.cache_bytes = cpu_last_level_cache_bytes()
            self.modes = CPU_MODES
        self._flush_buf = None
        self._cycles_per_us = None
        self.probe = noise.HostProbe()
        self.gpu_probe = noise.GpuProbe() if kind == "cuda" else None

    def hold(self, us: float) -> None:
        """Queue a spin kernel of about ``us`` microseconds on the current stream: what is queued after it
        waits, so the host can queue calls faster than the GPU runs them."""
        torch = self.torch
        if self._cycles_per_us is None:  # the spin kernel counts clock cycles: calibrate once
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(1000)
            start.record()
            torch.cuda._sleep(2_000_000)
            end.record()
            end.synchronize()
            self._cycles_per_us = 2_000_000 / max(start.elapsed_time(end) * 1e3, 1.0)
        torch.cuda._sleep(int(us * self._cycles_per_us))

    def warm_up(self, seconds: float = 1.0) -> None:
        """Keep the device busy for a moment so that clocks leave their idle state before timing."""
        if self.kind != "cuda":
            return
        torch = self.torch
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(20):
                a = torch.tanh(a @ a)
            torch.cuda.synchronize()

    def release(self) -> None:
        """After a case: collect what it left and hand the memory torch keeps cached back to the driver. The two
        workers of an A/B share one GPU and take turns; a worker keeping its last case's input sets cached (tens
        of GB at the bandwidth shapes) left the other's next case out of memory on an 80 GB card."""
        gc.collect()
        if self.kind == "cuda":
            self.torch.cuda.empty_cache()

    def sync(self) -> None:
        """Wait for the device and for every host thread the measured contender started (``threads``)."""
        threads.settle()
        if self.kind == "cuda":
            self.torch.cuda.synchronize()

    def flush(self) -> None:
        """Evict the cache by writing a buffer twice its size."""
        torch = self.torch
        if self._flush_buf is None:
            n = 2 * self.cache_bytes // 4
            self._flush_buf = torch.empty(n, dtype=torch.float32, device=self.kind)
            self._flush_value = 0.0
        self._flush_value += 1.0
        self._flush_buf.fill_(self._flush_value)
        if self.kind == "cpu":
            float(self._flush_buf[-1])  # the fill is synchronous on the CPU; touch to be sure


def cpu_last_level_cache_bytes() -> int:
    """The largest cache the OS reports, or 32 MiB where it reports none."""
    best = 0
    for size_file in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = size_file.read_text().strip()
        mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        try:
            best = max(best, int(text.rstrip("KMG")) * mult)
        except ValueError:
            continue
    return best or 32 * 2**20


def rotation_count(set_bytes: int, cache_bytes: int, *, limit_bytes: int, max_sets: int = 4096,
                   least: int = 1) -> int:
    """Enough input sets that their working set exceeds twice the cache, within a memory limit, and at least
    ``least`` whatever the limit: the runner asks for one a call of the longest batch, since a batch whose later
    calls read the inputs of its first would let a contender that works only on poisoned outputs (the first
    call's) return at once from the rest with the right answer already in place."""
    if set_bytes <= 0:
        return max(1, least)
    want = -(-2 * cache_bytes // set_bytes) + 1
    fit = max(1, limit_bytes // set_bytes)
    return max(1, least, min(want, fit, max_sets))


class Batch(Protocol):
    """What the runner does around every timed batch, outside the clock: fresh input contents for the
    calls about to run and poisoned outputs (``before``), then the outputs of the batch's last call
    checked against the truth of its inputs (``after``). Every batch is treated alike, so nothing
    tells a contender a checked call from a timed one."""

    def before(self, first: int, count: int) -> None: ...

    def stopped(self, result: object) -> None:
        """The clock has just stopped: what the outputs hold now is what ``after`` checks, so that work a
        contender left running past its return (a thread no synchronization reaches) fails."""

    def after(self, last: int, result: object) -> None: ...


class _NoBatch:
    def before(self, first: int, count: int) -> None:
        pass

    def stopped(self, result: object) -> None:
        pass

    def after(self, last: int, result: object) -> None:
        pass


def measure(mode: str, calls: Sequence[Callable[[], object]], device: Device, *, samples: int,
            iterations: int, batch: Batch | None = None, marks: list[dict] | None = None) -> list[float]:
    """Time one mode; returns ``samples`` values in microseconds per call. ``batch`` runs around every
    sample (see ``Batch``); ``marks``, where given, receives what disturbed each sample (``noise``)."""
    if mode not in device.modes:
        raise ValueError(f"mode {mode!r} is not available on {device.kind}; modes: {device.modes}")
    if samples < 1 or iterations < 1:
        raise ValueError(f"samples and iterations must be >= 1, got {samples} and {iterations}")
    n = len(calls)
    out: list[float] = []
    batch = batch or _NoBatch()
    probe = device.probe
    torch = device.torch
    clock, sync, record, event_sync, elapsed, started, replay, draw = _timed_path(device)
    # A checked batch ends where a draw from the operating system, made after each call returns, says (1 in
    # ``iterations``; at ``longest`` calls at most), so that no call can know it is the last, the one whose outputs
    # are checked, and skip its work when it is not. An unchecked batch (a tool's timing) is ``iterations`` long.
    drawn = not isinstance(batch, _NoBatch)
    longest = LONGEST_BATCH * iterations if drawn else iterations
    below = ENDS_OF // iterations if drawn else 0  # a draw under this ends the batch (1 in ``iterations``)
    ends = draw if drawn else None
    run = _calls_until_drawn  # taken before any call: what a patch made during one cannot reach
    after_contender = _checked_after_contender(drawn)
    after_contender("the calls before this timing")

    def mark(before: tuple) -> None:
        if marks is not None:
            marks.append(probe.delta(before, probe.read()))

    if mode == "gpu_throughput":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        k, hold = 0, HOLD_MIN_US
        for _ in range(samples):
            for _ in range(HOLD_TRIES):
                batch.before(k, longest)
                sync()
                before = probe.read()
                device.hold(hold)
                record(start)
                t0 = clock()
                count, result = run(calls, k, longest, ends, below)
                record(end)
                queued = (clock() - t0) / 1e3
                held = not started(start)  # the GPU had not passed the hold when the last call was queued
                event_sync(end)
                sync()
                after_contender("a timed batch")
                hold = max(HOLD_MIN_US, 2 * queued, hold if held else 2 * hold)
                if held:
                    break
            else:
                raise RuntimeError(f"gpu_throughput: {iterations} calls could not be queued behind a hold of "
                                   f"{hold / 2:.0f} us (a launch queue fills up?); use fewer iterations")
            batch.stopped(result)
            mark(before)
            out.append(_positive(elapsed(start, end) * 1e3 / count, mode))
            batch.after(k + count - 1, result)
            k += count
    elif mode == "gpu_latency":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for s in range(samples):
            batch.before(s, 1)
            device.flush()
            sync()
            before = probe.read()
            record(start)
            result = calls[s % n]()
            record(end)
            event_sync(end)
            sync()
            after_contender("a timed call")
            batch.stopped(result)
            mark(before)
            out.append(_positive(elapsed(start, end) * 1e3, mode))
            batch.after(s, result)
    elif mode == "e2e_throughput":
        k = 0
        for _ in range(samples):
            batch.before(k, longest)
            sync()
            before = probe.read()
            t0 = clock()
            count, result = run(calls, k, longest, ends, below)
            sync()
            out.append(_positive((clock() - t0) / 1e3 / count, mode))
            after_contender("a timed batch")
            batch.stopped(result)
            mark(before)
            batch.after(k + count - 1, result)
            k += count
    elif mode == "e2e_latency":
        for s in range(samples):
            batch.before(s, 1)
            device.flush()
            sync()
            before = probe.read()
            t0 = clock()
            result = calls[s % n]()
            sync()
            out.append(_positive((clock() - t0) / 1e3, mode))
            after_contender("a timed call")
            batch.stopped(result)
            mark(before)
            batch.after(s, result)
    elif mode == "graph_throughput":
        graph, length, result = graph_of(calls, device, iterations, after_contender)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        target, take = length, capture
        while drawn:  # the timed graph's length drawn at its capture (mean ``target``), as a checked batch's is
            del graph, result
            graph, length, result = take(calls, device, LONGEST_BATCH * target, after_contender,
                                         ends=(draw, ENDS_OF // target))
            if 2 * length >= target:
                break
            # too short to time (fewer calls than half the target, so fewer sets than the cache asks): checked as
            # a timed replay is, then captured again; every capture's last call is checked, wherever a draw ended it
            batch.before(0, length)
            sync()
            replay(graph)
            sync()
            after_contender("a graph's replay")  # a graph can hold host functions of the contender's
            batch.stopped(result)
            batch.after(length - 1, result)
        for _ in range(samples):
            batch.before(0, length)
            sync()
            before = probe.read()
            record(start)
            replay(graph)
            record(end)
            event_sync(end)
            after_contender("a graph's replay")
            batch.stopped(result)
            mark(before)
            out.append(_positive(elapsed(start, end) * 1e3 / length, mode))
            batch.after(length - 1, result)
        del graph
    return out


def _timed_path(device: Device) -> tuple:
    """The clock, the synchronize, the CUDA event and graph methods and the OS's random source of a mode's timed
    path, each taken once when ``measure`` starts, just before the seal is verified (a checked timing). Inside the
    loop nothing is looked up again, so a patch a call makes and undoes at its first use (a clock that returns an
    earlier time once, a synchronize that does not wait once) is never reached: it stays in place, and the check
    after the batch refuses it."""
    import torch

    clock, settle, cuda_sync, event = time.perf_counter_ns, threads.settle, torch.cuda.synchronize, torch.cuda.Event
    cuda = device.kind == "cuda"

    def sync() -> None:
        settle()
        if cuda:
            cuda_sync()

    return (clock, sync, event.record, event.synchronize, event.elapsed_time, event.query,
            torch.cuda.CUDAGraph.replay, os.urandom)


def _calls_until_drawn(calls: Sequence[Callable[[], object]], first: int, longest: int, draw, below: int):
    """(calls made, the last one's result): calls from ``first`` over the rotated ones until, after a call returns,
    four bytes drawn from ``draw`` (the OS's random source) read under ``below``, or ``longest`` calls are made.
    Without ``draw``, exactly ``longest`` calls. Nothing is looked up between the calls but the calls."""
    n, count, from_bytes = len(calls), 0, int.from_bytes
    while True:
        result = calls[(first + count) % n]()
        count += 1
        if count >= longest or (draw is not None and from_bytes(draw(4), "little") < below):
            return count, result


def _checked_after_contender(checked: bool):
    """``integrity.guard``'s check for a timing with a ``Batch`` (contender code), a no-op for a tool's timing."""
    return integrity.guard() if checked else lambda where: None


def _positive(us: float, mode: str) -> float:
    """A sample's value, which no call can make zero or negative: one that is was not measured by this clock."""
    if not us > 0:
        raise RuntimeError(f"{mode}: a sample of {us!r} us; a call cannot take no time (was the clock replaced?)")
    return us


def graph_of(calls: Sequence[Callable[[], object]], device: Device, iterations: int,
             after_contender: Callable[[str], None] = lambda where: None):
    """(graph, calls in it, the last captured call's result) for graph_throughput: at least ``iterations``
    calls and every rotated set (so none stays in cache), lengthened until one replay does GRAPH_REPLAY_US
    of work, so that what each replay costs beyond its calls (its launch, the restart after the
    synchronize) is spread thin."""
    torch, take = device.torch, capture  # taken once: contender code runs between captures
    length = max(iterations, len(calls))
    while True:
        graph, length, result = take(calls, device, length, after_contender)
        graph.replay()  # the first replay uploads the graph
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        took = start.elapsed_time(end) * 1e3
        if took >= GRAPH_REPLAY_US or length >= MAX_GRAPH_CALLS:
            return graph, length, result
        del graph, result
        length = min(MAX_GRAPH_CALLS, max(2 * length, math.ceil(length * 1.2 * GRAPH_REPLAY_US / max(took, 1.0))))


def capture(calls: Sequence[Callable[[], object]], device: Device, iterations: int,
            after_contender: Callable[[str], None] = lambda where: None, ends: tuple | None = None):
    """(graph, calls in it, what the last captured call returned): a CUDA graph of ``iterations`` calls cycling
    through the rotated sets (warmed on a side stream; the result's tensors are the graph's, each replay rewrites
    them). With ``ends`` (the OS's random source, the draw under which the capture ends), the capture ends where
    a draw after each captured call says, and at ``iterations`` calls at most."""
    torch = device.torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in calls:
            c()
    after_contender("the calls before a graph's capture")
    torch.cuda.current_stream().wait_stream(side)
    device.sync()
    graph = torch.cuda.CUDAGraph()
    draw, below = ends or (None, 0)
    with torch.cuda.graph(graph):
        count, result = _calls_until_drawn(calls, 0, iterations, draw, below)
    after_contender("a graph's capture")
    device.sync()
    return graph, count, result
