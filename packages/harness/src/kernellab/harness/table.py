"""Terminal tables of reports (tabulate)."""

from __future__ import annotations

from tabulate import tabulate

from .timing import ALL_MODES


def primary_mode(report: dict) -> str:
    """The mode a reader looks at first: graph throughput on the GPU, host throughput on the CPU."""
    return "graph_throughput" if report.get("suite_device") == "cuda" else "e2e_throughput"


def ceiling_op(report: dict) -> str | None:
    """The problem op that measured the bandwidth ceiling; reports before 0.2 recorded none and used copy."""
    return report.get("ceiling_op", "copy")


ABOVE_CEILING = 1.15
"""A contender past its shape's copy by more than this is marked: a kernel that moves at least the bytes it is
counted by cannot beat the device's copy by much (inputs rotated past the L2), so the copy is the suspect (a slow
copy: a CUDA graph's memcpy node ran fp32 copies of 512 MB at two thirds of a kernel's rate on the H200)."""
ABOVE_NOTE = (f"!: more than {ABOVE_CEILING - 1:.0%} above the copy of its shape: the ceiling, not the kernel, is "
              "suspect (a slow copy)")


def _fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def _above(x) -> bool:
    return x is not None and x > ABOVE_CEILING


def _fraction(x) -> str:
    """A fraction of the copy ceiling, marked ``!`` past ``ABOVE_CEILING``."""
    return _fmt(x) + ("!" if _above(x) else "")


def _noted(fractions) -> str:
    """The note under a table where one of its fractions is marked."""
    return "\n" + ABOVE_NOTE if any(_above(x) for x in fractions) else ""


def run_table(report: dict, fmt: str = "simple") -> str:
    modes = [m for m in ALL_MODES if any(m in c["modes"] for c in report["cases"])]
    primary = primary_mode(report)
    ratios = {(r["name"], r["impl"]): r.get(primary, {}).get("native_torch_ratio") for r in report["versus_control"]}
    rows, fractions = [], []
    for c in report["cases"]:
        status = c["status"] if c["status"] == "ok" else f"{c['status']}: {c.get('reason') or ''}"[:60]
        row = [c["name"], c["impl"], status]
        row += [_fmt(c["modes"].get(m, {}).get("summary_us", {}).get("p50")) for m in modes]
        m = c["modes"].get(primary, {})
        row += [_fmt(ratios.get((c["name"], c["impl"])), ".3f"), _fmt(m.get("gbps"), ".1f"),
                _fraction(m.get("ceiling_fraction"))]
        rows.append(row)
        fractions.append(m.get("ceiling_fraction"))
    headers = ["case", "impl", "status", *[f"{m} p50 us" for m in modes], f"x torch ({primary})", "GB/s", "of copy"]
    return (tabulate(rows, headers=headers, disable_numparse=True, tablefmt=fmt)
            + f"\nx torch: time per call / torch's, median over rounds in {primary}; below 1 is faster than torch"
            + _noted(fractions))


def pivot_table(report: dict, mode: str | None = None, fmt: str = "simple") -> str:
    """One row per problem, one column per impl: p50 in ``mode``, each contender's time over the
    control's, and each contender's fraction of the copy ceiling (the bandwidth figures)."""
    mode = mode or primary_mode(report)
    control = report.get("control", "torch")
    ceiling = ceiling_op(report)
    impls = [control] + sorted({c["impl"] for c in report["cases"]} - {control})
    cells: dict[str, dict[str, dict]] = {}
    for c in report["cases"]:
        if c["problem"]["op"] != ceiling:
            cells.setdefault(c["name"], {})[c["impl"]] = c["modes"].get(mode, {})
    rows, fractions = [], []
    for name, by_impl in cells.items():
        p50 = {i: by_impl.get(i, {}).get("summary_us", {}).get("p50") for i in impls}
        row = [name, *[_fmt(p50[i]) for i in impls]]
        row += [_fmt(p50[i] / p50[control] if p50[i] and p50[control] else None, ".3f") for i in impls[1:]]
        shares = [by_impl.get(i, {}).get("ceiling_fraction") for i in impls[1:]]
        row += [_fraction(x) for x in shares]
        rows.append(row)
        fractions += shares
    headers = ["case", *[f"{i} us" for i in impls], *[f"{i} / {control}" for i in impls[1:]],
               *[f"{i} of copy" for i in impls[1:]]]
    return (f"{mode} p50 per call\n" + tabulate(rows, headers=headers, disable_numparse=True, tablefmt=fmt)
            + f"\nimpl / {control}: time per call over {control}'s; below 1 is faster than {control}"
            + _noted(fractions))


def comparison_table(report: dict, fmt: str = "simple") -> str:
    rows = []
    for r in report["records"]:
        for mode in ALL_MODES:
            if mode not in r:
                continue
            m = r[mode]
            lo, hi = m["gain_ci"]
            rows.append([
                r["name"], mode, _fmt(m["reference_us"]), _fmt(m["candidate_us"]),
                f"{m['gain']:.3f} [{lo:.3f}, {hi:.3f}]" + _unclaimed(m),
                f"{m['gain_min']:.3f}..{m['gain_max']:.3f}",
                _fmt(m.get("native_torch_ratio"), ".3f"),
                "drift!" if m.get("control_flagged") else "",
            ])
    headers = ["case", "mode", "reference us", "candidate us", "gain [95% CI]", "gain range", "x torch", "control"]
    lines = [tabulate(rows, headers=headers, disable_numparse=True, tablefmt=fmt)]
    rng = report.get("torch_probe_control_ratio_range")
    if rng:
        lines.append(f"control probe ratio (reference run / candidate run): {rng[0]:.3f} .. {rng[1]:.3f}")
    for mode, s in report["summaries"].items():
        lines.append(f"{mode}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                              for k, v in s.items()))
    lines.append("gain: reference time / candidate time, above 1 is faster; n.s.: not significant (the 95% CI "
                 "holds 1); few rounds: fewer than the report's significance_min_rounds, no claim; x torch: candidate "
                 "time / torch's, below 1 is faster; drift!: torch, timed in both runs, moved more than 10%")
    return "\n".join(lines)


def _unclaimed(record: dict) -> str:
    """Why a comparison's or a before/after record claims no significance: nothing where it does (or, from before
    significance was recorded, says nothing)."""
    if record.get("significant", True):
        return ""
    if record.get("disturbed"):
        return " disturbed"
    return " few rounds" if record.get("too_few_rounds") else " n.s."


def before_after_table(report: dict, fmt: str = "simple") -> str:
    rows = []
    for r in report["records"]:
        ci = r.get("speedup_ci")
        interval = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""
        rows.append([r["operation"], r["impl"], f"{r['before_ms']:.4f}", f"{r['after_ms']:.4f}",
                     f"{r['speedup']:.3f}{interval}{_unclaimed(r)}"])
    return tabulate(rows, headers=["operation", "impl", "before ms", "after ms", "speedup [CI]"],
                    disable_numparse=True, tablefmt=fmt)


def render(report: dict, fmt: str = "simple") -> str:
    """The report's table; ``fmt`` is a tabulate format ("github" for a README)."""
    tables = {"run": run_table, "comparison": comparison_table, "before_after": before_after_table}
    notice = report.get("notice") or (report.get("metadata") or {}).get("notice")
    body = tables[report["kind"]](report, fmt)
    return f"NOTE: {notice}\n{body}" if notice else body
