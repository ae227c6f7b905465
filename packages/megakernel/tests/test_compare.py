"""The A/B comparison of engine reports: grouping by commit, ratios, the control, refusals."""

import json

import pytest

from kernellab.megakernel import compare, report


def _report(commit, p50s_us, failed=()):
    """A sealed report's body: engines -> p50 (us) at two shapes, one per section."""
    def entry(name, us):
        ok = name not in failed
        s = {"count": 20, "p50_ms": us / 1e3, "p95_ms": 0, "min_ms": 0, "max_ms": 0, "mean_ms": 0}
        return {"passed": ok, "replay_changed_input": ok, "stream_summary": s, "host_summary": s}
    shape = {"rows": 1, "channels": 7, "hidden": 13}
    other = {"rows": 5, "channels": 19, "hidden": 37}
    return {"source_commit": commit,
            "development": [{"shape": shape, "engines": {n: entry(n, v[0]) for n, v in p50s_us.items()}}],
            "assessment": [{"shape": other, "engines": {n: entry(n, v[1]) for n, v in p50s_us.items()}}]}


ABBA = [_report("a" * 40, {"persistent": (4.0, 8.0), "torch-cublas": (20.0, 20.0)}),
        _report("b" * 40, {"persistent": (3.0, 7.0), "torch-cublas": (19.0, 20.0)}),
        _report("b" * 40, {"persistent": (3.4, 7.4), "torch-cublas": (21.0, 20.0)}),
        _report("a" * 40, {"persistent": (4.0, 8.0), "torch-cublas": (20.0, 20.0)})]


def test_ratios_geomeans_and_the_control():
    result = compare.compare(ABBA)
    assert (result["base"], result["change"]) == ("a" * 40, "b" * 40)
    persistent = result["engines"]["persistent"]
    assert persistent["ratios"] == pytest.approx({"1x7x13": 3.2 / 4.0, "5x19x37": 7.2 / 8.0})
    assert persistent["geomean"] == pytest.approx((0.8 * 0.9) ** 0.5)
    assert (persistent["min"], persistent["max"]) == pytest.approx((0.8, 0.9))
    assert result["control"] == {"engine": "torch-cublas", "geomean": pytest.approx(1.0)}
    assert result["failed"] == []
    text = compare.printout(result)
    assert "0.849" in text and "control: torch-cublas" in text  # sqrt(0.72)


def test_base_named_by_a_commit_prefix(tmp_path, capsys):
    """Runs made change, base, base, change: --base names the base, and the ratios are the same as above."""
    change_first = [ABBA[1], ABBA[0], ABBA[3], ABBA[2]]
    assert compare.compare(change_first)["base"] == "b" * 40  # without it: the first report's commit
    result = compare.compare(change_first, base="aaaa")
    assert (result["base"], result["change"]) == ("a" * 40, "b" * 40)
    assert result["engines"]["persistent"]["ratios"] == pytest.approx({"1x7x13": 0.8, "5x19x37": 0.9})
    paths = [str(report.seal_and_write(r, tmp_path / f"{i}.json")) for i, r in enumerate(change_first)]
    assert compare.main([*paths, "--base", "a"]) == 0
    assert "of bbbbbbb over aaaaaaa" in capsys.readouterr().out
    for wrong in ("c", ""):
        assert compare.main([*paths, "--base", wrong]) == 2
        assert "names neither or both" in capsys.readouterr().err


def test_a_failed_engine_is_left_out_and_fails_the_command(tmp_path, capsys):
    reports = [*ABBA[:2], _report("b" * 40, {"persistent": (3.4, 7.4), "torch-cublas": (21.0, 20.0)},
                                  failed=("persistent",)), ABBA[3]]
    paths = [str(report.seal_and_write(r, tmp_path / f"{i}.json")) for i, r in enumerate(reports)]
    assert compare.main(paths) == 1
    out = capsys.readouterr().out
    assert "FAILED validation (left out): persistent at 1x7x13, persistent at 5x19x37" in out
    assert set(compare.compare(reports)["engines"]) == {"torch-cublas"}  # no ratio from a wrong answer


def test_refusals(tmp_path, capsys):
    assert compare.main([str(report.seal_and_write(r, tmp_path / f"{i}.json")) for i, r in
                         enumerate([ABBA[0], ABBA[1], _report("c" * 40, {"persistent": (1, 1)})])]) == 2
    assert "exactly two commits" in capsys.readouterr().err
    tampered = json.loads(report.seal_and_write(ABBA[0], tmp_path / "t.json").read_text())
    tampered["development"][0]["engines"]["persistent"]["passed"] = True
    tampered["source_commit"] = "d" * 40
    (tmp_path / "t.json").write_text(json.dumps(tampered))
    with pytest.raises(SystemExit, match="sha256 mismatch"):
        compare.load([str(tmp_path / "t.json")])
    partial = report.seal_and_write({**ABBA[0], "partial": {"rounds_done": 1}}, tmp_path / "p.json")
    with pytest.raises(SystemExit, match="partial report"):
        compare.load([str(partial)])
    with pytest.raises(SystemExit, match="cannot read"):
        compare.load([str(tmp_path / "absent.json")])
