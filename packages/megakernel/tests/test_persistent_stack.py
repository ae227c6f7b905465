"""The fused whole-stack engine on the CPU: its planning (form, tile, ring, grid, why, refusals), the stack pass's
choice through ``compile_model``'s planning, the printed plan, and the packed parameters the kernel reads (an
emulation of the kernel's schedule over the packed tensors against the float64 reference)."""

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernellab.megakernel import models, planning, stack
from kernellab.megakernel.compiler import frontend, passes, runner
from kernellab.megakernel.compiler.ir import Block
from kernellab.megakernel.engines import stack_packing
from kernellab.megakernel.planning.stack import (
    GEMV_PLANNED_ROWS,
    GEMV_RING_STAGES,
    GEMV_ROW_TILES,
    GEMV_ROWS,
    MMA_PLANNED_ROWS,
    MMA_RESIDENT_ROWS,
    MMA_ROWS,
    MMA_SPLIT_MOST,
    STACK_TILE,
    StackPlan,
    call_plan,
    mma_split,
    plan_stack,
    rows_cost,
    rows_form_of,
    stack_smem_bytes,
)

H200 = planning.H200


def _blocks(spec):
    return frontend.read_spec(spec)[0]


def _uniform(channels, hidden, depth, **block):
    return {"channels": channels, "blocks": [{"hidden": hidden, **block} for _ in range(depth)]}


# ---- planning ---------------------------------------------------------------------------------------------

def planned_form(rows: int, gated: bool, weights_fit_l2: bool = True) -> str | None:
    """The form planning takes unforced at ``rows`` where each fits; None: the per-block chain serves."""
    if rows <= GEMV_PLANNED_ROWS:
        return "gemv"
    if rows <= (MMA_RESIDENT_ROWS if weights_fit_l2 else MMA_PLANNED_ROWS):
        return "mma"
    return None


def weights_fit_l2(blocks) -> bool:
    return sum((3 if b.gated else 2) * 2 * b.channels * b.hidden for b in blocks) <= H200.l2_bytes


@pytest.mark.parametrize("case", models.REPORT_MODELS, ids=lambda c: c.name)
def test_report_models_plan_gemv_then_mma_at_decode_rows_then_the_chain(case):
    blocks = _blocks(case.spec)
    for rows in sorted({*models.REPORT_ROWS, 24, 32, 33}):
        plan = plan_stack(blocks, rows, H200)
        expected = planned_form(rows, blocks[0].gated, weights_fit_l2(blocks))
        if expected is None:
            assert isinstance(plan, planning.Refusal) and "per-block chain was faster there" in plan.reason
            continue
        assert isinstance(plan, StackPlan), plan
        assert plan.form == expected and not plan.forced
        assert plan.smem_bytes == stack_smem_bytes(plan.form, plan.tile_rows, plan.channels_tile, plan.stages,
                                                   plan.split)
        assert plan.smem_bytes + H200.reserved_smem_per_block <= H200.smem_per_sm
        assert plan.grid <= H200.sm_count  # the grid form's barrier needs every CTA resident
        assert plan.channels_tile % STACK_TILE == 0 and plan.channels_tile >= plan.channels
        assert sum(plan.chunks) * STACK_TILE >= sum(b.hidden for b in blocks)


def test_grid_form_spreads_each_row_tile_over_the_chunks_it_has():
    plan = plan_stack(_blocks(_uniform(2048, 8192, 4, gated=True, norm="rmsnorm")), 3, H200, form="grid")
    assert (plan.form, plan.tile_rows, plan.num_tiles) == ("grid", 16, 1)
    assert plan.ctas_per_tile == 128 == plan.chunks[0]  # one chunk of 64 hidden units a CTA a block
    small = plan_stack(_blocks(_uniform(256, 1024, 4)), 64, H200, form="grid")
    assert small.tile_rows == 64 and small.num_tiles == 1  # the fewest row tiles: each streams every weight
    assert small.ctas_per_tile == 16 and small.grid == 16  # 16 chunks a block
    wide = plan_stack(_blocks(_uniform(2048, 8192, 4, gated=True)), 64, H200, form="grid")
    assert (wide.tile_rows, wide.num_tiles, wide.ctas_per_tile) == (32, 2, 66)  # a 64-row operand does not fit
    forced = plan_stack(_blocks(_uniform(256, 1024, 4)), 64, H200, form="grid", tile_rows=16)
    assert forced.num_tiles == 4 and forced.grid == 64


