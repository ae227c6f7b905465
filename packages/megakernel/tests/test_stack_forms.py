"""The stack forms on the CPU: the frontend reads every form from an nn.Module (modules or functions)
and from a spec, the float64 reference is the module's own math, the torch chain keeps the kernels'
rounding points, compile_model runs on the CPU only when asked to, and the models section's schema."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from kernellab.megakernel import models, stack
from kernellab.megakernel.compiler import frontend, ir, passes, runner
from kernellab.megakernel.compiler.ir import TORCH_CHAIN, Block, Program
from kernellab.megakernel.stack import Norm


def fp16_exact(module: nn.Module) -> nn.Module:
    """Round every weight to fp16 (and back) so the frontend's fp16 weights are the module's exactly."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(p.half().float())
    return module


def module_matches_reference(module: nn.Module, rows: int = 5, seed: int = 0, tol: float = 1e-12) -> frontend.Source:
    """The frontend's reading of ``module``, through the unrounded float64 reference, is the module in float64
    (``tol``: where the module itself rounds, as ``x.float()`` does even in float64)."""
    source = frontend.from_module(module)
    x = torch.randn(rows, source.blocks[0].channels, generator=torch.Generator().manual_seed(seed)).half()
    ours = stack.reference_stack(x, source.blocks, source.parameters, source.final_norm, source.final_parameters,
                                 rounded=False)
    with torch.no_grad():
        theirs = module.double()(x.double())
    torch.testing.assert_close(ours, theirs, rtol=tol, atol=tol)
    return source


# ---- nn.Module forms ------------------------------------------------------------------------------------

class FunctionalGated(nn.Module):
    """A SwiGLU/GeGLU block written with functions: F.rms_norm / F.layer_norm with the module's own
    weights, the gate multiplied first or second."""

    def __init__(self, c, h, norm="rms", act="silu", gate_first=False, bias=False):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(c))
        self.shift = nn.Parameter(0.1 * torch.randn(c)) if norm == "layer" else None
        self.up, self.gate = nn.Linear(c, h, bias=bias), nn.Linear(c, h, bias=bias)
        self.down = nn.Linear(h, c, bias=bias)
        self.norm, self.act, self.gate_first, self.c = norm, act, gate_first, c

    def forward(self, x):
        if self.norm == "rms":
            u = F.rms_norm(x, (self.c,), self.weight, 1e-5)
        else:
            u = F.layer_norm(x, (self.c,), self.weight, self.shift, eps=1e-4)
        a = F.silu(self.up(u)) if self.act == "silu" else F.gelu(self.up(u), approximate="tanh")
        h = self.gate(u) * a if self.gate_first else torch.mul(a, self.gate(u))
        return self.down(h) + x


class MethodBlock(nn.Module):
    def __init__(self, c, h):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(c, h), nn.Linear(h, c)

    def forward(self, x):
        return x + self.fc2(self.fc1(x).relu())


class ExactGeluBlock(nn.Module):
    def __init__(self, c, h, norm: nn.Module | None = None):
        super().__init__()
        self.norm, self.fc1, self.fc2 = norm, nn.Linear(c, h), nn.Linear(h, c, bias=False)

    def forward(self, x):
        u = self.norm(x) if self.norm is not None else x
        return x + self.fc2(F.gelu(self.fc1(u)))


class WithFinal(nn.Module):
    def __init__(self, body: nn.Module, final):
        super().__init__()
        self.body, self.final = body, final

    def forward(self, x):
        y = self.body(x)
        return F.rms_norm(y, (16,), None, 1e-6) if self.final == "functional" else self.final(y)


class WidthFromInput(nn.Module):
    """A functional norm whose width is read from its input, as models written for any width do."""

    def __init__(self, c, h, width, kind="rms"):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(c))
        self.fc1, self.fc2 = nn.Linear(c, h), nn.Linear(h, c)
        self.width, self.kind = width, kind

    def forward(self, x):
        shape = self.width(x)
        u = F.rms_norm(x, shape, self.weight, 1e-6) if self.kind == "rms" else F.layer_norm(x, shape, self.weight)
        return x + self.fc2(F.silu(self.fc1(u)))


WIDTHS = {"shape[-1]": lambda x: (x.shape[-1],), "size(-1)": lambda x: (x.size(-1),),
          "size()[-1]": lambda x: [x.size()[-1]], "shape[-1:]": lambda x: x.shape[-1:]}


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("width", WIDTHS, ids=list(WIDTHS))
def test_a_norm_width_read_from_its_input_is_the_stream_width(width, kind):
    torch.manual_seed(1)
    source = module_matches_reference(fp16_exact(WidthFromInput(16, 32, WIDTHS[width], kind)))
    assert source.blocks[0].norm.kind == ("rmsnorm" if kind == "rms" else "layernorm")


@pytest.mark.parametrize("width", [lambda x: (x.shape[0],), lambda x: x.shape[:1], lambda x: (x.size(0),)],
                         ids=["shape[0]", "shape[:1]", "size(0)"])
def test_a_norm_width_from_another_size_is_refused_with_the_node(width):
    with pytest.raises(frontend.FrontendError, match="rms_norm.*last dimension only"):
        frontend.from_module(WidthFromInput(16, 32, width))


