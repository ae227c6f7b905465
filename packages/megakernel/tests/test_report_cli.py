"""The report command's CPU-side parts: arguments, the no-GPU exit, targets, the table, sealing."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kernellab.harness import report as report_io
from kernellab.megakernel import bench, report


def test_shape_and_engine_selection():
    both = report._shape_list(None)
    assert len(both) == len(bench.DEVELOPMENT_SHAPES) + len(bench.ASSESSMENT_SHAPES)
    assert report._shape_list("assessment") == [("assessment", s) for s in bench.ASSESSMENT_SHAPES]
    assert report._shape_list("5x19x37,3x4x5") == [("assessment", (5, 19, 37)), ("development", (3, 4, 5))]
    assert report._engine_list("persistent*") == ["persistent", "persistent-global", "persistent-graph",
                                                  "persistent-global-graph", "persistent-tc", "persistent-tc-graph"]
    with pytest.raises(SystemExit):
        report._shape_list("4x4")
    with pytest.raises(SystemExit):
        report._engine_list("cudnn")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit")
def test_no_gpu_exits_2_with_a_message(capsys):
    assert report.main(["--out", "/tmp/never-written.json"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def _entry(p50_us, passed=True):
    s = {"count": 3, "p50_ms": p50_us / 1e3, "p95_ms": 0, "min_ms": 0, "max_ms": 0, "mean_ms": 0}
    return {"passed": passed, "replay_changed_input": passed, "stream_summary": s, "host_summary": s}


def test_targets_and_table():
    sections = {"development": [{"shape": {"rows": 1, "channels": 7, "hidden": 13}, "engines": {
        "persistent": _entry(20), "torch-cublas": _entry(100), "persistent-graph": _entry(4),
        "persistent-tc-graph": _entry(3), "torch-cublas-graph": _entry(12), "torch-compile-graph": _entry(3.5)}}],
        "assessment": [{"shape": {"rows": 5, "channels": 19, "hidden": 37}, "engines": {
            "persistent-graph": _entry(5, passed=False), "torch-cublas-graph": _entry(12)}}]}
    targets = report._targets(sections)
    first = targets[0]
    assert first["best_persistent_graph_vs_torch_cublas_graph"] == {"ratio": 0.25, "target": 0.5, "met": True}
    assert first["best_persistent_graph_vs_torch_compile_graph"]["met"] is False  # 3 / 3.5 > 0.8
    assert first["persistent_vs_torch_cublas"]["ratio"] == pytest.approx(0.2)
    assert targets[1] == {"shape": {"rows": 5, "channels": 19, "hidden": 37}}  # a failed engine is no evidence
    table = report._table(sections)
    assert "1x7x13" in table and "5x19x37*" in table and "5.0 FAIL" in table


def _floor_block(direct_us, graph_us):
    """The launch_floor block the report builds from these stream samples (host samples the same)."""
    run = SimpleNamespace(floor_error=None, floor_samples={"direct": {"stream": direct_us, "host": direct_us},
                                                          "graph": {"stream": graph_us, "host": graph_us}})
    return report.Run.launch_floor(run)


def test_launch_floor_block_and_its_line_under_the_table(tmp_path, capsys):
    sections = {"development": [{"shape": {"rows": 1, "channels": 7, "hidden": 13},
                                 "engines": {"persistent-tc-graph": _entry(3)}}], "assessment": []}
    floor = _floor_block([2.3, 2.1, 1.9], [0.8, 0.9, 1.2])
    assert set(floor) == {"what", "stream_summary", "host_summary", "graph_summary", "graph_host_summary"}
    for key in ("stream_summary", "host_summary", "graph_summary", "graph_host_summary"):
        assert set(floor[key]) == set(_entry(1)["stream_summary"]) and floor[key]["count"] == 3  # an engine's
    assert floor["stream_summary"]["p50_ms"] == pytest.approx(2.1e-3)
    assert floor["graph_summary"]["max_ms"] == pytest.approx(1.2e-3)

    assert report.show(str(report.seal_and_write({**sections, "launch_floor": floor}, tmp_path / "new.json")),
                       "simple") == 0
    lines = capsys.readouterr().out.splitlines()
    assert "1x7x13" in lines[1] and "3.0" in lines[3]  # the table (title, heading, rule, row), then the floor
    assert lines[-1] == "launch floor (empty kernel): 2.1 us on the stream, 0.9 us in a CUDA graph"

    assert report.show(str(report.seal_and_write(sections, tmp_path / "old.json")), "simple") == 0
    out = capsys.readouterr().out
    assert "3.0" in out and "launch floor" not in out  # a report from before the floor: the table alone

    other = tmp_path / "floor-probes.json"  # JSON of another tool (sealed or not) is named as such, not as tampered
    for body in ({"shape": [1, 7, 13], "p50_us": {}}, [1, 2]):
        other.write_text(json.dumps(body))
        assert report.show(str(other), "simple") == 1
        assert "not an engine report" in capsys.readouterr().err
    assert report.show(str(report.seal_and_write({"shape": [1, 7, 13]}, other)), "simple") == 1
    assert "not an engine report" in capsys.readouterr().err

    failed = {"what": report.FLOOR_WHAT, "error": "ImportError: no cutlass"}
    assert report.floor_line({**sections, "launch_floor": failed}) == \
        "launch floor (empty kernel): not measured: ImportError: no cutlass"


def test_seal_and_write_uses_the_harness_hash(tmp_path):
    path = report.seal_and_write({"b": 1.5, "a": [float("nan")]}, tmp_path / "r.json")
    body = json.loads(path.read_text())
    assert body["a"] == [None]
    assert body["sha256"] == report_io.report_hash(body)


def test_merge_keeps_earlier_results_unless_remeasured():
    previous = {"development": [{"shape": {"rows": 1, "channels": 7, "hidden": 13},
                                 "engines": {"persistent": _entry(20), "torch-compile": _entry(9)}}],
                "assessment": [{"shape": {"rows": 5, "channels": 19, "hidden": 37},
                                "engines": {"torch-compile": _entry(8)}}]}
    results = {((1, 7, 13), "persistent"): _entry(10), ((5, 19, 37), "conventional"): _entry(30)}
    kinds = {(1, 7, 13): "development", (5, 19, 37): "assessment"}
    sections = report.merge_sections(results, kinds, previous)
    dev = sections["development"][0]["engines"]
    assert list(dev) == ["persistent", "torch-compile"]  # report order
    assert dev["persistent"]["stream_summary"]["p50_ms"] == 0.010  # re-measured
    assert dev["torch-compile"]["stream_summary"]["p50_ms"] == 0.009  # kept
    assert set(sections["assessment"][0]["engines"]) == {"conventional", "torch-compile"}


def test_provenance_hashes_the_engine_and_harness_sources():
    prov = report._provenance()
    wanted = {"megakernel/report.py", "megakernel/engines/persistent_tc.py", "harness/timing.py"}
    assert wanted <= set(prov["source_sha256"])
    assert all(len(h) == 64 for h in prov["source_sha256"].values())


def test_relative_times_and_the_picture(tmp_path):
    pytest.importorskip("matplotlib")
    sections = {"development": [{"shape": {"rows": 1, "channels": 7, "hidden": 13}, "engines": {
        "persistent-tc-graph": _entry(3), "torch-cublas-graph": _entry(12), "persistent-graph": _entry(6, False)}}],
        "assessment": [{"shape": {"rows": 5, "channels": 19, "hidden": 37}, "engines": {
            "persistent-tc-graph": _entry(5), "torch-cublas-graph": _entry(10)}}]}
    assert report.relative(sections, "persistent-tc-graph", "torch-cublas-graph") == [0.25, 0.5]
    assert report.relative(sections, "persistent-graph", "torch-cublas-graph") == [None, None]  # failed; absent
    data = {**sections, "targets": report._targets(sections), "device": "test"}
    path = report.draw(data, tmp_path / "r.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _partial_run(tmp_path, monkeypatch, rounds_done):
    """A report as a checkpoint writes it: one shape validated, ``rounds_done`` rounds timed."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "test device")
    args = report.parser().parse_args(["--rounds", "3", "--sanitizers", str(tmp_path / "absent.json")])
    floor = {"stream": [1.5] * rounds_done, "host": [2.0] * rounds_done}
    run = SimpleNamespace(args=args, shapes=[("development", (1, 7, 13))],
                          results={((1, 7, 13), "persistent"): _entry(4) if rounds_done else
                                   {"passed": True, "replay_changed_input": True}},
                          launch_floor=lambda: report.Run.launch_floor(SimpleNamespace(
                              floor_error=None, floor_samples={"direct": floor, "graph": floor})))
    progress = {"shapes": 11, "shapes_validated": 1, "rounds": 3, "rounds_done": rounds_done}
    return report.build_report(run, None, partial=progress)


