"""The fused whole-stack engine on the GPU: random stacks of every form it fuses (all four, forced and planned)
against the float64 reference of the stack with the kernels' rounding points, through the engines' protocol
(NaN-poisoned output, fresh inputs, inputs unchanged, changed-input CUDA-graph replay); a grid-form plan called
with more rows than its barrier can hold; and the report's models planned and served by the fused engine."""

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kernellab.megakernel import compile_model, models, planning, stack, validation
from kernellab.megakernel.compiler import frontend
from kernellab.megakernel.compiler.passes import PassError
from kernellab.megakernel.engines.graph import GraphCall
from kernellab.megakernel.planning.stack import (
    GEMV_PLANNED_ROWS,
    GEMV_ROW_TILES,
    MMA_PLANNED_ROWS,
    MMA_RESIDENT_ROWS,
    MMA_ROW_TILES,
    StackPlan,
    plan_stack,
)

pytestmark = pytest.mark.gpu


@st.composite
def fusable_stacks(draw):
    """Stacks the fused engine serves: any depth, hidden differing per block (odd sizes included), every norm and
    activation, biases or not, gated throughout or plain throughout, a final norm or not."""
    gated = draw(st.booleans())
    blocks = [{"hidden": draw(st.integers(1, 300)), "activation": draw(st.sampled_from(stack.STACK_ACTIVATIONS)),
               "norm": draw(st.sampled_from([None, "rmsnorm", {"kind": "layernorm", "bias": True},
                                             {"kind": "layernorm", "bias": False}])),
               "gated": gated, "bias": draw(st.booleans())} for _ in range(draw(st.integers(1, 5)))]
    spec = {"channels": draw(st.sampled_from([1, 7, 64, 100, 256, 333])), "blocks": blocks}
    if draw(st.booleans()):
        spec["final_norm"] = draw(st.sampled_from(["rmsnorm", "layernorm"]))
    return spec


def _validate(spec, rows, seed, **options):
    """The fused model of ``spec`` through the engines' protocol, direct and in a CUDA graph."""
    case = models.ModelCase("random", spec, fits_l2=True)
    compiled = compile_model(spec, rows=rows, seed=seed, engine="persistent-stack", **options)
    assert compiled.fused is not None, compiled.plan()
    assert compiled.engines == ["persistent-stack"] * len(spec["blocks"])
    problem = models.StackProblem(case, rows, weights_seed=seed)

    def call(inputs, outputs):
        compiled(inputs["x"], out=outputs["y"])
        return outputs

    for name, run in (("persistent-stack", call), ("persistent-stack-graph", GraphCall(call))):
        result = validation.check(problem, name, run, seed=seed)
        assert result["passed"] and result["replay_changed_input"] and result["inputs_unchanged"], (
            name, str(compiled.plan()), result)
    return compiled


@settings(max_examples=25, deadline=None)
@given(spec=fusable_stacks(), rows=st.integers(1, 300), seed=st.integers(0, 2**16),
       form=st.sampled_from([None, "grid", "rows", "gemv", "mma"]))
def test_random_stacks_match_the_reference(spec, rows, seed, form):
    blocks, _ = frontend.read_spec(spec)
    assume(isinstance(plan_stack(blocks, rows, planning.current_device(), form=form), StackPlan))  # forced: if it can
    _validate(spec, rows, seed, stack_form=form)


@pytest.mark.parametrize("tile_rows", [16, 32, 64])
def test_every_rows_form_tile(tile_rows):
    spec = {"channels": 96, "blocks": [{"hidden": 130, "activation": "silu", "norm": "rmsnorm"},
                                       {"hidden": 64, "activation": "gelu"}], "final_norm": "layernorm"}
    _validate(spec, 200, 4, stack_form="rows", stack_tile_rows=tile_rows)


@pytest.mark.parametrize("rows", [1024, 4096])
def test_the_grid_form_forced_past_decode_rows(rows):
    """Forced past 4 x DECODE_ROWS (a timing probe): many row tiles, few CTAs each, their atomic partial sums."""
    compiled = _validate(models.REPORT_MODELS[0].spec, rows, 2, stack_form="grid")
    plan = compiled.fused.plan_for(rows)
    assert plan.form == "grid" and plan.num_tiles > 1 and plan.ctas_per_tile >= 2


@pytest.mark.parametrize("tile_rows", GEMV_ROW_TILES)
@pytest.mark.parametrize("rows", [1, 5, 16])
def test_every_gemv_tile_at_rows_it_takes_at_once_and_by_row_tiles(tile_rows, rows):
    """Rows past the tile run a row tile after another in each phase; odd channels and hidden, both norms."""
    spec = {"channels": 200, "blocks": [{"hidden": 130, "activation": "gelu_erf", "norm": "rmsnorm"},
                                        {"hidden": 70, "activation": "relu", "norm": {"kind": "layernorm"}},
                                        {"hidden": 64, "activation": "silu"}], "final_norm": "layernorm"}
    compiled = _validate(spec, rows, 3, stack_form="gemv", stack_tile_rows=tile_rows)
    assert compiled.fused.plan_for(rows).form == "gemv"


