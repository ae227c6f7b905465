"""The compiled models on the GPU: bit-identical to the hand-written engine where they share a
schedule, the fallback within rtol 1e-4 / atol 1e-5 of the float reference, stacks with norms."""

import pytest
import torch
from torch import nn

from kernellab.megakernel import compile_model, model, planning, stack
from kernellab.megakernel.compiler import checks as compiler_checks

pytestmark = pytest.mark.gpu


def test_compiled_block_is_bitwise_the_hand_written_engine():
    result = compiler_checks.small_output_check()
    assert result["bitwise_equal"] and result["engine"] == result["hand_written"] == "persistent-tc", result


def test_compiled_split_block_is_bitwise_the_hand_written_engine():
    shape = model.Shape(1024, 128, 256)  # planned as a hidden split over 2-CTA clusters
    plan = planning.choose("persistent-tc", shape.rows, shape.channels, shape.hidden, planning.current_device()).plan
    assert plan.tile.split == 2
    result = compiler_checks.small_output_check(shape=shape)
    assert result["bitwise_equal"] and result["engine"] == result["hand_written"] == "persistent-tc", result


def test_fallback_matches_the_float_reference():
    result = compiler_checks.fallback_output_check()
    assert result["passed"] and result["engine"] == "persistent-global", result
    assert result["skipped"] == ["persistent-tc", "persistent"]


@pytest.mark.parametrize("engine", ["persistent-tc", "persistent", "persistent-global", "conventional"])
def test_stack_with_norms_matches_the_stack_reference(engine):
    spec = {"channels": 64, "blocks": [{"hidden": 128, "norm": True}, {"hidden": 96, "activation": "silu"},
                                       {"hidden": 64, "activation": "relu", "norm": True, "eps": 1e-5}]}
    compiled = compile_model(spec, rows=300, engine=engine, seed=3)
    x = model.make_input(300, 64, seed=9, device="cuda")
    y = compiled(x)
    truth = stack.reference_stack(x, compiled.program.blocks, compiled.parameters)
    torch.testing.assert_close(y.double(), truth, rtol=2e-3, atol=2e-3)


class PlainBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(48, 96), nn.GELU(approximate="tanh"), nn.Linear(96, 48)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(x)))


class NormBlock(PlainBlock):
    def __init__(self):
        super().__init__()
        self.norm = nn.RMSNorm(48)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


def test_module_compiles_and_matches_its_reference():
    torch.manual_seed(0)
    compiled = compile_model(nn.Sequential(PlainBlock(), NormBlock()), rows=77)
    x = torch.randn(77, 48, device="cuda").half()
    y = compiled(x)
    assert compiled.program.blocks[1].norm.eps == torch.finfo(torch.float32).eps
    truth = stack.reference_stack(x, compiled.program.blocks, compiled.parameters)
    torch.testing.assert_close(y.double(), truth, rtol=2e-3, atol=2e-3)


def test_fp32_input():
    spec = {"channels": 40, "blocks": [{"hidden": 72}]}
    compiled = compile_model(spec, rows=20, input_dtype="float32")
    x = torch.randn(20, 40, device="cuda")
    y = compiled(x)
    p = compiled.parameters[0]
    truth = model.reference_block(x.half(), x, p["w1"], p["b1"], p["w2"], p["b2"], "gelu")
    torch.testing.assert_close(y.double(), truth, rtol=1e-3, atol=1e-3)
