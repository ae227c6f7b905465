"""The harness's own suites: problem families with torch as the control impl.

Other packages add contenders to them through ``kernellab.suites`` entry points named
``cpu-ops.<part>`` or ``gpu-norm.<part>``.
"""

from __future__ import annotations

from ..case import Suite
from .problems import (
    AutogradFloor,
    Copy,
    LayerNorm,
    LayerNormBackward,
    LayerNormTrain,
    LinearBackward,
    LinearForward,
    LinearTrain,
    RMSNorm,
    RMSNormBackward,
    RMSNormTrain,
    Softmax,
    SoftmaxBackward,
    SoftmaxTrain,
)

CPU_NORM_SHAPES = ((128, 512),)
CPU_LINEAR_SHAPES = ((128, 512, 512),)  # (M, K, N)
# The linear sweep: decode rows (M = 1, a matrix-vector product bound by reading W) and other small M,
# odd K, K > N and N > K.
CPU_LINEAR_SWEEP = ((1, 512, 512), (1, 2048, 2048), (4, 512, 512), (16, 512, 512), (128, 509, 512),
                    (128, 1024, 256), (128, 256, 1024))

# The example audit's four shapes, then bandwidth shapes of at least 64 MiB per fp32 tensor.
GPU_NORM_SHAPES = ((37, 1537), (256, 3072), (768, 6144), (1024, 4096))
GPU_BANDWIDTH_SHAPES = ((16384, 8192), (8192, 16384), (65536, 1024))
GPU_DTYPES = ("fp32", "bf16")
# Backward shapes no issue names: a mid-size aligned row and a long prime N (no vector width divides it).
GPU_BACKWARD_EXTRA_SHAPES = ((4096, 2560), (1000, 12289))


def cpu_ops() -> Suite:
    def problems():
        out = []
        for shape in CPU_NORM_SHAPES:
            for problem in (Softmax, RMSNorm, LayerNorm, SoftmaxBackward, RMSNormBackward, LayerNormBackward,
                            SoftmaxTrain, RMSNormTrain, LayerNormTrain, Copy):
                out.append(problem(shape, "fp32", "cpu"))
        for shape in CPU_LINEAR_SHAPES:
            out += [LinearForward(shape, "fp32", "cpu"), LinearBackward(shape, "fp32", "cpu"),
                    LinearTrain(shape, "fp32", "cpu")]
        for shape in CPU_LINEAR_SWEEP:
            out += [LinearForward(shape, "fp32", "cpu"), LinearBackward(shape, "fp32", "cpu")]
        return out

    return Suite(
        name="cpu-ops",
        device="cpu",
        description="CPU softmax, RMSNorm, LayerNorm at 128x512: forward, backward from the saved statistics and "
                    "forward+backward through autograd; linear forward/backward at 128x512x512 (and through "
                    "autograd) and across a sweep of shapes (fp32); a copy at 128x512 as the bandwidth ceiling "
                    "the row ops are read against",
        make_problems=problems,
        ceiling_op="copy",
        defaults={"rounds": 3, "samples": 30, "warmup": 10, "iterations": 5},
    )


def gpu_norm() -> Suite:
    def problems():
        out = []
        for shape in GPU_NORM_SHAPES + GPU_BANDWIDTH_SHAPES:
            for dtype in GPU_DTYPES:
                out += [Softmax(shape, dtype, "cuda"), RMSNorm(shape, dtype, "cuda"), LayerNorm(shape, dtype, "cuda"),
                        Copy(shape, dtype, "cuda")]
        return out

    return Suite(
        name="gpu-norm",
        device="cuda",
        description="CUDA softmax, RMSNorm, LayerNorm forward at the example audit's shapes and bandwidth shapes, "
                    "fp32 and bf16, with a copy per shape as the bandwidth ceiling",
        make_problems=problems,
        ceiling_op="copy",
        defaults={"rounds": 3, "samples": 20, "warmup": 5, "iterations": 10},
    )


def gpu_norm_backward() -> Suite:
    def problems():
        out = []
        for shape in GPU_NORM_SHAPES + GPU_BANDWIDTH_SHAPES + GPU_BACKWARD_EXTRA_SHAPES:
            for dtype in GPU_DTYPES:
                out += [SoftmaxBackward(shape, dtype, "cuda"), RMSNormBackward(shape, dtype, "cuda"),
                        LayerNormBackward(shape, dtype, "cuda"), Copy(shape, dtype, "cuda")]
        for shape in GPU_NORM_SHAPES:
            for dtype in GPU_DTYPES:
                out += [SoftmaxTrain(shape, dtype, "cuda"), RMSNormTrain(shape, dtype, "cuda"),
                        LayerNormTrain(shape, dtype, "cuda"), AutogradFloor(shape, dtype, "cuda")]
        return out

    return Suite(
        name="gpu-norm-backward",
        device="cuda",
        description="CUDA softmax, RMSNorm, LayerNorm backward alone (from the forward's saved y, rstd, mean) at "
                    "the example audit's shapes, the bandwidth shapes and two more, and forward+backward through "
                    "autograd at the example shapes; fp32 and bf16, weights in the input dtype; a copy per shape "
                    "as the bandwidth ceiling, and per example shape the host floor of a training step (a copy "
                    "forward and backward through autograd)",
        make_problems=problems,
        ceiling_op="copy",
        defaults={"rounds": 3, "samples": 10, "warmup": 3, "iterations": 5},
    )