def test_sizes_used_elsewhere_are_refused_with_their_use():
    class Reshaping(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 16)

        def forward(self, x):
            return x + self.fc2(F.relu(self.fc1(x))).view(x.shape[0], -1)

    with pytest.raises(frontend.FrontendError, match="view"):
        frontend.from_module(Reshaping())


class InferenceForms(nn.Module):
    """What real blocks carry besides the pattern: dropout (identity in eval mode), an nn.Identity where a
    norm may be, the gated block's norm applied to each branch, and an in-place residual add."""

    def __init__(self, c, h, gated: bool, functional_dropout: bool = False):
        super().__init__()
        self.norm, self.skip = nn.RMSNorm(c, eps=1e-6), nn.Identity()
        self.fc1, self.fc3, self.fc2 = nn.Linear(c, h), nn.Linear(c, h, bias=False), nn.Linear(h, c)
        self.drop = nn.Dropout(0.25)
        self.gated, self.functional_dropout = gated, functional_dropout

    def forward(self, x):
        if self.gated:
            h = F.silu(self.fc1(self.norm(x))) * self.fc3(self.norm(x))
        else:
            h = F.gelu(self.fc1(self.skip(x)))
        y = F.dropout(self.fc2(h), 0.25, self.training) if self.functional_dropout else self.drop(self.fc2(h))
        x += y
        return x


@pytest.mark.parametrize("functional_dropout", [False, True], ids=["nn.Dropout", "F.dropout"])
def test_eval_mode_dropout_identity_a_norm_twice_and_an_inplace_add_read_as_the_pattern(functional_dropout):
    torch.manual_seed(2)
    net = fp16_exact(nn.Sequential(InferenceForms(16, 24, gated=True, functional_dropout=functional_dropout),
                                   InferenceForms(16, 32, gated=False, functional_dropout=functional_dropout))).eval()
    source = module_matches_reference(net)
    assert [(b.activation, b.norm, b.gated) for b in source.blocks] == [
        ("silu", Norm("rmsnorm", 1e-6), True), ("gelu_erf", None, False)]


@pytest.mark.parametrize("functional_dropout", [False, True], ids=["nn.Dropout", "F.dropout"])
def test_dropout_in_training_mode_is_refused_with_a_request_for_eval(functional_dropout):
    net = InferenceForms(16, 24, gated=True, functional_dropout=functional_dropout).train()
    with pytest.raises(frontend.FrontendError, match="drops at random"):
        frontend.from_module(net)


def test_a_gate_on_a_different_norm_is_refused():
    class TwoNorms(InferenceForms):
        def forward(self, x):
            return x + self.fc2(F.silu(self.fc1(self.norm(x))) * self.fc3(F.rms_norm(x, (16,), None, 1e-6)))

    with pytest.raises(frontend.FrontendError, match="mul"):
        frontend.from_module(TwoNorms(16, 24, gated=True).eval())


class HandwrittenRMSNorm(nn.Module):
    """RMSNorm as reference implementations write it out, in each spelling the frontend folds."""

    FORMS = {
        "llama": lambda self, x: (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps))
        .type_as(x) * self.weight,
        "weight-first": lambda self, x: self.weight * (x * (x * x).mean(dim=-1, keepdim=True).add(self.eps).rsqrt()),
        "no-weight": lambda self, x: x * torch.rsqrt(torch.mean(torch.square(x), -1, keepdim=True) + self.eps),
        "over-rows": lambda self, x: x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + self.eps),
        "hugging-face": lambda self, x: self.llama_style(x),
    }

    def llama_style(self, hidden_states):
        """Hugging Face's LlamaRMSNorm.forward, as written there."""
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.eps)
        return self.weight * hidden_states.to(input_dtype)

    def __init__(self, c, form, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(c))
        self.form, self.eps = form, eps

    def forward(self, x):
        return self.FORMS[self.form](self, x)


class HandwrittenStack(nn.Module):
    def __init__(self, form):
        super().__init__()
        self.norm, self.final = HandwrittenRMSNorm(16, form), HandwrittenRMSNorm(16, form, eps=1e-6)
        self.fc1, self.fc3, self.fc2 = nn.Linear(16, 40, bias=False), nn.Linear(16, 40, bias=False), nn.Linear(40, 16)

    def forward(self, x):
        u = self.norm(x)
        return self.final(x + self.fc2(F.silu(self.fc1(u)) * self.fc3(u)))


@pytest.mark.parametrize("form", ["llama", "hugging-face", "weight-first", "no-weight"])
def test_a_handwritten_rmsnorm_reads_as_an_rmsnorm_and_matches_the_module(form):
    torch.manual_seed(3)
    rounds = form in ("llama", "hugging-face")  # x.float() and .to(torch.float32) round to fp32 even in float64
    source = module_matches_reference(fp16_exact(HandwrittenStack(form)), tol=1e-5 if rounds else 1e-12)
    assert source.blocks[0].norm == Norm("rmsnorm", 1e-5) and source.final_norm == Norm("rmsnorm", 1e-6)


def test_a_handwritten_norm_over_another_dimension_is_refused():
    with pytest.raises(frontend.FrontendError, match="does not fit the pattern"):
        frontend.from_module(HandwrittenStack("over-rows"))


