"""The compiler's passes: each accepts what it should and rejects the rest with a clear message;
the IR is validated on the way in and out of every pass."""

import dataclasses

import pytest

from kernellab.megakernel import planning
from kernellab.megakernel.compiler import checks as compiler_checks
from kernellab.megakernel.compiler import ir, passes
from kernellab.megakernel.compiler.ir import Block, Program
from kernellab.megakernel.stack import Norm


@pytest.mark.parametrize("case", compiler_checks.PASS_CASES, ids=lambda c: c.name)
def test_pass_case(case):
    assert case.run() is None


def test_every_pass_has_a_positive_and_a_negative_case():
    for p in passes.PIPELINE:
        kinds = {case.error is None for case in compiler_checks.PASS_CASES if case.pass_name == p.name}
        assert kinds == {True, False}, f"pass {p.name} lacks a positive or a negative case"


def test_pipeline_declares_a_linear_order():
    have: set[str] = set()
    for p in passes.PIPELINE:
        assert p.requires <= have, p.name
        have |= p.ensures
    assert have == set(ir.PROPERTIES)


@pytest.mark.parametrize("rows,channels,hidden,split", [(33, 32, 64, 1), (1024, 128, 256, 2), (4096, 256, 1024, 2),
                                                     (16384, 512, 2048, 1)])
def test_full_pipeline_plan_matches_the_hand_bound_engine(rows, channels, hidden, split):
    """The compiler and engines.bind plan with the same functions: same plan, same kernel (hidden splits
    included, whose grid is clusters of CTAs)."""
    program = passes.plan([Block(channels, hidden, "gelu")], rows=rows, device=planning.H200)
    hand = planning.choose("persistent-tc", rows, channels, hidden, planning.H200).plan
    assert program.blocks[0].plan == hand and hand.tile.split == split
    assert program.describe()["blocks"][0]["plan"]["engine"] == "persistent-tc"


def test_ir_rejects_a_split_grid_of_partial_clusters():
    program = passes.plan([Block(128, 256, "gelu")], rows=1024, device=planning.H200)
    plan = program.blocks[0].plan
    torn = dataclasses.replace(plan, owners=dataclasses.replace(plan.owners, grid=plan.owners.grid - 1))
    with pytest.raises(ir.IRError, match="not whole clusters of 2 CTAs"):
        ir.validate(program.with_blocks([dataclasses.replace(program.blocks[0], plan=torn)]))


def test_stack_plan():
    blocks = [Block(32, 64, "gelu"), Block(32, 64, "relu", norm=Norm("rmsnorm")), Block(32, 48, "silu")]
    program = passes.plan(blocks, rows=100, engine="persistent", device=planning.H200)
    assert [(b.prologue, b.residual, b.plan.engine) for b in program.blocks] == [
        ("none", "float16", "persistent"), ("rmsnorm", "float32", "persistent"), ("cast", "float32", "persistent")]


def test_fp32_input_gets_a_cast_prologue():
    program = passes.plan([Block(16, 32, "relu")], rows=4, input_dtype="float32", device=planning.H200)
    assert (program.blocks[0].prologue, program.blocks[0].residual) == ("cast", "float32")


@pytest.mark.parametrize("program,message", [
    (Program(blocks=(), rows=4), "non-empty tuple of blocks"),
    (Program(blocks=(Block(8, 8, "gelu"),), rows=0), "rows must be an integer >= 1"),
    (Program(blocks=(Block(8, 8, "tanh"),), rows=4), "activation must be one of"),
    (Program(blocks=(Block(8, 0, "gelu"),), rows=4), "channels and hidden must be integers >= 1"),
    (Program(blocks=(Block(8, 8, "gelu"),), rows=4, engine="cublas"), "engine must be one of"),
    (Program(blocks=(Block(8, 8, "gelu"),), rows=4, input_dtype="bfloat16"), "input_dtype must be one of"),
    (Program(blocks=(Block(8, 8, "gelu"),), rows=4, properties=frozenset({"prologues"})), "prologue must be one of"),
])
def test_ir_validation_rejects_malformed_programs(program, message):
    with pytest.raises(ir.IRError, match=message):
        ir.validate(program)


def test_a_pass_cannot_hand_on_an_inconsistent_program():
    """A pass whose output breaks the IR is caught on the way out."""

    class Broken(passes.Pass):
        name = "broken"
        requires = frozenset({"engine"})
        ensures = frozenset({"owners"})

        def run(self, program):  # claims owners but plans none
            return program.with_blocks(program.blocks, *self.ensures)

    program = compiler_checks.run_to("owners", Program(blocks=(Block(32, 64, "gelu"),), rows=33))
    with pytest.raises(ir.IRError, match="has no plan for its chosen engine"):
        Broken()(program)


def test_ir_checks_the_chosen_engine_is_the_first_that_fits():
    program = compiler_checks.run_to("owners", Program(blocks=(Block(31, 47, "gelu"),), rows=129))
    program = passes.ChooseEngine()(program)
    tampered = program.with_blocks([dataclasses.replace(program.blocks[0], chosen="conventional")])
    with pytest.raises(ir.IRError, match="not the first candidate that fits"):
        ir.validate(tampered)


def test_pdl_launches_the_chains_persistent_tc_blocks_and_nothing_else():
    """``pdl`` puts programmatic dependent launch on persistent-tc's shared-memory tiles (and, through codegen, their
    prologues); the register form, the other engines of the fallback chain and a program without it keep plain
    launches, and the plans are otherwise the ones without it."""
    blocks = [Block(256, 1024, "gelu"), Block(256, 1024, "silu", norm=Norm("rmsnorm"))]
    plain = passes.plan(blocks, rows=1024, device=planning.H200)
    early = passes.plan(blocks, rows=1024, device=planning.H200, pdl=True)
    assert [b.plan.tile.pdl for b in plain.blocks] == [False, False]
    assert [b.plan.tile.pdl for b in early.blocks] == [True, True]
    registers = passes.plan([Block(32, 64, "relu")], rows=1024, device=planning.H200, pdl=True).blocks[0].plan.tile
    assert registers.registers and not registers.pdl
    for a, b in zip(plain.blocks, early.blocks, strict=True):
        assert dataclasses.replace(b.plan.tile, pdl=False) == a.plan.tile and b.plan.owners == a.plan.owners
    assert early.describe()["pdl"] and not plain.describe()["pdl"]
    fallback = [c for c in passes.plan([Block(256, 1024, "gelu")], rows=64, device=planning.H200, pdl=True,
                                       engine="persistent-tc").blocks[0].candidates if c.tile is not None]
    assert [c.tile.pdl for c in fallback] == [c.engine == "persistent-tc" for c in fallback]
    with pytest.raises(ir.IRError, match="programmatic launch is the program's"):
        ir.validate(plain.with_blocks([dataclasses.replace(
            plain.blocks[0], candidates=(dataclasses.replace(plain.blocks[0].candidates[0], tile=early.blocks[0]
                                                             .plan.tile), *plain.blocks[0].candidates[1:]))]))
    with pytest.raises(ir.IRError, match="pdl must be a bool"):
        ir.validate(Program(blocks=(Block(8, 8, "gelu"),), rows=4, pdl="yes"))


def test_codegen_needs_a_planned_program():
    from kernellab.megakernel.compiler import codegen

    with pytest.raises(passes.PassError, match="fully planned program"):
        codegen.generate(Program(blocks=(Block(8, 8, "gelu"),), rows=1))


def test_pass_cases_summary():
    summary = compiler_checks.run_pass_cases()
    assert summary == {"result": "passed", "cases": len(compiler_checks.PASS_CASES), "failures": []}
