import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernellab.harness import report


def _sample_report():
    return {
        "schema": report.SCHEMA, "kind": "run", "suite": "affine", "created_at": "2026-12-02T00:00:00+00:00",
        "config": {"rounds": 2, "samples": 3}, "provenance": {"git": {"commit": "abc", "dirty": False}},
        "cases": [{"id": "a/torch", "modes": {"e2e_throughput": {"rounds_us": [[1.5, 2.25, 3.0], [1.0, 2.0, 4.5]],
                                                                  "summary_us": {"p50": 2.1, "count": 6}}}}],
    }


def _numeric_paths(obj, path=()):
    if isinstance(obj, bool):
        return
    if isinstance(obj, (int, float)):
        yield path
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _numeric_paths(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _numeric_paths(v, (*path, i))


def _set(obj, path, value):
    for p in path[:-1]:
        obj = obj[p]
    obj[path[-1]] = value


def _get(obj, path):
    for p in path:
        obj = obj[p]
    return obj


def test_round_trip(tmp_path):
    path = report.write(_sample_report(), tmp_path / "r.json")
    loaded = report.load(path)
    assert loaded["sha256"] == report.report_hash(loaded)
    assert loaded["cases"][0]["modes"]["e2e_throughput"]["rounds_us"][1][2] == 4.5


def test_hash_is_over_canonical_json_without_the_hash_field():
    r = report.seal(_sample_report())
    body = {k: v for k, v in r.items() if k != "sha256"}
    canon = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    import hashlib

    assert r["sha256"] == hashlib.sha256(canon).hexdigest()


@given(st.data())
def test_editing_any_number_changes_the_hash(data):
    sealed = report.seal(_sample_report())
    paths = list(_numeric_paths(sealed))
    path = data.draw(st.sampled_from(paths))
    old = _get(sealed, path)
    new = data.draw(st.one_of(st.integers(-10**6, 10**6), st.floats(-1e6, 1e6, allow_nan=False)).filter(
        lambda v: v != old or type(v) is not type(old)))
    edited = json.loads(json.dumps(sealed))
    _set(edited, path, new)
    assert report.report_hash(edited) != sealed["sha256"]


def test_a_hand_edited_report_fails_to_load_naming_the_hash_mismatch(tmp_path):
    path = report.write(_sample_report(), tmp_path / "r.json")
    text = path.read_text().replace("4.5", "3.5")
    path.write_text(text)
    with pytest.raises(report.ReportError, match="sha256 mismatch: recorded [0-9a-f]{64}, content hashes to"):
        report.load(path)


def test_schema_and_fields_are_checked(tmp_path):
    bad = _sample_report() | {"schema": "other/9"}
    with pytest.raises(report.ReportError, match="unknown report schema"):
        report.seal(bad)
    missing = _sample_report()
    del missing["cases"]
    with pytest.raises(report.ReportError, match="lacks required fields"):
        report.seal(missing)
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(report.ReportError, match="not valid JSON"):
        report.load(tmp_path / "x.json")
    with pytest.raises(report.ReportError, match="does not exist"):
        report.load(tmp_path / "absent.json")


def test_nan_and_infinity_become_null():
    r = _sample_report()
    r["config"]["bad"] = float("nan")
    r["config"]["worse"] = float("inf")
    sealed = report.seal(r)
    assert sealed["config"]["bad"] is None and sealed["config"]["worse"] is None
