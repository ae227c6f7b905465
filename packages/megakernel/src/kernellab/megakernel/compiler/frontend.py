"""From a model to the IR: a torch ``nn.Module`` (traced with torch.fx) or a spec.

Both give a ``Source``: the IR blocks (``ir.Block``), per block the tensors the kernels take
(``w1 w2 [w3]`` fp16; ``b1 b2 [b3]`` fp32, zeros where the model has no bias; ``norm_weight``
(ones where the norm has none) and ``norm_bias`` fp32), and the optional final norm with its own.

An nn.Module is accepted when its traced graph is a chain of residual blocks, each

    s -> [norm] -> Linear(C -> H) -> act ------------------------> Linear(H -> C) -> add(s, .)
                \\-> Linear(C -> H) (gated blocks) -> mul(act, .) /

then optionally a final norm whose output the module returns. Norms: ``nn.RMSNorm``,
``nn.LayerNorm`` (bias or not), ``F.rms_norm``, ``F.layer_norm``, over the last dimension only (a functional
norm's width a constant, a parameter's size, or read from its input: ``x.shape[-1]``, ``x.size(-1)``,
``x.shape[-1:]``), and
RMSNorm written out as reference implementations do (``_handwritten_rms``: folded into ``F.rms_norm`` first).
Activations: ReLU, GELU (``approximate="tanh"``: ``gelu``; exact: ``gelu_erf``), SiLU, as modules
or as functions. Linears may lack biases; hidden may differ per block; the residual add may be in place
(``x += ...``); ``nn.Identity`` and dropout in eval mode (or p = 0) pass their input through, and a gated
block may apply its norm once or twice. Anything else is rejected with the node that does not fit (a
dropout in training mode with a request for ``model.eval()``).

A spec is ``{"channels": C, "blocks": [{"hidden": H, ...}, ...], "final_norm": ...}``; a block's keys
are in ``SPEC_BLOCK_KEYS`` (a norm is ``"rmsnorm"``, ``"layernorm"``, ``True`` (rmsnorm) or a dict
``{"kind", "eps", "bias"}``). Sizes are checked before anything is allocated; weights come from a seed.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any

from .. import model, stack
from ..stack import Norm
from .ir import Block
from .passes import MAX_ELEMENTS


class FrontendError(ValueError):
    """The model is not one the compiler understands; the message names the part that is not."""


@dataclasses.dataclass
class Source:
    """What the frontend read: IR blocks, their parameters, and the final norm with its parameters."""

    blocks: list[Block]
    parameters: list[dict]
    final_norm: Norm | None = None
    final_parameters: dict = dataclasses.field(default_factory=dict)


# ---- spec -------------------------------------------------------------------------------------------

SPEC_KEYS = {"channels", "blocks", "final_norm"}
SPEC_BLOCK_KEYS = {"channels", "hidden", "activation", "norm", "eps", "gated", "bias"}
SPEC_NORM_KEYS = {"kind", "eps", "bias"}
MAX_SPEC_BYTES = 2**36
"""A spec's weights are allocated from a seed: a spec asking for more than 64 GiB is refused before."""


def _spec_size(where: str, name: str, value) -> int:
    try:
        return model.check_positive_int(name, value)
    except ValueError as e:
        raise FrontendError(f"{where}: {e}") from None


def _spec_norm(where: str, value, eps) -> Norm | None:
    """A spec's norm: None/False, True or a kind name (with the block's ``eps``), or a dict."""
    if value is None or value is False:
        return None
    if value is True:
        value = "rmsnorm"
    if isinstance(value, str):
        value = {"kind": value}
    if not isinstance(value, dict) or set(value) - SPEC_NORM_KEYS:
        raise FrontendError(f"{where}: a norm is 'rmsnorm', 'layernorm', True, or a dict with keys "
                            f"{sorted(SPEC_NORM_KEYS)}; got {value!r}")
    kind = value.get("kind")
    if kind not in stack.NORMS:
        raise FrontendError(f"{where}: norm kind must be one of {stack.NORMS}, got {kind!r}")
    eps = value.get("eps", model.DEFAULT_NORM_EPS if eps is None else eps)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise FrontendError(f"{where}: norm eps must be a number > 0, got {eps!r}")
    bias = value.get("bias", False)
    if not isinstance(bias, bool) or (bias and kind != "layernorm"):
        raise FrontendError(f"{where}: norm bias must be a bool, and only a layernorm has one; got {bias!r}")
    return Norm(kind, float(eps), bias)