@pytest.mark.parametrize("form, tile_rows, rows", [("gemv", 1, 1), ("gemv", 1, 3), ("mma", 16, 16),
                                                     ("mma", 16, 20)])
def test_hidden_values_kept_across_a_warps_phase_b_items(form, tile_rows, rows):
    """A warp's phase B items are a run of consecutive ones, slice-major, and it keeps a slice's hidden values
    from one to the next (the gemv form at one-row tiles in registers, the mma form staged in shared memory):
    hidden sizes of several slices differing per block (the kept values are dropped at each block) and 640
    channels, so that a warp has more than one item and some runs cross from one slice to the next; rows past the
    tile take a row tile after another (nothing kept)."""
    spec = {"channels": 640, "blocks": [{"hidden": 5000, "activation": "silu", "norm": "rmsnorm"},
                                        {"hidden": 2100, "activation": "gelu"},
                                        {"hidden": 700, "activation": "relu", "norm": {"kind": "layernorm"}}]}
    compiled = _validate(spec, rows, 5, stack_form=form, stack_tile_rows=tile_rows)
    assert compiled.fused.plan_for(rows).tile_rows == tile_rows


@pytest.mark.parametrize("form, tile_rows, rows", [("mma", 16, 16), ("grid", 32, 40), ("rows", 16, 200)])
def test_wide_operand_rows_normed_a_batch_of_channels_at_a_time(form, tile_rows, rows):
    """Past 16 channels a lane (512 channels a warp a row) the operand step loads a row's values, gains and biases
    a batch at a time: 1100 channels (a lane's last batch partly past the packed 1152 and the stream's 1100), both
    norms with and without biases, in every form whose warps take whole rows."""
    spec = {"channels": 1100, "final_norm": "layernorm", "blocks": [
        {"hidden": 200, "activation": "gelu", "norm": {"kind": "layernorm", "bias": True}},
        {"hidden": 130, "activation": "silu", "norm": "rmsnorm"},
        {"hidden": 64, "activation": "relu", "norm": {"kind": "layernorm", "bias": False}}]}
    compiled = _validate(spec, rows, 11, stack_form=form, stack_tile_rows=tile_rows)
    assert compiled.fused.plan_for(rows).form == form


@pytest.mark.parametrize("case", models.REPORT_MODELS, ids=lambda c: c.name)
@pytest.mark.parametrize("rows", [1, 16])
def test_report_models_in_the_gemv_form(case, rows):
    _validate(case.spec, rows, 0, stack_form="gemv")


@pytest.mark.parametrize("tile_rows", MMA_ROW_TILES)
@pytest.mark.parametrize("rows", [1, 9, 64])
def test_every_mma_tile_at_rows_it_takes_at_once_and_by_row_tiles(tile_rows, rows):
    """The mma form: rows under, at and past each tile (a row tile after another), odd channels and hidden (the
    packing's padding in every tile), both norms, every activation, gated and plain blocks in turn."""
    for gated in (False, True):
        spec = {"channels": 200, "final_norm": "layernorm", "blocks": [
            {"hidden": 130, "activation": "gelu_erf", "norm": "rmsnorm", "gated": gated},
            {"hidden": 70, "activation": "relu", "norm": {"kind": "layernorm"}, "gated": gated},
            {"hidden": 64, "activation": "silu", "gated": gated}]}
        compiled = _validate(spec, rows, 3, stack_form="mma", stack_tile_rows=tile_rows)
        assert compiled.fused.plan_for(rows).form == "mma"


@pytest.mark.parametrize("case", models.REPORT_MODELS, ids=lambda c: c.name)
@pytest.mark.parametrize("rows", [16, 64])
def test_report_models_in_the_mma_form(case, rows):
    """Each report model in the mma form where a row tile fits beside the ring; where none does (the 1B-sized
    stack's 2048 channels at 64 rows), a clear refusal at compile time, before any launch."""
    blocks, _ = frontend.read_spec(case.spec)
    plan = plan_stack(blocks, rows, planning.current_device(), form="mma")
    if isinstance(plan, StackPlan):
        _validate(case.spec, rows, 0, stack_form="mma")
        return
    assert "no row tile" in plan.reason
    with pytest.raises(PassError, match="no row tile"):
        compile_model(case.spec, rows=rows, engine="persistent-stack", stack_form="mma")


