"""The CUDA timing modes on a GPU: gpu_throughput measures device time per call, not the host's."""

from __future__ import annotations

import time

import pytest
import torch

from kernellab.harness import timing

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="skipped: no CUDA device")]


def test_gpu_throughput_queues_calls_behind_a_hold():
    """A call whose host side takes 300 us and whose kernel takes a few: gpu_throughput sees the kernel,
    e2e_throughput the host."""
    device = timing.Device("cuda")
    x = torch.randn(1024, device="cuda")

    def slow_host_call():
        time.sleep(300e-6)
        x.mul_(1.0001)

    gpu = timing.measure("gpu_throughput", [slow_host_call], device, samples=5, iterations=8)
    host = timing.measure("e2e_throughput", [slow_host_call], device, samples=5, iterations=8)
    assert max(gpu) < 50, f"gpu_throughput counted host time: {gpu}"
    assert min(host) > 300, f"e2e_throughput missed the host time: {host}"


def test_gpu_throughput_refuses_calls_that_wait_for_the_gpu():
    """A call that synchronizes cannot be queued behind a hold: no sample is made up."""
    device = timing.Device("cuda")
    with pytest.raises(RuntimeError, match="could not be queued behind a hold"):
        timing.measure("gpu_throughput", [torch.cuda.synchronize], device, samples=1, iterations=2)