def _spec_block(i: int, entry, channels) -> Block:
    where = f"spec block {i}"
    if not isinstance(entry, dict):
        raise FrontendError(f"{where} must be a dict, got {entry!r}")
    unknown = set(entry) - SPEC_BLOCK_KEYS
    if unknown:
        raise FrontendError(f"{where} has unknown keys {sorted(unknown)}; known: {sorted(SPEC_BLOCK_KEYS)}")
    c = entry.get("channels", channels)
    if "hidden" not in entry or c is None:
        raise FrontendError(f"{where} needs 'hidden' and 'channels' (its own or the spec's)")
    c, hidden = _spec_size(where, "channels", c), _spec_size(where, "hidden", entry["hidden"])
    activation = entry.get("activation", "gelu")
    if activation not in stack.STACK_ACTIVATIONS:
        raise FrontendError(f"{where}: activation must be one of {stack.STACK_ACTIVATIONS}, got {activation!r}")
    gated, bias = entry.get("gated", False), entry.get("bias", True)
    if not isinstance(gated, bool) or not isinstance(bias, bool):
        raise FrontendError(f"{where}: 'gated' and 'bias' must be bools, got {gated!r} and {bias!r}")
    norm = _spec_norm(where, entry.get("norm"), entry.get("eps"))
    return Block(channels=c, hidden=hidden, activation=activation, norm=norm, gated=gated, bias1=bias, bias2=bias,
                 bias3=bias and gated)


def _check_spec_sizes(blocks: list[Block]) -> None:
    """Each weight addressable with 32-bit indices and all of them under ``MAX_SPEC_BYTES``, before any allocation."""
    total = 0
    for i, b in enumerate(blocks):
        if b.channels * b.hidden > MAX_ELEMENTS:
            raise FrontendError(f"spec block {i}: a {b.hidden} x {b.channels} weight has {b.channels * b.hidden} "
                                f"elements, more than the kernels' 32-bit indexing allows ({MAX_ELEMENTS})")
        total += (3 if b.gated else 2) * 2 * b.channels * b.hidden
    if total > MAX_SPEC_BYTES:
        raise FrontendError(f"the spec's weights take {total} bytes, more than {MAX_SPEC_BYTES}")


def read_spec(spec: dict) -> tuple[list[Block], Norm | None]:
    """A spec's IR blocks and final norm, every size checked; nothing is allocated."""
    if not isinstance(spec, dict) or "blocks" not in spec:
        raise FrontendError(f"a spec is a dict with 'channels' and 'blocks', got {spec!r}")
    unknown = set(spec) - SPEC_KEYS
    if unknown:
        raise FrontendError(f"the spec has unknown keys {sorted(unknown)}; known: {sorted(SPEC_KEYS)}")
    if not isinstance(spec["blocks"], (list, tuple)) or not spec["blocks"]:
        raise FrontendError("a spec needs at least one block (a list of dicts under 'blocks')")
    blocks = [_spec_block(i, entry, spec.get("channels")) for i, entry in enumerate(spec["blocks"])]
    final_norm = _spec_norm("spec final_norm", spec.get("final_norm"), None)
    _check_spec_sizes(blocks)
    return blocks, final_norm


def from_spec(spec: dict, *, seed: int = 0, device="cpu") -> Source:
    """A spec read (``read_spec``) and its parameters made from ``seed`` on ``device``."""
    blocks, final_norm = read_spec(spec)
    params = [stack.make_parameters(b, seed=seed + 1000 * i, device=device) for i, b in enumerate(blocks)]
    final_params = {}
    if final_norm is not None:
        final_params = stack.make_norm_parameters(final_norm, blocks[-1].channels, seed=seed - 1, device=device)
    return Source(blocks, params, final_norm, final_params)