def test_grid_form_past_decode_rows_only_when_forced_and_while_each_tile_keeps_two_ctas():
    """Unforced, the per-block chain serves 1024 rows; forced, the grid form takes them (16 tiles of 64 rows, 8 CTAs
    each on 132 SMs) so that its atomic partial sums can be timed there, and refuses where a tile would get one CTA."""
    blocks = _blocks(_uniform(256, 1024, 4))
    assert isinstance(plan_stack(blocks, 1024, H200), planning.Refusal)
    forced = plan_stack(blocks, 1024, H200, form="grid")
    assert isinstance(forced, StackPlan) and forced.forced
    assert (forced.tile_rows, forced.num_tiles, forced.ctas_per_tile) == (64, 16, 8)
    assert forced.grid == 128 <= H200.sm_count
    many = plan_stack(blocks, 64 * (H200.sm_count // 2 + 1), H200, form="grid")
    assert isinstance(many, planning.Refusal) and "fewer than 2 CTAs" in many.reason


def test_grid_form_stages_are_the_deepest_ring_that_fits():
    plan = plan_stack(_blocks(_uniform(2048, 8192, 1)), 16, H200, form="grid")
    assert plan.stages == 8
    tight = dataclasses.replace(H200, smem_per_block=stack_smem_bytes("grid", 16, 2048, 3),
                                smem_per_sm=stack_smem_bytes("grid", 16, 2048, 3) + 1024)
    assert plan_stack(_blocks(_uniform(2048, 8192, 1)), 16, tight, form="grid").stages == 3


def test_rows_form_picks_the_cheapest_tile_and_the_largest_on_ties():
    blocks = _blocks(_uniform(512, 2048, 8, norm="rmsnorm"))
    for rows in (65, 1024, 4096, 20000):
        plan = plan_stack(blocks, rows, H200, form="rows")
        costs = {t: rows_cost(rows, t, H200) for t in (16, 32, 64)}
        assert costs[plan.tile_rows] == min(costs.values())
        assert plan.tile_rows == max(t for t, c in costs.items() if c == costs[plan.tile_rows])
    # 2048 channels: only 16-row tiles leave room for the fp32 stream tile
    assert plan_stack(_blocks(_uniform(2048, 1024, 2)), 4096, H200, form="rows").tile_rows == 16


def test_decode_rows_with_too_few_chunks_for_the_grid_form_leave_the_chain_and_say_why():
    plan = plan_stack(_blocks(_uniform(64, 64, 3)), MMA_RESIDENT_ROWS + 1, H200)
    assert isinstance(plan, planning.Refusal) and "past the 32 a fused form takes unforced" in plan.reason
    forced_tile = plan_stack(_blocks(_uniform(64, 64, 3)), MMA_RESIDENT_ROWS + 1, H200, tile_rows=64)
    assert forced_tile.form == "rows" and forced_tile.why.startswith("grid form: 1 row tiles leave fewer than 2")


def test_rows_form_refuses_a_stream_tile_that_cannot_fit():
    got = plan_stack(_blocks(_uniform(4096, 64, 1)), 4096, H200, form="rows")
    assert isinstance(got, planning.Refusal) and "rows form" in got.reason and "shared memory" in got.reason


@pytest.mark.parametrize("spec, words", [
    ({"channels": 64, "blocks": [{"hidden": 64, "gated": True}, {"hidden": 64}]}, "mixed"),
])
def test_stack_refusals_name_the_reason(spec, words):
    got = plan_stack(_blocks(spec), 16, H200)
    assert isinstance(got, planning.Refusal) and words in got.reason


def test_stack_refuses_a_cpu_target_and_an_fp32_input():
    blocks = _blocks(_uniform(64, 64, 1))
    assert "CUDA device" in plan_stack(blocks, 16, H200, target="cpu").reason
    assert "fp16 input" in plan_stack(blocks, 16, H200, input_dtype="float32").reason


def test_forced_form_and_tile_are_kept_or_refused_never_replaced():
    blocks = _blocks(_uniform(256, 1024, 2))
    plan = plan_stack(blocks, 16, H200, form="rows", tile_rows=64)
    assert (plan.form, plan.tile_rows, plan.why.startswith("rows form (forced tile)")) == ("rows", 64, True)
    too_many_tiles = 64 * (H200.sm_count // 2 + 1)  # a 64-row tile each, fewer than 2 CTAs a tile
    assert plan_stack(blocks, too_many_tiles, H200, form="grid").reason.startswith("grid form:")
    with pytest.raises(ValueError, match="form must be one of"):
        plan_stack(blocks, 16, H200, form="cluster")
    with pytest.raises(ValueError, match="tile_rows must be one of"):
        plan_stack(blocks, 16, H200, tile_rows=48)


def test_rows_fallback_of_a_grid_plan_keeps_its_packing():
    plan = plan_stack(_blocks(_uniform(1024, 2816, 2, gated=True)), 16, H200, form="grid")
    many = H200.sm_count * plan.tile_rows + 1
    fallback = rows_form_of(plan, many, H200)
    assert fallback.form == "rows"
    assert (fallback.channels_tile, fallback.chunks, fallback.gated) == (plan.channels_tile, plan.chunks, plan.gated)


@pytest.mark.parametrize("rows,tile", [(1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (16, 16)])
def test_gemv_form_takes_the_smallest_tile_holding_the_rows_and_every_sm(rows, tile):
    plan = plan_stack(_blocks(_uniform(2048, 8192, 4, gated=True, norm="rmsnorm")), rows, H200, form="gemv")
    assert (plan.form, plan.tile_rows, plan.grid, plan.threads) == ("gemv", tile, H200.sm_count, 256)
    assert plan.stages == GEMV_RING_STAGES  # room for the whole ring at 2048 channels
    assert plan.smem_bytes == stack_smem_bytes("gemv", tile, 2048, plan.stages) >= tile * 2048 * 2
    assert "gemv form" in plan.summary()


def test_gemv_ring_takes_the_most_stages_that_fit_beside_a_wide_operand():
    """The ring shrinks (down to 2 stages) where the operand tile takes the shared memory, then the tile is refused."""
    got = []
    for channels in (2048, 4096, 5120, 6144):
        plan = plan_stack(_blocks(_uniform(channels, 1024, 2, gated=True)), 16, H200, form="gemv", tile_rows=16)
        if not isinstance(plan, StackPlan):
            assert "ring of two stages" in plan.reason
            got.append(0)
            continue
        assert plan.smem_bytes == stack_smem_bytes("gemv", 16, plan.channels_tile, plan.stages) <= H200.smem_per_block
        more = stack_smem_bytes("gemv", 16, plan.channels_tile, plan.stages + 1)
        assert plan.stages == GEMV_RING_STAGES or more > H200.smem_per_block or (
            more + H200.reserved_smem_per_block > H200.smem_per_sm)
        got.append(plan.stages)
    assert got[0] == GEMV_RING_STAGES and got == sorted(got, reverse=True) and got[-1] == 0 and 2 in got


@pytest.mark.parametrize("rows,tile", [(1, 16), (16, 16), (17, 32), (33, 64), (64, 64)])
def test_mma_form_takes_the_smallest_tile_holding_the_rows(rows, tile):
    blocks = _blocks(_uniform(1024, 2816, 2, gated=True, norm="rmsnorm"))
    plan = plan_stack(blocks, rows, H200, form="mma")
    assert (plan.form, plan.tile_rows, plan.grid, plan.threads, plan.forced) == ("mma", tile, H200.sm_count, 256, True)
    assert plan.smem_bytes == stack_smem_bytes("mma", tile, 1024, plan.stages, plan.split) <= H200.smem_per_block
    assert 2 <= plan.stages <= GEMV_RING_STAGES and "mma form" in plan.summary()
    unforced = plan_stack(blocks, rows, H200)
    assert weights_fit_l2(blocks)
    if planned_form(rows, gated=True) is None:
        assert isinstance(unforced, planning.Refusal)
        return
    assert unforced.form == planned_form(rows, gated=True) and not unforced.forced
    if unforced.form == "mma":
        assert dataclasses.replace(unforced, forced=True) == plan  # the same kernel, planned or forced


def test_mma_form_refuses_past_its_rows_and_calls_past_them_run_the_rows_form():
    blocks = _blocks(_uniform(512, 2048, 4, norm="rmsnorm"))
    assert "past the 64 it takes" in plan_stack(blocks, MMA_ROWS + 1, H200, form="mma").reason
    forced = plan_stack(blocks, 16, H200, form="mma")
    assert call_plan(forced, MMA_ROWS, H200) is forced  # a tile after another up to its rows
    assert call_plan(forced, MMA_ROWS + 1, H200).form == "rows"
    wide = plan_stack(_blocks(_uniform(4096, 1024, 1, gated=True)), 64, H200, form="mma", tile_rows=64)
    assert "no row tile" in wide.reason  # a 64-row operand of 4096 channels leaves no room for the ring


def test_gemv_form_is_planned_at_decode_rows_and_refuses_a_tile_it_has_not():
    blocks = _blocks(_uniform(512, 2048, 8, norm="rmsnorm", activation="silu"))
    for rows in range(1, GEMV_PLANNED_ROWS + 1):
        planned = plan_stack(blocks, rows, H200)
        assert (planned.form, planned.forced) == ("gemv", False)
        assert planned.tile_rows == min(t for t in GEMV_ROW_TILES if t >= rows), "the smallest tile that holds them"
    assert plan_stack(blocks, GEMV_PLANNED_ROWS + 1, H200).form == "mma"
    assert plan_stack(blocks, MMA_RESIDENT_ROWS, H200).form == "mma"  # its weights (16 MB) fit the L2
    past = plan_stack(blocks, MMA_RESIDENT_ROWS + 1, H200)
    assert isinstance(past, planning.Refusal) and "per-block chain was faster there" in past.reason
    assert plan_stack(blocks, 1, H200, tile_rows=16).form == "grid", "a forced tile keeps the forms it names"
    forced = plan_stack(blocks, 4, H200, form="gemv", tile_rows=2)
    assert (forced.tile_rows, forced.forced) == (2, True)
    assert plan_stack(blocks, 4, H200, form="gemv", tile_rows=32).reason.startswith("gemv form: no row tile")
    assert "past the 16 it takes" in plan_stack(blocks, GEMV_ROWS + 1, H200, form="gemv").reason
    with pytest.raises(ValueError, match="tile_rows must be one of"):
        plan_stack(blocks, 4, H200, form="gemv", tile_rows=3)


def test_a_call_past_its_forms_rows_runs_what_planning_would_choose():
    """A model compiled for one row and called with more must not run the one-row gemv tile row after row."""
    blocks = _blocks(_uniform(512, 2048, 8, norm="rmsnorm", activation="silu"))
    planned = plan_stack(blocks, 1, H200)
    assert call_plan(planned, 1, H200) is planned
    wider = call_plan(planned, GEMV_PLANNED_ROWS, H200)  # still the gemv form, its tile holding the rows
    assert wider == plan_stack(blocks, GEMV_PLANNED_ROWS, H200) and wider.form == "gemv"
    assert wider.tile_rows == GEMV_PLANNED_ROWS and wider.chunks == planned.chunks
    assert call_plan(plan_stack(blocks, GEMV_PLANNED_ROWS, H200), 1, H200).tile_rows == GEMV_PLANNED_ROWS
    at_16 = call_plan(planned, MMA_PLANNED_ROWS, H200)
    assert at_16 == plan_stack(blocks, MMA_PLANNED_ROWS, H200) and at_16.form == "mma"
    assert at_16.chunks == planned.chunks and at_16.channels_tile == planned.channels_tile  # the same packing
    assert call_plan(at_16, GEMV_PLANNED_ROWS + 1, H200) is at_16  # its tile holds them
    assert call_plan(at_16, 1, H200) == planned  # the gemv form again under its rows
    wider_mma = call_plan(at_16, MMA_PLANNED_ROWS + 1, H200)  # weights in the L2: the mma form, a tile holding them
    assert wider_mma == plan_stack(blocks, MMA_PLANNED_ROWS + 1, H200) and (wider_mma.form, wider_mma.tile_rows) == (
        "mma", MMA_RESIDENT_ROWS)
    assert call_plan(at_16, MMA_RESIDENT_ROWS + 1, H200) is None  # past the mma form's rows: the per-block chain
    assert call_plan(planned, MMA_RESIDENT_ROWS + 1, H200) is None
    gated = plan_stack(_blocks(_uniform(512, 2048, 2, gated=True)), MMA_PLANNED_ROWS, H200)
    assert call_plan(gated, MMA_PLANNED_ROWS, H200) is gated
    wider_gated = call_plan(gated, MMA_RESIDENT_ROWS, H200)  # weights in the L2: the mma form, a tile holding the rows
    assert (wider_gated.form, wider_gated.tile_rows) == ("mma", MMA_RESIDENT_ROWS)
    assert call_plan(gated, MMA_RESIDENT_ROWS + 1, H200) is None
    streamed = plan_stack(_blocks(_uniform(2048, 8192, 4, gated=True)), MMA_PLANNED_ROWS, H200)  # 400 MB of weights
    assert streamed.form == "mma" and call_plan(streamed, MMA_PLANNED_ROWS + 1, H200) is None
    assert "past the 16 a fused form takes" in plan_stack(_blocks(_uniform(2048, 8192, 4, gated=True)),
                                                           MMA_PLANNED_ROWS + 1, H200).reason
    forced = plan_stack(blocks, 1, H200, form="gemv")
    assert call_plan(forced, GEMV_ROWS, H200) is forced  # a forced form keeps its rows, a tile after another
    assert call_plan(forced, GEMV_ROWS + 1, H200).form == "rows"
    grid = plan_stack(blocks, 16, H200, form="grid")
    assert call_plan(grid, 16 * H200.sm_count, H200) is grid
    assert call_plan(grid, 16 * H200.sm_count + 1, H200).form == "rows"


def test_gemv_launcher_sizes_the_workspace_and_falls_back_past_its_rows():
    from kernellab.megakernel.engines.persistent_stack import Launcher

    plan = plan_stack(_blocks({"channels": 100, "blocks": [{"hidden": 130}, {"hidden": 300}]}), 3, H200, form="gemv")
    launcher = Launcher(plan, {}, H200)
    ws, sync = launcher.workspace(plan, 3, "cpu")
    # three stream buffers, then each row's hidden units: 5 chunks of 64 = 320 units over rows of 128 columns
    assert tuple(ws.shape) == (3 * 3 + 3 * 3, 128) and tuple(sync.shape) == (1,) and not sync.any()
    assert launcher.grid(plan, 3) == H200.sm_count
    assert launcher.plan_for(16) is plan, "rows up to GEMV_ROWS run a row tile after another"
    assert launcher.plan_for(17).form == "rows"


# ---- the stack pass and the printed plan -----------------------------------------------------------------

def test_compile_planning_fuses_every_form_and_prints_one_launch():
    spec = {"channels": 48, "final_norm": "layernorm",
            "blocks": [{"hidden": 96, "activation": "gelu_erf", "norm": {"kind": "layernorm", "bias": True},
                        "gated": True},
                       {"hidden": 70, "activation": "silu", "norm": "rmsnorm", "gated": True, "bias": False}]}
    blocks, final = frontend.read_spec(spec)
    program = passes.plan(blocks, rows=8, final_norm=final, fuse=True)
    plan = runner.describe_plan(program)
    assert plan.form == "persistent-stack" and "mma form" in plan.form_reason
    assert [b.engine for b in plan.blocks] == ["persistent-stack"] * 2
    assert [b.why for b in plan.blocks] == ["fused: 2 hidden chunks of the one launch"] * 2
    text = str(plan)
    assert "final norm: layernorm" in text and "in the fused kernel" in text
    assert text.splitlines()[-1].startswith(f"a call of more than {MMA_RESIDENT_ROWS} rows (or any rows no fused "
                                            "form takes) runs the per-block chain: block 0 ")
    forced = runner.describe_plan(passes.plan(blocks, rows=8, final_norm=final, fuse=True, stack_form="mma"))
    assert forced.beyond is None and "per-block chain" not in str(forced)  # a forced form's calls stay fused


def test_a_refused_stack_prints_the_chain_and_why():
    blocks, final = frontend.read_spec({"channels": 64, "blocks": [{"hidden": 64, "gated": True}, {"hidden": 64}]})
    plan = runner.describe_plan(passes.plan(blocks, rows=8, fuse=True))
    assert plan.form == "per-block chain" and "not fused" in plan.form_reason and "mixed" in plan.form_reason


def test_compile_model_rejects_a_forced_stack_form_for_a_block_engine():
    with pytest.raises(ValueError, match="force the fused engine"):
        runner.compile_model(_uniform(64, 64, 1), rows=4, engine="persistent-tc", stack_form="grid", target="cpu")


def test_ir_rejects_a_bad_forced_stack_form():
    from kernellab.megakernel.compiler import ir

    with pytest.raises(ir.IRError, match="stack_form must be"):
        ir.validate(ir.Program(blocks=(Block(64, 64, "gelu"),), rows=4, stack_form="warp"))


# ---- packing: the kernel's schedule over the packed tensors, in float64 ---------------------------------------

ACTIVATION_NAMES = {code: name for name, code in stack_packing.ACT_CODES.items()}


def _norm64(s, kind, eps, weight, bias):
    if kind == 0:
        return s
    mean = s.mean(dim=-1, keepdim=True) if kind == 2 else 0.0
    centred = s - mean
    return centred * torch.rsqrt(centred.pow(2).mean(dim=-1, keepdim=True) + eps) * weight + bias


def emulate(packed: dict, plan: StackPlan, x):
    """The kernel's schedule over the packed tensors in float64: per block the operand from the meta row's norm,
    then each hidden chunk's W1 [W3] and W2 tiles, b2 once, and the final norm; only what ``meta`` says."""
    f64, c = torch.float64, plan.channels
    meta, eps = packed["meta"].tolist(), packed["eps"].tolist()
    s = x.to(f64)
    w1, w3, w2 = (packed[k][:, :c].to(f64) if k != "w2" else packed[k][:c].to(f64) for k in ("w1", "w3", "w2"))
    for i, (first, chunks, act, kind) in enumerate(meta[:-1]):
        if i > 0:
            s = s.to(torch.float32).to(f64)
        u = _norm64(s, kind, eps[i], packed["norm_w"][i, :c].to(f64), packed["norm_b"][i, :c].to(f64))
        u = u.to(torch.float16).to(f64)
        out = packed["b2"][i, :c].to(f64).expand_as(s).clone()
        for g in range(first, first + chunks):
            units = slice(g * STACK_TILE, (g + 1) * STACK_TILE)
            h = stack.activation_float64(ACTIVATION_NAMES[act], u @ w1[units].T + packed["b1"][units].to(f64))
            if plan.gated:
                h = h * (u @ w3[units].T + packed["b3"][units].to(f64))
            out = out + h.to(torch.float16).to(f64) @ w2[:, units].T
        s = s + out
    kind = meta[-1][3]
    if kind:
        s = _norm64(s.to(torch.float32).to(f64), kind, eps[-1], packed["norm_w"][-1, :c].to(f64),
                    packed["norm_b"][-1, :c].to(f64))
    return s


@st.composite
def uniform_stacks(draw):
    gated = draw(st.booleans())
    blocks = [{"hidden": draw(st.integers(1, 200)), "activation": draw(st.sampled_from(stack.STACK_ACTIVATIONS)),
               "norm": draw(st.sampled_from([None, "rmsnorm", {"kind": "layernorm", "bias": True},
                                             {"kind": "layernorm", "bias": False}])),
               "gated": gated, "bias": draw(st.booleans())} for _ in range(draw(st.integers(1, 4)))]
    spec = {"channels": draw(st.integers(1, 150)), "blocks": blocks}
    if draw(st.booleans()):
        spec["final_norm"] = draw(st.sampled_from(["rmsnorm", "layernorm"]))
    return spec


@settings(max_examples=40, deadline=None)
@given(spec=uniform_stacks(), rows=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_packed_parameters_compute_the_stack(spec, rows, seed):
    """What the kernel reads (offsets, padding, biases, norms, codes) computes the reference stack."""
    source = frontend.from_spec(spec, seed=seed)
    plan = plan_stack(source.blocks, rows, H200)
    if not isinstance(plan, StackPlan):  # the chain serves these rows unforced: the rows form packs as any form
        plan = plan_stack(source.blocks, rows, H200, form="rows")
    packed = stack_packing.pack(source.blocks, source.parameters, source.final_norm, source.final_parameters, plan,
                                "cpu")
    x = torch.randn(rows, spec["channels"], generator=torch.Generator().manual_seed(seed)).half()
    truth = stack.reference_stack(x, source.blocks, source.parameters, source.final_norm, source.final_parameters)
    torch.testing.assert_close(emulate(packed, plan, x), truth, rtol=1e-3, atol=1e-3)


def test_packing_pads_with_zeros_and_records_the_meta():
    spec = {"channels": 70, "final_norm": "rmsnorm",
            "blocks": [{"hidden": 65, "activation": "gelu_erf", "norm": {"kind": "layernorm", "bias": True}},
                       {"hidden": 64, "activation": "relu"}]}
    source = frontend.from_spec(spec, seed=1)
    plan = plan_stack(source.blocks, 4, H200)
    packed = stack_packing.pack(source.blocks, source.parameters, source.final_norm, source.final_parameters, plan,
                                "cpu")
    assert packed["w1"].shape == (3 * STACK_TILE, 128) and packed["w2"].shape == (128, 3 * STACK_TILE)
    assert packed["meta"].tolist() == [[0, 2, stack_packing.ACT_CODES["gelu_erf"], 2],
                                       [2, 1, stack_packing.ACT_CODES["relu"], 0], [0, 0, 0, 1]]
    assert not packed["w1"][65:128].any() and not packed["w1"][:, 70:].any() and not packed["w2"][70:].any()
    assert packed["w3"] is packed["w1"]  # a plain stack reads no gate
    assert packed["eps"][0] == source.blocks[0].norm.eps


def test_a_forced_form_is_marked_forced_and_a_planned_one_not():
    blocks = _blocks(_uniform(256, 1024, 2))
    assert not any(plan_stack(blocks, rows, H200).forced for rows in (1, 16, 32))
    assert plan_stack(blocks, 16, H200, tile_rows=16).forced  # a forced tile is kept by calls as a forced form
    assert all(plan_stack(blocks, rows, H200, form=form).forced for rows, form in ((1, "gemv"), (16, "grid"),
                                                                                   (1024, "rows")))


@settings(max_examples=200, deadline=None)
@given(channel_blocks=st.integers(1, 300), slices=st.integers(1, 80), ctas=st.integers(1, 150),
       split=st.sampled_from([1, 2, 4, 8]))
def test_mma_phase_b_items_by_cta_cover_each_tile_and_slice_once(channel_blocks, slices, ctas, split):
    """The mma form's phase B with ``split`` > 1 (``StackMma.slice_run``, ``slice_item``, ``group_slice``): a CTA's
    warps share one run of (channel tile, slice group) items, each warp its slice of the group, so every (channel
    tile, slice) is taken once and the CTA's warps meet once an item; with ``split`` 1 a warp's own run."""
    from kernellab.megakernel.engines.persistent_stack import Variant
    from kernellab.megakernel.engines.persistent_stack_gemv import StackGemv
    from kernellab.megakernel.engines.persistent_stack_mma import StackMma

    form = StackMma(Variant("mma", 16, 256, 2, False, split))
    warps = form.warps
    seen, taken = set(), 0
    for cta in range(ctas):
        runs = [form.slice_run(channel_blocks, slices, cta * warps + w, ctas * warps) for w in range(warps)]
        if split > 1:
            assert len(set(runs)) == 1  # every warp of the CTA the same items: they sync once an item
        for w, (first, items) in enumerate(runs):
            for m in range(items):
                block, k = StackGemv.slice_item(form, first, m, channel_blocks)
                if split > 1:
                    k = form.group_slice(k, w)
                    if k >= slices:  # the last group's warps past the block's slices add nothing
                        continue
                assert 0 <= block < channel_blocks and 0 <= k < slices and (block, k) not in seen
                seen.add((block, k))
                taken += 1
    assert taken == len(seen) == channel_blocks * slices


@settings(max_examples=200, deadline=None)
@given(channel_blocks=st.integers(1, 300), slices=st.integers(1, 50), all_warps=st.integers(1, 1200))
def test_phase_b_runs_cover_each_item_once_and_mostly_keep_a_slice(channel_blocks, slices, all_warps):
    """The fused stack's phase B items (``StackGemv.slice_run``, ``slice_item``): each warp's run is consecutive
    items, slice-major, so the runs cover every (channel block, slice) once and a run of n items spans at most
    n // channel_blocks + 2 slices (each a load of hidden values for the warp)."""
    from kernellab.megakernel.engines.persistent_stack import Variant
    from kernellab.megakernel.engines.persistent_stack_gemv import StackGemv

    form = StackGemv(Variant("gemv", 1, 256, 4, False))
    seen, taken = set(), 0
    for warp in range(all_warps):
        first, items = form.slice_run(channel_blocks, slices, warp, all_warps)
        run = [form.slice_item(first, m, channel_blocks) for m in range(items)]
        assert all(0 <= block < channel_blocks and 0 <= k < slices for block, k in run)
        assert len({k for _, k in run}) <= items // channel_blocks + 2
        seen.update(run)
        taken += items
    assert taken == len(seen) == channel_blocks * slices


@pytest.mark.parametrize("tile_rows, split", [(1, 8), (2, 4), (4, 2), (8, 1), (16, 1)])
def test_the_gemv_forms_operand_spreads_rows_fewer_than_warps_over_them(tile_rows, split):
    """Each of a gemv tile's rows takes warps // tile_rows warps for its operand (their sums meet in a float a
    warp of shared memory, which the plan counts: the final norm's rows, a CTA each, use it too); the mma form's
    tiles have more rows than warps."""
    from kernellab.megakernel.engines.persistent_stack import Variant
    from kernellab.megakernel.engines.persistent_stack_gemv import StackGemv
    from kernellab.megakernel.engines.persistent_stack_mma import StackMma

    form = StackGemv(Variant("gemv", tile_rows, 2048, 4, True))
    assert (form.warps, form.row_split) == (8, split)
    operand_and_ring = -(-tile_rows * 2048 * 2 // 1024) * 1024 + 4 * 8 * 32 * 8 * 16
    assert stack_smem_bytes("gemv", tile_rows, 2048, 4) == operand_and_ring + 4 * 8
    assert StackMma(Variant("mma", 16, 2048, 4, True)).row_split == 1


@pytest.mark.parametrize("case, split", [("mlp4-c256-h1024-gelu", 4), ("mlp8-c512-h2048-rms-silu", 8),
                                         ("swiglu2-c1024-h2816-final-norm", 4), ("swiglu4-c2048-h8192-1b-ffn", 2)])
def test_mma_plans_split_each_unit_tile_over_the_warps_the_grid_has_to_spare(case, split):
    """At 16 rows the report models' unit tiles (16 hidden units) are fewer than the grid's warps: the mma plan
    gives each tile the most warps of a CTA (a power of two up to the tile's chunks) that still take the widest
    block's tiles in one round, and counts their partial sums' shared memory."""
    spec = next(c for c in models.REPORT_MODELS if c.name == case).spec
    plan = plan_stack(_blocks(spec), 16, H200)
    assert (plan.form, plan.split) == ("mma", split)
    tiles = max(plan.chunks) * STACK_TILE // 16
    warps = H200.sm_count * 8
    assert tiles * split <= warps and split <= min(MMA_SPLIT_MOST, plan.channels_tile // STACK_TILE)
    assert split == MMA_SPLIT_MOST or tiles * split * 2 > warps or split * 2 > plan.channels_tile // STACK_TILE
    partials = 8 * 16 * 16 * 2 * 4  # a warp's (rows x 16) sums of W1 and W3, fp32
    assert plan.smem_bytes == stack_smem_bytes("mma", 16, plan.channels_tile, plan.stages) + partials
    assert f"{split} warps per phase A unit tile" in plan.summary()
    assert stack_smem_bytes("gemv", 1, 256, 4, split=4) == stack_smem_bytes("gemv", 1, 256, 4)  # mma only


def test_mma_split_is_one_where_the_tiles_fill_the_warps_or_its_sums_would_cost_a_stage():
    device = dataclasses.replace(H200, sm_count=8)  # 64 warps against the tiles of 1024 hidden units
    assert mma_split((16,) * 4, 256, device) == 1
    assert mma_split((16,) * 4, 64, H200) == 1  # one 64-column chunk: nothing to share
    wide = plan_stack(_blocks(_uniform(2688, 1024, 2, gated=True)), 16, H200)  # 4 stages fill the CTA's memory
    assert (wide.form, wide.stages, wide.split) == ("mma", 4, 1)
    assert wide.smem_bytes == stack_smem_bytes("mma", 16, 2688, 4)
    assert mma_split(wide.chunks, 2688, H200) > 1


@pytest.mark.parametrize("units, cols, split, ctas", [(1024, 256, 4, 132), (2816, 1024, 4, 132), (8192, 2048, 2, 132),
                                                      (2816, 1024, 4, 7), (320, 960, 8, 3), (64, 128, 2, 5)])
def test_mma_split_items_take_every_chunk_of_every_unit_tile_once(units, cols, split, ctas):
    """The mma form's phase A items with ``split`` warps a unit tile: over every warp of the grid, each (unit tile,
    chunk) pair of the block is taken once (the rest are past the block: no copy, no write); every warp of a CTA
    has the same count, a whole number of rounds of ``batches`` items (they meet in ``finish_unit``'s CTA syncs);
    a tile's warps are consecutive in one CTA, its first the writer."""
    from kernellab.megakernel.engines.persistent_stack import Variant
    from kernellab.megakernel.engines.persistent_stack_mma import StackMma

    form = StackMma(Variant("mma", 16, cols, 2, True, split))
    k_tiles, tiles = cols // STACK_TILE, -(-units // 16)
    all_warps, taken = ctas * form.warps, []
    for cta in range(ctas):
        counts = set()
        for warp in range(form.warps):
            first_warp = cta * form.warps + warp
            items = form.unit_items(units, first_warp, all_warps)
            counts.add(items)
            assert items % form.batches == 0
            for m in range(items):
                t, k = form.unit_block_of(first_warp, all_warps, m), form.chunk_of(first_warp, m)
                assert t == form.unit_block_of(first_warp - warp % split, all_warps, m)  # the group's writer's tile
                if t < tiles and k < k_tiles:
                    taken.append((t, k))
        assert len(counts) == 1
    assert sorted(taken) == [(t, k) for t in range(tiles) for k in range(k_tiles)]