def test_functional_gated_forms_read_and_match_the_module():
    torch.manual_seed(0)
    net = fp16_exact(nn.Sequential(FunctionalGated(16, 24), FunctionalGated(16, 40, norm="layer", act="gelu",
                                                                          gate_first=True, bias=True)))
    source = module_matches_reference(net)
    assert source.blocks == [
        Block(16, 24, "silu", norm=Norm("rmsnorm", 1e-5), gated=True, bias1=False, bias2=False),
        Block(16, 40, "gelu", norm=Norm("layernorm", 1e-4, bias=True), gated=True, bias3=True)]
    assert torch.equal(source.parameters[1]["w3"], net[1].gate.weight.detach().half())
    assert torch.equal(source.parameters[1]["norm_bias"], net[1].shift.detach())
    assert torch.equal(source.parameters[0]["b2"], torch.zeros(16))  # no bias reads as a zero bias


@pytest.mark.parametrize("final", ["functional", nn.RMSNorm(16, eps=1e-5), nn.LayerNorm(16, bias=False),
                                   nn.LayerNorm(16)], ids=["F.rms_norm", "RMSNorm", "LayerNorm-nobias", "LayerNorm"])
def test_final_norm_forms(final):
    torch.manual_seed(1)
    net = fp16_exact(WithFinal(nn.Sequential(MethodBlock(16, 32), ExactGeluBlock(16, 24, nn.LayerNorm(16))), final))
    source = module_matches_reference(net)
    assert [b.activation for b in source.blocks] == ["relu", "gelu_erf"]
    assert source.blocks[1].norm == Norm("layernorm", 1e-5, bias=True)
    assert source.final_norm.kind == ("rmsnorm" if final == "functional" or isinstance(final, nn.RMSNorm)
                                      else "layernorm")
    assert source.final_norm.bias == (isinstance(final, nn.LayerNorm) and final.bias is not None)


@st.composite
def stack_specs(draw):
    channels = draw(st.integers(1, 24))
    blocks = []
    for _ in range(draw(st.integers(1, 4))):
        norm = draw(st.sampled_from([None, "rmsnorm", {"kind": "layernorm", "bias": True},
                                     {"kind": "layernorm", "eps": 1e-3}]))
        blocks.append({"hidden": draw(st.integers(1, 40)), "activation": draw(st.sampled_from(stack.STACK_ACTIVATIONS)),
                       "norm": norm, "gated": draw(st.booleans()), "bias": draw(st.booleans())})
    spec = {"channels": channels, "blocks": blocks}
    final = draw(st.sampled_from([None, "rmsnorm", "layernorm", {"kind": "layernorm", "bias": True}]))
    if final is not None:
        spec["final_norm"] = final
    return spec


@settings(deadline=None)
@given(spec=stack_specs(), seed=st.integers(0, 2**16))
def test_random_stacks_round_trip_through_the_module(spec, seed):
    """A random stack as an nn.Module: the frontend reads back the spec's blocks and weights, and the
    float64 reference of what it read is the module's own float64 output."""
    module = models.build_module(spec, seed=seed)
    source = module_matches_reference(module, rows=3, seed=seed)
    expected = frontend.from_spec(spec, seed=seed)
    assert source.blocks == expected.blocks and source.final_norm == expected.final_norm
    for got, want in zip(source.parameters, expected.parameters, strict=True):
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


ACT_SPELLINGS = {  # activation -> its spellings: a module, a function, a tensor method
    "relu": (nn.ReLU, lambda t: F.relu(t), lambda t: t.relu()),
    "silu": (nn.SiLU, lambda t: F.silu(t)),
    "gelu": (lambda: nn.GELU(approximate="tanh"), lambda t: F.gelu(t, approximate="tanh")),
    "gelu_erf": (nn.GELU, lambda t: F.gelu(t)),
}
RMS_SPELLINGS = ("module", "constant", "shape", "llama", "hugging-face")
LAYER_SPELLINGS = ("module", "constant", "slice", "weight-shape")


class SpelledBlock(nn.Module):
    """One residual block written in drawn spellings: the norm (module, functional with a constant or a read
    width, hand-written), the activation (module, function, method), the gate's order and whether the norm is
    applied to each branch, eval-mode dropout or not, and the residual add's form."""

    def __init__(self, c, h, act, act_form, norm, norm_form, gated, gate_first, norm_twice, dropout, add, bias):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(c, h, bias=bias), nn.Linear(h, c, bias=bias)
        self.fc3 = nn.Linear(c, h, bias=bias) if gated else None
        spelled = ACT_SPELLINGS[act][act_form]
        self.act_module = spelled() if act_form == 0 else None
        self.act_function = None if act_form == 0 else spelled
        self.norm_kind, self.norm_form, self.eps = norm, norm_form, 1e-5
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(c)) if norm else None
        self.shift = nn.Parameter(0.1 * torch.randn(c)) if norm == "layernorm" else None
        self.norm_module = None
        if norm and norm_form == "module":
            self.norm_module = nn.RMSNorm(c, eps=self.eps) if norm == "rmsnorm" else nn.LayerNorm(c, eps=self.eps)
        self.gate_first, self.norm_twice, self.add = gate_first, norm_twice, add
        self.drop = nn.Dropout(0.5) if dropout else None
        self.spelling = (f"act={act}/{act_form} norm={norm}/{norm_form} gated={gated} gate_first={gate_first} "
                         f"norm_twice={norm_twice} dropout={dropout} add={add} bias={bias}")

    def extra_repr(self) -> str:
        return self.spelling

    def norm(self, x):
        if self.norm_kind is None:
            return x
        if self.norm_module is not None:
            return self.norm_module(x)
        if self.norm_kind == "layernorm":
            shape = {"slice": x.shape[-1:], "weight-shape": self.weight.shape}.get(self.norm_form,
                                                                                  (self.weight.shape[0],))
            return F.layer_norm(x, shape, self.weight, self.shift, self.eps)
        if self.norm_form in ("constant", "shape"):
            shape = (x.shape[-1],) if self.norm_form == "shape" else (self.weight.shape[0],)
            return F.rms_norm(x, shape, self.weight, self.eps)
        return HandwrittenRMSNorm.FORMS[self.norm_form](self, x)

    def llama_style(self, x):
        return HandwrittenRMSNorm.llama_style(self, x)

    def forward(self, x):
        u = self.norm(x)
        a = self.fc1(u)
        a = self.act_module(a) if self.act_module is not None else self.act_function(a)
        if self.fc3 is not None:
            g = self.fc3(self.norm(x) if self.norm_twice else u)
            a = g * a if self.gate_first else a * g
        y = self.fc2(a)
        if self.drop is not None:
            y = self.drop(y)
        if self.add == "inplace":
            x += y
            return x
        return y + x if self.add == "swapped" else x + y


