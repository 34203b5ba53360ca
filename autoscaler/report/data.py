"""The report's numbers: one :class:`Section` per simulated policy (or per Prometheus range), and how a
``slotwise simulate --json`` file becomes them.

A simulation section carries the scorecard's own fields (:mod:`autoscaler.sim.scorecard`, the same names, the
same values: nothing is recomputed that could come out different), per model and in total. The one exception is
``--price KIND=USD``: a simulation JSON carries the GPU-hours per model and GPU kind and the prices it was run
with, so the report re-prices it with the operator's table without re-running anything -- the costs then are the
JSON's GPU-hours times the new prices, added up the way the scorecard adds them (serving + idle = cost).

A file without one of the fields this report reads (written by an older slotwise) is a ValueError naming the
file and the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from autoscaler.accounting.cost import price_table
from sharing.catalog import load_catalog

LENT_NOTE = "lent value is 0: no GPU was lent to training in this range (lending off, or nothing idle enough)"
EPS = 1e-9  # the scorecard's float noise: stored and shown as 0

# The scorecard fields a simulation section reads, top level and per model (all must be in the file).
CARD_FIELDS = (
    "slo_attainment",
    "slo_attainment_attainable",
    "violating_requests",
    "unattainable_requests",
    "requests",
    "slo_minutes_met",
    "requests_within_latency",
    "late_requests",
    "gpu_hours",
    "gpu_hours_vs_lower_bound",
    "gpu_hours_vs_oracle",
    "cost_usd",
    "serving_cost_usd",
    "idle_cost_usd",
    "idle_gpu_hours",
    "idle_reserved_gpu_hours",
    "lent_gpu_hours",
    "fragmentation",
)
COST_FIELDS = ("hours", "prices_usd_per_gpu_hour", "idle_gpu_hours_by_kind", "lent_gpu_hours_by_kind",
               "lent_value_usd")
MODEL_FIELDS = (
    "team",
    "namespace",
    "gpu_hours",
    "gpu_hours_by_kind",
    "cost_usd",
    "requests",
    "violating_requests",
    "late_requests",
    "slo_attainment",
    "requests_within_latency",
    "slo_percentile",
    "latency_at_slo_percentile_s",
    "slo_latency_s",
)


@dataclass(frozen=True)
class ModelRow:
    """One model: the scorecard's per-model fields (same names). None: the source does not have the number
    (Prometheus has no per-minute counts, so no SLO attainment, and no latency percentile of its own)."""

    model: str
    team: str
    namespace: str
    gpu_hours: float  # GPU-equivalent hours held (starting, serving, draining)
    gpu_hours_by_kind: dict[str, float]
    cost_usd: float  # what its replicas held x price (idle capacity is no model's)
    requests: int | None = None
    violating_requests: int | None = None  # in model-minutes that missed the SLO
    late_requests: int | None = None  # beyond the latency target
    slo_attainment: float | None = None  # requests in SLO-meeting model-minutes / requests
    requests_within_latency: float | None = None  # raw share within the latency target (not SLO attainment)
    slo_percentile: float | None = None  # the declared percentile (95.0)
    latency_at_slo_percentile_s: float | None = None  # the run's latency at that percentile
    slo_latency_s: float | None = None  # the latency target


@dataclass(frozen=True)
class TeamRow:
    """A team: its models' numbers added up (costs exactly, ``math.fsum``); ratios from the summed counts."""

    team: str
    models: int
    gpu_hours: float
    cost_usd: float
    cost_share: float  # of the section's serving cost (idle capacity is no team's)
    requests: int | None
    violating_requests: int | None
    late_requests: int | None
    slo_attainment: float | None
    requests_within_latency: float | None