# ---- nn.Module ----------------------------------------------------------------------------------------

def _activation_of(node, modules) -> str | None:
    """The activation a node applies, or None if it is not one."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    def gelu(approximate) -> str:
        if approximate not in ("none", "tanh"):
            raise FrontendError(f"node {node.name}: gelu(approximate={approximate!r}) is not one of 'none', 'tanh'")
        return "gelu" if approximate == "tanh" else "gelu_erf"

    if node.op == "call_module":
        mod = modules[node.target]
        if isinstance(mod, nn.ReLU):
            return "relu"
        if isinstance(mod, nn.SiLU):
            return "silu"
        if isinstance(mod, nn.GELU):
            return gelu(mod.approximate)
        return None
    if node.op in ("call_function", "call_method"):
        target = node.target
        if target in (F.relu, torch.relu, "relu"):
            return "relu"
        if target in (F.silu, "silu"):
            return "silu"
        if target in (F.gelu, "gelu"):
            return gelu(node.kwargs.get("approximate", "none"))
    return None


def _identity_input(node, modules):
    """The input of a node that passes it through unchanged at inference: ``nn.Identity``, a dropout in eval mode
    or with p = 0 (``nn.Dropout``, ``F.dropout(..., training=False)``); None for any other node. A dropout that
    would drop (training mode, p > 0) is refused: its output is not a function of the input alone."""
    import torch.nn.functional as F
    from torch import nn

    if node.op == "call_module":
        mod = modules[node.target]
        if isinstance(mod, nn.Identity):
            return node.args[0]
        if isinstance(mod, nn.Dropout):
            if mod.training and mod.p > 0:
                raise FrontendError(f"node {node.name}: {type(mod).__name__}(p={mod.p}) in training mode drops at "
                                    "random; call model.eval() before compiling")
            return node.args[0]
    elif node.op == "call_function" and node.target is F.dropout:
        args = _arguments(node, ("input", "p", "training", "inplace"))
        p, training = args.get("p", 0.5), args.get("training", True)
        if training and p:
            raise FrontendError(f"node {node.name}: F.dropout(p={p}, training={training}) drops at random; pass "
                                "training=False (or self.training in eval mode) before compiling")
        return args["input"]
    return None


def _same_value(a, b) -> bool:
    """Whether two nodes compute the same value: the same node, or the same module, function or method on
    arguments of the same values (a norm applied twice to the stream, ``x.float()`` or ``x.shape[-1]`` written
    twice)."""
    return a is b or (getattr(a, "op", None) in ("call_module", "call_function", "call_method")
                      and a.op == getattr(b, "op", None) and a.target == b.target
                      and _same_arguments(a.args, b.args) and _same_arguments(a.kwargs, b.kwargs))


def _same_arguments(a, b) -> bool:
    """Whether two fx argument structures (nodes, tuples, lists, dicts, constants) hold the same values."""
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same_arguments, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_arguments(a[k], b[k]) for k in a)
    if getattr(a, "op", None) is not None or getattr(b, "op", None) is not None:
        return _same_value(a, b)
    return a == b


def _linear_of(node, modules):
    from torch import nn

    if node.op == "call_module" and isinstance(modules[node.target], nn.Linear):
        return modules[node.target]
    return None


def _attribute(graph_module, node, what: str):
    """The tensor a get_attr node names (a function-form norm's weight or bias), None for None."""
    if node is None:
        return None
    if getattr(node, "op", None) != "get_attr":
        raise FrontendError(f"the {what} must be a parameter of the module, got {node}")
    value = graph_module
    for part in node.target.split("."):
        value = getattr(value, part)
    return value


def _arguments(node, names: tuple[str, ...]) -> dict:
    """A call's positional and keyword arguments by parameter name."""
    bound = dict(zip(names, node.args, strict=False))
    bound.update(node.kwargs)
    return bound


LAST = "last"
"""A norm's width read from its input (``x.shape[-1]``, ``x.size(-1)``, ``x.shape[-1:]``): the stream's channels."""


def _size_node(node) -> bool:
    """Whether an fx node only reads metadata: ``t.shape``, ``t.dtype``, ``t.size(...)``, or an item or slice of
    those."""
    if getattr(node, "op", None) == "call_function" and node.target is getattr:
        return len(node.args) == 2 and node.args[1] in ("shape", "dtype")
    if getattr(node, "op", None) == "call_method" and node.target == "size":
        return True
    return (getattr(node, "op", None) == "call_function" and node.target is operator.getitem
            and _size_node(node.args[0]))


def _sizes_of(node):
    """(tensor, index or None for all sizes) of ``t.shape`` / ``t.size()`` / ``t.size(i)``, else None."""
    if node.op == "call_function" and node.target is getattr:
        return node.args[0], None
    if node.op == "call_method" and node.target == "size" and not node.kwargs:
        return node.args[0], node.args[1] if len(node.args) > 1 else None
    return None


def _is_last_size(value, tensor) -> bool:
    """Whether an fx value is ``tensor``'s last size: ``tensor.shape[-1]``, ``tensor.size(-1)`` or
    ``tensor.size()[-1]``."""
    if getattr(value, "op", None) is None:
        return False
    sizes = _sizes_of(value)
    if sizes is not None:
        return sizes == (tensor, -1)
    if value.op == "call_function" and value.target is operator.getitem and value.args[1] == -1:
        inner = _sizes_of(value.args[0]) if getattr(value.args[0], "op", None) else None
        return inner == (tensor, None)
    return False


def _parameter_sizes(value, graph_module):
    """The sizes a node reads from a parameter (``self.weight.shape``, ``self.weight.shape[0]``,
    ``self.weight.size(0)``) as an int or a tuple of ints; None where it reads no parameter's size."""
    node = value
    index = None
    if getattr(node, "op", None) == "call_function" and node.target is operator.getitem:
        node, index = node.args
    sizes = _sizes_of(node) if getattr(node, "op", None) else None
    if sizes is None or getattr(sizes[0], "op", None) != "get_attr" or (index is not None and sizes[1] is not None):
        return None
    shape = tuple(_attribute(graph_module, sizes[0], "tensor whose size is read").shape)
    index = sizes[1] if sizes[1] is not None else index
    return shape if index is None else shape[index]


def _normalized_shape(raw, tensor, graph_module) -> tuple:
    """A functional norm's ``normalized_shape`` as a tuple of ints and ``LAST`` (the input's last size, however
    it was read); a parameter's sizes read as the ints they are; anything else is kept as given, for the caller
    to refuse."""
    if getattr(raw, "op", None) == "call_function" and raw.target is operator.getitem:
        index = raw.args[1]
        inner = _sizes_of(raw.args[0]) if getattr(raw.args[0], "op", None) else None
        if inner == (tensor, None) and index == slice(-1, None, None):
            return (LAST,)
    read = _parameter_sizes(raw, graph_module)
    if read is not None:
        return read if isinstance(read, tuple) else (read,)
    if isinstance(raw, (tuple, list)):
        out = []
        for v in raw:
            read = _parameter_sizes(v, graph_module)
            out.append(LAST if _is_last_size(v, tensor) else v if read is None else read)
        return tuple(out)
    return (raw,)


def _pair(node, test):
    """(the argument passing ``test``, the other) of a two-argument node, either order, or None."""
    if len(node.args) != 2 or node.kwargs:
        return None
    a, b = node.args
    return (a, b) if test(a) else (b, a) if test(b) else None


def _handwritten_rms(node):
    """(input, eps, weight get_attr node or None) when ``node`` ends a hand-written RMSNorm over the last
    dimension, as reference implementations write it:
    ``[(] x.float() * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) [).type_as(x)] [* weight]``
    (``x.float()``, ``x.to(torch.float32)`` or ``x``; ``pow(2)``, ``x * x`` or ``torch.square``; ``t.rsqrt()`` or
    ``torch.rsqrt``; the cast back ``type_as`` or ``to``, as Hugging Face's LlamaRMSNorm writes it); else None."""
    import torch

    weight, core = None, node
    if _is_mul(node):
        split = _pair(node, lambda v: getattr(v, "op", None) == "get_attr")
        if split is not None:
            weight, core = split
    if _is_call(core, (), "type_as") or _is_call(core, (), "to"):  # the cast back to the input's dtype
        core = core.args[0]
    if not _is_mul(core):
        return None
    split = _pair(core, lambda v: _is_call(v, (torch.rsqrt,), "rsqrt"))
    if split is None:
        return None
    root, xf = split
    total = root.args[0]
    if not _is_add(total):
        return None
    moments = _pair(total, lambda v: isinstance(v, float))
    if moments is None:
        return None
    eps, mean = moments
    if not _is_call(mean, (torch.mean,), "mean", keywords=True):
        return None
    margs = _arguments(mean, ("input", "dim", "keepdim"))
    if margs.get("dim") not in (-1, (-1,), [-1]) or not margs.get("keepdim", False):
        return None
    square = margs["input"]
    squared = (_is_call(square, (torch.pow,), "pow") and len(square.args) == 2 and _same_value(square.args[0], xf)
               and square.args[1] in (2, 2.0)) or (_is_call(square, (torch.square,), "square")
                                                   and _same_value(square.args[0], xf)) or (
        _is_mul(square) and _same_value(square.args[0], xf) and _same_value(square.args[1], xf))
    if not squared:
        return None
    cast = (_is_call(xf, (), "float") and len(xf.args) == 1) or (
        _is_call(xf, (), "to") and len(xf.args) == 2 and xf.args[1] is torch.float32)
    return (xf.args[0] if cast else xf), eps, weight


def _fold_handwritten_norms(graph_module) -> None:
    """Replace each hand-written RMSNorm (``_handwritten_rms``) by the ``F.rms_norm`` call it computes, so that
    the reader below sees one norm node; the nodes it made of are dropped where nothing else uses them."""
    import torch.nn.functional as F

    graph = graph_module.graph
    while True:  # the outermost match first (a norm's inner products match too), then what is left
        for node in reversed(list(graph.nodes)):
            found = _handwritten_rms(node) if node.op in ("call_function", "call_method") else None
            if found is not None:
                x, eps, weight = found
                with graph.inserting_before(node):
                    norm = graph.call_function(F.rms_norm, (x, (LAST,), weight, eps), name=f"rms_norm_of_{node.name}")
                node.replace_all_uses_with(norm)
                graph.eliminate_dead_code()
                break
        else:
            return


def _norm_of(node, modules, graph_module):
    """(Norm, weight or None, bias or None, width) of a norm node over the last dimension, or None."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    if node.op == "call_module" and isinstance(modules[node.target], (nn.RMSNorm, nn.LayerNorm)):
        mod = modules[node.target]
        kind = "rmsnorm" if isinstance(mod, nn.RMSNorm) else "layernorm"
        shape, eps, weight = tuple(mod.normalized_shape), mod.eps, mod.weight
        bias = getattr(mod, "bias", None) if kind == "layernorm" else None
    elif node.op == "call_function" and node.target in (F.rms_norm, F.layer_norm):
        kind = "rmsnorm" if node.target is F.rms_norm else "layernorm"
        names = ("input", "normalized_shape", "weight", "eps") if kind == "rmsnorm" else (
            "input", "normalized_shape", "weight", "bias", "eps")
        args = _arguments(node, names)
        shape = _normalized_shape(args.get("normalized_shape", ()), args.get("input"), graph_module)
        eps = args.get("eps", None if kind == "rmsnorm" else 1e-5)
        weight = _attribute(graph_module, args.get("weight"), f"weight of {node.name}")
        bias = _attribute(graph_module, args.get("bias"), f"bias of {node.name}")
    else:
        return None
    if len(shape) != 1 or not (isinstance(shape[0], int) or shape[0] == LAST):
        raise FrontendError(f"node {node.name}: a norm must normalize the last dimension only, its width a "
                            f"constant or the input's last size (x.shape[-1], x.size(-1), x.shape[-1:]); it "
                            f"normalizes {shape}")
    if eps is None:  # torch's default for RMSNorm: the epsilon of the input's dtype (fp32 here)
        eps = torch.finfo(torch.float32).eps
    return Norm(kind, float(eps), bias is not None), weight, bias, shape[0]


def _is_call(node, functions, method: str, *, keywords: bool = False) -> bool:
    """Whether a value is the node ``t.method(...)`` or ``f(t, ...)`` for one of ``functions``, with keyword
    arguments only where ``keywords``."""
    op = getattr(node, "op", None)
    if op not in ("call_method", "call_function") or (node.kwargs and not keywords):
        return False
    return node.target == method if op == "call_method" else node.target in functions


def _is_add(node) -> bool:
    import torch

    return _is_call(node, (operator.add, operator.iadd, torch.add), "add") and len(node.args) == 2


def _is_mul(node) -> bool:
    import torch

    return _is_call(node, (operator.mul, torch.mul), "mul") and len(node.args) == 2


@dataclasses.dataclass
class _Partial:
    """A block being read: the stream it started from, its operand's norm, and what is known so far."""

    stream: Any
    operand: Any  # the node whose fp16 rounding is u (the stream itself, or its norm)
    norm: tuple | None = None  # (Norm, weight, bias)
    first: Any = None  # Linear W1 (the one the activation is applied to)
    gate: Any = None  # Linear W3
    activation: str | None = None
    second: Any = None  # Linear W2


PATTERN = ("[RMSNorm|LayerNorm] -> Linear -> ReLU/GELU/SiLU [* Linear] -> Linear -> residual add, "
           "then an optional final norm")


def from_module(module, *, device="cpu") -> Source:
    """Trace ``module`` with torch.fx and read its residual blocks and final norm."""
    import torch.fx

    try:
        graph_module = torch.fx.symbolic_trace(module)
    except Exception as e:  # noqa: BLE001 - tracing errors come in many types; report them as one
        raise FrontendError(f"torch.fx could not trace {type(module).__name__}: {e}") from e
    modules = dict(graph_module.named_modules())
    _fold_handwritten_norms(graph_module)
    for node in list(graph_module.graph.nodes):  # identities (eval-mode dropout, nn.Identity) read as their input
        source_node = _identity_input(node, modules)
        if source_node is not None:
            node.replace_all_uses_with(source_node)
            graph_module.graph.erase_node(node)
    nodes = list(graph_module.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise FrontendError(f"the model must take one input (the rows), it takes {len(placeholders)}")
    stream = placeholders[0]
    roles: dict[Any, tuple[str, _Partial]] = {}  # node -> (role, the block it belongs to)
    final = None  # (node, (Norm, weight, bias, width)) of the latest norm of the stream: maybe the final norm
    source = Source([], [])

    def role(node, *names):
        entry = roles.get(node)
        return entry[1] if entry is not None and entry[0] in names and entry[1].stream is stream else None

    for node in nodes:
        if node.op in ("placeholder", "get_attr") or _size_node(node):
            continue  # sizes are read where a norm's width uses them; any other use is refused there
        if node.op == "output":
            returned = node.args[0]
            if final is not None and returned is final[0] and source.blocks:
                source.final_norm = final[1][0]
                source.final_parameters = _norm_parameters(final[1], source.blocks[-1].channels, final[0], device)
            elif returned is not stream:
                raise FrontendError(f"the model must return the residual stream (or its final norm); it returns "
                                    f"{returned}")
            break
        first = node.args[0] if node.args else None
        linear = _linear_of(node, modules)
        activation = _activation_of(node, modules)
        norm = _norm_of(node, modules, graph_module) if first is stream else None
        if norm is not None:
            roles[node] = ("operand", _Partial(stream, node, norm))
            final = (node, norm)
        elif linear is not None and (first is stream or role(first, "operand")):
            block = role(first, "operand") or _Partial(stream, stream)
            roles[node] = ("pre", dataclasses.replace(block, first=linear))
        elif activation is not None and role(first, "pre"):
            roles[node] = ("act", dataclasses.replace(role(first, "pre"), activation=activation))
        elif _is_mul(node) and _gated(node, role):
            roles[node] = ("hidden", _gated(node, role))
        elif linear is not None and role(first, "act", "hidden"):
            roles[node] = ("post", dataclasses.replace(role(first, "act", "hidden"), second=linear))
        elif _is_add(node) and stream in node.args:
            other = node.args[1] if node.args[0] is stream else node.args[0]
            block = role(other, "post")
            if block is None:
                raise FrontendError(f"node {node.name}: the residual add must add the block's second Linear to the "
                                    f"stream, it adds {other}")
            b, p = _block(len(source.blocks), block, device)
            source.blocks.append(b)
            source.parameters.append(p)
            stream, final = node, None
        else:
            raise FrontendError(f"node {node.name} ({node.op} {getattr(node.target, '__name__', node.target)}) does "
                                f"not fit the pattern {PATTERN}")
    if not source.blocks:
        raise FrontendError(f"no residual block found: expected {PATTERN}")
    return source


def _gated(node, role):
    """The block of ``act(W1 u) * (W3 u)`` (either order, the same operand u), or None."""
    a, b = node.args
    for act_node, gate_node in ((a, b), (b, a)):
        act, gate = role(act_node, "act"), role(gate_node, "pre")
        if act is not None and gate is not None and _same_value(act.operand, gate.operand) and act.gate is None:
            return dataclasses.replace(act, gate=gate.first)
    return None


def _norm_parameters(norm, channels: int, node, device) -> dict:
    """fp32 ``norm_weight`` (ones when the norm has none) and, for a LayerNorm with one, ``norm_bias``."""
    import torch

    _, weight, bias, width = norm
    if width == LAST:  # read from the input, the stream itself: the norm's parameters must still fit it
        width = channels if weight is None else weight.shape[-1]
    if width != channels:
        raise FrontendError(f"node {node}: the norm normalizes {width} channels, the stream has {channels}")
    params = {"norm_weight": torch.ones(channels, device=device) if weight is None else
              weight.detach().to(device=device, dtype=torch.float32).contiguous()}
    if bias is not None:
        params["norm_bias"] = bias.detach().to(device=device, dtype=torch.float32).contiguous()
    return params


def _block(index: int, block: _Partial, device) -> tuple[Block, dict]:
    import torch

    first, second, gate = block.first, block.second, block.gate
    channels, hidden = first.in_features, first.out_features
    if (second.in_features, second.out_features) != (hidden, channels):
        raise FrontendError(f"block {index}: the second Linear is {second.in_features} -> {second.out_features}, "
                            f"expected {hidden} -> {channels}")
    if gate is not None and (gate.in_features, gate.out_features) != (channels, hidden):
        raise FrontendError(f"block {index}: the gate Linear is {gate.in_features} -> {gate.out_features}, "
                            f"expected {channels} -> {hidden}")

    def f16(t):
        return t.detach().to(device=device, dtype=torch.float16).contiguous()

    def f32(t, n):
        if t is None:
            return torch.zeros(n, dtype=torch.float32, device=device)
        return t.detach().to(device=device, dtype=torch.float32).contiguous()

    params = {"w1": f16(first.weight), "b1": f32(first.bias, hidden), "w2": f16(second.weight),
              "b2": f32(second.bias, channels)}
    if gate is not None:
        params.update(w3=f16(gate.weight), b3=f32(gate.bias, hidden))
    norm = None
    if block.norm is not None:
        norm = block.norm[0]
        params.update(_norm_parameters(block.norm, channels, block.operand, device))
    ir_block = Block(channels=channels, hidden=hidden, activation=block.activation, norm=norm, gated=gate is not None,
                     bias1=first.bias is not None, bias2=second.bias is not None,
                     bias3=gate is not None and gate.bias is not None)
    return ir_block, params

