"""kernellab-audit on a user's mistakes: a one-line error (exit 64) before any replay, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernellab.audit import cli
from kernellab.harness import report as report_io


@pytest.fixture
def repo(tmp_path) -> Path:
    """A directory the CLI accepts as a checkout (it has packages/); nothing here reaches the replay."""
    (tmp_path / "repo" / "packages").mkdir(parents=True)
    return tmp_path / "repo"


def run_report(path: Path, names: list[str]) -> Path:
    cases = [{"id": f"{n}/torch", "name": n, "impl": "torch", "status": "ok", "modes": {}} for n in names]
    report_io.write({"schema": report_io.SCHEMA, "kind": "run", "suite": "cpu-ops", "created_at": "2026-12-05",
                     "config": {"rounds": 1}, "provenance": {"git": {"commit": None, "dirty": False}},
                     "cases": cases, "versus_control": []}, path)
    return path


@pytest.fixture
def no_replay(monkeypatch):
    def audit(*args, **kwargs):
        raise AssertionError("the audit ran before its inputs were checked")
    monkeypatch.setattr(cli, "Audit", audit)


def refused(capsys, argv, repo) -> str:
    assert cli.main([*argv, "--repo", str(repo), "--quiet"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_reports_with_no_case_in_common_are_refused_before_any_replay(tmp_path, repo, no_replay, capsys):
    a = run_report(tmp_path / "a.json", ["softmax_128x512_fp32"])
    b = run_report(tmp_path / "b.json", ["rmsnorm_128x512_fp32"])
    err = refused(capsys, [str(a), str(b), "--out", str(tmp_path / "audit.json")], repo)
    assert ("the reports have no case in common, so there is nothing to replay (reference: "
            "['softmax_128x512_fp32'], candidate: ['rmsnorm_128x512_fp32'])") in err


def test_a_directory_for_a_report_or_for_out_is_refused(tmp_path, repo, no_replay, capsys):
    a = run_report(tmp_path / "a.json", ["softmax_128x512_fp32"])
    (tmp_path / "folder").mkdir()
    assert "candidate report" in refused(capsys, [str(a), str(tmp_path / "folder")], repo)
    assert "is a directory" in refused(capsys, [str(a), str(a), "--out", str(tmp_path / "folder")], repo)
    (tmp_path / "a-file").write_text("")
    assert "a-file is a file" in refused(capsys, [str(a), str(a), "--out", str(tmp_path / "a-file" / "x.json")], repo)


def test_a_validly_hashed_report_with_a_wrong_inside_is_refused(tmp_path, repo, no_replay, capsys):
    a = run_report(tmp_path / "a.json", ["softmax_128x512_fp32"])
    data = json.loads(a.read_text())
    data["cases"] = [{"name": "softmax_128x512_fp32"}]
    data[report_io.HASH_FIELD] = report_io.report_hash(data)
    (tmp_path / "bad.json").write_text(json.dumps(data))
    err = refused(capsys, [str(a), str(tmp_path / "bad.json")], repo)
    assert f"candidate report {tmp_path / 'bad.json'}: run report cases[0] lacks ['impl', 'status', 'modes']" in err


def test_a_binary_report_fails_its_check_without_a_traceback(tmp_path, repo, capsys):
    a = run_report(tmp_path / "a.json", ["softmax_128x512_fp32"])
    (tmp_path / "binary.json").write_bytes(bytes(range(256)))
    out = tmp_path / "audit.json"
    assert cli.main([str(a), str(tmp_path / "binary.json"), "--repo", str(repo), "--out", str(out), "--quiet"]) == 1
    assert "Traceback" not in capsys.readouterr().err
    audit = json.loads(out.read_text())
    assert any("is not a text file" in r for r in audit["reasons"])


def test_the_newest_pair_is_the_two_files_written_last_whatever_they_say(tmp_path):
    """Two copies of an old report dated ahead (2099) had been audited in place of the run just written."""
    import os

    old, older, new, newer = (run_report(tmp_path / f"{n}.json", ["softmax"]) for n in ("old", "older", "new", "newer"))
    for path, when in ((older, 1), (old, 2), (new, 3), (newer, 4)):
        os.utime(path, ns=(when * 10**18, when * 10**18))
    for forged in (old, older):
        data = json.loads(forged.read_text())
        report_io.write({**data, "created_at": "2099-01-01T00:00:00+00:00"}, forged)
        os.utime(forged, ns=(10**18, 10**18))
    assert cli.newest_pair(tmp_path) == (new, newer)
