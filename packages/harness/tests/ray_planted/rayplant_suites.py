"""Planted suites for the cluster tests (test_cluster.py), installed outside the checkout (a
contender from elsewhere, as the tree's worker sees it): fixed-duration cases whose time is a sleep,
so that a run's wall time falls with workers however loaded the machine is, and a contender that
kills its worker on one problem, and one that never returns (test_revision.py)."""

import os
import signal
import time

from kernellab.harness.case import Impl, Problem, Suite, Tolerance

SLEEP_S = 28.0  # each ray-sleepy problem's fixed duration
CRASH_ON = "affine_4x3_fp32"  # the ray-crashy problem whose crasher kills its worker


class Affine(Problem):
    """y = 2 x + 1 over an (M, N) tensor."""

    op = "affine"

    def make_inputs(self, seed):
        return {"x": self.randn(self.shape, self.generator(seed))}

    def make_outputs(self, inputs):
        import torch

        return {"y": torch.empty_like(inputs["x"])}

    def reference(self, inputs):
        return {"y": inputs["x"].double() * 2 + 1}

    def control(self, inputs, outputs):
        import torch

        torch.add(inputs["x"] * 2, 1, out=outputs["y"])
        return outputs

    def bytes_moved(self):
        return 2 * self.shape[0] * self.shape[1] * 4

    def tolerance(self):
        return Tolerance(1e-6, 1e-6)


def honest(i, o):
    o["y"].copy_(i["x"]).mul_(2).add_(1)
    return o


def sleeper(problem):
    time.sleep(SLEEP_S)
    return honest


def crasher(problem):
    if problem.name == CRASH_ON:
        os.kill(os.getpid(), signal.SIGSEGV)
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
