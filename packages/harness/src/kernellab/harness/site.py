"""The results page: one self-contained HTML file (inline CSS and SVG, nothing fetched) built from the
history store: per suite and device the latest run's table, a trend chart per case across commits in
the suite's primary mode, and a list of every indexed run. Every point links to its report's JSON."""

from __future__ import annotations

import argparse
import html
import math
import os
import sys
from pathlib import Path

from . import history

PRIMARY_ORDER = ("graph_throughput", "gpu_throughput", "stream", "e2e_throughput", "host", "e2e_latency",
                 "gpu_latency")
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac", "#1f77b4", "#8c564b", "#17becf", "#bcbd22")
CONTROLS = ("torch", "torch-cublas")
DEFAULT_OUT = "reports/runs/results.html"
CHART_W, CHART_H, PAD_L, PAD_B, PAD_T, PAD_R = 320, 170, 48, 22, 8, 8
LOG_SCALE_ABOVE = 8.0  # a chart whose largest p50 exceeds its smallest by this factor gets a log axis

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:24px auto;max-width:1280px;color:#222;
padding:0 16px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:20px;margin:32px 0 6px;border-bottom:2px solid #ddd;padding-bottom:4px}
h3{font-size:16px;margin:18px 0 6px}p.note{color:#555;margin:4px 0 10px}
nav a{margin-right:14px}code{font-size:12px}
.scroll{overflow-x:auto}table{border-collapse:collapse;font-size:12.5px;margin:6px 0 12px}
th,td{padding:3px 8px;border-bottom:1px solid #e4e4e4;text-align:right;white-space:nowrap}
th{background:#f4f5f7;position:sticky;top:0}td.l,th.l{text-align:left}
td.good{color:#1a7f37}td.bad{color:#b42318}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(330px,1fr));gap:10px}
figure{margin:0;border:1px solid #e4e4e4;border-radius:6px;padding:6px 6px 2px;background:#fff}
figcaption{font-size:12.5px;font-weight:600;margin-bottom:2px}
.legend span{display:inline-block;margin-right:12px;font-size:12.5px}
.legend i{display:inline-block;width:10px;height:10px;border-radius:5px;margin-right:4px;vertical-align:-1px}
svg text{font:10px system-ui,sans-serif;fill:#555}
"""


def primary_mode(rows: list[dict]) -> str:
    present = {r["mode"] for r in rows}
    return next((m for m in PRIMARY_ORDER if m in present), sorted(present)[0])


def commit_axis(rows: list[dict]) -> list[str]:
    """Commits in the order their first report was made (ties by commit, so the order is stable)."""
    first: dict[str, str] = {}
    for r in rows:
        c = r["commit"] or "unknown"
        first[c] = min(first.get(c, r["created_at"] or ""), r["created_at"] or "")
    return sorted(first, key=lambda c: (first[c], c))


def groups(rows: list[dict]) -> dict[tuple[str, str], list[dict]]:
    out: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        out.setdefault((r["suite"], r["device"]), []).append(r)
    return dict(sorted(out.items()))


def latest_report(rows: list[dict]) -> str:
    """The report whose rows are newest: a run report is preferred over the side of a comparison."""
    return max(rows, key=lambda r: (r["created_at"] or "", r["side"] is None, r["report"]))["report"]


def impl_order(rows: list[dict]) -> list[str]:
    impls = sorted({r["impl"] for r in rows})
    return [i for i in CONTROLS if i in impls] + [i for i in impls if i not in CONTROLS]


class Page:
    def __init__(self, rows: list[dict], out: Path, root: Path, commit_url: str | None):
        self.rows, self.out, self.root, self.commit_url = rows, out, root, commit_url

    def href(self, report: str) -> str:
        """A report's path (recorded relative to the checkout) as seen from the page."""
        return Path(os.path.relpath(self.root / report, self.out.parent)).as_posix()

    def commit(self, commit: str | None, dirty: bool | None = None) -> str:
        text = html.escape((commit or "unknown")[:10] + ("+dirty" if dirty else ""))
        if commit and self.commit_url:
            url = html.escape(self.commit_url.format(commit=commit))
            return f'<a class="commit" href="{url}"><code>{text}</code></a>'
        return f'<code class="commit" title="{html.escape(commit or "")}">{text}</code>'

    def render(self) -> str:
        reports = sorted({r["report"] for r in self.rows})
        sections = groups(self.rows)
        parts = [
            "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            "<title>KernelLab results</title>", f"<style>{CSS}</style></head><body>",
            "<h1>KernelLab results</h1>",
            f'<p class="note">Built by <code>kernellab-bench site</code> from {len(reports)} indexed run reports '
            f"({len(self.rows)} rows of the history store). Times are p50 per call; "
            "x&nbsp;torch is the case's time over the control's in the same run (below 1 is faster); "
            "of&nbsp;copy is the fraction of the same-shape copy's bandwidth.</p>",
            "<nav>" + "".join(f'<a href="#{self.anchor(s, d)}">{html.escape(s)} on {html.escape(d)}</a>'
                              for s, d in sections) + '<a href="#runs">every run</a></nav>',
        ]
        for (suite, device), rows in sections.items():
            parts.append(self.section(suite, device, rows))
        parts.append(self.runs_table())
        parts.append("</body></html>")
        return "\n".join(parts) + "\n"

    @staticmethod
    def anchor(suite: str, device: str) -> str:
        return "s-" + "".join(ch if ch.isalnum() else "-" for ch in f"{suite}-{device}".lower())

    def section(self, suite: str, device: str, rows: list[dict]) -> str:
        mode = primary_mode(rows)
        latest = latest_report(rows)
        current = [r for r in rows if r["report"] == latest and r["mode"] == mode]
        first = current[0]
        commits = commit_axis([r for r in rows if r["mode"] == mode])
        parts = [f'<h2 id="{self.anchor(suite, device)}">{html.escape(suite)} on {html.escape(device)}</h2>',
                 f'<p class="note">Latest run: <a href="{html.escape(self.href(latest))}">{html.escape(latest)}</a>'
                 f", commit {self.commit(first['commit'], first['dirty'])}, {html.escape(first['created_at'] or '')}"
                 f"; mode <code>{mode}</code>; {len(commits)} commit(s) in the history.</p>",
                 self.latest_table(current), "<h3>Trend per case across commits</h3>",
                 self.legend(impl_order([r for r in rows if r["mode"] == mode])), '<div class="charts">']
        by_case: dict[str, list[dict]] = {}
        for r in rows:
            if r["mode"] == mode:
                by_case.setdefault(r["case"], []).append(r)
        colors = dict(zip(impl_order([r for r in rows if r["mode"] == mode]), _cycle(PALETTE), strict=False))
        for case in sorted(by_case):
            parts.append(self.chart(case, by_case[case], commits, colors))
        parts.append("</div>")
        return "\n".join(parts)

    def legend(self, impls: list[str]) -> str:
        return '<p class="legend">' + "".join(f'<span><i style="background:{c}"></i>{html.escape(i)}</span>'
                                              for i, c in zip(impls, _cycle(PALETTE), strict=False)) + "</p>"

    def latest_table(self, rows: list[dict]) -> str:
        impls = impl_order(rows)
        cells = {(r["case"], r["impl"]): r for r in rows}
        contenders = [i for i in impls if i not in CONTROLS]
        control = next((i for i in impls if i in CONTROLS), "torch")
        # cases only the control ran (the suite's copy ceiling) after the contested ones
        cases = sorted({r["case"] for r in rows},
                       key=lambda case: (not any((case, i) in cells for i in contenders), case))
        ceiling = any(r["ceiling_fraction"] is not None for r in rows)
        head = ['<th class="l">case</th>'] + [f"<th>{html.escape(i)} us</th>" for i in impls]
        head += [f"<th>{html.escape(i)} x {html.escape(control)}</th>" for i in contenders]
        head += [f"<th>{html.escape(i)} of copy</th>" for i in contenders] if ceiling else []
        body = []
        for case in cases:
            tds = [f'<td class="l">{html.escape(case)}</td>']
            for i in impls:
                r = cells.get((case, i))
                tds.append(f"<td>{_num(r and r['p50_us'], '.3f')}</td>")
            for i in contenders:
                ratio = (cells.get((case, i)) or {}).get("torch_ratio")
                cls = "" if ratio is None else ' class="good"' if ratio < 1 else ' class="bad"'
                tds.append(f"<td{cls}>{_num(ratio, '.3f')}</td>")
            if ceiling:
                tds += [f"<td>{_num((cells.get((case, i)) or {}).get('ceiling_fraction'), '.2f')}</td>"
                        for i in contenders]
            body.append("<tr>" + "".join(tds) + "</tr>")
        return ('<div class="scroll"><table><thead><tr>' + "".join(head) + "</tr></thead><tbody>"
                + "".join(body) + "</tbody></table></div>")

    def chart(self, case: str, rows: list[dict], commits: list[str], colors: dict[str, str]) -> str:
        """p50 against the commit axis, one line per impl; each point a link to its report."""
        ys = [r["p50_us"] for r in rows if r["p50_us"] is not None]
        log = min(ys) > 0 and max(ys) / min(ys) > LOG_SCALE_ABOVE  # engines 100x apart: a log axis shows both
        scale = math.log if log else float
        lo, hi = scale(min(ys)), scale(max(ys))
        span = (hi - lo) or abs(hi) * 0.1 or 1.0
        lo, hi = lo - span * 0.08, hi + span * 0.08
        if not log:
            lo = max(lo, 0.0) if min(ys) >= 0 else lo
        inner_w, inner_h = CHART_W - PAD_L - PAD_R, CHART_H - PAD_T - PAD_B
        step = inner_w / max(1, len(commits) - 1) if len(commits) > 1 else 0.0

        def x_of(commit):
            return PAD_L + (commits.index(commit) * step if len(commits) > 1 else inner_w / 2)

        def y_of(v):
            return PAD_T + inner_h * (1 - (scale(v) - lo) / (hi - lo))

        svg = [f'<svg viewBox="0 0 {CHART_W} {CHART_H}" width="{CHART_W}" height="{CHART_H}" role="img" '
               f'aria-label="{html.escape(case)}">',
               f'<rect x="{PAD_L}" y="{PAD_T}" width="{inner_w}" height="{inner_h}" fill="#fafbfc" stroke="#ddd"/>']
        for frac in (0.0, 0.5, 1.0):
            v = math.exp(lo + (hi - lo) * frac) if log else lo + (hi - lo) * frac
            y = y_of(v)
            svg.append(f'<line x1="{PAD_L}" x2="{PAD_L + inner_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                       f'<text x="{PAD_L - 4}" y="{y + 3:.1f}" text-anchor="end">{_short(v)}</text>')
        labels = commits if len(commits) <= 6 else commits[:: max(1, len(commits) // 5)]
        for c in labels:
            label = f'<text x="{x_of(c):.1f}" y="{CHART_H - 6}" text-anchor="middle">{html.escape(c[:7])}</text>'
            if self.commit_url and c != "unknown":
                label = f'<a class="axis-commit" href="{html.escape(self.commit_url.format(commit=c))}">{label}</a>'
            svg.append(label)
        by_impl: dict[str, list[dict]] = {}
        for r in rows:
            by_impl.setdefault(r["impl"], []).append(r)
        for impl in impl_order(rows):
            pts = sorted(by_impl[impl], key=lambda r: (commits.index(r["commit"] or "unknown"), r["report"]))
            color = colors.get(impl, "#888")
            means: list[tuple[float, float]] = []
            for commit in dict.fromkeys(r["commit"] or "unknown" for r in pts):
                at = [r["p50_us"] for r in pts if (r["commit"] or "unknown") == commit]
                means.append((x_of(commit), sum(at) / len(at)))
            if len(means) > 1:
                path = " ".join(f"{x:.1f},{y_of(v):.1f}" for x, v in means)
                svg.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.5"/>')
            for r in pts:
                x, y = x_of(r["commit"] or "unknown"), y_of(r["p50_us"])
                tip = (f"{impl} {r['mode']}: {r['p50_us']:.3f} us at {(r['commit'] or '?')[:10]}"
                       f" ({r['created_at']}), {r['report']}" + (f" [{r['side']}]" if r["side"] else ""))
                svg.append(f'<a href="{html.escape(self.href(r["report"]))}" class="point" '
                           f'data-report="{html.escape(r["report"])}" data-commit="{html.escape(r["commit"] or "")}">'
                           f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.2" fill="{color}" stroke="#fff" stroke-width="0.8">'
                           f"<title>{html.escape(tip)}</title></circle></a>")
        svg.append("</svg>")
        unit = "us, log scale" if log else "us"
        return f"<figure><figcaption>{html.escape(case)} <small>({unit})</small></figcaption>{''.join(svg)}</figure>"

    def runs_table(self) -> str:
        runs: dict[tuple, dict] = {}
        for r in self.rows:
            key = (r["report"], r["side"])
            entry = runs.setdefault(key, {"row": r, "rows": 0})
            entry["rows"] += 1
        body = []
        for (report, side), entry in sorted(runs.items(), key=lambda kv: (kv[1]["row"]["created_at"] or "", kv[0]),
                                            reverse=True):
            r = entry["row"]
            body.append(f'<tr><td class="l"><a class="run" href="{html.escape(self.href(report))}">'
                        f"{html.escape(report)}</a></td><td class=\"l\">{html.escape(side or '')}</td>"
                        f'<td class="l">{html.escape(r["suite"])}</td><td class="l">{html.escape(r["device"])}</td>'
                        f'<td class="l">{self.commit(r["commit"], r["dirty"])}</td>'
                        f'<td class="l">{html.escape(r["created_at"] or "")}</td><td>{entry["rows"]}</td></tr>')
        return ('<h2 id="runs">Every indexed run</h2><div class="scroll"><table><thead><tr>'
                '<th class="l">report</th><th class="l">side</th><th class="l">suite</th><th class="l">device</th>'
                '<th class="l">commit</th><th class="l">created</th><th>rows</th></tr></thead><tbody>'
                + "".join(body) + "</tbody></table></div>")


def _cycle(items):
    while True:
        yield from items


def _num(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _short(v: float) -> str:
    """An axis label that fits the margin: 3 significant digits, thousands as k."""
    return f"{v / 1e3:.3g}k" if abs(v) >= 1e3 else f"{v:.3g}"


def build(rows: list[dict], out: Path, root: Path, commit_url: str | None = None) -> Path:
    """Write the page for ``rows`` to ``out``; report links are relative to it."""
    if not rows:
        raise history.HistoryError("the history store has no rows; nothing to show")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(Page(rows, out.resolve(), root.resolve(), commit_url).render(), encoding="utf-8")
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kernellab-bench site", description=__doc__)
    p.add_argument("--store", help=f"the history store (default: {history.DEFAULT_STORE} of the checkout)")
    p.add_argument("--out", default=DEFAULT_OUT, help="the HTML file to write")
    p.add_argument("--commit-url", help="link commits through this template, e.g. "
                   "'https://github.com/ORG/REPO/commit/{commit}'")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.commit_url and "{commit}" not in args.commit_url:
        print("kernellab-bench site: error: --commit-url must contain '{commit}'", file=sys.stderr)
        return 2
    root = history.repo_root()
    try:
        rows = history.read_store(args.store or root / history.DEFAULT_STORE)
        out = build(rows, Path(args.out), root, args.commit_url)
    except history.HistoryError as e:
        print(f"kernellab-bench site: error: {e}", file=sys.stderr)
        return 2
    print(f"results page: {out} ({len({r['report'] for r in rows})} runs)")
    return 0