@st.composite
def spelled_stacks(draw):
    """A random stack in random spellings, and the IR blocks it must read as."""
    c = draw(st.integers(1, 12))
    blocks, expected, rounds = [], [], False
    for _ in range(draw(st.integers(1, 3))):
        h, act = draw(st.integers(1, 20)), draw(st.sampled_from(sorted(ACT_SPELLINGS)))
        norm = draw(st.sampled_from([None, "rmsnorm", "layernorm"]))
        norm_form = draw(st.sampled_from(RMS_SPELLINGS if norm == "rmsnorm" else LAYER_SPELLINGS))
        rounds |= norm_form in ("llama", "hugging-face")
        gated, bias = draw(st.booleans()), draw(st.booleans())
        blocks.append(SpelledBlock(c, h, act, draw(st.integers(0, len(ACT_SPELLINGS[act]) - 1)), norm, norm_form,
                                   gated, draw(st.booleans()), draw(st.booleans()), draw(st.booleans()),
                                   draw(st.sampled_from(["plain", "swapped", "inplace"])), bias))
        expected.append(Block(c, h, act, norm=None if norm is None else Norm(norm, 1e-5, bias=norm == "layernorm"),
                              gated=gated, bias1=bias, bias2=bias, bias3=gated and bias))
    return nn.Sequential(*blocks).eval(), expected, rounds


@settings(deadline=None)
@given(stack=spelled_stacks(), seed=st.integers(0, 2**16))
def test_random_spellings_of_random_stacks_read_as_their_blocks(stack, seed):
    """However a block is spelled, the frontend reads the blocks it is, and the float64 reference of what it
    read is the module's float64 output (within fp32 where a hand-written norm casts to float)."""
    module, expected, rounds = stack
    torch.manual_seed(seed)
    source = module_matches_reference(fp16_exact(module), rows=3, seed=seed, tol=1e-5 if rounds else 1e-12)
    assert source.blocks == expected


class OldStream(nn.Module):
    """The second block's Linear reads the stream before the first block: not a chain of residual blocks."""

    def __init__(self):
        super().__init__()
        self.a1, self.a2, self.b1, self.b2 = nn.Linear(8, 16), nn.Linear(16, 8), nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x):
        y = x + self.a2(F.relu(self.a1(x)))
        return y + self.b2(F.relu(self.b1(x)))


class TwoActs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 16), nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x):
        return x + self.c(F.relu(self.a(x)) * F.silu(self.b(x)))


class WideNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm((4, 8)), nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x):
        return x + self.fc2(F.relu(self.fc1(self.norm(x))))


class Dropped(MethodBlock):
    def __init__(self):
        super().__init__(8, 16)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return x + self.drop(self.fc2(self.fc1(x).relu()))