@dataclass
class Section:
    """One scorecard: a simulated policy, or a Prometheus range. Fields named as the scorecard's carry its meaning
    (:mod:`autoscaler.sim.scorecard`); None: the source does not have the number."""

    title: str
    source: str  # "simulation" or "prometheus"
    hours: float  # the period the numbers cover
    prices: dict[str, float]  # USD per GPU-hour by GPU kind, as used for every cost here
    models: list[ModelRow]
    slo_attainment: float | None
    slo_attainment_attainable: float | None
    violating_requests: int | None
    unattainable_requests: int | None
    requests: int | None
    slo_minutes_met: float | None
    requests_within_latency: float | None
    late_requests: int | None
    gpu_hours: float
    gpu_hours_vs_lower_bound: float | None
    gpu_hours_vs_oracle: float | None
    cost_usd: float  # serving + idle
    serving_cost_usd: float
    idle_cost_usd: float
    idle_gpu_hours: float  # free GPU-equivalents on nodes holding replicas
    idle_gpu_hours_by_kind: dict[str, float]
    idle_reserved_gpu_hours: float | None  # the inference pool less what replicas held (simulation only)
    lent_gpu_hours: float
    lent_gpu_hours_by_kind: dict[str, float]
    lent_value_usd: float
    fragmentation: float | None  # mean stranded share of free GPU memory over the period
    policy: str | None = None
    notes: list[str] = field(default_factory=list)
    # Scale to zero (issue 18; simulation only, None in a scorecard written before it): requests that arrived with
    # no routable replica, how the SLO judged them, and the GPU-hours of replicas held while serving nothing.
    cold_started_requests: int | None = None
    cold_start_slo: str | None = None
    warm_idle_gpu_hours: float | None = None

    @property
    def teams(self) -> list[TeamRow]:
        """Per team, most expensive first."""
        by: dict[str, list[ModelRow]] = {}
        for m in self.models:
            by.setdefault(m.team, []).append(m)
        rows = []
        for team, ms in by.items():
            cost = math.fsum(m.cost_usd for m in ms)
            req, viol, late = (_total([getattr(m, k) for m in ms])
                               for k in ("requests", "violating_requests", "late_requests"))
            rows.append(TeamRow(
                team=team, models=len(ms), gpu_hours=math.fsum(m.gpu_hours for m in ms), cost_usd=cost,
                cost_share=cost / self.serving_cost_usd if self.serving_cost_usd > 0 else 0.0,
                requests=req, violating_requests=viol, late_requests=late,
                slo_attainment=_share_of(req, viol), requests_within_latency=_share_of(req, late)))
        return sorted(rows, key=lambda t: (-t.cost_usd, t.team))

    def to_dict(self) -> dict[str, Any]:
        """Every number the tables, the page and the figure show (report.json); the scorecard's names."""
        d = asdict(self)
        d["models"] = [asdict(m) for m in sorted(self.models, key=lambda m: (-m.cost_usd, m.model))]
        d["teams"] = [asdict(t) for t in self.teams]
        d["currency"] = "USD"
        d["prices_usd_per_gpu_hour"] = d.pop("prices")
        return d


def _total(values: Sequence[int | None]) -> int | None:
    """The sum of counts, None when any is unknown."""
    return None if any(v is None for v in values) else sum(int(v or 0) for v in values)


def _share_of(requests: int | None, bad: int | None) -> float | None:
    """1 - bad / requests (None without requests or without the count)."""
    if not requests or bad is None:
        return None
    return (requests - bad) / requests


def _z(x: float) -> float:
    return 0.0 if abs(x) < EPS else x


def priced(hours_by_kind: Mapping[str, float], prices: Mapping[str, float]) -> float:
    """GPU-hours by kind x USD per GPU-hour, added up exactly (as the scorecard prices them)."""
    return _z(math.fsum(h * prices.get(k, 0.0) for k, h in hours_by_kind.items()))


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


def _check(doc: Any, path: str) -> None:
    """A simulation JSON with every field the report reads, or a ValueError naming the file and the field."""
    res = doc.get("results") if isinstance(doc, dict) else None
    if isinstance(res, dict) and "policy" in res:
        raise ValueError(f"{path}: 'results' is one scorecard, not a list (written by an older slotwise): "
                         "re-run `slotwise simulate --json`")
    if not isinstance(res, list) or not res or not all(
        isinstance(c, dict) and "policy" in c and isinstance(c.get("per_model"), dict) for c in res
    ):
        raise ValueError(f"{path}: not a slotwise simulation JSON (expected 'results' with a scorecard per policy)")
    old = "(written by an older slotwise?): re-run `slotwise simulate --json`"
    for i, c in enumerate(res):
        where = f"results[{i}] ({c['policy']})"
        cost = c.get("cost")
        if not isinstance(cost, dict) or "prices_usd_per_gpu_hour" not in cost or any(
            not isinstance(m, dict) or "gpu_hours_by_kind" not in m for m in c["per_model"].values()
        ):
            raise ValueError(f"{path}: {where}: the simulation JSON has no cost data {old}")
        for key in CARD_FIELDS:
            if key not in c:
                raise ValueError(f"{path}: {where} has no field '{key}' {old}")
        for key in COST_FIELDS:
            if key not in cost:
                raise ValueError(f"{path}: {where} has no field 'cost.{key}' {old}")
        for name, m in c["per_model"].items():
            for key in MODEL_FIELDS:
                if key not in m:
                    raise ValueError(f"{path}: {where} has no field 'per_model.{name}.{key}' {old}")


def _opt(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) else None


def _count(x: Any) -> int | None:
    return int(x) if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) else None


