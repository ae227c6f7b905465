"""The frontend: an nn.Module (traced with torch.fx) or a spec, to IR blocks and parameters."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kernellab.megakernel import model, planning
from kernellab.megakernel.compiler import frontend, passes
from kernellab.megakernel.compiler.ir import Block
from kernellab.megakernel.stack import Norm


class ResidualBlock(nn.Module):
    def __init__(self, channels, hidden, act, norm=False):
        super().__init__()
        self.norm = nn.RMSNorm(channels, eps=1e-5) if norm else None
        self.fc1 = nn.Linear(channels, hidden)
        self.act = act
        self.fc2 = nn.Linear(hidden, channels)

    def forward(self, x):
        h = self.norm(x) if self.norm is not None else x
        return x + self.fc2(self.act(self.fc1(h)))


class FunctionalBlock(nn.Module):
    def __init__(self, channels, hidden):
        super().__init__()
        self.up = nn.Linear(channels, hidden)
        self.down = nn.Linear(hidden, channels, bias=False)

    def forward(self, x):
        return self.down(F.gelu(self.up(x), approximate="tanh")) + x


def test_module_stack_to_blocks_and_parameters():
    torch.manual_seed(0)
    net = nn.Sequential(ResidualBlock(32, 64, nn.GELU(approximate="tanh")),
                        ResidualBlock(32, 48, nn.SiLU(), norm=True),
                        FunctionalBlock(32, 80),
                        ResidualBlock(32, 16, nn.ReLU()))
    source = frontend.from_module(net)
    blocks, params = source.blocks, source.parameters
    assert blocks == [Block(32, 64, "gelu"), Block(32, 48, "silu", norm=Norm("rmsnorm", 1e-5)),
                      Block(32, 80, "gelu", bias2=False), Block(32, 16, "relu")]
    assert source.final_norm is None
    p = params[1]
    assert p["w1"].dtype == torch.float16 and p["b1"].dtype == torch.float32
    assert torch.equal(p["w1"], net[1].fc1.weight.detach().half())
    assert torch.equal(p["norm_weight"], net[1].norm.weight.detach())
    assert torch.equal(params[2]["b2"], torch.zeros(32))  # bias=False reads as a zero bias
    program = passes.plan(blocks, rows=10, device=planning.H200)
    assert [b.prologue for b in program.blocks] == ["none", "rmsnorm", "cast", "cast"]


def test_module_parameters_reproduce_the_module():
    """The extracted parameters, through the float reference, give what the module gives (up to
    the fp16 rounding of the weights and hidden)."""
    torch.manual_seed(1)
    net = ResidualBlock(24, 40, nn.GELU(approximate="tanh"))
    source = frontend.from_module(net)
    blocks, params = source.blocks, source.parameters
    x = torch.randn(7, 24).half()
    ours = model.reference(x, **params[0], activation=blocks[0].activation)
    theirs = net.double()(x.double())
    torch.testing.assert_close(ours, theirs, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("net,message", [
    (ResidualBlock(8, 16, nn.Tanh()), "does not fit the pattern"),
    (nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8)), "must return the residual stream"),
    (nn.Linear(8, 8), "does not fit the pattern"),
])
def test_module_rejections_name_the_problem(net, message):
    with pytest.raises(frontend.FrontendError, match=message):
        frontend.from_module(net)


def test_module_with_mismatched_second_linear_is_rejected():
    class Bad(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 8)
            self.fc2.weight = nn.Parameter(torch.zeros(8, 12))
            self.fc2.in_features = 12

        def forward(self, x):
            return x + self.fc2(F.relu(self.fc1(x)))

    with pytest.raises(frontend.FrontendError, match="expected 16 -> 8"):
        frontend.from_module(Bad())


def test_spec_to_blocks_and_parameters():
    spec = {"channels": 16, "blocks": [{"hidden": 32, "activation": "relu"}, {"hidden": 8, "norm": True}]}
    source = frontend.from_spec(spec, seed=7)
    blocks, params = source.blocks, source.parameters
    assert blocks == [Block(16, 32, "relu"), Block(16, 8, "gelu", norm=Norm("rmsnorm"))]
    assert params[0]["w1"].shape == (32, 16) and params[1]["norm_weight"].shape == (16,)
    again = frontend.from_spec(spec, seed=7)
    assert torch.equal(params[0]["w2"], again.parameters[0]["w2"])


@pytest.mark.parametrize("spec,message", [
    ([{"hidden": 8}], "a spec is a dict"),
    ({"channels": 8, "blocks": []}, "at least one block"),
    ({"channels": 8, "blocks": [{"hidden": 8, "activation": "tanh"}]}, "activation must be one of"),
    ({"channels": 8, "blocks": [{"hidden": 8}], "final": "rmsnorm"}, "unknown keys \\['final'\\]"),
    ({"channels": 8, "blocks": [{"hidden": 8, "norm": "batchnorm"}]}, "norm kind must be one of"),
    ({"channels": 8, "blocks": [{"hidden": 8, "norm": {"kind": "rmsnorm", "bias": True}}]}, "only a layernorm"),
    ({"channels": 8, "blocks": [{"hidden": 8, "norm": "rmsnorm", "eps": 0}]}, "eps must be a number > 0"),
    ({"channels": 8, "blocks": [{"hidden": 8, "gated": 1}]}, "must be bools"),
    ({"channels": 8, "blocks": [{"hidden": 8}], "final_norm": {"kind": "layernorm", "eps": -1.0}}, "final_norm"),
    ({"channels": 8, "blocks": {"hidden": 8}}, "at least one block"),
    ({"channels": 8, "blocks": [{"hiden": 8}]}, "unknown keys"),
    ({"blocks": [{"hidden": 8}]}, "needs 'hidden' and 'channels'"),
])
def test_spec_rejections(spec, message):
    with pytest.raises(frontend.FrontendError, match=message):
        frontend.from_spec(spec)
