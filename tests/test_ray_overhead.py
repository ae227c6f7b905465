"""tools/ray_overhead.py: pairs in alternating order, Ray's start-up left out of the ratio, a record
whose hash covers it. The benches are replaced by fixed numbers: this tests the bookkeeping, not Ray."""

import json

import pytest


def test_pairs_alternate_and_the_start_up_is_left_out(load_tool, tmp_path, monkeypatch):
    pytest.importorskip("ray", reason="the tool refuses to run without Ray")
    from kernellab.harness import report

    tool = load_tool("ray_overhead")
    calls = []

    def fake_bench(common, out, on_ray):
        calls.append("ray" if on_ray else "single")
        rep = {"sha256": f"h{len(calls)}", "cases": [{"id": "p/torch"}, {"id": "p/native"}],
               "provenance": {"cluster": {"ray_startup_s": 3.0, "run_s": 9.5, "nodes": ["vm"]}} if on_ray else {}}
        out.write_text(json.dumps(rep))
        return (14.0 if on_ray else 10.0), rep  # the cluster run: 11 s once its 3 s start-up is taken out

    monkeypatch.setattr(tool, "bench", fake_bench)
    assert tool.main(["--pairs", "3", "--out", str(tmp_path), "--cases", "p"]) == 0
    assert calls == ["single", "ray", "ray", "single", "single", "ray"]
    record = json.loads((tmp_path / "ray-overhead.json").read_text())
    assert [p["ratio"] for p in record["pairs"]] == [pytest.approx(1.1)] * 3
    assert record["pairs"][0]["ray_startup_s"] == 3.0 and record["pairs"][1]["order"] == ["ray", "single"]
    assert record["meets_target"] is True and record["cases"] == ["p/native", "p/torch"]
    assert record["sha256"] == report.report_hash(record)


def test_show_prints_a_record_as_a_table_without_ray(load_tool, tmp_path, capsys):
    """--show is what the reports' generated block runs: each pair, then the median against the target."""
    tool = load_tool("ray_overhead")
    pairs = [{"order": ["single", "ray"], "single_s": 100.0, "ray_s": 120.0, "ray_startup_s": 2.5, "ratio": 1.2},
             {"order": ["ray", "single"], "single_s": 100.0, "ray_s": 110.0, "ray_startup_s": 2.0, "ratio": 1.1}]
    path = tmp_path / "ray-overhead.json"
    path.write_text(json.dumps({"pairs": pairs, "ratio_median": 1.15, "ratio_range": [1.1, 1.2],
                                "target_ratio": 1.15, "meets_target": True}))
    capsys.readouterr()
    assert tool.main(["--show", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "| 1 | single then ray | 100.0 | 120.0 | 2.5 | 1.200 |"
    assert lines[3] == "| 2 | ray then single | 100.0 | 110.0 | 2.0 | 1.100 |"
    assert lines[-1] == "median ratio 1.150 (range 1.100-1.200), target <= 1.15: met"


def test_a_failing_bench_stops_the_tool(load_tool, tmp_path, monkeypatch):
    pytest.importorskip("ray", reason="the tool refuses to run without Ray")
    tool = load_tool("ray_overhead")
    with pytest.raises(SystemExit, match="exited 2"):
        tool.bench(["--suite", "no-such-suite"], tmp_path / "x.json", False)
    with pytest.raises(SystemExit):
        tool.main(["--pairs", "0", "--out", str(tmp_path)])
