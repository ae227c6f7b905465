"""A tiny CPU problem and contenders, honest and planted, for testing the harness itself."""

from kernellab.harness.case import Impl, Problem, Suite, Tolerance


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


def honest(problem):
    def call(i, o):
        o["y"].copy_(i["x"]).mul_(2).add_(1)
        return o
    return call


def leaves_tail_unwritten(problem):
    def call(i, o):
        o["y"][:, :-1].copy_(i["x"][:, :-1] * 2 + 1)
        return o
    return call


def writes_input(problem):
    def call(i, o):
        i["x"].mul_(2).add_(1)
        o["y"].copy_(i["x"])
        return o
    return call


def caches_by_pointer(problem):
    cache = {}

    def call(i, o):
        key = i["x"].data_ptr()
        if key not in cache:
            cache[key] = i["x"] * 2 + 1
        o["y"].copy_(cache[key])
        return o
    return call


def affine_suite(*impls: Impl, shapes=((8, 16), (3, 5))) -> Suite:
    return Suite(name="affine", device="cpu", description="test suite",
                 make_problems=lambda: [Affine(s, "fp32", "cpu") for s in shapes],
                 impls=[Impl("torch", bind=lambda p: p.control), *impls])
