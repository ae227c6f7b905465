from html.parser import HTMLParser
from pathlib import Path

import planted
import pytest
from test_history import engine_report, reports  # noqa: F401  (the fixture)

from kernellab.harness import history, site
from kernellab.harness import report as report_io


class Links(HTMLParser):
    """Every link of a page by class, the resources it would fetch, and its section headings."""

    def __init__(self):
        super().__init__()
        self.by_class: dict[str, list[dict]] = {}
        self.fetches: list[str] = []
        self.headings: list[str] = []
        self._in_h2 = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "a":
            self.by_class.setdefault(a.get("class", ""), []).append(a)
        if tag in ("script", "img", "iframe") and a.get("src") or tag == "link" and a.get("href"):
            self.fetches.append(a.get("src") or a.get("href"))
        self._in_h2 = tag == "h2"

    def handle_data(self, data):
        if self._in_h2:
            self.headings.append(data)
            self._in_h2 = False


def parse(path: Path) -> Links:
    links = Links()
    links.feed(path.read_text())
    return links


def check_page(page: Path, rows: list[dict]) -> Links:
    """Every indexed run is listed and charted, every link resolves, nothing is fetched."""
    links = parse(page)
    points = links.by_class["point"]
    for report in {r["report"] for r in rows}:
        assert any(p["data-report"] == report for p in points), f"{report} has no point on the page"
    for a in links.by_class["run"] + points:
        assert (page.parent / a["href"]).is_file(), f"{a['href']} does not resolve from the page"
    assert {(page.parent / a["href"]).resolve() for a in links.by_class["run"]} == \
        {(page.parent / a["href"]).resolve() for a in points}
    assert not links.fetches and "http://" not in page.read_text() and "https://" not in page.read_text()
    return links


def test_page_shows_every_indexed_run(reports, tmp_path):  # noqa: F811
    rows = history.index([reports], tmp_path)
    page = site.build(rows, tmp_path / "out" / "results.html", tmp_path)
    links = check_page(page, rows)
    assert links.headings == ["affine on Planted CPU", "megakernel on NVIDIA H200", "Every indexed run"]
    commits = {a["data-commit"][0] for a in links.by_class["point"]}
    assert commits == {"1", "2", "3", "4"}


def test_trend_points_follow_commits_and_link_them(tmp_path):
    root = tmp_path / "reports"
    for n, (commit, ms) in enumerate((("c" * 40, 0.005), ("a" * 40, 0.004), ("b" * 40, 0.006))):
        body = engine_report(commit, ms)
        body["recorded_on"] = f"2026-12-0{n + 1}"
        body["sha256"] = report_io.report_hash(body)
        report_io.write(body, root / f"engine-{n}.json")
    rows = history.index([root], tmp_path)
    page = site.build(rows, tmp_path / "results.html", tmp_path, commit_url="https://example.invalid/c/{commit}")
    text = page.read_text()
    assert site.commit_axis(rows) == ["c" * 40, "a" * 40, "b" * 40]  # by date, not by hash
    links = parse(page)
    assert len(links.by_class["commit"]) == 4  # the latest run's and the runs table's
    assert [a["href"][-40:] for a in links.by_class["axis-commit"]] == ["c" * 40, "a" * 40, "b" * 40]
    persistent = [a for a in parse(page).by_class["point"] if a["data-report"].startswith("reports/engine")]
    assert len(persistent) == 3 * 2  # three reports, control and engine, in the primary mode (stream)
    assert "(us, log scale)" not in text


def test_a_wide_range_gets_a_log_axis(reports, tmp_path):  # noqa: F811
    engine = engine_report("9" * 40, 2.0)  # 100x the control
    (reports / "h200" / "megakernel.json").write_text(report_io.json.dumps(engine))
    page = site.build(history.index([reports], tmp_path), tmp_path / "p.html", tmp_path)
    assert "1x7x13 <small>(us, log scale)</small>" in page.read_text()


def test_an_empty_store_is_an_error(tmp_path):
    with pytest.raises(history.HistoryError, match="no rows"):
        site.build([], tmp_path / "p.html", tmp_path)


def test_cli_builds_from_a_store(reports, tmp_path, monkeypatch, capsys):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    store = tmp_path / "h.jsonl"
    history.write_store(history.index([reports], tmp_path), store)
    assert site.main(["--store", str(store), "--out", "page/index.html"]) == 0
    assert "(3 runs)" in capsys.readouterr().out
    check_page(tmp_path / "page" / "index.html", history.read_store(store))
    assert site.main(["--store", str(store), "--commit-url", "https://x.invalid/"]) == 2
    assert "must contain '{commit}'" in capsys.readouterr().err


def test_planted_run_has_its_latest_table(tmp_path):
    report_io.write(planted.run_report(commit="7" * 40), tmp_path / "r" / "a.json")
    page = site.build(history.index([tmp_path / "r"], tmp_path), tmp_path / "p.html", tmp_path)
    text = page.read_text()
    assert "<th>torch us</th><th>ours us</th><th>ours x torch</th>" in text
    assert '<td class="good">0.667</td>' in text or '<td class="good">0.66' in text


def test_control_only_cases_come_last_and_ratios_name_the_control(tmp_path):
    side = planted.side()
    side["cases"] = [c for c in side["cases"] if c["id"] != "affine_256x128_fp32/ours"]
    for data in side["rounds"]:
        del data["affine_256x128_fp32/ours"]
    report_io.write(report_io.seal(planted.assemble.run_report(planted.suite(), planted.CONFIG, side)),
                    tmp_path / "r" / "a.json")
    text = site.build(history.index([tmp_path / "r"], tmp_path), tmp_path / "p.html", tmp_path).read_text()
    assert text.index('<td class="l">affine_64x64_fp32</td>') < text.index('<td class="l">affine_256x128_fp32</td>')
    engines = tmp_path / "e"
    engines.mkdir()
    (engines / "m.json").write_text(report_io.json.dumps(engine_report("8" * 40, 0.005)))
    text = site.build(history.index([engines], tmp_path), tmp_path / "q.html", tmp_path).read_text()
    assert "<th>persistent x torch-cublas</th>" in text
