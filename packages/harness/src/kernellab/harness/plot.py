"""One PNG per report (optional extra ``[plot]``: matplotlib).

A run: time per call relative to torch, per case and impl, in every mode (log scale), and for the
GPU the fraction of the copy ceiling. A comparison: each record's gain with its confidence interval
(log scale). Legends sit outside the axes, so no mark is covered.
"""

from __future__ import annotations

from pathlib import Path

from .table import ceiling_op, primary_mode
from .timing import ALL_MODES


def available() -> str | None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is not installed (pip install 'kernellab-harness[plot]')"
    return None


def draw(report: dict, path: str | Path) -> Path | None:
    """Draw the report's picture to ``path``; returns None where there is nothing to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if report["kind"] == "run":
        fig = _run_figure(plt, report)
    elif report["kind"] == "comparison":
        fig = _comparison_figure(plt, report)
    else:
        return None
    if fig is None:
        return None
    path = Path(path)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _ratio_axis(ax) -> None:
    """A log x axis for ratios, its ticks written as plain numbers (0.5, 1, 2) rather than 6x10^-1."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def _run_figure(plt, report: dict):
    records = [r for r in report["versus_control"] if any(m in r for m in ALL_MODES)]
    cases = report["cases"]
    gpu = report.get("suite_device") == "cuda"
    panels = 2 if gpu else 1
    rows = records or [{"name": c["name"], "impl": c["impl"]} for c in cases]
    height = max(3.0, 0.28 * len(rows) + 1.5)
    fig, axes = plt.subplots(1, panels, figsize=(7 * panels, height), squeeze=False)
    ax = axes[0][0]
    if records:
        labels = [f"{r['name']} [{r['impl']}]" for r in records]
        modes = [m for m in ALL_MODES if any(m in r for r in records)]
        width = 0.8 / max(1, len(modes))
        for k, mode in enumerate(modes):
            ys = [i + k * width for i in range(len(records))]
            xs = [r.get(mode, {}).get("native_torch_ratio") or float("nan") for r in records]
            lo = [x - (r.get(mode, {}).get("ratio_min") or x) for x, r in zip(xs, records, strict=True)]
            hi = [(r.get(mode, {}).get("ratio_max") or x) - x for x, r in zip(xs, records, strict=True)]
            ax.barh(ys, xs, height=width, xerr=[lo, hi], label=mode, capsize=2)
        ax.set_yticks([i + 0.4 - width / 2 for i in range(len(records))], labels, fontsize=7)
        ax.axvline(1.0, color="black", lw=0.8)
        _ratio_axis(ax)
        ax.set_xlabel("time per call / torch's (lower is faster; bars: min..max over rounds)")
        # above the axes, not over them: inside, the legend covered the top rows' bars
        ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=len(modes), frameon=False)
    else:
        labels = [f"{c['name']} [{c['impl']}]" for c in cases]
        mode = primary_mode(report)
        xs = [c["modes"].get(mode, {}).get("summary_us", {}).get("p50") or float("nan") for c in cases]
        ax.barh(range(len(cases)), xs)
        ax.set_yticks(range(len(cases)), labels, fontsize=7)
        ax.set_xscale("log")
        ax.set_xlabel(f"{mode} p50, us per call")
    ax.invert_yaxis()
    fig.suptitle(f"{report['suite']}: {report['provenance']['device'].get('name')}", fontsize=9)
    if gpu:
        ax2 = axes[0][1]
        mode = primary_mode(report)
        ceiling = ceiling_op(report)
        shown = [c for c in cases
                 if c["problem"]["op"] != ceiling and "ceiling_fraction" in c["modes"].get(mode, {})]
        ax2.barh(range(len(shown)), [c["modes"][mode]["ceiling_fraction"] for c in shown])
        ax2.set_yticks(range(len(shown)), [f"{c['name']} [{c['impl']}]" for c in shown], fontsize=7)
        ax2.axvline(1.0, color="black", lw=0.8)
        ax2.invert_yaxis()
        ax2.set_xlabel(f"{mode}: fraction of the same-shape copy bandwidth")
    fig.tight_layout()
    return fig


def _comparison_figure(plt, report: dict):
    records = report["records"]
    if not records:
        return None
    modes = [m for m in ALL_MODES if any(m in r for r in records)]
    fig, ax = plt.subplots(figsize=(8, max(3.0, 0.3 * len(records) * len(modes) + 1.5)))
    y = 0
    ticks, labels = [], []
    for r in records:
        for mode in modes:
            if mode not in r:
                continue
            m = r[mode]
            lo, hi = m["gain_ci"]
            color = "tab:green" if lo > 1 else "tab:red" if hi < 1 else "tab:gray"
            ax.errorbar([m["gain"]], [y], xerr=[[m["gain"] - lo], [hi - m["gain"]]], fmt="o", color=color, capsize=2)
            ax.plot([m["gain_min"], m["gain_max"]], [y, y], color=color, alpha=0.35, lw=4)
            ticks.append(y)
            labels.append(f"{r['name']} {mode}")
            y += 1
    ax.axvline(1.0, color="black", lw=0.8)
    _ratio_axis(ax)  # a ratio: 2x faster and 2x slower sit equally far from 1, one outlier crushes nothing
    ax.set_yticks(ticks, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("gain = reference time / candidate time, log scale (dot: median, whiskers: 95% CI, band: rounds)")
    ax.set_title(f"{report['suite']}: candidate vs reference", fontsize=9)
    fig.tight_layout()
    return fig