def sections_from_simulation(
    doc: Mapping[str, Any], prices: Mapping[str, float] | None = None, source: str = "simulation"
) -> list[Section]:
    """One section per policy of a simulation JSON: its scorecard's fields as they are; with ``prices``
    (``--price`` overrides, any accepted GPU name) the costs re-priced from the JSON's GPU-hours."""
    _check(doc, source)
    over = override_prices(prices)
    # a scenario's JSON (`simulate --scenario`) names its scenario instead of a trace
    trace = doc.get("trace") or (f"scenario {doc['scenario']}" if doc.get("scenario") else "?")
    out = []
    for card in doc["results"]:
        cost = card["cost"]
        table = {k: float(v) for k, v in cost["prices_usd_per_gpu_hour"].items()} | over
        models = []
        for name, pm in card["per_model"].items():
            by_kind = {k: float(h) for k, h in pm["gpu_hours_by_kind"].items()}
            models.append(ModelRow(
                model=name,
                team=str(pm["team"]),
                namespace=str(pm["namespace"]),
                gpu_hours=float(pm["gpu_hours"]),
                gpu_hours_by_kind=by_kind,
                cost_usd=priced(by_kind, table) if over else float(pm["cost_usd"]),
                requests=_count(pm["requests"]),
                violating_requests=_count(pm["violating_requests"]),
                late_requests=_count(pm["late_requests"]),
                slo_attainment=_opt(pm["slo_attainment"]),
                requests_within_latency=_opt(pm["requests_within_latency"]),
                slo_percentile=_opt(pm["slo_percentile"]),
                latency_at_slo_percentile_s=_opt(pm["latency_at_slo_percentile_s"]),
                slo_latency_s=_opt(pm["slo_latency_s"]),
            ))
        idle_by_kind = {k: float(h) for k, h in cost["idle_gpu_hours_by_kind"].items()}
        lent_by_kind = {k: float(h) for k, h in cost["lent_gpu_hours_by_kind"].items()}
        if over:
            serving = math.fsum(m.cost_usd for m in models)
            idle = priced(idle_by_kind, table)
            money = {"serving_cost_usd": serving, "idle_cost_usd": idle, "cost_usd": serving + idle,
                     "lent_value_usd": priced(lent_by_kind, table)}
        else:
            money = {"serving_cost_usd": float(card["serving_cost_usd"]), "idle_cost_usd": float(card["idle_cost_usd"]),
                     "cost_usd": float(card["cost_usd"]), "lent_value_usd": float(cost["lent_value_usd"])}
        hours = _opt(cost["hours"]) or 0.0
        policy = str(card["policy"])
        notes = [
            *([] if float(card["lent_gpu_hours"]) > 0 else [LENT_NOTE]),
            "SLO attainment = requests in model-minutes that met their declared percentile / requests; requests "
            "within the latency target is the raw share, not SLO attainment; latency per model is at its own SLO "
            "percentile over the run (queue wait + service; '-' where the simulator did not give it)",
        ]
        if over:
            notes.append("re-priced with --price: " + ", ".join(f"{k} ${v:g}/h" for k, v in sorted(over.items())))
        out.append(Section(
            title=f"{policy} on {trace} ({hours:.2f} h simulated, {card.get('mode', 'fluid')})",
            source="simulation",
            hours=hours,
            prices=table,
            models=models,
            slo_attainment=_opt(card["slo_attainment"]),
            slo_attainment_attainable=_opt(card["slo_attainment_attainable"]),
            violating_requests=_count(card["violating_requests"]),
            unattainable_requests=_count(card["unattainable_requests"]),
            requests=_count(card["requests"]),
            slo_minutes_met=_opt(card["slo_minutes_met"]),
            requests_within_latency=_opt(card["requests_within_latency"]),
            late_requests=_count(card["late_requests"]),
            gpu_hours=float(card["gpu_hours"]),
            gpu_hours_vs_lower_bound=_opt(card["gpu_hours_vs_lower_bound"]),
            gpu_hours_vs_oracle=_opt(card["gpu_hours_vs_oracle"]),
            idle_gpu_hours=float(card["idle_gpu_hours"]),
            idle_gpu_hours_by_kind=idle_by_kind,
            idle_reserved_gpu_hours=_opt(card["idle_reserved_gpu_hours"]),
            lent_gpu_hours=float(card["lent_gpu_hours"]),
            lent_gpu_hours_by_kind=lent_by_kind,
            fragmentation=_opt(card["fragmentation"]),
            policy=policy,
            notes=notes,
            cold_started_requests=_count(card.get("cold_started_requests")),
            cold_start_slo=card.get("cold_start_slo") if isinstance(card.get("cold_start_slo"), str) else None,
            warm_idle_gpu_hours=_opt(card.get("warm_idle_gpu_hours")),
            **money,
        ))
    return out