@pytest.mark.parametrize("form", ["grid", "gemv", "mma"])
def test_the_grid_barrier_words_stay_ready_over_many_launches(form):
    """The barrier's word is zeroed once: hundreds of launches, direct and replayed in a graph, each correct."""
    spec = {"channels": 128, "blocks": [{"hidden": 256, "activation": "silu", "norm": "rmsnorm"}] * 3}
    compiled = compile_model(spec, rows=4, seed=5, engine="persistent-stack", stack_form=form)
    x = torch.randn(4, 128, device="cuda").half()
    truth = stack.reference_stack(x, compiled.program.blocks, compiled.parameters)
    out = torch.empty(4, 128, device="cuda")
    for _ in range(300):
        compiled(x, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(10):
            compiled(x, out=out)
    for _ in range(30):
        graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.double(), truth, rtol=models.STACK_TOLERANCE, atol=models.STACK_TOLERANCE)


def call_checked(compiled, rows: int):
    """Call a compiled model with ``rows`` fresh rows into a poisoned output, check it against the float64 reference,
    and return the fused plan that served the call (None: the per-block chain)."""
    channels = compiled.program.blocks[0].channels
    x = torch.randn(rows, channels, device="cuda").half()
    out = torch.full((rows, channels), float("nan"), device="cuda")
    compiled(x, out=out)
    torch.cuda.synchronize()
    truth = stack.reference_stack(x, compiled.program.blocks, compiled.parameters, compiled.program.final_norm,
                                  compiled.final_parameters)
    torch.testing.assert_close(out.double(), truth, rtol=models.STACK_TOLERANCE, atol=models.STACK_TOLERANCE)
    return compiled.fused.plan_for(rows)


def test_a_gated_plan_takes_the_mma_form_to_its_rows_then_the_chain():
    """A gated stack whose weights fit the L2, compiled for the mma form's planned rows and called past them: the
    mma form on a tile holding the rows up to ``MMA_RESIDENT_ROWS``, the per-block chain past it, each call correct."""
    spec = {"channels": 128, "blocks": [{"hidden": 320, "gated": True, "norm": "rmsnorm"}] * 2}
    compiled = compile_model(spec, rows=MMA_PLANNED_ROWS, seed=3, engine="persistent-stack")
    assert compiled.program.stack.form == "mma"
    mma = ("mma", MMA_RESIDENT_ROWS)  # the tile holding the rows
    for rows, runs in [(MMA_PLANNED_ROWS + 1, mma), (MMA_RESIDENT_ROWS, mma), (MMA_RESIDENT_ROWS + 1, None)]:
        plan = call_checked(compiled, rows)
        assert (plan and (plan.form, plan.tile_rows)) == runs


@pytest.mark.parametrize("compiled_rows, form", [(1, "gemv"), (GEMV_PLANNED_ROWS + 1, "mma")])
def test_a_plan_called_past_its_forms_rows_runs_the_planned_form(compiled_rows, form):
    """Compiled for one row (the gemv form) or past the gemv form's planned rows (the mma form), called with the
    gemv form's planned rows, the mma form's and past them: each call correct, on the form planning chooses for its
    rows, past the mma form's on the per-block chain."""
    spec = {"channels": 64, "blocks": [{"hidden": 256, "activation": "silu", "norm": "rmsnorm"}] * 2}
    compiled = compile_model(spec, rows=compiled_rows, seed=2, engine="persistent-stack")
    assert compiled.program.stack.form == form
    for rows, runs in [(GEMV_PLANNED_ROWS, "gemv"), (MMA_RESIDENT_ROWS, "mma"), (MMA_RESIDENT_ROWS + 1, None),
                       (300, None)]:
        plan = call_checked(compiled, rows)
        assert (plan and plan.form) == runs


@pytest.mark.parametrize("case", models.REPORT_MODELS[:3], ids=lambda c: c.name)
@pytest.mark.parametrize("rows", [1, 16, 64])
def test_report_models_are_fused_and_pass(case, rows):
    if isinstance(plan_stack(frontend.read_spec(case.spec)[0], rows, planning.current_device()), StackPlan):
        compiled = _validate(case.spec, rows, 0)
        assert "persistent-stack" in str(compiled.plan())
    else:  # the per-block chain serves it (past the mma form's rows)
        compiled = compile_model(case.spec, rows=rows, seed=0, engine="persistent-stack")
        assert compiled.fused is None and "per-block chain was faster" in str(compiled.plan())


def test_the_1b_ffn_stack_at_decode_rows():
    _validate(models.REPORT_MODELS[3].spec, 16, 0)


def test_models_contenders_on_a_fusable_model():
    """The models section's five contenders on a small model the fused engine serves: the fused ones are not
    recorded as served by anything else, and every one passes."""
    case = models.ModelCase("small-swiglu-fused", {"channels": 128, "final_norm": "rmsnorm", "blocks": [
        {"hidden": 352, "activation": "silu", "norm": "rmsnorm", "gated": True, "bias": False}] * 2}, fits_l2=True)
    built = models.contenders(case, 16)
    assert built["persistent-stack"].served_by is None and built["persistent-stack-graph"].served_by is None
    for name, contender in built.items():
        result = validation.check(contender.problem, name, contender.call, seed=7)
        assert result["passed"] and result["replay_changed_input"], (name, result)
