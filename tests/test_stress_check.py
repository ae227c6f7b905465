"""tools/stress_check.py counts each test's passes over runs and says whether every run passed."""

import json


def test_counts_passes_and_failures_per_test(load_tool, tmp_path):
    flaky = tmp_path / "test_planted.py"
    counter = tmp_path / "count"
    flaky.write_text(f"""
from pathlib import Path
def test_steady():
    assert True
def test_second_run_fails():
    p = Path({str(counter)!r})
    n = int(p.read_text()) if p.exists() else 0
    p.write_text(str(n + 1))
    assert n != 1
""")
    out = tmp_path / "record.json"
    assert load_tool("stress_check").main(["--runs", "3", "--load", "0", "--out", str(out), str(flaky)]) == 1
    record = json.loads(out.read_text())
    assert [r["failed"] for r in record["runs"]] == [0, 1, 0] and not record["every_run_passed"]
    tests = {k.rsplit("::", 1)[1]: v for k, v in record["tests"].items()}
    assert tests["test_steady"] == {"passed": 3, "failed": 0, "skipped": 0}
    assert tests["test_second_run_fails"] == {"passed": 2, "failed": 1, "skipped": 0}


def test_a_run_that_executes_no_test_is_not_a_pass(load_tool, tmp_path):
    empty = tmp_path / "test_none.py"
    empty.write_text("X = 1\n")
    out = tmp_path / "record.json"
    assert load_tool("stress_check").main(["--runs", "1", "--load", "0", "--out", str(out), str(empty)]) == 1
    assert json.loads(out.read_text())["every_run_passed"] is False