def test_a_checkpoint_is_marked_partial_and_shown_so(tmp_path, monkeypatch, capsys):
    validated = _partial_run(tmp_path, monkeypatch, rounds_done=0)
    assert validated["partial"] == {"shapes": 11, "shapes_validated": 1, "rounds": 3, "rounds_done": 0}
    assert "compiler" not in validated  # the compiler checks run once, at the end
    assert validated["launch_floor"]["error"] == "not timed yet (the report is partial)"
    path = report.seal_and_write(validated, tmp_path / "partial.json")
    assert report.show(str(path), "simple") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("PARTIAL report (the run stopped before its end): 1 of 11 shapes validated, "
                        "0 of 3 rounds timed")
    assert lines[-1] == "launch floor (empty kernel): not measured: not timed yet (the report is partial)"

    timed = _partial_run(tmp_path, monkeypatch, rounds_done=1)
    assert timed["development"][0]["engines"]["persistent"]["stream_summary"]["p50_ms"] == 0.004
    assert timed["launch_floor"]["stream_summary"]["p50_ms"] == pytest.approx(1.5e-3)
    assert report.partial_line(timed).endswith("1 of 3 rounds timed")
    assert report.partial_line({"development": []}) is None


def test_resume_is_checked_before_any_gpu_work(tmp_path, monkeypatch, capsys):
    partial = report.seal_and_write(_partial_run(tmp_path, monkeypatch, rounds_done=1), tmp_path / "p.json")
    complete = report.seal_and_write({"rounds": 3, "samples_per_round": 50, "development": []}, tmp_path / "c.json")
    tampered = tmp_path / "tampered.json"
    tampered.write_text(complete.read_text().replace('"rounds": 3', '"rounds": 4'))
    cases = [(["--resume", str(tmp_path / "none.json")], "cannot read a report there"),
             (["--resume", str(tampered)], "sha256 mismatch"),
             (["--resume", str(partial), "--rounds", "3"], "is a partial report (PARTIAL report"),
             (["--resume", str(complete), "--out", str(complete), "--rounds", "3", "--samples", "50"],
              "checkpoints would overwrite it"),
             (["--resume", str(complete), "--out", str(tmp_path / "new.json")], "rounds=3, samples=50")]
    for argv, message in cases:
        assert report.main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv


