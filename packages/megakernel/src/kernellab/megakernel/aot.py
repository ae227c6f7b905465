"""Ahead-of-time compile of every kernel variant (``nox -s build``): ``python -m kernellab.megakernel.aot``.

Works without a GPU: with ``CUTE_DSL_ARCH=sm_90a`` (set here if unset) CuTe DSL compiles against
fake tensors. A variant fixes what is compile-time (tile shape, hidden placement, residual dtype). For the
tensor-core kernels and the prologue, rows, channels, hidden and the activation are runtime values, so their
list is every kernel they can ever launch. The CUDA-core kernels (conventional, persistent, persistent-global)
are compiled for their sizes too (channels, hidden, rows per tile), so theirs is the kernels of the engine
report's shapes (``cuda_core_variants``); any other shape compiles its own on first use. The fused stack
(``persistent-stack``) fixes its padded channels, row tile, ring depth, form and gating, so its list is the
kernels of the report's models section (``stack_variants``). And the report's empty launch-floor kernel.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def variants(representative: bool = False) -> list:
    """Every variant, or (``representative``) one of each kernel class and code path: what the CI
    test compiles in a few minutes on two cores."""
    from .engines import (
        conventional,
        conventional_tc,
        floor,
        persistent,
        persistent_stack,
        persistent_tc,
        persistent_tc_registers,
        prologue,
    )
    from .planning import (
        H200,
        REGISTER_FORM_MAX,
        REGISTER_FORM_PAD,
        TC_CHANNEL_TILES,
        TC_MAX_STAGES,
        TC_MULTICASTS,
        TC_ROW_TILES,
        TC_SPLITS,
        WGMMA_ROW_TILES,
        persistent_tc_smem_bytes,
        register_form_fits,
        tc_split_fits,
    )

    if representative:
        return [
            persistent.Variant(hidden_on_chip=True, weights="smem", channels=64, hidden=128, tile_rows=4),
            persistent.Variant(hidden_on_chip=False, weights="global", channels=19, hidden=37, tile_rows=8,
                               residual="float32"),
            persistent.Variant(hidden_on_chip=True, weights="registers", channels=31, hidden=47, tile_rows=4),
            conventional.Variant("hidden", k=7, n=13, tile_rows=4),
            conventional.Variant("output", k=13, n=7, tile_rows=4),
            conventional_tc.Variant("hidden"),
            conventional_tc.Variant("output", "float32"),
            persistent_tc.Variant(TC_ROW_TILES[0], TC_CHANNEL_TILES[0]),
            persistent_tc.Variant(TC_ROW_TILES[0], TC_CHANNEL_TILES[1], stages=TC_MAX_STAGES),
            persistent_tc.Variant(TC_ROW_TILES[0], TC_CHANNEL_TILES[0], vector=1),
            persistent_tc.Variant(WGMMA_ROW_TILES[0], TC_CHANNEL_TILES[1], stages=2, mma="wgmma"),
            persistent_tc.Variant(WGMMA_ROW_TILES[1], TC_CHANNEL_TILES[0], mma="wgmma"),
            persistent_tc.Variant(TC_ROW_TILES[1], TC_CHANNEL_TILES[2], stages=2, split=2),
            persistent_tc.Variant(TC_ROW_TILES[0], TC_CHANNEL_TILES[3], split=8),
            persistent_tc.Variant(WGMMA_ROW_TILES[0], TC_CHANNEL_TILES[2], stages=2, mma="wgmma", multicast=2,
                                  loads="tma"),
            persistent_tc.Variant(WGMMA_ROW_TILES[0], TC_CHANNEL_TILES[1], stages=2, mma="wgmma", split=2,
                                  loads="tma"),
            persistent_tc.Variant(WGMMA_ROW_TILES[0], TC_CHANNEL_TILES[1], stages=2, mma="wgmma", loads="tma",
                                  overlap=True),
            persistent_tc.Variant(WGMMA_ROW_TILES[0], TC_CHANNEL_TILES[1], stages=2, mma="wgmma", split=4,
                                  loads="tma", pdl=True),  # programmatic dependent launch (forced only) on
            persistent_tc.Variant(TC_ROW_TILES[0], TC_CHANNEL_TILES[0], pdl=True),  # either load path
            persistent_tc_registers.Variant(16, 16, vector=1),
            persistent_tc_registers.Variant(48, 32, "float32"),
            prologue.Variant(norm=True, stream="float16"),
            prologue.Variant(norm=False),
            prologue.Variant(norm=True, pdl=True),  # the chain's programmatic dependent launch (compile_model(pdl=))
            prologue.Variant(norm=False, pdl=True),
            persistent_stack.Variant("rows", 32, 128, 4, gated=False),
            persistent_stack.Variant("grid", 16, 192, 8, gated=True),
            floor.Variant(),
        ]
    out = cuda_core_variants()
    for residual in ("float16", "float32"):
        out += [conventional_tc.Variant("output", residual)]
        out += [persistent_tc.Variant(rows, cols, residual, stages, vector)
                for rows in TC_ROW_TILES for cols in TC_CHANNEL_TILES for stages in range(1, TC_MAX_STAGES + 1)
                for vector in (8, 1)
                if stages == 1 or persistent_tc_smem_bytes(rows, cols, stages) <= H200.smem_per_block]
        out += [persistent_tc.Variant(rows, cols, residual, stages, mma="wgmma")
                for rows in WGMMA_ROW_TILES for cols in TC_CHANNEL_TILES for stages in range(1, TC_MAX_STAGES + 1)
                if not (rows == WGMMA_ROW_TILES[1] and cols > 256)
                and persistent_tc_smem_bytes(rows, cols, stages) <= H200.smem_per_block]
        out += [persistent_tc.Variant(rows, cols, residual, stages, mma=mma, split=split)
                for mma, row_tiles in (("mma.sync", TC_ROW_TILES), ("wgmma", WGMMA_ROW_TILES[:1]))
                for rows in row_tiles for cols in TC_CHANNEL_TILES for stages in range(1, TC_MAX_STAGES + 1)
                for split in TC_SPLITS[1:]
                if tc_split_fits(rows, cols, split)
                and persistent_tc_smem_bytes(rows, cols, stages, split=split) <= H200.smem_per_block]
        out += [persistent_tc.Variant(WGMMA_ROW_TILES[0], cols, residual, stages, mma="wgmma", multicast=m, loads="tma")
                for m in TC_MULTICASTS[1:] for cols in TC_CHANNEL_TILES for stages in range(1, TC_MAX_STAGES + 1)
                if persistent_tc_smem_bytes(WGMMA_ROW_TILES[0], cols, stages, loads="tma") <= H200.smem_per_block]
        out += [persistent_tc.Variant(WGMMA_ROW_TILES[0], cols, residual, stages, mma="wgmma", split=split,
                                      loads="tma", overlap=overlap)
                for cols in TC_CHANNEL_TILES for stages in range(1, TC_MAX_STAGES + 1) for split in TC_SPLITS
                for overlap in (False, True)
                if tc_split_fits(WGMMA_ROW_TILES[0], cols, split)
                and persistent_tc_smem_bytes(WGMMA_ROW_TILES[0], cols, stages, split, "tma", overlap)
                <= H200.smem_per_block]
        out += [persistent_tc_registers.Variant(cols, hid, residual, vector)
                for cols in range(REGISTER_FORM_PAD, REGISTER_FORM_MAX[0] + 1, REGISTER_FORM_PAD)
                for hid in range(REGISTER_FORM_PAD, REGISTER_FORM_MAX[1] + 1, REGISTER_FORM_PAD) for vector in (8, 1)
                if register_form_fits(cols, hid)]
        out += [prologue.Variant(norm=True, stream=residual)]
    out += [conventional_tc.Variant("hidden"), prologue.Variant(norm=False),
            floor.Variant()]
    return out + stack_variants()


def stack_variants() -> list:
    """The persistent-stack kernels of the report's models section: each model's plan at each row count, and the
    gemv, mma, grid and rows forms forced at the row counts each takes (the rows form at every one: it is forced
    only; the grid form to ``DECODE_ROWS``, where the forms are timed side by side)."""
    from .compiler import frontend
    from .engines import persistent_stack
    from .models import REPORT_MODELS, REPORT_ROWS
    from .planning import H200
    from .planning.stack import DECODE_ROWS, GEMV_ROWS, MMA_ROWS, StackPlan, plan_stack

    out = []
    for case in REPORT_MODELS:
        blocks, _ = frontend.read_spec(case.spec)
        for rows in REPORT_ROWS:
            plan = plan_stack(blocks, rows, H200)
            if isinstance(plan, StackPlan):
                out.append(persistent_stack.variant(plan))
            for form, most in (("gemv", GEMV_ROWS), ("mma", MMA_ROWS), ("grid", DECODE_ROWS), ("rows", None)):
                if most is None or rows <= most:
                    forced = plan_stack(blocks, rows, H200, form=form)
                    if isinstance(forced, StackPlan):
                        out.append(persistent_stack.variant(forced))
    return list(dict.fromkeys(out))


def cuda_core_variants() -> list:
    """The CUDA-core kernels of the engine report's shapes (``bench``'s development and assessment shapes), for
    both residual dtypes: each shape's planned conventional stages and persistent and persistent-global kernels,
    and the persistent kernels of every other weight placement the planner allows there."""
    from .bench import ASSESSMENT_SHAPES, DEVELOPMENT_SHAPES
    from .engines import conventional, persistent
    from .planning import H200, SCALAR_WEIGHTS, forced

    out = []
    for residual in ("float16", "float32"):
        for rows, channels, hidden in DEVELOPMENT_SHAPES + ASSESSMENT_SHAPES:
            plan = forced("conventional", rows, channels, hidden, H200)
            out += [conventional.Variant("hidden", channels, hidden, plan.tile.rows),
                    conventional.Variant("output", hidden, channels, plan.tile.rows, residual)]
            for engine in ("persistent", "persistent-global"):
                for weights in SCALAR_WEIGHTS:
                    try:
                        plan = forced(engine, rows, channels, hidden, H200, weights=weights)
                    except ValueError:  # a placement the shape does not allow
                        continue
                    out.append(persistent.Variant.of(plan, residual))
    return list(dict.fromkeys(out))  # each once: the hidden stage does not depend on the residual


def compile_all(arch: str = "sm_90a", representative: bool = False, log=None) -> list[str]:
    """Compile every variant (or the representative ones) for ``arch``; raises on the first compile
    error. Returns the names of the variants compiled."""
    os.environ.setdefault("CUTE_DSL_ARCH", arch)
    done = []
    for variant in variants(representative):
        start = time.perf_counter()
        variant.compile(arch)
        done.append(variant.name)
        if log:
            log(f"{variant.name}: {time.perf_counter() - start:.1f} s")
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernellab.megakernel.aot", description=__doc__)
    p.add_argument("--arch", default="sm_90a")
    p.add_argument("--representative", action="store_true", help="one variant per kernel class (quick)")
    args = p.parse_args(argv)
    start = time.perf_counter()
    names = compile_all(args.arch, args.representative, log=lambda line: print(line, flush=True))
    print(f"compiled {len(names)} megakernel variants for {args.arch} in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