class BadGate(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.g, self.c = nn.Linear(8, 16), nn.Linear(8, 16), nn.Linear(16, 8)
        self.g.weight = nn.Parameter(torch.zeros(12, 8))
        self.g.out_features = 12

    def forward(self, x):
        return x + self.c(F.silu(self.a(x)) * self.g(x))


class ReturnsHidden(MethodBlock):
    def forward(self, x):
        return self.fc1(x)


class TwoInputs(nn.Module):
    def forward(self, x, y):
        return x + y


@pytest.mark.parametrize("net,message", [
    (OldStream(), r"node b1 \(call_module b1\) does not fit the pattern"),
    (TwoActs(), r"node mul \(call_function mul\) does not fit the pattern"),
    (WideNorm(), r"node norm: a norm must normalize the last dimension only"),
    (Dropped(), r"node drop: Dropout\(p=0.1\) in training mode drops at random; call model.eval\(\)"),
    (BadGate(), r"the gate Linear is 8 -> 12, expected 8 -> 16"),
    (ReturnsHidden(8, 16), r"must return the residual stream \(or its final norm\); it returns fc1"),
    (TwoInputs(), r"must take one input"),
    (ExactGeluBlock(8, 16, nn.Tanh()), r"node norm \(call_module norm\) does not fit"),
])
def test_module_rejections_name_the_node(net, message):
    with pytest.raises(frontend.FrontendError, match=message):
        frontend.from_module(net)


# ---- spec forms and refusals ------------------------------------------------------------------------------

def test_spec_forms_and_parameters():
    spec = {"channels": 12, "final_norm": {"kind": "layernorm", "bias": True},
            "blocks": [{"hidden": 20, "activation": "gelu_erf", "norm": "layernorm", "gated": True, "bias": False},
                       {"hidden": 8, "norm": True, "eps": 1e-5}]}
    source = frontend.from_spec(spec, seed=5)
    assert source.blocks == [Block(12, 20, "gelu_erf", norm=Norm("layernorm"), gated=True, bias1=False, bias2=False),
                             Block(12, 8, "gelu", norm=Norm("rmsnorm", 1e-5))]
    p = source.parameters[0]
    assert p["w3"].shape == (20, 12) and p["w3"].dtype == torch.float16
    assert not p["b1"].any() and not p["b2"].any() and not p["b3"].any() and source.parameters[1]["b1"].any()
    assert source.final_norm == Norm("layernorm", bias=True) and set(source.final_parameters) == {"norm_weight",
                                                                                                 "norm_bias"}


@pytest.mark.parametrize("field", ["channels", "hidden"])
@pytest.mark.parametrize("value", [0, -1, 2.0, True])
def test_spec_sizes_name_the_argument(field, value):
    spec = {"channels": 8, "blocks": [{"hidden": 8, field: value}]}
    with pytest.raises(frontend.FrontendError, match=f"spec block 0: {field} must be an integer >= 1, got {value!r}"):
        frontend.from_spec(spec)


def test_huge_spec_fails_before_allocating(monkeypatch):
    def no_allocation(*args, **kwargs):
        raise AssertionError("parameters were allocated for a spec that must be refused")

    monkeypatch.setattr(stack, "make_parameters", no_allocation)
    with pytest.raises(frontend.FrontendError, match="32-bit indexing"):
        frontend.from_spec({"channels": 1024, "blocks": [{"hidden": 10**12}]})
    with pytest.raises(frontend.FrontendError, match="more than 68719476736"):
        frontend.from_spec({"channels": 32768, "blocks": [{"hidden": 65535, "gated": True}] * 12})


# ---- the torch chain, the plan and compile_model on the CPU ------------------------------------------------

GATED_SPEC = {"channels": 48, "final_norm": "rmsnorm",
              "blocks": [{"hidden": 96, "activation": "silu", "norm": "rmsnorm", "gated": True, "bias": False},
                         {"hidden": 64, "activation": "gelu_erf", "norm": {"kind": "layernorm", "bias": True}},
                         {"hidden": 80, "activation": "relu"}]}


def test_cpu_target_runs_the_torch_chain_within_tolerance_of_the_reference():
    compiled = runner.compile_model(GATED_SPEC, rows=33, seed=2, target="cpu")
    assert compiled.engines == [TORCH_CHAIN] * 3
    x = torch.randn(33, 48, generator=torch.Generator().manual_seed(3)).half()
    out = torch.full((33, 48), float("nan"))
    y = compiled(x, out=out)
    assert y is out and torch.isfinite(y).all()
    truth = stack.reference_stack(x, compiled.program.blocks, compiled.parameters, compiled.program.final_norm,
                                  compiled.final_parameters)
    torch.testing.assert_close(y.double(), truth, rtol=1e-3, atol=1e-3)
    x2 = torch.randn(33, 48, generator=torch.Generator().manual_seed(4)).half()
    assert not torch.allclose(compiled(x2), y)  # a fresh input, a fresh answer


def test_an_out_buffer_that_does_not_fit_is_refused_naming_it():
    compiled = runner.compile_model(GATED_SPEC, rows=4, seed=2, target="cpu")
    x = torch.randn(4, 48).half()
    for bad in (torch.empty(4, 47), torch.empty(4, 48, dtype=torch.float16), torch.empty(48, 4).t()):
        with pytest.raises(ValueError, match="out must be a contiguous"):
            compiled(x, out=bad)


def test_torch_block_keeps_the_kernels_rounding_points():
    """The torch chain rounds the operand and hidden to fp16 like the kernels: against the rounded
    reference it is within fp32 accumulation error, against the unrounded one it is not."""
    block = Block(32, 64, "silu", norm=Norm("rmsnorm"), gated=True)
    params = stack.make_parameters(block, seed=1)
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(0)).float()
    y = stack.torch_block(x, block, params, torch.empty(16, 32))
    rounded = stack.reference_stack(x, [block], [params])
    exact = stack.reference_stack(x, [block], [params], rounded=False)
    assert (y.double() - rounded).abs().max() < 1e-4 < (y.double() - exact).abs().max()


