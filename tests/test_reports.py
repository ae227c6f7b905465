"""The committed reports: their layout, the history store derived from them, the results page built from
it, the READMEs' generated tables, and every reference to a report in the repository."""

import fnmatch
import importlib.util
import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path

from kernellab.harness import history, readme, site

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / history.DEFAULT_STORE
THIS = "tests/test_reports.py"  # its layout examples name reports that do not exist


def load_tool(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tracked(*patterns: str) -> list[str]:
    return subprocess.run(["git", "-C", str(ROOT), "ls-files", *patterns], check=True, capture_output=True,
                          text=True).stdout.splitlines()


def test_the_committed_store_is_the_index_of_the_committed_reports():
    committed = history.read_store(STORE)
    rebuilt = history.index([ROOT / history.DEFAULT_REPORTS], ROOT)
    assert [history.sort_key(r) for r in committed] == [history.sort_key(r) for r in rebuilt], \
        "reports/history.jsonl is stale: run `kernellab-bench history index`"
    assert history.main(["index", "--check"]) == 0
    indexed = {r["report"] for r in committed}
    assert {"reports/h200/gpu-norm.json", "reports/h200/megakernel.json", "reports/cpu/cpu-ops.json"} <= indexed
    assert all(r["commit"] and r["p50_us"] > 0 for r in committed)


class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: dict[str, list[dict]] = {}
        self.fetches: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "a":
            self.links.setdefault(a.get("class", ""), []).append(a)
        if tag in ("script", "img", "iframe", "link") and (a.get("src") or a.get("href")):
            self.fetches.append(a.get("src") or a.get("href"))


def test_every_committed_report_holds_its_hash_and_every_derived_number():
    """History, the results page and the README tables read committed reports without a replay: a report whose
    derived number was edited and re-hashed (a ratio against torch turned from 1.2 into 0.25) would show there.
    Every committed harness report is consistent with its raw data and its hash."""
    import json

    from kernellab.harness import consistency
    from kernellab.harness import report as report_io

    checked, bad = 0, {}
    for path in tracked("reports/*.json", "reports/**/*.json"):
        try:
            data = json.loads((ROOT / path).read_text())
        except ValueError:
            continue
        if not isinstance(data, dict) or data.get("kind") not in report_io.KINDS:
            continue  # a tool's record, not a harness report
        checked += 1
        found = [str(i) for i in consistency.check(data)[:2]]
        if data.get(report_io.HASH_FIELD) != report_io.report_hash(data):
            found.append("sha256 mismatch")
        if found:
            bad[path] = found
    assert checked > 0 and not bad, bad


def test_the_results_page_built_from_the_committed_reports_shows_every_run(tmp_path):
    rows = history.read_store(STORE)
    page_path = site.build(rows, tmp_path / "results.html", ROOT)
    page = Page()
    page.feed(page_path.read_text())
    runs = {(page_path.parent / a["href"]).resolve() for a in page.links["run"]}
    assert runs == {(ROOT / r["report"]).resolve() for r in rows}
    charted = {a["data-report"] for a in page.links["point"]}
    assert charted == {r["report"] for r in rows}, "every indexed run has a point in a trend chart"
    assert all((page_path.parent / a["href"]).is_file() for a in page.links["point"])
    assert not page.fetches, "the page is self-contained"


def test_the_readme_tables_are_what_the_reports_generate():
    files = readme.default_files(ROOT)
    generated = {str(b.path.relative_to(ROOT)): b.command for f in files for b in readme.blocks(f)}
    assert set(generated) >= {"packages/kernels/README.md", "packages/megakernel/README.md"}
    for path in files:
        assert readme.refresh(path, ROOT, write=False) == [], f"{path}: run `kernellab-bench tables`"


def test_the_layout_holds():
    """Only headline reports at the top of a device folder; every topic folder indexes each of its files."""
    layout = load_tool("reports_layout")
    for rel in layout.DEVICE_DIRS:
        assert layout.plan(ROOT / rel) == {}, f"{rel}: run `python tools/reports_layout.py`"
    for index in tracked("reports/*/*/README.md"):
        folder = (ROOT / index).parent
        text = (ROOT / index).read_text()
        listed = [n for token in re.findall(r"`([^`]+\.(?:json|png|log))`", text)
                  for n in layout.expand_braces(token)]
        for f in sorted(folder.iterdir()):
            if f.name != "README.md":
                assert any(fnmatch.fnmatchcase(f.name, pattern) for pattern in listed), f"{f} is not in {index}"


def test_every_reference_to_a_committed_report_resolves():
    layout = load_tool("reports_layout")
    present = set(tracked("reports"))
    token = re.compile(r"reports/(?:h200|h100|cpu)/[\w{},*./-]+\.(?:json|png)")
    for path in tracked():
        if path.startswith("reports/") or Path(path).suffix not in layout.TEXT_SUFFIXES or path == THIS:
            continue
        for ref in token.findall((ROOT / path).read_text()):
            for pattern in layout.expand_braces(ref):
                assert fnmatch.filter(present, pattern), f"{path} names {ref}, which no committed file matches"


def test_layout_rewrites_paths_patterns_and_the_sanitize_swap_in_one_pass():
    layout = load_tool("reports_layout")
    moves = {"megakernel-sweep-a.json": "sweeps/megakernel-sweep-a.json",
             "megakernel-sweep-b.json": "sweeps/megakernel-sweep-b.json",
             "megakernel-sanitize.json": "sanitize-history/megakernel-sanitize-1111111.json",
             "megakernel-sanitize-2222222.json": "megakernel-sanitize.json"}
    before = sorted([*moves, "gpu-norm.json", "megakernel.json"])
    cases = {
        "`reports/h200/megakernel-sweep-a.json`": "`reports/h200/sweeps/megakernel-sweep-a.json`",
        "(`megakernel-sweep-{a,b}.json`)": "(`sweeps/megakernel-sweep-{a,b}.json`)",
        "runs in `reports/h200/megakernel-sweep*.json`.": "runs in `reports/h200/sweeps/megakernel-sweep*.json`.",
        "`reports/h200/megakernel-sanitize.json`": "`reports/h200/sanitize-history/megakernel-sanitize-1111111.json`",
        "`reports/h200/megakernel-sanitize-2222222.json`": "`reports/h200/megakernel-sanitize.json`",
        "the `megakernel-sanitize.json` of a run": "the `megakernel-sanitize.json` of a run",  # bare and renamed
        '"$OUT/megakernel-sweep-a.json" and "megakernel-trace.json"': '"$OUT/megakernel-sweep-a.json" and '
                                                                      '"megakernel-trace.json"',
        "`reports/h200/gpu-norm.json`, `megakernel-sweep-a.json` and `megakernel-{sweep-a,sanitize}.json`":
            "`reports/h200/gpu-norm.json`, `sweeps/megakernel-sweep-a.json` and `megakernel-{sweep-a,sanitize}.json`",
    }
    for text, expected in cases.items():
        assert layout.rewrite(text, moves, before) == expected
        assert layout.rewrite(expected, {k: v for k, v in moves.items() if "sanitize" not in k}, before) == expected


def test_layout_makes_the_headline_sanitize_run_the_one_of_megakernel_json(tmp_path):
    import json

    layout = load_tool("reports_layout")

    def write(name, body):
        (tmp_path / name).write_text(json.dumps(body))
    write("megakernel.json", {"source_commit": "2222222" + "0" * 33})
    for commit in ("1111111", "2222222", "3333333"):
        name = "megakernel-sanitize.json" if commit == "1111111" else f"megakernel-sanitize-{commit}.json"
        write(name, {"provenance": {"git": {"commit": commit + "0" * 33}}})
    write("megakernel-sweep-x.json", {})
    write("gpu-norm.json", {})
    assert layout.plan(tmp_path) == {
        "megakernel-sanitize.json": "sanitize-history/megakernel-sanitize-1111111.json",
        "megakernel-sanitize-2222222.json": "megakernel-sanitize.json",
        "megakernel-sanitize-3333333.json": "sanitize-history/megakernel-sanitize-3333333.json",
        "megakernel-sweep-x.json": "sweeps/megakernel-sweep-x.json"}
    (tmp_path / "megakernel-sanitize.json").unlink()
    (tmp_path / "megakernel-sanitize-2222222.json").rename(tmp_path / "megakernel-sanitize.json")
    (tmp_path / "megakernel-sanitize-3333333.json").unlink()
    (tmp_path / "megakernel-sweep-x.json").unlink()
    assert layout.plan(tmp_path) == {}  # the layout holds: nothing moves
