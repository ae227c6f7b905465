"""The compiler's evidence: each pass accepting what it should and rejecting the rest, the
compiled output against the hand-written engine, and the fallback against the float reference.

The pass cases run on the CPU (the unit tests parametrize over ``PASS_CASES``); the two output
checks need a GPU. The report's ``compiler`` block is ``report_block()``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from .. import model, planning, validation
from ..stack import Norm
from . import passes
from .ir import TORCH_CHAIN, Block, Program

SMALL_SHAPE = model.Shape(33, 32, 64)
FALLBACK_SHAPE = model.Shape(128, 1024, 14336)
"""channels > 512 rules out persistent-tc, and 4 rows of (channels + hidden) fp32 need 245,760 bytes
(> 227 KB) so persistent's hidden tile does not fit on chip: the block falls back to persistent-global."""
COMPILER_RTOL, COMPILER_ATOL = 1e-4, 1e-5


def _program(*blocks: Block, rows: int = 33, **options) -> Program:
    return Program(blocks=tuple(blocks), rows=rows, **options)


def run_to(pass_name: str, program: Program) -> Program:
    """The program through every pass before ``pass_name``."""
    done = []
    for p in passes.PIPELINE:
        if p.name == pass_name:
            break
        done.append(p)
    return passes.run_pipeline(program, tuple(done))


def _all_refused(program: Program) -> Program:
    """A program at 'smem' whose every candidate was refused (what ChooseEngine must reject)."""
    ready = run_to("engine", program)
    blocks = []
    for b in ready.blocks:
        candidates = tuple(dataclasses.replace(c, smem=None, refusal=planning.Refusal(c.engine, "refused for the test"))
                           for c in b.candidates)
        blocks.append(dataclasses.replace(b, candidates=candidates))
    return ready.with_blocks(blocks)


RMSNORM = Norm("rmsnorm")

CRAMPED_DEVICE = planning.DeviceSpec(name="inconsistent device", sm_count=4, smem_per_block=232448, smem_per_sm=65536)
"""Claims 227 KB per block but only 64 KB per SM: no 200 KB CTA could ever be resident."""


@dataclasses.dataclass(frozen=True)
class PassCase:
    name: str
    pass_name: str
    build: Callable[[], Program]  # the program handed to the pass (earlier passes already run)
    error: str | None = None  # None: the pass must accept; else a fragment of its error message
    expect: Callable[[Program], bool] | None = None  # what an accepted program must show

    def run(self) -> str | None:
        """None when the pass behaves as expected, else what went wrong."""
        the_pass = next(p for p in passes.PIPELINE if p.name == self.pass_name)
        try:
            out = the_pass(self.build())
        except (passes.PassError, ValueError) as e:
            if self.error is not None and self.error in str(e):
                return None
            return f"{self.name}: unexpected error {type(e).__name__}: {e}"
        if self.error is not None:
            return f"{self.name}: accepted a program it must reject (expected an error with {self.error!r})"
        if self.expect is not None and not self.expect(out):
            return f"{self.name}: accepted, but the result is not what it should be: {out.describe()}"
        return None


def _gelu(c, h, **kw):
    return Block(channels=c, hidden=h, activation="gelu", **kw)


