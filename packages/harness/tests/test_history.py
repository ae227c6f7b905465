import json

import planted
import pytest

from kernellab.harness import assemble, history
from kernellab.harness import report as report_io


def engine_report(commit: str, persistent_ms: float) -> dict:
    """A megakernel engine report in miniature: one shape, the control and one engine."""
    def summary(p50):
        return {"count": 10, "p50_ms": p50, "p95_ms": p50 * 1.1, "min_ms": p50 * 0.9, "max_ms": p50 * 1.2,
                "mean_ms": p50}
    engines = {"torch-cublas": {"stream_summary": summary(0.02), "host_summary": summary(0.03)},
               "persistent": {"stream_summary": summary(persistent_ms), "host_summary": summary(0.01)}}
    body = {"device": "NVIDIA H200", "source_commit": commit, "recorded_on": "2026-12-04",
            "development": [{"shape": {"rows": 1, "channels": 7, "hidden": 13}, "engines": engines}],
            "assessment": []}
    body["sha256"] = report_io.report_hash(body)
    return body


@pytest.fixture
def reports(tmp_path):
    root = tmp_path / "reports"
    report_io.write(planted.run_report(commit="1" * 40), root / "planted" / "affine.json")
    report_io.write(report_io.seal(assemble.comparison_report(
        planted.suite(), planted.CONFIG, planted.side(commit="2" * 40), planted.side(90.0, commit="3" * 40))),
        root / "planted" / "ab" / "affine-ab.json")
    (root / "h200").mkdir()
    (root / "h200" / "megakernel.json").write_text(json.dumps(engine_report("4" * 40, 0.005)))
    (root / "h200" / "sweep.json").write_text(json.dumps({"provenance": {}, "shapes": []}))  # not a run
    report_io.write(planted.run_report(commit="5" * 40), root / "runs" / "local.json")  # ignored by git
    return root


def test_index_reads_runs_both_sides_of_comparisons_and_engine_reports(reports, tmp_path):
    rows = history.index([reports], tmp_path)
    by_report = {}
    for r in rows:
        by_report.setdefault(r["report"], set()).add((r["commit"][0], r["side"]))
    assert by_report == {"reports/planted/affine.json": {("1", None)},
                         "reports/planted/ab/affine-ab.json": {("2", "reference"), ("3", "candidate")},
                         "reports/h200/megakernel.json": {("4", None)}}
    run = [r for r in rows if r["report"] == "reports/planted/affine.json"]
    assert len(run) == 2 * 2 * 2  # two shapes, two impls, two modes
    ours = next(r for r in run if r["impl"] == "ours" and r["case"] == "affine_64x64_fp32"
                and r["mode"] == "e2e_latency")
    assert ours["p50_us"] == pytest.approx(100.0, rel=0.01) and ours["torch_ratio"] == pytest.approx(2 / 3, rel=0.02)
    assert ours["interval_us"][0] <= ours["p50_us"] * 1.005 and ours["interval_us"][1] >= ours["p50_us"] * 0.995
    assert ours["device"] == "Planted CPU" and ours["dirty"] is False and ours["suite"] == "affine"
    candidate = [r for r in rows if r["side"] == "candidate" and r["impl"] == "ours"]
    assert all(r["torch_ratio"] == pytest.approx(0.6, rel=0.02) for r in candidate)
    engine = {(r["impl"], r["mode"]): r for r in rows if r["suite"] == "megakernel"}
    assert engine["persistent", "stream"]["p50_us"] == pytest.approx(5.0)
    assert engine["persistent", "stream"]["torch_ratio"] == pytest.approx(0.25)
    assert engine["persistent", "host"]["case"] == "1x7x13"


def test_an_edited_report_is_refused(reports, tmp_path):
    path = reports / "planted" / "affine.json"
    path.write_text(path.read_text().replace('"rounds": 5', '"rounds": 6'))
    with pytest.raises(history.HistoryError, match="affine.json: sha256 mismatch"):
        history.index([reports], tmp_path)


def test_the_store_round_trips(reports, tmp_path):
    rows = history.index([reports], tmp_path)
    store = history.write_store(rows, tmp_path / "history.jsonl")
    lines = store.read_text().splitlines()
    assert json.loads(lines[0])["schema"] == history.SCHEMA and len(lines) == len(rows) + 1
    back = history.read_store(store)
    assert [{k: r[k] for k in ("report", "commit", "case", "impl", "mode")} for r in back] == \
        [{k: r[k] for k in ("report", "commit", "case", "impl", "mode")} for r in rows]
    assert all(b["p50_us"] == pytest.approx(r["p50_us"], rel=1e-6) for b, r in zip(back, rows, strict=True))
    history.write_store(back, store)
    assert history.read_store(store) == back  # a second trip changes nothing


def test_a_store_of_another_schema_or_shape_is_refused(tmp_path):
    store = tmp_path / "h.jsonl"
    store.write_text('{"schema": "kernellab.history/0"}\n')
    with pytest.raises(history.HistoryError, match="has schema 'kernellab.history/0'; this harness reads"):
        history.read_store(store)
    store.write_text(json.dumps({"schema": history.SCHEMA}) + '\n{"report": "x"}\n')
    with pytest.raises(history.HistoryError, match="line 2: fields"):
        history.read_store(store)
    with pytest.raises(history.HistoryError, match="does not exist; build it"):
        history.read_store(tmp_path / "none.jsonl")


def test_select_filters(reports, tmp_path):
    rows = history.index([reports], tmp_path)
    assert {r["suite"] for r in history.select(rows, device="h200")} == {"megakernel"}
    picked = history.select(rows, suite="affine", case="*64x64*", impl="ours", mode="e2e_latency", commit="3")
    assert len(picked) == 1 and picked[0]["side"] == "candidate"


def test_cli_index_check_and_list(reports, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    store = str(tmp_path / "h.jsonl")
    assert history.main(["index", str(reports), "--store", store]) == 0
    assert history.main(["index", str(reports), "--store", store, "--check"]) == 0
    report_io.write(planted.run_report(commit="6" * 40), reports / "planted" / "affine-later.json")
    assert history.main(["index", str(reports), "--store", store, "--check"]) == 1
    assert "is stale" in capsys.readouterr().err
    assert history.main(["list", "--store", store, "--suite", "megakernel", "--mode", "stream"]) == 0
    out = capsys.readouterr().out
    assert "persistent" in out and "4444444444" in out and out.rstrip().endswith("2 rows")
    assert history.main(["list", "--store", str(tmp_path / "missing.jsonl")]) == 2
