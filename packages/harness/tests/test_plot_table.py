"""The pictures and tables read well: ratios on log axes, legends beside the marks rather than over
them, and every symbol a table prints explained under it."""

from __future__ import annotations

import pytest

from kernellab.harness import assemble, plot, table

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
plt = pytest.importorskip("matplotlib.pyplot")

MODES = ("e2e_throughput", "e2e_latency")


def run_report(rows: int = 12) -> dict:
    ratios = [0.5 + 0.1 * i for i in range(rows)]
    return {
        "kind": "run", "suite": "fake", "suite_device": "cpu", "provenance": {"device": {"name": "test cpu"}},
        "cases": [{"name": f"op_{i}", "impl": "ours", "status": "ok", "problem": {"op": "op"},
                   "modes": {m: {"summary_us": {"p50": 10.0 * r}} for m in MODES}} for i, r in enumerate(ratios)],
        "versus_control": [{"name": f"op_{i}", "impl": "ours",
                            **{m: {"native_torch_ratio": r, "ratio_min": r * 0.9, "ratio_max": r * 1.1} for m in MODES}}
                           for i, r in enumerate(ratios)],
    }


def comparison_report() -> dict:
    gains = [0.95, 1.02, 1.1, 0.9, 40.0]  # one outlier: on a linear axis it crushed the others into 0-1
    records = [{"name": f"op_{i}", "impl": "ours",
                **{m: {"gain": g, "gain_ci": [g * 0.9, g * 1.1], "gain_min": g * 0.8, "gain_max": g * 1.2,
                       "significant": i != 0, "reference_us": 10.0 * g, "candidate_us": 10.0,
                       "native_torch_ratio": 0.8, "control_flagged": i == 1} for m in MODES}}
               for i, g in enumerate(gains)]
    return {"kind": "comparison", "suite": "fake", "records": records, "torch_probe_control_ratio_range": [0.98, 1.03],
            "summaries": {m: {"positive_medians": 3} for m in MODES}}


def boxes(fig):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return renderer


def test_the_ab_plot_puts_gains_on_a_log_axis():
    fig = plot._comparison_figure(plt, comparison_report())
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    lo, hi = ax.get_xlim()
    assert lo < 0.8 * 0.9 and hi > 40.0 * 1.2  # every band is inside the axis
    plt.close(fig)


def test_the_run_plot_legend_covers_no_bar():
    fig = plot._run_figure(plt, run_report())
    renderer = boxes(fig)
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent(renderer)
    bars = [p.get_window_extent(renderer) for p in ax.patches]
    assert bars and not any(legend.overlaps(b) for b in bars)
    assert not legend.overlaps(ax.get_window_extent(renderer))  # beside the axes, not in them
    title = fig._suptitle.get_window_extent(renderer)
    assert not legend.overlaps(title)
    plt.close(fig)


def test_draw_writes_both_pictures(tmp_path):
    assert plot.draw(run_report(), tmp_path / "run.png").stat().st_size > 0
    assert plot.draw(comparison_report(), tmp_path / "ab.png").stat().st_size > 0


def test_the_run_table_says_which_way_x_torch_is_faster():
    text = table.run_table(run_report())
    assert "x torch (e2e_throughput)" in text
    assert text.splitlines()[-1] == ("x torch: time per call / torch's, median over rounds in e2e_throughput; "
                                     "below 1 is faster than torch")


def test_the_comparison_table_explains_its_marks():
    text = table.comparison_table(comparison_report())
    assert " n.s." in text and "drift!" in text
    legend = text.splitlines()[-1]
    for explained in ("n.s.: not significant (the 95% CI holds 1)", "drift!: torch, timed in both runs, moved more "
                      "than 10%", "gain: reference time / candidate time, above 1 is faster",
                      "x torch: candidate time / torch's, below 1 is faster",
                      "few rounds: fewer than the report's significance_min_rounds, no claim"):
        assert explained in legend


def test_a_record_over_too_few_rounds_is_marked_as_such_not_as_noise():
    report = comparison_report()
    name, rec = next((r["name"], r[m]) for r in report["records"] for m in r
                     if isinstance(r[m], dict) and r[m].get("significant"))
    rec.update(significant=False, too_few_rounds=True)
    line = next(x for x in table.comparison_table(report).splitlines() if x.startswith(name))
    assert " few rounds" in line and " n.s." not in line
    record = assemble.before_after_record("affine_8_16", "ours", [[2.0, 2.1]] * 2, [[1.0, 1.1]] * 2, rec)
    assert record["too_few_rounds"] and not record["significant"]
    assert " few rounds" in table.before_after_table({"records": [record]})


def test_a_fraction_far_above_the_copy_is_marked_and_explained():
    """Past ``table.ABOVE_CEILING`` of its shape's copy a fraction is suspect (the copy was slow, not the kernel
    fast): marked '!' in both tables, the mark explained under them; at or under it, no mark and no note."""
    report = run_report(3)
    for case, fraction in zip(report["cases"], (1.08, table.ABOVE_CEILING, 1.57), strict=True):
        case["modes"]["e2e_throughput"]["ceiling_fraction"] = fraction
    rows = table.run_table(report).splitlines()
    assert [row.split()[-1] for row in rows if row.startswith("op_")] == ["1.08", "1.15", "1.57!"]
    assert rows[-1] == table.ABOVE_NOTE
    pivot = table.pivot_table({**report, "control": "torch"}, "e2e_throughput").splitlines()
    assert [row.split()[-1] for row in pivot if row.startswith("op_")] == ["1.08", "1.15", "1.57!"]
    assert pivot[-1] == table.ABOVE_NOTE
    report["cases"][2]["modes"]["e2e_throughput"]["ceiling_fraction"] = 1.1
    assert table.ABOVE_NOTE not in table.run_table(report)