PASS_CASES = (
    PassCase("validate accepts a residual stack", "validate",
             lambda: _program(_gelu(32, 64), _gelu(32, 128, norm=RMSNORM)),
             expect=lambda p: "validated" in p.properties),
    PassCase("validate rejects a stack that changes width", "validate",
             lambda: _program(_gelu(32, 64), _gelu(48, 64)), error="must keep the width"),
    PassCase("validate rejects a non-positive norm eps", "validate",
             lambda: _program(_gelu(32, 64, norm=Norm("rmsnorm", 0.0))), error="norm eps must be a float > 0"),
    PassCase("validate rejects a weight past 32-bit indexing", "validate",
             lambda: _program(_gelu(65536, 65536), rows=1), error="65536 x 65536 weight"),
    PassCase("forms: kernel forms stay with the kernels, the others go to the torch chain with the reason", "forms",
             lambda: run_to("forms", _program(_gelu(32, 64, norm=RMSNORM), _gelu(32, 64, gated=True),
                                              Block(32, 64, "gelu_erf"), _gelu(32, 64, norm=Norm("layernorm")))),
             expect=lambda p: p.blocks[0].kernel_refusal is None
             and [b.kernel_refusal.split()[0] for b in p.blocks[1:]] == ["gated", "activation", "layernorm"]),
    PassCase("forms: a CPU target sends every block to the torch chain", "forms",
             lambda: run_to("forms", _program(_gelu(32, 64), target="cpu")),
             expect=lambda p: "need a CUDA device" in p.blocks[0].kernel_refusal),
    PassCase("forms rejects a program that was not validated", "forms",
             lambda: _program(_gelu(32, 64)), error="requires ['validated']"),
    PassCase("prologues: fp16 input used as is, norm and later blocks get prologues", "prologues",
             lambda: run_to("prologues", _program(_gelu(32, 64), _gelu(32, 64, norm=RMSNORM), _gelu(32, 64),
                                                  _gelu(32, 64, norm=Norm("layernorm", bias=True)))),
             expect=lambda p: [(b.prologue, b.residual) for b in p.blocks]
             == [("none", "float16"), ("rmsnorm", "float32"), ("cast", "float32"), ("layernorm", "float32")]),
    PassCase("prologues rejects a program whose forms were not decided", "prologues",
             lambda: run_to("forms", _program(_gelu(32, 64))), error="requires ['forms']"),
    PassCase("tiles: odd sizes get element loads on tensor cores, scalar engines tile them", "tiles",
             lambda: run_to("tiles", _program(_gelu(31, 47), rows=129)),
             expect=lambda p: p.blocks[0].candidates[0].tile.vector == 1
             and all(c.tile is not None for c in p.blocks[0].candidates)),
    PassCase("tiles: tensor cores refuse channels past their largest tile", "tiles",
             lambda: run_to("tiles", _program(_gelu(520, 64), rows=9)),
             expect=lambda p: p.blocks[0].candidates[0].refusal is not None
             and all(c.tile is not None for c in p.blocks[0].candidates[1:])),
    PassCase("tiles rejects a forced tile the requested engine cannot use", "tiles",
             lambda: run_to("tiles", _program(_gelu(32, 64), tile_rows=48)), error="does not suit persistent-tc"),
    PassCase("smem: a hidden tile too big for the chip is refused, the rest planned", "smem",
             lambda: run_to("smem", _program(_gelu(1024, 14336), rows=128)),
             expect=lambda p: [c.fits for c in p.blocks[0].candidates] == [False, False, True, True]),
    PassCase("smem rejects a forced tile that does not fit", "smem",
             lambda: run_to("smem", _program(_gelu(512, 2048), rows=16384, engine="persistent", tile_rows=4096)),
             error="the forced tile does not fit"),
    PassCase("engine: falls back along the chain and records why", "engine",
             lambda: run_to("engine", _program(_gelu(1024, 14336), rows=128)),
             expect=lambda p: p.blocks[0].chosen == "persistent-global" and len(p.blocks[0].skipped) == 2),
    PassCase("engine: a block no kernel computes is served by the torch chain, kernel blocks by the kernels", "engine",
             lambda: run_to("engine", _program(_gelu(32, 64, gated=True), _gelu(32, 64))),
             expect=lambda p: [b.chosen for b in p.blocks] == [TORCH_CHAIN, "persistent-tc"]
             and p.blocks[0].candidates == ()),
    PassCase("engine rejects a block no engine can serve", "engine",
             lambda: _all_refused(_program(_gelu(32, 64))), error="no engine of the chain can serve it"),
    PassCase("owners: persistent grid is min(tiles, resident CTAs)", "owners",
             lambda: run_to("owners", _program(_gelu(512, 2048), rows=16384)),
             expect=lambda p: p.blocks[0].plan.owners.grid
             == min(p.blocks[0].plan.tile.num_tiles, p.device.sm_count * p.blocks[0].plan.owners.occupancy)),
    PassCase("owners rejects a plan no SM could hold", "owners",
             lambda: run_to("owners", _program(_gelu(512, 2048), rows=16384, device=CRAMPED_DEVICE)),
             error="no CTA could be resident"),
    PassCase("stack: blocks of every norm and activation fused in one launch, the mma form at decode rows", "stack",
             lambda: run_to("stack", _program(_gelu(256, 1024, norm=RMSNORM),
                                              Block(256, 1000, "gelu_erf", norm=Norm("layernorm", bias=True)), rows=16,
                                              fuse=True)),
             expect=lambda p: p.stack is not None and p.stack.form == "mma" and p.stack.chunks == (16, 16)
             and p.stack_refusal is None),
    PassCase("stack: a plain stack past the mma form's rows keeps the per-block chain, with the reason", "stack",
             lambda: run_to("stack", _program(_gelu(256, 1024, norm=RMSNORM), _gelu(256, 1024), rows=48, fuse=True)),
             expect=lambda p: p.stack is None and "past the 32 a fused form takes" in p.stack_refusal),
    PassCase("stack: a gated stack past the mma form's rows keeps the per-block chain, with the reason", "stack",
             lambda: run_to("stack", _program(_gelu(256, 1024, gated=True), _gelu(256, 1024, gated=True), rows=48,
                                              fuse=True)),
             expect=lambda p: p.stack is None and "gated stack" in p.stack_refusal),
    PassCase("stack: a stack whose weights fit the L2 takes the mma form to 32 rows", "stack",
             lambda: run_to("stack", _program(_gelu(256, 1024, gated=True), _gelu(256, 1024, gated=True), rows=32,
                                              fuse=True)),
             expect=lambda p: p.stack is not None and p.stack.form == "mma" and p.stack.tile_rows == 32),
    PassCase("stack: past decode rows the per-block chain serves, with the reason", "stack",
             lambda: run_to("stack", _program(_gelu(512, 2048, norm=RMSNORM), _gelu(512, 2048), rows=4096, fuse=True)),
             expect=lambda p: p.stack is None and "per-block chain was faster" in p.stack_refusal),
    PassCase("stack: the rows form forced past decode rows, the stream tile in shared memory", "stack",
             lambda: run_to("stack", _program(_gelu(512, 2048, norm=RMSNORM), _gelu(512, 2048), rows=4096, fuse=True,
                                              stack_form="rows")),
             expect=lambda p: p.stack is not None and p.stack.form == "rows" and p.stack.forced
             and p.stack.smem_bytes <= p.device.smem_per_block),
    PassCase("stack: mixed gated and plain blocks keep the per-block chain, with the reason", "stack",
             lambda: run_to("stack", _program(_gelu(64, 128, gated=True), _gelu(64, 128), fuse=True)),
             expect=lambda p: p.stack is None and "mixed" in p.stack_refusal),
    PassCase("stack: without fuse the per-block chain is what was asked for", "stack",
             lambda: run_to("stack", _program(_gelu(64, 128))),
             expect=lambda p: p.stack is None and "per-block chain asked for" in p.stack_refusal),
    PassCase("stack rejects a forced fused form that cannot run", "stack",
             lambda: run_to("stack", _program(_gelu(2048, 128), rows=64, fuse=True, stack_form="rows",
                                              stack_tile_rows=64)),
             error="the forced fused plan cannot run"),
    PassCase("stack rejects a program without owners", "stack",
             lambda: run_to("owners", _program(_gelu(64, 128), fuse=True)), error="requires ['owners']"),
)