@pytest.mark.gpu
def test_a_run_cut_short_leaves_its_partial_report(tmp_path, monkeypatch):
    """The second round dies: the report holds the validation and the first round, marked partial."""
    rounds = []

    def floor_then_stop(run):
        rounds.append(1)
        if len(rounds) == 2:
            raise KeyboardInterrupt
    monkeypatch.setattr(report.Run, "time_floor", floor_then_stop)
    out = tmp_path / "cut.json"
    with pytest.raises(KeyboardInterrupt):
        report.main(["--engines", "persistent,torch-cublas", "--shapes", "1x7x13,5x19x37", "--rounds", "3",
                     "--samples", "3", "--warmup", "2", "--out", str(out), "--quiet"])
    data = json.loads(out.read_text())
    assert data["sha256"] == report_io.report_hash(data)
    assert data["partial"] == {"shapes": 2, "shapes_validated": 2, "rounds": 3, "rounds_done": 1}
    for item in data["development"] + data["assessment"]:
        for name, entry in item["engines"].items():
            assert entry["passed"] and entry["replay_changed_input"], (item["shape"], name)
            assert entry["stream_summary"]["count"] == 3  # one round of three samples


REPO = Path(__file__).resolve().parents[3]


def test_model_selection_arguments_are_checked_before_anything_runs(capsys, tmp_path):
    out = str(tmp_path / "r.json")
    assert report.main(["--models", "--model-rows", "1,x", "--out", out]) == 2
    assert "--model-rows must be comma-separated integers" in capsys.readouterr().err
    assert report.main(["--models", "--model-cases", "resnet*", "--out", out]) == 2
    assert "--model-cases 'resnet*' matches none" in capsys.readouterr().err
    assert report.main(["--model-cases", "swiglu*", "--out", out]) == 2
    assert "add --models" in capsys.readouterr().err