def test_plan_says_per_block_engine_tile_and_why():
    blocks, final = frontend.read_spec(GATED_SPEC)
    program = passes.plan(blocks, rows=64, final_norm=final)
    plan = runner.describe_plan(program)
    assert [b.engine for b in plan.blocks] == [TORCH_CHAIN, TORCH_CHAIN, "persistent-tc"]
    assert "gated blocks" in plan.blocks[0].why
    assert "'gelu_erf' has no kernel" in plan.blocks[1].why and "layernorm has no prologue kernel" in plan.blocks[1].why
    assert plan.blocks[2].tile.startswith(f"{program.blocks[2].plan.tile.rows}x")
    text = str(plan)
    assert len(text.splitlines()) == 2 + 1 + 3 + 1  # title, form, header, three blocks, final norm
    assert "final norm: rmsnorm" in text and "per-block chain" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_compile_model_without_cuda_says_it_needs_a_gpu():
    with pytest.raises(runner.NeedsGPUError, match="needs a CUDA device.*target='cpu'"):
        runner.compile_model(GATED_SPEC, rows=4)


def test_compile_model_rejects_an_unknown_target():
    with pytest.raises(ValueError, match="target must be 'cuda' or 'cpu', got 'tpu'"):
        runner.compile_model(GATED_SPEC, rows=4, target="tpu")


# ---- IR checks of the new fields ----------------------------------------------------------------------

@pytest.mark.parametrize("block,message", [
    (Block(8, 8, "gelu", bias3=True), "bias3 .* needs a gated block"),
    (Block(8, 8, "tanh"), "activation must be one of"),
    (Block(8, 8, "gelu", norm=Norm("rmsnorm", bias=True)), "only a LayerNorm has a bias"),
    (Block(8, 8, "gelu", norm=Norm("groupnorm")), "norm kind must be one of"),
    (Block(8, 8, "gelu", kernel_refusal="test", chosen=TORCH_CHAIN, skipped=(None,)), "no kernel candidates"),
])
def test_ir_rejects_malformed_forms(block, message):
    with pytest.raises(ir.IRError, match=message):
        ir.validate(Program(blocks=(block,), rows=1))


def test_ir_rejects_a_torch_chain_block_that_claims_a_kernel():
    program = passes.plan([Block(8, 8, "gelu", gated=True)], rows=4)
    tampered = program.with_blocks([Block(8, 8, "gelu", gated=True, kernel_refusal="no kernel", prologue="none",
                                          residual="float16", chosen="persistent-tc")])
    with pytest.raises(ir.IRError, match="must choose 'torch-chain'"):
        ir.validate(tampered)


# ---- the report's models --------------------------------------------------------------------------------

def test_report_models_are_the_issues_four():
    sizes = {m.name: m.weight_bytes() for m in models.REPORT_MODELS}
    assert sizes["swiglu4-c2048-h8192-1b-ffn"] == 4 * 3 * 2 * 2048 * 8192  # about 400 MB of fp16
    assert [m.fits_l2 for m in models.REPORT_MODELS] == [True, True, True, False]
    blocks, final = frontend.read_spec(models.REPORT_MODELS[2].spec)
    assert [(b.gated, b.bias1, b.norm.kind) for b in blocks] == [(True, False, "rmsnorm")] * 2 and final is not None


def _complete_section() -> dict:
    summary = dict.fromkeys(models.SUMMARY_KEYS, 1.0)
    contender = {"stream_summary": summary, "host_summary": summary,
                 "validation": {"passed": True, "replay_changed_input": True, "inputs_unchanged": True,
                                "max_abs_error": 0.0}}
    return {"entries": [{"model": m.name, "rows": rows, "contenders": dict.fromkeys(models.CONTENDERS, contender),
                         "floor": {"launch_floor_us": 2.0, "weight_bytes": m.weight_bytes(), "copy_bandwidth_gbs": 4e3,
                                   "weight_floor_us": 1.0}}
                        for m in models.REPORT_MODELS for rows in models.REPORT_ROWS]}


def test_models_section_schema():
    assert models.check_models_section(_complete_section()) == []
    assert len(models.check_models_section({})) == len(models.REPORT_MODELS) * len(models.REPORT_ROWS)
    broken = _complete_section()
    entry = broken["entries"][0]
    eager = entry["contenders"]["torch-eager"]
    entry["contenders"] = {**entry["contenders"], "torch-eager": {
        "stream_summary": {}, "host_summary": eager["host_summary"],
        "validation": {**eager["validation"], "passed": False}}}
    entry["floor"] = {**entry["floor"], "weight_bytes": 1}
    problems = models.check_models_section(broken)
    assert len(problems) == len(models.SUMMARY_KEYS) + 2
    assert any("did not pass validation" in p for p in problems) and any("weight_bytes 1" in p for p in problems)


SMALL_CASE = models.ModelCase("small-swiglu", {"channels": 16, "final_norm": "rmsnorm", "blocks": [
    {"hidden": 24, "activation": "silu", "norm": "rmsnorm", "gated": True, "bias": False},
    {"hidden": 40, "activation": "gelu", "norm": {"kind": "layernorm", "bias": True}}]}, fits_l2=True)


def _cpu_chain(case, rows):
    compiled = runner.compile_model(case.spec, rows=rows, target="cpu")

    def call(inputs, outputs):
        compiled(inputs["x"], out=outputs["y"])
        return outputs
    return call


