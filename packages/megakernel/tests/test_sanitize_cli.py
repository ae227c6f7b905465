"""The sanitize command's CPU-side parts: parsing compute-sanitizer summaries, the no-GPU exit."""

import pytest
import torch

from kernellab.megakernel import planning, sanitize


def test_counts_from_tool_summaries():
    assert sanitize.count("memcheck", "...\n========= ERROR SUMMARY: 0 errors\n") == {"errors": 0}
    assert sanitize.count("initcheck", "========= ERROR SUMMARY: 3 errors") == {"errors": 3}
    race = "========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)"
    assert sanitize.count("racecheck", race) == {"hazards": 2, "errors": 1, "warnings": 1}
    assert sanitize.count("synccheck", "crashed") == {"errors": None}  # no summary: not a clean run


def test_cases_reach_every_kernel_variant():
    plans = [planning.forced(engine, *shape, planning.H200, **choices)
             for _, engine, shape, choices in sanitize.cases()]
    seen = {(p.engine, p.smem.weights, p.owners.tiles_per_cta > 1) for p in plans}
    for engine in ("persistent", "persistent-global"):
        assert {(engine, weights) for weights in planning.SCALAR_WEIGHTS} <= {(e, w) for e, w, _ in seen}
        assert any(e == engine and multi for e, _, multi in seen)
    assert {p.engine for p in plans} == set(planning.KERNEL_ENGINES)
    assert any(p.engine == "persistent-tc" and p.tile.rows == 64 and p.hidden % 64 for p in plans)
    multicast = [p for p in plans if p.tile.multicast > 1]  # a CTA runs an empty tile beside its peer
    assert any(p.owners.grid * p.owners.tiles_per_cta > p.tile.num_tiles for p in multicast)
    assert any(p.owners.tiles_per_cta > 1 for p in multicast)


def test_stack_cases_reach_every_form_every_row_tile_and_both_gatings():
    from kernellab.megakernel.compiler import frontend, passes

    plans = []
    for _, spec, rows, forced in sanitize.stack_cases():
        assert forced["engine"] == "persistent-stack"  # compile_model's opt-in
        blocks, final = frontend.read_spec(spec)
        stack_plan = {k: v for k, v in forced.items() if k != "engine"}
        plans.append(passes.plan(blocks, rows, final_norm=final, fuse=True, **stack_plan).stack)
    assert {p.form for p in plans} == {"rows", "grid", "gemv", "mma"}
    assert {p.tile_rows for p in plans if p.form == "rows"} == {16, 32, 64}
    assert {p.gated for p in plans} == {True, False}
    assert any(p.form == "rows" and p.num_tiles > p.grid for p in plans)  # a CTA runs several row tiles
    assert any(p.form == "grid" and p.num_tiles > 1 for p in plans)
    assert {p.tile_rows for p in plans if p.form == "grid"} == {16, 64}
    assert {p.tile_rows for p in plans if p.form == "gemv"} == {1, 4}
    assert any(p.form == "gemv" and p.rows > p.tile_rows for p in plans)  # row tiles one after another
    assert any(p.form == "gemv" and p.gated for p in plans)
    assert any(p.form == "mma" and p.rows > p.tile_rows and p.gated for p in plans)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit")
def test_no_gpu_exits_2(capsys, tmp_path):
    assert sanitize.main(["--out", str(tmp_path)]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_the_record_names_what_ran():
    record = sanitize.provenance("cpu")
    assert record["measured_packages"] == ["megakernel"]
    assert record["packages"]["kernellab-megakernel"]
    assert any(name.startswith("megakernel/") for name in record["sources_sha256"])
    assert "commit" in record["git"] and record["device"]["kind"] == "cpu"


def test_cases_filter_keeps_matching_labels_and_refuses_no_match(capsys, tmp_path):
    labels = [c[0] for c in sanitize.cases()] + [c[0] for c in sanitize.stack_cases()]
    mma = [label for label in labels if sanitize.wanted(label, "mma form")]
    assert mma and all("mma form" in label for label in mma) and len(mma) < len(labels)
    assert all(sanitize.wanted(label, None) for label in labels)
    assert sanitize.main(["--out", str(tmp_path), "--cases", "no such kernel"]) == 2
    assert "matches no case label" in capsys.readouterr().err
