"""How a report looks: rich tables on the terminal, ``report.json``, ``report.png`` and a self-contained
``report.html`` (tables plus the PNG inlined as base64, so the one file can be mailed or attached to a ticket).

All four show the same numbers, from :meth:`Section.to_dict`.
"""

from __future__ import annotations

import base64
import html
import json
import os
from collections.abc import Sequence
from typing import Any

from autoscaler.report.data import Section

TOP_MODELS_PLOT = 20  # SLO attainment bars: the busiest models (a 50-model fleet would be unreadable)
TOP_MODELS_LEGEND = 10  # cost stacks: the most expensive models get a colour each, the rest are "other"


# -- formatting ------------------------------------------------------------------------------------------
def usd(x: float | None) -> str:
    return "-" if x is None else f"${x:,.2f}"


def hours(x: float | None) -> str:
    return "-" if x is None else f"{x:,.2f}"


def pct(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def secs(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _by_kind(d: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:,.2f}" for k, v in sorted(d.items()) if v > 0) or "-"


def summary_rows(s: Section) -> list[tuple[str, str]]:
    return [
        ("period (h)", hours(s.hours)),
        ("GPU-hours held", hours(s.gpu_hours)),
        ("cost", usd(s.cost_usd)),
        ("idle reserved GPU-hours", hours(s.idle_gpu_hours)),
        ("idle reserved cost", usd(s.idle_cost_usd)),
        ("lent GPU-hours", hours(s.lent_gpu_hours)),
        ("lent value", usd(s.lent_value_usd)),
        ("requests", num(s.requests)),
        ("late requests", num(s.late_requests)),
        ("SLO attainment (requests)", pct(s.slo_attainment)),
        ("SLO windows met", pct(s.slo_windows_met)),
        ("fragmentation", pct(s.fragmentation, 1)),
    ]


TEAM_HEADER = ("team", "models", "GPU-hours", "cost", "share", "requests", "SLO attainment")
MODEL_HEADER = ("model", "team", "namespace", "GPU-hours by kind", "cost", "requests", "late", "SLO attainment",
                "objective", "p95 latency (s)", "SLO (s)")


def team_rows(s: Section) -> list[tuple[str, ...]]:
    return [(t.team, str(t.models), hours(t.gpu_hours), usd(t.cost_usd), pct(t.cost_share, 1),
             num(t.requests), pct(t.slo_attainment)) for t in s.teams]


def model_table(s: Section) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """Header and rows of the per-model table; columns the source has no numbers for (p95 latency and SLO
    from Prometheus) are left out."""
    rows = model_rows(s)
    keep = [i for i, _ in enumerate(MODEL_HEADER) if i < 3 or any(r[i] != "-" for r in rows)]
    return tuple(MODEL_HEADER[i] for i in keep), [tuple(r[i] for i in keep) for r in rows]


def model_rows(s: Section) -> list[tuple[str, ...]]:
    rows = []
    for m in sorted(s.models, key=lambda m: (-m.cost_usd, m.model)):
        late = None if not m.requests or m.late_requests is None else m.late_requests / m.requests
        rows.append((m.model, m.team, m.namespace, _by_kind(m.gpu_hours_by_kind), usd(m.cost_usd), num(m.requests),
                     pct(late), pct(m.slo_attainment), pct(m.slo_objective, 1), secs(m.p95_latency_s),
                     secs(m.slo_latency_s)))
    return rows


# -- terminal --------------------------------------------------------------------------------------------
def print_report(sections: Sequence[Section], console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    con = console or Console(width=max(120, 30 + 18 * len(sections)))
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
    """Per section: cost per team stacked by model (left), SLO attainment per model against its objective
    (right)."""
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
        ax_cost.set_title(f"{s.title}\ncost per team, by model (total {usd(s.cost_usd)}; idle reserved "
                          f"{usd(s.idle_cost_usd)})".replace("$", r"\$"), fontsize=9)
        if named or other.any():
            ax_cost.legend(fontsize=7, loc="upper right")

        busy = sorted([m for m in s.models if m.slo_attainment is not None],
                      key=lambda m: (-(m.requests or 0.0), m.model))[:TOP_MODELS_PLOT]
        if busy:
            names = [m.model for m in busy][::-1]
            att = [100 * (m.slo_attainment or 0.0) for m in busy][::-1]
            obj = [100 * m.slo_objective if m.slo_objective is not None else np.nan for m in busy][::-1]
            y = np.arange(len(names))
            ax_slo.barh(y, att, color=["tab:green" if a >= o - 1e-9 or np.isnan(o) else "tab:red"
                                       for a, o in zip(att, obj, strict=True)])
            ax_slo.scatter(obj, y, marker="|", s=300, color="black", zorder=3)
            ax_slo.set_yticks(y, names, fontsize=7)
            lo = min(att + [o for o in obj if not np.isnan(o)])
            ax_slo.set_xlim(max(0.0, min(90.0, lo - 2.0)), 100.5)
        else:
            ax_slo.text(0.5, 0.5, "no request counts", ha="center", va="center", transform=ax_slo.transAxes)
        ax_slo.set_xlabel("% of requests within the SLO latency")
        busiest = f", busiest {TOP_MODELS_PLOT}" if len(s.models) > TOP_MODELS_PLOT else ""
        ax_slo.set_title(f"SLO attainment per model (| = objective; red: below it{busiest})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


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
        parts.append(f"<img alt='cost per team and SLO attainment per model' "
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
