"""The scenario scorecard of ``slotwise simulate --scenario`` (issue 9): what a platform team evaluates a PoC with.

Per team and overall, for every run side by side (``slotwise/slo``, ``slotwise/priority``, ``slotwise/partition``):
GPU utilization (allocated and busy), waiting (replicas asked for but not placed; training jobs), success rate,
SLO attainment, fragmentation, cost attribution (GPU-hours and cost per team, idle cost, lent value),
preemptions by reason and shortfall by cause, and after each node loss or GPU kind removal the **recovery time**
of the highest-priority models next to their cold start.

:func:`build_doc` turns the simulation results into one JSON-able document (``scorecard.json``); every table
(:func:`tables`) -- on the terminal, in ``report.html`` -- and the figure (``report.png``) are rendered from that
document only, so all of them carry the same numbers.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoscaler.api.plan import PreemptionReason, ShortfallCause
from autoscaler.report.render import _CSS, _table, hours, pct, usd

RECOVERY_MINUTES = 3  # consecutive minutes at or above the SLO percentile that count as recovered
PREEMPTIONS_KEPT = 50  # per run in the JSON (the count is always whole)
PREEMPTIONS_SHOWN = 10  # per run in the tables
PLOT_MODELS = 3  # top-priority models drawn in the attainment panel
RECOVERY_EVENTS = ("node_lost", "gpu_kind_removed")


# -- recovery time ---------------------------------------------------------------------------------------------
def minute_met(arrivals: np.ndarray, within: np.ndarray, objective: float) -> np.ndarray:
    """Per minute: did at least ``objective`` (the SLO percentile / 100) of the minute's requests finish within
    the SLO latency? A minute without requests missed nothing and counts as met."""
    a = np.asarray(arrivals, dtype=float)
    w = np.asarray(within, dtype=float)
    frac = np.divide(w, a, out=np.ones_like(a), where=a > 0)
    return frac >= objective - 1e-9


def requests_in_slo_minutes(result: Any, models: Sequence[str]) -> float | None:
    """The share of ``models``' requests (together) that arrived in a model-minute meeting the SLO percentile
    (:func:`minute_met`); None without requests. From a SimResult, unrounded: a scenario document takes it from the
    scorecard instead (its whole-number counts), so its tables agree with the scorecard."""
    served = total = 0.0
    for m in models:
        if m in result.models:
            i = result.models.index(m)
            a = np.asarray(result.minute_arrivals[i], dtype=float)
            served += float(a[minute_met(a, result.minute_within[i], float(result.slo_percentile[i]) / 100.0)].sum())
            total += float(a.sum())
    return served / total if total > 0 else None


def recovery_time_s(
    arrivals: np.ndarray,
    within: np.ndarray,
    objective: float,
    at_s: float,
    start_s: float = 0.0,
    step_s: float = 60.0,
    run: int = RECOVERY_MINUTES,
) -> float | None:
    """Seconds from an event at ``at_s`` until the model's minutes meet the SLO again (the share of the minute's
    requests within the latency target at or above ``objective``) for ``run`` consecutive minutes: the start of
    the first such run of minutes, counted from the minute the event falls in (0 when the model never dipped).
    None when it never recovers within the series.

    ``arrivals`` / ``within`` are one model's per-minute counts; minute ``j`` covers
    ``[start_s + j*step_s, start_s + (j+1)*step_s)`` (a run's scored minutes start after the burn-in).
    """
    met = minute_met(arrivals, within, objective)
    j0 = max(0, int(math.floor((at_s - start_s) / step_s + 1e-9)))
    streak = 0
    for j in range(j0, met.size):
        streak = streak + 1 if met[j] else 0
        if streak == run:
            first = j - run + 1
            return max(0.0, start_s + first * step_s - at_s)
    return None


def minute_attainment(arrivals: np.ndarray, within: np.ndarray) -> list[float | None]:
    """Within-SLO share of each minute's requests (None: no requests that minute)."""
    return [float(w / a) if a > 0 else None for a, w in zip(np.asarray(arrivals, float), np.asarray(within, float),
                                                            strict=True)]


def top_priority_models(priorities: Mapping[str, int]) -> list[str]:
    """The models at the highest priority of the scenario, in its order."""
    if not priorities:
        return []
    top = max(priorities.values())
    return [m for m, p in priorities.items() if p == top]


# -- the document --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    """One simulated run: ``label`` (``policy/mode``), the autoscaling policy, the arbitration mode."""

    label: str
    policy: str
    arbitration: str


def build_doc(
    *,
    meta: Mapping[str, Any],
    runs: Sequence[Run],
    results: Sequence[Any],
    cards: Sequence[Mapping[str, Any]],
    team_cards: Sequence[Mapping[str, Any]],
    priorities: Mapping[str, int],
    cold_starts: Mapping[str, float],
    surges: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The scorecard document: ``meta`` (scenario, file, hours, ...) and per run (``runs``, ``results``: their
    SimResults, ``cards``: their scorecards, ``team_cards``: ``autoscaler.sim.scorecard.team_card`` of each)
    the per-team rows, the overall row, recoveries, preemptions, the top-priority models' per-minute attainment,
    the cluster events that fired. ``priorities`` / ``cold_starts``: per model, from its spec."""
    top = top_priority_models(priorities)
    doc: dict[str, Any] = {**meta, "runs": [dataclasses.asdict(r) for r in runs], "per_team": {}, "overall": {},
                           "recovery": {}, "preemptions": {}, "attainment": {},
                           "events": {"surges": list(surges), "cluster": {}}, "results": list(cards)}
    doc["top_priority_models"] = top
    for run, result, card, tc in zip(runs, results, cards, team_cards, strict=True):
        scored_h = float(card.get("cost", {}).get("hours") or 0.0)
        rows = [_with_derived(dict(r), scored_h) for r in tc["teams"]]
        overall = _with_derived(dict(tc["all"]), scored_h)
        gpus = overall.get("gpus_total") or card.get("gpus_total") or 0
        overall["utilization_allocated"] = (overall["gpu_hours_allocated"] / (gpus * scored_h)
                                            if gpus and scored_h > 0 else None)
        index = {m: i for i, m in enumerate(result.models)}
        # The issue-9 targets: the SLO attainment summed over models (each model counts once, whatever its
        # traffic), and the share of the top-priority class's requests served in minutes that met their SLO --
        # both from the scorecard's own per-model fields (its whole-number counts), so they agree with it.
        per_model = card.get("per_model", {})
        overall["summed_slo_attainment"] = float(sum(m["slo_attainment"] for m in per_model.values()))
        overall["top_priority_requests_in_slo"] = _top_in_slo(per_model, top)
        doc["per_team"][run.label] = rows
        doc["overall"][run.label] = overall
        doc["recovery"][run.label] = recoveries(result, top, cold_starts)
        pre = list(getattr(result, "preemptions", None) or [])
        doc["preemptions"][run.label] = {"count": len(pre), "first": pre[:PREEMPTIONS_KEPT]}
        doc["attainment"][run.label] = {
            "minute0_s": float(result.burn_in_s),
            "models": {m: minute_attainment(result.minute_arrivals[index[m]], result.minute_within[index[m]])
                       for m in top if m in index},
            "objective": {m: float(result.slo_percentile[index[m]]) / 100.0 for m in top if m in index},
        }
        doc["events"]["cluster"][run.label] = list(result.events)
    return doc


def _top_in_slo(per_model: Mapping[str, Mapping[str, Any]], models: Sequence[str]) -> float | None:
    """Requests of ``models`` (together) in their SLO-meeting model-minutes / their requests (None: none)."""
    rows = [per_model[m] for m in models if m in per_model]
    n = sum(int(r["requests"]) for r in rows)
    return (n - sum(int(r["violating_requests"]) for r in rows)) / n if n > 0 else None


def _with_derived(row: dict[str, Any], scored_h: float) -> dict[str, Any]:
    """A team_card row plus what the tables derive from it: mean GPUs held and preemptions suffered in total."""
    row["mean_gpus_allocated"] = row.get("gpu_hours_allocated", 0.0) / scored_h if scored_h > 0 else None
    row["preempted"] = int(sum((row.get("preemptions_by_reason") or {}).values()))
    return row


def recoveries(result: Any, models: Sequence[str], cold_starts: Mapping[str, float]) -> list[dict[str, Any]]:
    """For each node loss / GPU kind removal that fired in ``result``, each of ``models``' recovery time
    (:func:`recovery_time_s`) and cold start; ``within_cold_start`` is the issue's target."""
    index = {m: i for i, m in enumerate(result.models)}
    out = []
    for e in result.events:
        if e.get("kind") not in RECOVERY_EVENTS:
            continue
        at = float(e["at_s"])
        for m in models:
            if m not in index:
                continue
            i = index[m]
            rec = recovery_time_s(result.minute_arrivals[i], result.minute_within[i],
                                  float(result.slo_percentile[i]) / 100.0, at, start_s=float(result.burn_in_s))
            cold = float(cold_starts.get(m, 0.0))
            out.append({"at_s": at, "kind": e["kind"], "target": e.get("target"), "model": m, "cold_start_s": cold,
                        "recovery_s": rec, "within_cold_start": None if rec is None else rec <= cold + 1e-9})
    return out


# -- tables ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TableData:
    title: str
    header: tuple[str, ...]
    rows: list[tuple[str, ...]]
    left: int = 1  # the first ``left`` columns are names (left-aligned), the rest numbers


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        if abs(v) < 1e-9:
            return "0"  # float noise (the scorecard stores it as 0)
        if abs(v) < 0.01:
            return f"{v:.2e}"
        return f"{v:.4f}" if abs(v) < 10 else f"{v:,.1f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def _secs(v: Any) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _int(v: Any) -> str:
    return "-" if v is None else f"{round(v):,}"


def _g(v: Any) -> str:
    return "-" if v is None else f"{v:g}"


def _one(v: Any) -> str:
    return "-" if v is None else f"{v:,.1f}"


Col = tuple[str, str, Callable[[Any], str]]
# (header, key, format): the per-team PoC tables, one row per run and team (two tables: one is too wide to read)
TEAM_COLUMNS: tuple[Col, ...] = (
    ("guaranteed GPUs", "guaranteed_gpus", _g),
    ("borrowing limit", "borrowing_limit_gpus", lambda v: "none" if v is None else _g(v)),  # None: no limit
    ("mean GPUs held", "mean_gpus_allocated", lambda v: "-" if v is None else f"{v:,.2f}"),
    ("models", "models", lambda v: fmt(len(v)) if isinstance(v, list | tuple) else fmt(v)),  # team_card: names
    ("requests", "requests", _int),
    ("violating requests", "violating_requests", _int),
    ("SLO attainment", "slo_attainment", pct),
    ("within latency target", "requests_within_latency", pct),
    ("success rate", "success_rate", pct),
)
TEAM_COST_COLUMNS: tuple[Col, ...] = (
    ("GPU-h allocated", "gpu_hours_allocated", hours),
    ("GPU-h busy", "gpu_hours_busy", hours),
    ("busy/allocated", "utilization_busy", lambda v: pct(v, 1)),
    ("cost", "cost_usd", usd),
    ("replica wait (replica-min)", "replica_wait_minutes", _one),
    ("refused in guarantee (replica-min)", "refusals_within_guarantee", _one),
    ("preempted", "preempted", fmt),
    ("preemptions caused", "preemptions_caused", fmt),
)
# the overall table: one row per number, one column per run
OVERALL_ROWS: tuple[Col, ...] = (
    ("GPUs", "gpus_total", fmt),
    ("SLO attainment: requests in SLO-meeting model-minutes", "slo_attainment", pct),
    ("violating requests (in model-minutes that missed)", "violating_requests", _int),
    ("requests", "requests", _int),
    ("SLO attainment summed over models", "summed_slo_attainment", lambda v: "-" if v is None else f"{v:.4f}"),
    ("top priority: requests in minutes meeting the SLO", "top_priority_requests_in_slo", lambda v: pct(v, 2)),
    ("requests within the latency target (raw share)", "requests_within_latency", pct),
    ("success rate", "success_rate", pct),
    ("GPU-hours allocated", "gpu_hours_allocated", hours),
    ("GPU-hours busy", "gpu_hours_busy", hours),
    ("utilization allocated (of all GPUs)", "utilization_allocated", lambda v: pct(v, 1)),
    ("utilization busy (of allocated)", "utilization_busy", lambda v: pct(v, 1)),
    ("fragmentation", "fragmentation", lambda v: pct(v, 1)),
    ("cost (serving + idle)", "cost_usd", usd),
    ("serving cost (the teams')", "serving_cost_usd", usd),
    ("idle cost (free GPUs on nodes holding replicas)", "idle_cost_usd", usd),
    ("lent GPU-hours", "lent_gpu_hours", hours),
    ("lent value", "lent_value_usd", usd),
    ("replica wait (replica-min)", "replica_wait_minutes", _one),
    ("refused in guarantee (replica-min)", "refusals_within_guarantee", _one),
    ("preempted replicas", "preempted", fmt),
    ("training jobs started", "training_jobs_started", fmt),
    ("training jobs completed", "training_jobs_completed", fmt),
    ("training wait p50 (s)", "training_wait_p50_s", _secs),
    ("training wait p95 (s)", "training_wait_p95_s", _secs),
    ("training goodput GPU-hours", "training_goodput_gpu_hours", hours),
    ("unreasoned (must be 0)", "unreasoned", fmt),
)


def _labels(doc: Mapping[str, Any]) -> list[str]:
    return [r["label"] for r in doc.get("runs", [])]


def _clock(s: float) -> str:
    return f"{int(s // 3600):02d}:{int(s % 3600 // 60):02d}"


def _ordered(keys: set[str], order: Sequence[str]) -> list[str]:
    return [k for k in order if k in keys] + sorted(keys - set(order))


def tables(doc: Mapping[str, Any]) -> list[TableData]:
    """Every table of the scenario report, from the document alone (terminal and HTML alike)."""
    from autoscaler.sim.scorecard import COLUMNS, LABELS, LENDING_COLUMNS

    labels = _labels(doc)
    out: list[TableData] = []
    cards = doc.get("results", [])
    keys = COLUMNS + (LENDING_COLUMNS if any(c.get("lending") is not None for c in cards) else ())
    out.append(TableData("scorecard", ("metric", "JSON field", *labels),
                         [(LABELS.get(k, k), k, *[fmt(c.get(k)) for c in cards]) for k in keys], left=2))
    overall = doc.get("overall", {})
    out.append(TableData("overall", ("", *labels),
                         [(name, *[f(overall[lb].get(key)) for lb in labels]) for name, key, f in OVERALL_ROWS]))
    per_team = doc.get("per_team", {})
    for title, cols in (("per team: quota, requests, SLO", TEAM_COLUMNS),
                        ("per team: GPU-hours, cost, waiting, preemptions", TEAM_COST_COLUMNS)):
        out.append(TableData(title, ("run", "team", *[h for h, _, _ in cols]),
                             [(lb, r["team"], *[f(r.get(key)) for _, key, f in cols])
                              for lb in labels for r in per_team.get(lb, [])], left=2))
    out.append(_causes_table(labels, per_team, overall))
    out.append(_events_table(doc))
    out.append(_recovery_table(doc, labels))
    out.append(_preemption_list(doc, labels))
    return out


def _causes_table(labels: Sequence[str], per_team: Mapping[str, Any], overall: Mapping[str, Any]) -> TableData:
    """Preemptions by reason (replicas) and shortfall by cause (replica-minutes), per run and team, and all."""
    rows = [(lb, r) for lb in labels for r in [*per_team.get(lb, []), overall.get(lb, {"team": "all"})]]
    # every reason always (a zero says as much as a count); only the causes that occurred (seven are too wide)
    reasons = _ordered({k for _, r in rows for k in (r.get("preemptions_by_reason") or {})}
                       | {x.value for x in PreemptionReason}, [x.value for x in PreemptionReason])
    causes = _ordered({k for _, r in rows for k in (r.get("shortfall_minutes_by_cause") or {})},
                      [x.value for x in ShortfallCause])
    header = ("run", "team", *[f"preempted: {x}" for x in reasons], "preemptions caused",
              *[f"shortfall {x} (replica-min)" for x in causes])
    body = []
    for lb, r in rows:
        by_reason = r.get("preemptions_by_reason") or {}
        by_cause = r.get("shortfall_minutes_by_cause") or {}
        body.append((lb, str(r.get("team", "all")), *[fmt(by_reason.get(x, 0)) for x in reasons],
                     fmt(r.get("preemptions_caused")), *[_one(by_cause.get(x, 0.0)) for x in causes]))
    return TableData("preemptions by reason and shortfall by cause", header, body, left=2)


def _events_table(doc: Mapping[str, Any]) -> TableData:
    rows: list[tuple[float, str, str, str]] = []
    for s in doc.get("events", {}).get("surges", []):
        rows.append((float(s["at_s"]), "surge", str(s["target"]),
                     f"x{s['multiplier']:g} for {s['duration_s']:g} s on {', '.join(s['models'])}"))
    for label, evs in doc.get("events", {}).get("cluster", {}).items():
        for e in evs:
            count = e.get("count")
            rows.append((float(e["at_s"]), str(e["kind"]), str(e["target"]) + (f" x{count}" if count else ""),
                         f"{label}: nodes {', '.join(e.get('nodes') or []) or '-'}; {e.get('gpus_removed', 0)} GPUs "
                         f"removed, {e.get('replicas_lost', 0)} replicas lost"))
    body = [(_clock(at), kind, target, what) for at, kind, target, what in sorted(rows, key=lambda r: r[0])]
    return TableData("events", ("at", "kind", "target", "what happened"), body or [("-", "-", "-", "no events")],
                     left=4)


def _recovery_table(doc: Mapping[str, Any], labels: Sequence[str]) -> TableData:
    body = []
    for lb in labels:
        for r in doc.get("recovery", {}).get(lb, []):
            body.append((lb, _clock(r["at_s"]), r["kind"], r["model"], _secs(r["cold_start_s"]),
                         "never" if r["recovery_s"] is None else _secs(r["recovery_s"]), fmt(r["within_cold_start"])))
    top = ", ".join(doc.get("top_priority_models", [])) or "-"
    return TableData(f"recovery of the highest-priority models ({top}): seconds until {RECOVERY_MINUTES} "
                     "consecutive minutes meet the SLO percentile",
                     ("run", "event at", "kind", "model", "cold start (s)", "recovery (s)", "within cold start"),
                     body or [("-", "-", "-", "-", "-", "-", "no node loss or GPU kind removal")], left=4)


def _preemption_list(doc: Mapping[str, Any], labels: Sequence[str]) -> TableData:
    body = []
    for lb in labels:
        p = doc.get("preemptions", {}).get(lb, {"count": 0, "first": []})
        for e in p["first"][:PREEMPTIONS_SHOWN]:
            body.append((lb, _clock(float(e.get("at_s", 0.0))), str(e.get("model", "")), str(e.get("team", "")),
                         str(e.get("by_model", "")), str(e.get("reason", "")), str(e.get("message", ""))))
        if p["count"] > PREEMPTIONS_SHOWN:
            body.append((lb, "", f"... {p['count'] - PREEMPTIONS_SHOWN} more", "", "", "", ""))
    return TableData(f"preemptions (first {PREEMPTIONS_SHOWN} per run)",
                     ("run", "at", "model", "team", "for model", "reason", "message"),
                     body or [("-", "-", "-", "-", "-", "-", "no preemptions")], left=7)


# -- outputs ---------------------------------------------------------------------------------------------
def print_tables(doc: Mapping[str, Any], title: str, console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    con = console or Console(width=max(160, 40 + 18 * len(_labels(doc))))
    for i, t in enumerate(tables(doc)):
        table = Table(title=f"{title}: {t.title}" if i == 0 else t.title)
        for j, h in enumerate(t.header):
            # names are what the reader looks for: never cut them short
            table.add_column(h, justify="left" if j < t.left else "right", no_wrap=j < min(t.left, 2))
        for row in t.rows:
            table.add_row(*row)
        con.print(table)


def write_png(doc: Mapping[str, Any], path: str) -> None:
    """Per team and run: SLO attainment, GPU-hours allocated vs busy, cost; and the highest-priority models'
    per-minute share of requests within the latency target with the cluster events marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = _labels(doc)
    per_team = doc.get("per_team", {})
    teams = [r["team"] for r in per_team.get(labels[0], [])] if labels else []
    fig, axes = plt.subplots(2, 2, figsize=(15, 9))
    (ax_slo, ax_gpu), (ax_cost, ax_time) = axes
    x = np.arange(len(teams))
    width = 0.8 / max(1, len(labels))
    cmap = plt.get_cmap("tab10")

    def team_values(label: str, key: str) -> np.ndarray:
        rows = {r["team"]: r for r in per_team.get(label, [])}
        return np.array([float(rows.get(t, {}).get(key) or 0.0) for t in teams])

    for k, lb in enumerate(labels):
        off = x - 0.4 + width * (k + 0.5)
        color = cmap(k % 10)
        ax_slo.bar(off, 100 * team_values(lb, "slo_attainment"), width, color=color, label=lb)
        ax_gpu.bar(off, team_values(lb, "gpu_hours_allocated"), width, color=color, alpha=0.35,
                   label=f"{lb} allocated")
        ax_gpu.bar(off, team_values(lb, "gpu_hours_busy"), width, color=color, label=f"{lb} busy")
        ax_cost.bar(off, team_values(lb, "cost_usd"), width, color=color, label=lb)
    for ax, title, ylabel in ((ax_slo, "SLO attainment per team (% of requests in SLO-meeting model-minutes)", "%"),
                              (ax_gpu, "GPU-hours per team: allocated (light) and busy (dark)", "GPU-hours"),
                              (ax_cost, "cost per team", "USD")):
        ax.set_xticks(x, teams)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    if teams:
        lo = min([100 * float(r.get("slo_attainment") or 0.0) for lb in labels for r in per_team.get(lb, [])])
        ax_slo.set_ylim(max(0.0, min(90.0, lo - 5.0)), 100.5)

    styles = ("-", "--", ":")
    drawn = False
    for k, lb in enumerate(labels):
        att = doc.get("attainment", {}).get(lb, {})
        t0 = float(att.get("minute0_s", 0.0))
        for s, (m, series) in enumerate(list(att.get("models", {}).items())[:PLOT_MODELS]):
            minutes = (t0 + 60.0 * np.arange(len(series))) / 60.0
            y = np.array([np.nan if v is None else 100 * v for v in series])
            ax_time.plot(minutes, y, styles[s % len(styles)], color=cmap(k % 10), lw=1, label=f"{lb} {m}")
            drawn = True
    # one line per distinct objective (models of one priority usually share one)
    objectives = {o for att in doc.get("attainment", {}).values() for o in att.get("objective", {}).values()}
    for obj in sorted(objectives):
        ax_time.axhline(100 * obj, color="0.5", lw=0.8, ls="--")
    seen = set()
    for evs in doc.get("events", {}).get("cluster", {}).values():
        for e in evs:
            if e["at_s"] not in seen:
                seen.add(e["at_s"])
                ax_time.axvline(float(e["at_s"]) / 60.0, color="red", lw=1)
    for s in doc.get("events", {}).get("surges", []):
        ax_time.axvspan(float(s["at_s"]) / 60.0, (float(s["at_s"]) + float(s["duration_s"])) / 60.0,
                        color="orange", alpha=0.15)
    ax_time.set_xlabel("minutes into the scenario (red: node loss / GPU kind removed; orange: surge)")
    ax_time.set_ylabel("% of the minute's requests within the latency target")
    ax_time.set_title("highest-priority models: per-minute share within the latency target (dashed grey: the "
                      "declared percentile; at or above it the minute meets its SLO)", fontsize=9)
    if drawn:
        ax_time.legend(fontsize=7)
    fig.suptitle(f"slotwise scenario {doc.get('scenario', '')}: {', '.join(labels)}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def render_html(doc: Mapping[str, Any], png: bytes | None) -> str:
    """A standalone page: the tables and the figure inlined (base64), so the one file can be mailed."""
    e = html.escape
    title = f"slotwise scenario {doc.get('scenario', '')}"
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title>"
             f"<style>{_CSS}</style></head><body><h1>{e(title)}</h1>"]
    meta = {k: doc[k] for k in ("description", "file", "hours", "mode", "tick_s", "seed", "request_timeout_s",
                                "gpus") if k in doc}
    parts.append("<p>" + e(", ".join(f"{k}: {v}" for k, v in meta.items())) + "</p>")
    if png:
        parts.append(f"<img alt='SLO attainment, GPU-hours and cost per team; recovery after events' "
                     f"src='data:image/png;base64,{base64.b64encode(png).decode('ascii')}'>")
    for t in tables(doc):
        parts.append(f"<h2>{e(t.title)}</h2>" + _table(t.header, t.rows, left=t.left))
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(doc: Mapping[str, Any], out_dir: str, json_path: str | None = None) -> dict[str, str]:
    """``scorecard.json`` (or ``json_path``), ``report.png`` and ``report.html`` in ``out_dir`` (created);
    returns kind -> path."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {"json": json_path or os.path.join(out_dir, "scorecard.json"),
             "png": os.path.join(out_dir, "report.png"), "html": os.path.join(out_dir, "report.html")}
    write_json(doc, paths["json"])
    write_png(doc, paths["png"])
    with open(paths["png"], "rb") as f:
        png = f.read()
    with open(paths["html"], "w") as f:
        f.write(render_html(doc, png))
    return paths


def write_json(doc: Mapping[str, Any], path: str) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=2, default=_json_default)


def _json_default(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    return str(v)
