"""The GPU-host tools that rewrite or read kernel source stay in step with it (checked on the CPU)."""

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNEL = ROOT / "packages/megakernel/src/kernellab/megakernel/engines/persistent_tc.py"


def load_tool(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools/device" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_trace_anchors_hold_in_the_kernel_source():
    trace = load_tool("megakernel_trace")
    traced = trace.traced_source(KERNEL.read_text())
    ast.parse(traced)
    steps = len(trace.OVERLAPPED) + len(trace.SERIAL) + 2  # and each loop's top
    assert traced.count("self.stamp(trace, tid, cta, ") == steps + 4  # and the tile's start, first GEMM, chunks, end
    assert "trace: cute.Tensor" in traced and 'f"traced-persistent-tc_m' in traced


def test_trace_names_an_anchor_the_kernel_lost():
    trace = load_tool("megakernel_trace")
    source = KERNEL.read_text().replace("warpgroup.wait_group(1)  # GEMM1(j + 1) is done", "warpgroup.wait_group(1)")
    with pytest.raises(SystemExit, match="GEMM1"):
        trace.traced_source(source)