def run_pass_cases() -> dict:
    failures = [f for f in (case.run() for case in PASS_CASES) if f]
    return {"result": "passed" if not failures else "failed", "cases": len(PASS_CASES), "failures": failures}


# ---- GPU output checks -------------------------------------------------------------------------------

def small_output_check(seed: int = 0, shape: model.Shape = SMALL_SHAPE) -> dict:
    """The compiled single block against the hand-bound persistent-tc engine on the same inputs:
    same plan, same kernel, so the outputs must be identical."""
    import torch

    from .. import engines
    from .runner import compile_model

    compiled = compile_model({"channels": shape.channels, "blocks": [{"hidden": shape.hidden, "activation": "gelu"}]},
                             rows=shape.rows, seed=seed, engine="persistent-tc")
    params = compiled.parameters[0]
    x = model.make_input(shape.rows, shape.channels, seed=seed, device="cuda")
    ours = compiled(x)
    bound = engines.bind("persistent-tc", shape, "gelu")
    theirs = torch.empty_like(ours)
    bound.call({"x": x, **{k: params[k] for k in ("w1", "b1", "w2", "b2")}}, {"y": theirs})
    torch.cuda.synchronize()
    result = validation.error_summary(ours, theirs, COMPILER_RTOL, COMPILER_ATOL)
    result.update(engine=compiled.engines[0], hand_written=bound.served_by,
                  bitwise_equal=bool(torch.equal(ours, theirs)), shape=shape.as_dict())
    return result


def fallback_output_check(seed: int = 0) -> dict:
    """A block whose hidden tile does not fit on chip, compiled (falls back to persistent-global), on
    dyadic data (exact fp32 accumulation) against the float64 reference."""
    import torch

    from .runner import CompiledModel

    shape = FALLBACK_SHAPE
    tensors = model.make_dyadic_problem_tensors(shape, seed=seed, device="cuda")
    program = passes.plan([Block(channels=shape.channels, hidden=shape.hidden, activation="relu")], shape.rows,
                          device=planning.current_device())
    params = [{k: tensors[k] for k in ("w1", "b1", "w2", "b2")}]
    compiled = CompiledModel(program, params)
    out = compiled(tensors["x"])
    torch.cuda.synchronize()
    truth = model.reference(tensors["x"], tensors["w1"], tensors["b1"], tensors["w2"], tensors["b2"], "relu")
    result = validation.error_summary(out, truth, COMPILER_RTOL, COMPILER_ATOL)
    result.update(engine=compiled.engines[0], skipped=[r.engine for r in program.blocks[0].skipped],
                  shape=shape.as_dict(), data="dyadic grids, relu: exact fp32 accumulation")
    return result


def report_block(seed: int = 0) -> dict:
    cases = run_pass_cases()
    block = {"positive_negative_pass_tests": cases["result"], "pass_cases": cases["cases"]}
    if cases["failures"]:
        block["pass_failures"] = cases["failures"]
    for name, check in (("small_gpu_output", small_output_check), ("fallback_gpu_output", fallback_output_check)):
        try:
            block[name] = check(seed)
        except Exception as e:  # noqa: BLE001 - a failing check is reported, the report still gets written
            block[name] = {"passed": False, "error": f"{type(e).__name__}: {e}"}
    return block