def test_stack_problem_validates_a_contender_and_catches_wrong_ones():
    from kernellab.harness import validate

    problem = models.StackProblem(SMALL_CASE, 9, device="cpu")
    assert problem.shape == (9, 16) and problem.make_inputs(1)["x"].dtype == torch.float16
    assert validate.validate_call(problem, _cpu_chain(SMALL_CASE, 9), seed=3)["passed"]

    def skips_the_final_norm(inputs, outputs):
        s = problem.source
        outputs["y"].copy_(stack.reference_stack(inputs["x"], s.blocks, s.parameters))
        return outputs

    def writes_nothing(inputs, outputs):
        return outputs

    for wrong in (skips_the_final_norm, writes_nothing):
        assert not validate.validate_call(problem, wrong, seed=3)["passed"], wrong.__name__


def test_models_section_validates_times_and_records_failures():
    """``models.section`` with the CPU torch chain as every contender, a fake clock and the harness's
    validation: a complete section passes the schema; a contender that fails validation is not timed; the others
    are timed round by round, their order reversed every other round; a model whose contenders cannot be built is
    recorded with the error."""
    from kernellab.harness import validate

    names = {}

    def make(case, rows):
        if case.name == "broken":
            raise RuntimeError("cannot build")
        problem = models.StackProblem(case, rows, device="cpu")
        built = {name: models.Contender(_cpu_chain(case, rows), problem) for name in models.CONTENDERS}
        built["torch-eager"] = models.Contender(lambda inputs, outputs: outputs, problem)  # leaves y poisoned
        names.update({id(c): name for name, c in built.items()})
        return built

    timed = []

    def time_round(contender, r, got):
        timed.append((r, names[id(contender)]))
        got["rounds"] = got.get("rounds", 0) + 1

    def summarize(got):
        assert got["rounds"] == 2
        summary = dict.fromkeys(models.SUMMARY_KEYS, 0.5)
        return {"stream_summary": summary, "host_summary": summary}

    def check(name, contender):
        result = validate.validate_call(contender.problem, contender.call, seed=7)
        return {"passed": result["passed"], "replay_changed_input": result["passed"],
                "inputs_unchanged": result.get("inputs_unchanged"),
                "max_abs_error": result["outputs"]["y"]["max_abs_error"]}

    broken = models.ModelCase("broken", SMALL_CASE.spec, fits_l2=True)
    got = models.section(time_round, summarize, check, lambda case: models.floor_entry(case, 2.0, 4000.0),
                         cases=(SMALL_CASE, broken), row_counts=(1, 5), make=make, rounds=2)
    passing = [name for name in models.CONTENDERS if name != "torch-eager"]
    one_entry = [(0, name) for name in passing] + [(1, name) for name in reversed(passing)]
    assert timed == one_entry * 2
    problems = models.check_models_section(got, cases=(SMALL_CASE,), row_counts=(1, 5))
    expected = [f"small-swiglu rows={r}: torch-eager {clock} lacks {k}" for r in (1, 5)
                for clock in ("stream_summary", "host_summary") for k in models.SUMMARY_KEYS]
    expected += [f"small-swiglu rows={r}: torch-eager did not pass validation" for r in (1, 5)]
    assert sorted(problems) == sorted(expected)
    assert [e.get("error") for e in got["entries"] if e["model"] == "broken"] == ["RuntimeError: cannot build"] * 2


def test_a_contender_that_fails_while_timed_is_recorded_and_timed_no_further():
    problem = models.StackProblem(SMALL_CASE, 3, device="cpu")
    steady, failing = models.Contender(_cpu_chain(SMALL_CASE, 3), problem), models.Contender(lambda i, o: o, problem)
    rounds = []

    def time_round(contender, r, got):
        if contender is failing:
            raise RuntimeError("out of memory")
        rounds.append(r)
        got["rounds"] = r + 1

    got = models.section(time_round, lambda got: {"timed_rounds": got["rounds"]}, lambda name, c: {"passed": True},
                         lambda case: {}, cases=(SMALL_CASE,), row_counts=(3,),
                         make=lambda case, rows: {"steady": steady, "failing": failing}, rounds=3)
    entry = got["entries"][0]["contenders"]
    assert entry["failing"]["error"] == "RuntimeError: out of memory" and "timed_rounds" not in entry["failing"]
    assert entry["steady"]["timed_rounds"] == 3 and rounds == [0, 1, 2]


def test_floor_entry_is_weight_bytes_over_the_copy_bandwidth():
    floor = models.floor_entry(models.REPORT_MODELS[3], 2.5, 4000.0)
    assert floor["weight_bytes"] == 402653184
    assert floor["weight_floor_us"] == pytest.approx(402653184 / 4000e9 * 1e6)  # about 100 us
    assert floor["launch_floor_us"] == 2.5


def test_model_selection_picks_by_pattern_and_rows_and_names_a_bad_argument():
    cases, rows = models.select("swiglu*", "1,16")
    assert [c.name for c in cases] == [c.name for c in models.REPORT_MODELS if c.name.startswith("swiglu")]
    assert rows == (1, 16)
    assert models.select(None, None) == (models.REPORT_MODELS, models.REPORT_ROWS)
    with pytest.raises(ValueError, match="--model-cases"):
        models.select("resnet", None)
    with pytest.raises(ValueError, match="--model-rows"):
        models.select(None, "1,x")
    with pytest.raises(ValueError, match="--model-rows"):
        models.select(None, "0")


