"""The sanitize command's CPU-side parts: parsing compute-sanitizer summaries, the no-GPU exit, the
record of what ran, and the driver's reach."""

import pytest
import torch

from kernellab.kernels import sanitize


def test_counts_from_tool_summaries():
    assert sanitize.parse("memcheck", "...\n========= ERROR SUMMARY: 0 errors\n") == {"errors": 0, "warnings": 0}
    assert sanitize.parse("initcheck", "========= ERROR SUMMARY: 3 errors") == {"errors": 3, "warnings": 0}
    race = "========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)\n========= ERROR SUMMARY: 0 errors"
    assert sanitize.parse("racecheck", race) == {"errors": 1, "warnings": 1}
    assert sanitize.parse("synccheck", "crashed")["errors"] is None  # no summary: not a clean run


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit")
def test_no_gpu_exits_2(capsys, tmp_path):
    assert sanitize.main(["--out", str(tmp_path)]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_the_record_names_what_ran():
    record = sanitize.provenance("cpu")
    assert record["measured_packages"] == ["kernels"]
    assert record["packages"]["kernellab-kernels"]
    assert any(name.startswith("kernels/") for name in record["sources_sha256"])
    assert "commit" in record["git"] and record["device"]["kind"] == "cpu"


def test_the_driver_reaches_streamed_rows_on_one_cta():
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    from kernellab.kernels.gpu.base import Tuning
    from kernellab.kernels.gpu.compiler import Variant, widest_vector

    plans = [Variant(op, dt, n, widest_vector(n, dt), tuning=Tuning(**knobs) if knobs else None).kernel().describe()
             for op, dt, _, n, *_, knobs in sanitize.DRIVER_CASES]
    assert any(knobs for *_, knobs in sanitize.DRIVER_CASES)  # explicit plans too, not only the ops' own
    assert any(p["tiles"] > 1 and p["cluster"] == 1 for p in plans)  # LayerNorm's 16-bit rule
    assert any(p["tiles"] > 1 and p["cluster"] > 1 for p in plans)  # rows past a cluster's registers
    assert any(p["cluster"] > 1 and p["tiles"] == 1 for p in plans)
