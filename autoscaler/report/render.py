"""How a report looks: rich tables on the terminal, ``report.json``, ``report.png`` and a self-contained
``report.html`` (tables plus the PNG inlined as base64, so the one file can be mailed or attached to a ticket).

All four show the same numbers: the section's fields, which for a simulation are its scorecard's (the JSON's).
"""

from __future__ import annotations

import base64
import html
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

from autoscaler.report.data import Section
from autoscaler.sim.scorecard import LABELS

TOP_MODELS_PLOT = 20  # per-model SLO bars: the busiest models (a 50-model fleet would be unreadable)
TOP_MODELS_LEGEND = 10  # cost stacks: the most expensive models get a colour each, the rest are "other"


# -- formatting ------------------------------------------------------------------------------------------
def usd(x: float | None) -> str:
    return "-" if x is None else f"${x:,.2f}"


def hours(x: float | None) -> str:
    return "-" if x is None else f"{x:,.2f}"


def pct(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def secs(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def count(x: int | None) -> str:
    return "-" if x is None else f"{x:,}"


def ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _by_kind(d: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:,.2f}" for k, v in sorted(d.items()) if v > 0) or "-"


Row = tuple[str, str, Callable[[Any], str]]  # (label, the scorecard field, how it is shown)

# The summary, the headline first; the labels are the scorecard's (autoscaler.sim.scorecard.LABELS) so the report
# and `slotwise simulate` say the same thing about the same field.
SUMMARY_ROWS: tuple[Row, ...] = (
    (LABELS["slo_attainment"], "slo_attainment", pct),
    (LABELS["slo_attainment_attainable"], "slo_attainment_attainable", pct),
    (LABELS["violating_requests"], "violating_requests", count),
    (LABELS["unattainable_requests"], "unattainable_requests", count),
    (LABELS["requests"], "requests", count),
    (LABELS["slo_minutes_met"], "slo_minutes_met", pct),
    (LABELS["requests_within_latency"], "requests_within_latency", pct),
    (LABELS["late_requests"], "late_requests", count),
    ("period (h)", "hours", hours),
    (LABELS["gpu_hours"], "gpu_hours", hours),
    (LABELS["gpu_hours_vs_lower_bound"], "gpu_hours_vs_lower_bound", ratio),
    (LABELS["gpu_hours_vs_oracle"], "gpu_hours_vs_oracle", ratio),
    ("cost (serving + idle)", "cost_usd", usd),
    ("serving cost (GPU-hours held x price)", "serving_cost_usd", usd),
    ("idle cost (free GPUs on nodes holding replicas)", "idle_cost_usd", usd),
    ("idle GPU-hours on nodes holding replicas", "idle_gpu_hours", hours),
    (LABELS["idle_reserved_gpu_hours"], "idle_reserved_gpu_hours", hours),
    (LABELS["lent_gpu_hours"], "lent_gpu_hours", hours),
    ("lent value", "lent_value_usd", usd),
    (LABELS["fragmentation"], "fragmentation", lambda v: pct(v, 1)),
)
TEAM_COLUMNS: tuple[Row, ...] = (
    ("team", "team", str),
    ("models", "models", str),
    ("GPU-hours", "gpu_hours", hours),
    ("cost", "cost_usd", usd),
    ("share of serving cost", "cost_share", lambda v: pct(v, 1)),
    ("requests", "requests", count),
    ("violating requests", "violating_requests", count),
    ("SLO attainment", "slo_attainment", pct),
    ("within latency target", "requests_within_latency", pct),
)
MODEL_COLUMNS: tuple[Row, ...] = (
    ("model", "model", str),
    ("team", "team", str),
    ("namespace", "namespace", str),
    ("GPU-hours by kind", "gpu_hours_by_kind", _by_kind),
    ("cost", "cost_usd", usd),
    ("requests", "requests", count),
    ("violating requests", "violating_requests", count),
    ("SLO attainment", "slo_attainment", pct),
    ("within latency target", "requests_within_latency", pct),
    ("SLO percentile", "slo_percentile", lambda v: "-" if v is None else f"p{v:g}"),
    ("latency at SLO percentile (s)", "latency_at_slo_percentile_s", secs),
    ("latency target (s)", "slo_latency_s", secs),
)
TEAM_HEADER = tuple(h for h, _, _ in TEAM_COLUMNS)
MODEL_HEADER = tuple(h for h, _, _ in MODEL_COLUMNS)


# Shown only where the section has them (a simulation scorecard written since scale to zero, issue 18).
ZERO_ROWS: tuple[Row, ...] = (
    (LABELS["cold_started_requests"], "cold_started_requests", count),
    (LABELS["cold_start_slo"], "cold_start_slo", str),
    (LABELS["warm_idle_gpu_hours"], "warm_idle_gpu_hours", hours),
)


def summary_rows(s: Section) -> list[tuple[str, str]]:
    rows = [(label, f(getattr(s, key))) for label, key, f in SUMMARY_ROWS]
    return rows + [(label, f(getattr(s, key))) for label, key, f in ZERO_ROWS if getattr(s, key) is not None]


def team_rows(s: Section) -> list[tuple[str, ...]]:
    return [tuple(f(getattr(t, key)) for _, key, f in TEAM_COLUMNS) for t in s.teams]


def model_table(s: Section) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """Header and rows of the per-model table; columns the source has no numbers for (SLO attainment and latency
    from Prometheus) are left out."""
    rows = model_rows(s)
    keep = [i for i, _ in enumerate(MODEL_HEADER) if i < 3 or any(r[i] != "-" for r in rows)]
    return tuple(MODEL_HEADER[i] for i in keep), [tuple(r[i] for i in keep) for r in rows]


def model_rows(s: Section) -> list[tuple[str, ...]]:
    return [tuple(f(getattr(m, key)) for _, key, f in MODEL_COLUMNS)
            for m in sorted(s.models, key=lambda m: (-m.cost_usd, m.model))]


# -- terminal --------------------------------------------------------------------------------------------
def print_report(sections: Sequence[Section], console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    con = console or Console(width=max(170, 30 + 18 * len(sections)))
    if len(sections) > 1:  # side by side first: the comparison a PoC is about
        table = Table(title="slotwise report: summary")
        table.add_column("")
        for s in sections:
            table.add_column(s.policy or s.title, justify="right")
        for i, (label, _) in enumerate(summary_rows(sections[0])):
            table.add_row(label, *[summary_rows(s)[i][1] for s in sections])
        con.print(table)
    for s in sections:
        if len(sections) == 1:
            summary = Table(title=f"slotwise report: {s.title}", show_header=False)
            summary.add_column("")
            summary.add_column("", justify="right")
            for row in summary_rows(s):
                summary.add_row(*row)
            con.print(summary)
        teams = Table(title=f"cost per team: {s.title}")
        for i, h in enumerate(TEAM_HEADER):
            teams.add_column(h, justify="left" if i == 0 else "right", no_wrap=i == 0)
        for row in team_rows(s):
            teams.add_row(*row)
        con.print(teams)
        models = Table(title=f"cost per model: {s.title}")
        header, rows = model_table(s)
        for i, h in enumerate(header):
            # names are what the reader looks for: never cut them short
            models.add_column(h, justify="left" if i < 3 else "right", no_wrap=i < 3)
        for row in rows:
            models.add_row(*row)
        con.print(models)
        for note in s.notes:
            con.print(f"[dim]note: {note}[/dim]")


# -- files -----------------------------------------------------------------------------------------------
def report_dict(sections: Sequence[Section], meta: dict[str, Any]) -> dict[str, Any]:
    return {**meta, "sections": [s.to_dict() for s in sections]}


def write_json(sections: Sequence[Section], meta: dict[str, Any], path: str) -> None:
    with open(path, "w") as f:
        json.dump(report_dict(sections, meta), f, indent=2)


def write_png(sections: Sequence[Section], path: str) -> None:
    """Per section: serving cost per team stacked by model (left); per model (right) its SLO attainment (bars),
    its requests within the latency target (dots) and its declared percentile (|)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    n_rows = max(1, len(sections))
    shown = [min(TOP_MODELS_PLOT, max(1, len(s.models))) for s in sections] or [1]
    heights = [max(3.6, 0.28 * k + 1.6) for k in shown]
    fig, axes = plt.subplots(n_rows, 2, figsize=(14, sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for row, s in enumerate(sections):
        ax_cost, ax_slo = axes[row]
        teams = [t.team for t in s.teams]
        ranked = sorted(s.models, key=lambda m: (-m.cost_usd, m.model))
        named = {m.model for m in ranked[:TOP_MODELS_LEGEND] if m.cost_usd > 0}
        bottom = np.zeros(len(teams))
        cmap = plt.get_cmap("tab20")
        for k, m in enumerate([m for m in ranked if m.model in named]):
            vals = np.array([m.cost_usd if m.team == t else 0.0 for t in teams])
            ax_cost.bar(teams, vals, bottom=bottom, label=m.model, color=cmap(k % 20), width=0.6)
            bottom += vals
        other = np.array([sum(m.cost_usd for m in ranked if m.team == t and m.model not in named) for t in teams])
        if other.any():
            ax_cost.bar(teams, other, bottom=bottom, label="other models", color="0.7", width=0.6)
        ax_cost.set_ylabel("USD")
        # "$" would start matplotlib's mathtext: escape it
        ax_cost.set_title(f"{s.title}\nserving cost per team, by model (cost {usd(s.cost_usd)} = serving "
                          f"{usd(s.serving_cost_usd)} + idle {usd(s.idle_cost_usd)})".replace("$", r"\$"),
                          fontsize=9)
        if named or other.any():
            ax_cost.legend(fontsize=7, loc="upper right")

        busy = sorted([m for m in s.models if m.requests], key=lambda m: (-(m.requests or 0), m.model))
        busy = busy[:TOP_MODELS_PLOT]
        if busy:
            names = [m.model for m in busy][::-1]
            y = np.arange(len(names))

            att, raw = (_percent_of(busy, key) for key in ("slo_attainment", "requests_within_latency"))
            obj = [np.nan if m.slo_percentile is None else m.slo_percentile for m in busy][::-1]
            if not all(np.isnan(att)):
                ax_slo.barh(y, np.nan_to_num(att), height=0.5, color="tab:blue",
                            label="SLO attainment: requests in SLO-meeting model-minutes")
            ax_slo.scatter(raw, y, marker="o", s=18, color="tab:orange", zorder=3,
                           label="requests within the latency target (raw share)")
            ax_slo.scatter(obj, y, marker="|", s=300, color="black", zorder=4, label="declared percentile")
            ax_slo.set_yticks(y, names, fontsize=7)
            shown = [v for v in (*att, *raw, *obj) if not np.isnan(v)]
            lo = min(shown, default=90.0)
            ax_slo.set_xlim(0.0 if lo < 50.0 else min(90.0, lo - 2.0), 100.5)
            # under the axes: inside, it would cover the bars
            ax_slo.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
        else:
            ax_slo.text(0.5, 0.5, "no request counts", ha="center", va="center", transform=ax_slo.transAxes)
        ax_slo.set_xlabel("% of the model's requests")
        busiest = f", busiest {TOP_MODELS_PLOT}" if len(s.models) > TOP_MODELS_PLOT else ""
        ax_slo.set_title(f"per model: SLO attainment and requests within the latency target{busiest}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _percent_of(models: Sequence[Any], key: str) -> list[float]:
    """``key`` of each model in %, bottom-up (the plot's order); NaN where unknown."""
    return [float("nan") if getattr(m, key) is None else 100 * getattr(m, key) for m in models][::-1]


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; }
th { background: #f0f0f0; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
p.note { color: #666; font-size: 0.85em; }
img { max-width: 100%; }
"""


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td{'' if i < left else ' class=n'}>{e(v)}</td>" for i, v in enumerate(r)) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(sections: Sequence[Section], meta: dict[str, Any], png: bytes | None) -> str:
    e = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>slotwise report</title>"
             f"<style>{_CSS}</style></head><body><h1>slotwise report</h1>"]
    parts.append("<p>" + e(", ".join(f"{k}: {v}" for k, v in meta.items() if k != "sections")) + "</p>")
    if len(sections) > 1:
        labels = [label for label, _ in summary_rows(sections[0])]
        rows = [[label, *[summary_rows(s)[i][1] for s in sections]] for i, label in enumerate(labels)]
        parts.append("<h2>summary</h2>" + _table(["", *[s.policy or s.title for s in sections]], rows))
    if png:
        parts.append("<img alt='serving cost per team; SLO attainment and requests within the latency target per "
                     f"model' "
                     f"src='data:image/png;base64,{base64.b64encode(png).decode('ascii')}'>")
    for s in sections:
        parts.append(f"<h2>{e(s.title)}</h2>")
        parts.append(_table(["", "value"], summary_rows(s)))
        parts.append("<h3>cost per team</h3>" + _table(TEAM_HEADER, team_rows(s)))
        parts.append("<h3>cost per model</h3>" + _table(*model_table(s), left=3))
        prices = [(k, f"${v:,.2f}") for k, v in sorted(s.prices.items())]
        parts.append("<h3>prices (USD per GPU-hour)</h3>" + _table(["GPU kind", "price"], prices))
        parts.extend(f"<p class=note>note: {e(n)}</p>" for n in s.notes)
    parts.append("</body></html>")
    return "\n".join(parts)


def write_all(sections: Sequence[Section], meta: dict[str, Any], out_dir: str) -> dict[str, str]:
    """report.json, report.png and report.html in ``out_dir`` (created); returns kind -> path."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {k: os.path.join(out_dir, f"report.{k}") for k in ("json", "png", "html")}
    write_json(sections, meta, paths["json"])
    write_png(sections, paths["png"])
    with open(paths["png"], "rb") as f:
        png = f.read()
    with open(paths["html"], "w") as f:
        f.write(render_html(sections, meta, png))
    return paths