def test_models_sections_merge_across_sittings_into_a_complete_section():
    """Measured in two sittings (--resume), the four models at all row counts make one section that passes the
    schema; an entry measured again replaces the earlier one."""
    complete = _complete_section()
    first = {**complete, "row_counts": [1, 16, 64],
             "entries": [e for e in complete["entries"] if e["rows"] <= 64]}
    second = {**complete, "row_counts": [1024, 4096],
              "entries": [e for e in complete["entries"] if e["rows"] > 64]}
    merged = models.merge_sections(first, second)
    assert models.check_models_section(merged) == [] and merged["row_counts"] == list(models.REPORT_ROWS)
    again = {**complete, "row_counts": [1], "entries": [{**complete["entries"][0], "error": "remeasured"}]}
    remerged = models.merge_sections(merged, again)
    assert remerged["entries"][0]["error"] == "remeasured" and len(remerged["entries"]) == len(merged["entries"])
    assert models.check_models_section(models.merge_sections(None, first)) != []  # half a section is incomplete


def _timed(section: dict, p50_us: dict) -> dict:
    """``section`` with each contender's stream p50 set from ``p50_us`` (contender -> us)."""
    out = {**section, "entries": []}
    for e in section["entries"]:
        contenders = {name: {**got, "stream_summary": {**got["stream_summary"], "p50_ms": p50_us[name] / 1e3}}
                      for name, got in e["contenders"].items()}
        out["entries"].append({**e, "contenders": contenders, "floor": {**e["floor"], "weight_floor_us": 90.0}})
    return out


def test_targets_are_read_from_the_section_met_and_missed():
    section = _timed(_complete_section(), {"persistent-stack": 10.0, "persistent-stack-graph": 9.0,
                                           "block-chain-graph": 20.0, "torch-eager": 100.0,
                                           "torch-compile-max-autotune-graph": 20.0})
    got = models.targets(section)
    ratios = [t for t in got if t["target"] is not None]
    # three L2 models: 3 decode rows x 2 ratios + 2 large rows x 1; the 1B stack: rows 1 and 16 x 2
    assert len(ratios) == 3 * (3 * 2 + 2) + 2 * 2
    assert all(t["met"] for t in ratios if "persistent-stack-graph /" in t["what"])  # 0.45 <= 0.5, 0.8, 0.9
    floor = [t for t in ratios if t["what"].startswith("weight floor")]
    assert floor and all(t["value"] == 10.0 and t["met"] for t in floor)
    slow = _timed(_complete_section(), {"persistent-stack": 10.0, "persistent-stack-graph": 12.0,
                                        "block-chain-graph": 20.0, "torch-eager": 100.0,
                                        "torch-compile-max-autotune-graph": 20.0})
    missed = [t for t in models.targets(slow) if t["target"] is not None and not t["met"]]
    assert {t["rows"] for t in missed} == {1, 16, 64}  # 0.6 > 0.5 at decode rows; 0.6 <= 0.8 and 0.9 elsewhere
    text = models.table(slow)
    assert "missed: mlp4-c256-h1024-gelu rows=1" in text and "validations failed: 0" in text


def test_a_missed_ratio_next_to_its_target_is_printed_with_the_digits_that_tell_them_apart():
    """A compile ratio of 0.8035 misses a 0.8 target; at two decimals it would print as 0.80, which reads as met."""
    section = _timed(_complete_section(), {"persistent-stack": 10.0, "persistent-stack-graph": 80.35,
                                           "block-chain-graph": 200.0, "torch-eager": 100.0,
                                           "torch-compile-max-autotune-graph": 100.0})
    text = models.table(section)
    large = [line for line in text.splitlines() if "rows=1024" in line and "torch-compile" in line]
    assert large and all(line.endswith("= 0.803 (<= 0.8)") for line in large), large
    assert "rows=1 persistent-stack-graph / torch-compile-max-autotune-graph = 0.80 (<= 0.5)" in text


def test_show_models_only_prints_the_section_alone(tmp_path, capsys):
    """``report --show R --models-only``: the models table and its targets without the engine table and the floor
    line (the block a models README shows); a report without a models section is refused by name."""
    from kernellab.megakernel import report

    section = _timed(_complete_section(), {"persistent-stack": 10.0, "persistent-stack-graph": 12.0,
                                           "block-chain-graph": 20.0, "torch-eager": 100.0,
                                           "torch-compile-max-autotune-graph": 20.0})
    engines = {"development": [], "assessment": []}
    path = report.seal_and_write({**engines, "models": section}, tmp_path / "models.json")
    assert report.main(["--show", str(path), "--models-only"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("models: stream p50") and "missed: mlp4-c256-h1024-gelu rows=1" in out
    assert report.main(["--show", str(path)]) == 0
    assert not capsys.readouterr().out.startswith("models:")  # in full, the engine table comes first
    bare = report.seal_and_write(engines, tmp_path / "bare.json")
    assert report.main(["--show", str(bare), "--models-only"]) == 1
    assert "no models section" in capsys.readouterr().err


def test_a_failed_contender_is_unmeasured_for_the_targets():
    section = _complete_section()
    section["entries"][0]["contenders"] = {**section["entries"][0]["contenders"],
                                           "persistent-stack-graph": {"validation": {"passed": False}}}
    got = [t for t in models.targets(section) if t["model"] == section["entries"][0]["model"]
           and t["rows"] == section["entries"][0]["rows"]]
    assert any(t["target"] is not None and t["met"] is None for t in got)
    assert any(t["what"] == "persistent-stack-graph passes validation" and t["met"] is False for t in got)
