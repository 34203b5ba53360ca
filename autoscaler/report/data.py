"""The report's numbers: one :class:`Section` per simulated policy (or per Prometheus range), and how a
``slotwise simulate --json`` file becomes them.

Costs are GPU-equivalent hours (see :mod:`autoscaler.accounting.cost`) times USD per GPU-hour. A simulation JSON carries
the hours per model and GPU kind and the prices it was run with, so the report can re-price it with the
operator's own table (``--price KIND=USD``) without re-running anything.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from autoscaler.accounting.cost import price_table
from sharing.catalog import load_catalog

LENT_NOTE = "lent value is 0: no GPU was lent to training in this range (lending off, or nothing idle enough)"


@dataclass(frozen=True)
class ModelRow:
    model: str
    team: str
    namespace: str
    gpu_hours: float  # GPU-equivalent hours held (starting, serving, draining)
    gpu_hours_by_kind: dict[str, float]
    cost_usd: float
    requests: float | None = None  # None: the source has no request counts for the model
    late_requests: float | None = None  # settled beyond the SLO latency
    slo_objective: float | None = None  # the SLO percentile / 100 (0.95)
    p95_latency_s: float | None = None  # simulation only: p95 latency over the run (queue wait + service)
    slo_latency_s: float | None = None

    @property
    def slo_attainment(self) -> float | None:
        """Share of requests settled within the SLO latency (None: no requests counted)."""
        if not self.requests or self.late_requests is None:
            return None
        return max(0.0, 1.0 - self.late_requests / self.requests)


@dataclass(frozen=True)
class TeamRow:
    team: str
    models: int
    gpu_hours: float
    cost_usd: float
    cost_share: float  # of the section's attributed cost
    requests: float
    late_requests: float

    @property
    def slo_attainment(self) -> float | None:
        return max(0.0, 1.0 - self.late_requests / self.requests) if self.requests > 0 else None


@dataclass
class Section:
    """One scorecard: a simulated policy, or a Prometheus range."""

    title: str
    source: str  # "simulation" or "prometheus"
    hours: float  # the period the numbers cover
    prices: dict[str, float]  # USD per GPU-hour by GPU kind, as used for idle and lent value
    models: list[ModelRow]
    idle_gpu_hours_by_kind: dict[str, float]
    fragmentation: float | None  # mean stranded share of free GPU memory over the period
    lent_gpu_hours_by_kind: dict[str, float] = field(default_factory=dict)
    policy: str | None = None
    slo_windows_met: float | None = None  # simulation only: share of model-minutes meeting the percentile
    notes: list[str] = field(default_factory=list)

    @property
    def cost_usd(self) -> float:
        return sum((m.cost_usd for m in self.models), 0.0)

    @property
    def gpu_hours(self) -> float:
        return sum((m.gpu_hours for m in self.models), 0.0)

    @property
    def idle_gpu_hours(self) -> float:
        return sum(self.idle_gpu_hours_by_kind.values(), 0.0)

    @property
    def idle_cost_usd(self) -> float:
        return sum((h * self.prices.get(k, 0.0) for k, h in self.idle_gpu_hours_by_kind.items()), 0.0)

    @property
    def lent_gpu_hours(self) -> float:
        return sum(self.lent_gpu_hours_by_kind.values(), 0.0)

    @property
    def lent_value_usd(self) -> float:
        return sum((h * self.prices.get(k, 0.0) for k, h in self.lent_gpu_hours_by_kind.items()), 0.0)

    @property
    def requests(self) -> float:
        return sum((m.requests or 0.0 for m in self.models), 0.0)

    @property
    def late_requests(self) -> float:
        return sum((m.late_requests or 0.0 for m in self.models if m.requests), 0.0)

    @property
    def slo_attainment(self) -> float | None:
        total = self.requests
        return max(0.0, 1.0 - self.late_requests / total) if total > 0 else None

    @property
    def teams(self) -> list[TeamRow]:
        """Per team, most expensive first."""
        acc: dict[str, list[float]] = {}
        for m in self.models:
            a = acc.setdefault(m.team, [0, 0.0, 0.0, 0.0, 0.0])
            a[0] += 1
            a[1] += m.gpu_hours
            a[2] += m.cost_usd
            if m.requests:
                a[3] += m.requests
                a[4] += m.late_requests or 0.0
        total = self.cost_usd
        rows = [
            TeamRow(team, int(n), h, c, c / total if total > 0 else 0.0, r, late)
            for team, (n, h, c, r, late) in acc.items()
        ]
        return sorted(rows, key=lambda t: (-t.cost_usd, t.team))

    def to_dict(self) -> dict[str, Any]:
        """Every number the tables, the page and the figure show (report.json)."""
        models = []
        for m in sorted(self.models, key=lambda m: (-m.cost_usd, m.model)):
            d = asdict(m)
            d["slo_attainment"] = m.slo_attainment
            models.append(d)
        teams = []
        for t in self.teams:
            d = asdict(t)
            d["slo_attainment"] = t.slo_attainment
            teams.append(d)
        return {
            "title": self.title,
            "source": self.source,
            "policy": self.policy,
            "hours": self.hours,
            "currency": "USD",
            "prices_usd_per_gpu_hour": dict(self.prices),
            "cost_usd": self.cost_usd,
            "gpu_hours": self.gpu_hours,
            "idle_gpu_hours": self.idle_gpu_hours,
            "idle_gpu_hours_by_kind": dict(self.idle_gpu_hours_by_kind),
            "idle_cost_usd": self.idle_cost_usd,
            "lent_gpu_hours": self.lent_gpu_hours,
            "lent_gpu_hours_by_kind": dict(self.lent_gpu_hours_by_kind),
            "lent_value_usd": self.lent_value_usd,
            "requests": self.requests,
            "late_requests": self.late_requests,
            "slo_attainment": self.slo_attainment,
            "slo_windows_met": self.slo_windows_met,
            "fragmentation": self.fragmentation,
            "teams": teams,
            "models": models,
            "notes": list(self.notes),
        }


def override_prices(overrides: Mapping[str, float] | None) -> dict[str, float]:
    """``--price`` overrides keyed by canonical GPU kind (any accepted name in; unknown kind: ValueError)."""
    if not overrides:
        return {}
    catalog = load_catalog()
    price_table(catalog, overrides)  # validates names and values in one place
    return {catalog.resolve(k): float(v) for k, v in overrides.items()}


def load_simulation(path: str) -> dict[str, Any]:
    """The JSON ``slotwise simulate --json`` wrote; a missing file is an OSError, anything else a ValueError."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise OSError(f"{path}: cannot read the simulation JSON: {e.strerror or e}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e.msg} at line {e.lineno}); expected `slotwise simulate --json`'s "
                         "output") from None
    _check(doc, path)
    return doc


def _cards(doc: Any) -> list[dict[str, Any]]:
    res = doc.get("results") if isinstance(doc, dict) else None
    return res if isinstance(res, list) else [res] if isinstance(res, dict) else []


def _check(doc: Any, path: str) -> None:
    cards = _cards(doc)
    if not cards or not all(isinstance(c, dict) and "policy" in c and isinstance(c.get("per_model"), dict)
                            for c in cards):
        raise ValueError(f"{path}: not a slotwise simulation JSON (expected 'results' with a scorecard per policy)")
    for c in cards:
        cost = c.get("cost")
        if not isinstance(cost, dict) or "prices_usd_per_gpu_hour" not in cost or any(
            "gpu_hours_by_kind" not in m for m in c["per_model"].values()
        ):
            raise ValueError(f"{path}: the simulation JSON has no cost data (written by an older slotwise?): "
                             "re-run `slotwise simulate --json`")


def _opt(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and math.isfinite(x) else None


def sections_from_simulation(
    doc: Mapping[str, Any], prices: Mapping[str, float] | None = None, source: str = "simulation"
) -> list[Section]:
    """One section per policy of a simulation JSON, priced with the run's prices updated by ``prices``
    (``--price`` overrides, any accepted GPU name)."""
    _check(doc, source)
    over = override_prices(prices)
    # a scenario's JSON (`simulate --scenario`) names its scenario instead of a trace
    trace = doc.get("trace") or (f"scenario {doc['scenario']}" if doc.get("scenario") else "?")
    out = []
    for card in _cards(doc):
        cost = card["cost"]
        table = {k: float(v) for k, v in cost["prices_usd_per_gpu_hour"].items()} | over
        models = []
        for name, pm in card["per_model"].items():
            by_kind = {k: float(h) for k, h in pm["gpu_hours_by_kind"].items()}
            pct = _opt(pm.get("slo_percentile"))
            models.append(
                ModelRow(
                    model=name,
                    team=str(pm.get("team", "default")),
                    namespace=str(pm.get("namespace", "default")),
                    gpu_hours=float(pm.get("gpu_hours", sum(by_kind.values()))),
                    gpu_hours_by_kind=by_kind,
                    cost_usd=sum(h * table.get(k, 0.0) for k, h in by_kind.items()),
                    requests=_opt(pm.get("requests")),
                    late_requests=_opt(pm.get("late_requests")),
                    slo_objective=pct / 100.0 if pct is not None else None,
                    p95_latency_s=_opt(pm.get("p95_latency_s")),
                    slo_latency_s=_opt(pm.get("slo_latency_s")),
                )
            )
        hours = _opt(cost.get("hours")) or 0.0
        policy = str(card["policy"])
        lent_by_kind = {k: float(h) for k, h in (cost.get("lent_gpu_hours_by_kind") or {}).items()}
        notes = [
            *([] if sum(lent_by_kind.values()) > 0 else [LENT_NOTE]),
            "waiting: the simulator's p95 latency per model over the run (queue wait plus service); SLO attainment "
            "= requests settled within the SLO latency",
        ]
        if over:
            notes.append("re-priced with --price: " + ", ".join(f"{k} ${v:g}/h" for k, v in sorted(over.items())))
        out.append(
            Section(
                title=f"{policy} on {trace} ({hours:.2f} h simulated, {card.get('mode', 'fluid')})",
                source="simulation",
                hours=hours,
                prices=table,
                models=models,
                idle_gpu_hours_by_kind={k: float(h) for k, h in cost.get("idle_gpu_hours_by_kind", {}).items()},
                fragmentation=_opt(card.get("fragmentation")),
                lent_gpu_hours_by_kind=lent_by_kind,
                policy=policy,
                slo_windows_met=_opt(card.get("slo_windows_met")),
                notes=notes,
            )
        )
    return out
