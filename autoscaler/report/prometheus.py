"""The report's numbers from Prometheus history: what the live controller exported over the last ``hours``.

:class:`PrometheusReadings` holds what ``slotwise report --prometheus`` read -- instant queries at ``end`` over
the range ``[end - hours, end]``, asked by :func:`autoscaler.live.prometheus.report.read_report` through the one
Prometheus client, their PromQL in :func:`autoscaler.live.prometheus.promql.report_queries` -- and
:func:`section_from_prometheus` turns them into the report's :class:`~autoscaler.report.data.Section` (pure):

- GPU-equivalent hours per (team, namespace, model, gpu_model): ``increase(slotwise_gpu_slot_seconds_total)``;
- cost per (team, namespace, model): ``increase(slotwise_gpu_cost_dollars_total)`` -- priced as the controller
  priced it at the time, so a price change during the range is honoured. With ``--price`` overrides the
  report re-prices the GPU-hours instead (every kind, with the overrides over the exported prices);
- idle reserved GPU-hours per kind: ``increase(slotwise_gpu_idle_seconds_total)``, priced with the exported
  ``slotwise_gpu_price_dollars_per_hour`` (last value; the catalog's default where absent);
- requests and late requests per model: ``increase(slotwise_requests_total)`` and
  ``increase(slotwise_requests_late_total)``, rounded to whole requests: ``requests_within_latency`` (the raw share
  within the latency target; SLO attainment, per model-minute, is not in the counters and stays None); the SLO
  percentile = 100 x ``slotwise_slo_objective_ratio`` (last value);
- cost = serving (the models') + idle (the idle GPU-hours priced), as the scorecard's;
- fragmentation: the mean of ``slotwise_fragmentation_ratio``; lent GPU-hours: the mean of
  ``slotwise_gpu_slots{state="lent"}`` times the hours. Gauges are read from the LEADER only
  (``and on(instance, job) slotwise_is_leader == 1``): a standby replica keeps the last values it had as
  leader, and those must not count. Without ``slotwise_is_leader`` series, all replicas count (max).

Counters are summed over replicas: only the leader ticks, so a standby's counters stay flat and add nothing.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from autoscaler.accounting.cost import price_table
from autoscaler.report.data import LENT_NOTE, ModelRow, Section, override_prices, priced
from sharing.catalog import load_catalog

Values = dict[tuple[str, ...], float]  # label values (in the query's label order) -> number


@dataclass(frozen=True)
class PrometheusReadings:
    """What the report read from Prometheus ``url`` over ``hours`` up to ``end`` (Unix seconds), one field per
    query of :func:`~autoscaler.live.prometheus.promql.report_queries` (same names), non-finite values left out.

    Keys: ``slot_seconds`` (team, namespace, model, gpu_model); ``dollars`` (team, namespace, model);
    ``idle_seconds``, ``prices``, ``lent_gpus`` (gpu_model); ``requests``, ``late``, ``objective`` (model);
    ``fragmentation`` () -- the empty key, when the gauge exists."""

    url: str
    hours: float
    end: float
    slot_seconds: Values
    dollars: Values
    idle_seconds: Values
    prices: Values
    requests: Values
    late: Values
    objective: Values
    fragmentation: Values
    lent_gpus: Values


def section_from_prometheus(r: PrometheusReadings, prices: dict[str, float] | None = None) -> Section:
    """The report's section from what Prometheus answered; ``prices``: ``--price`` overrides (any GPU name).
    Nothing of slotwise's in the range is a ValueError (the controller is not scraped, or the range is wrong)."""
    over = override_prices(prices)
    if not (r.slot_seconds or r.dollars or r.requests):
        raise ValueError(
            f"Prometheus at {r.url} has no slotwise cost or request series in the last {r.hours:g} h "
            "(is the controller scraped? slotwise_gpu_slot_seconds_total, slotwise_requests_total)"
        )

    # prices: the catalog's defaults, then what the controller exported, then --price
    table = price_table(load_catalog())
    table |= {k[0]: v for k, v in r.prices.items()}
    table |= over

    rows: dict[str, dict[str, Any]] = {}
    for (team, ns, model, kind), secs in r.slot_seconds.items():
        row = rows.setdefault(model, {"team": team, "namespace": ns, "by_kind": {}, "usd": 0.0})
        row["by_kind"][kind] = row["by_kind"].get(kind, 0.0) + secs / 3600.0
    for (team, ns, model), usd in r.dollars.items():
        row = rows.setdefault(model, {"team": team, "namespace": ns, "by_kind": {}, "usd": 0.0})
        row["usd"] += usd
    for (model,) in set(r.requests) | set(r.late):
        rows.setdefault(model, {"team": "unknown", "namespace": model.split("/", 1)[0] if "/" in model else "",
                                "by_kind": {}, "usd": 0.0})

    models = []
    for model, row in rows.items():
        by_kind = row["by_kind"]
        cost = priced(by_kind, table) if over else row["usd"]
        n = _whole(r.requests.get((model,)))
        late = min(_whole(r.late.get((model,), 0.0)) or 0, n) if n is not None else None
        objective = r.objective.get((model,))
        models.append(
            ModelRow(
                model=model,
                team=row["team"],
                namespace=row["namespace"],
                gpu_hours=math.fsum(by_kind.values()),
                gpu_hours_by_kind=by_kind,
                cost_usd=cost,
                requests=n,
                late_requests=late,
                requests_within_latency=(n - late) / n if n and late is not None else None,
                slo_percentile=100.0 * objective if objective is not None else None,
            )
        )
    notes = [
        "SLO attainment (requests in model-minutes that met their percentile) needs per-minute counts the exported "
        "counters do not have: '-'; requests within the latency target = 1 - slotwise_requests_late_total / "
        "slotwise_requests_total, the raw share (counts rounded to whole requests); latency percentiles are the "
        "model servers' own histograms",
    ]
    if not r.lent_gpus:
        notes.insert(0, LENT_NOTE)
    if over:
        notes.append("re-priced with --price: " + ", ".join(f"{k} ${v:g}/h" for k, v in sorted(over.items())))
    end_txt = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(r.end))
    kinds = ({k[0] for k in r.idle_seconds} | {k for row in rows.values() for k in row["by_kind"]}
             | {k[0] for k in r.lent_gpus} | {k[0] for k in r.prices})
    idle_by_kind = {k[0]: v / 3600.0 for k, v in r.idle_seconds.items()}
    lent_by_kind = {k[0]: v * r.hours for k, v in r.lent_gpus.items()}
    serving = math.fsum(m.cost_usd for m in models)
    idle = priced(idle_by_kind, table)
    reqs = [m.requests for m in models if m.requests is not None]
    lates = [m.late_requests or 0 for m in models if m.requests is not None]
    n_all = sum(reqs) if reqs else None
    late_all = sum(lates) if reqs else None
    return Section(
        title=f"Prometheus {r.url}: {r.hours:g} h to {end_txt}",
        source="prometheus",
        hours=r.hours,
        prices={k: table[k] for k in sorted(kinds) if k in table},
        models=models,
        slo_attainment=None,
        slo_attainment_attainable=None,
        violating_requests=None,
        unattainable_requests=None,
        requests=n_all,
        slo_minutes_met=None,
        requests_within_latency=(n_all - late_all) / n_all if n_all and late_all is not None else None,
        late_requests=late_all,
        gpu_hours=math.fsum(m.gpu_hours for m in models),
        gpu_hours_vs_lower_bound=None,
        gpu_hours_vs_oracle=None,
        cost_usd=serving + idle,
        serving_cost_usd=serving,
        idle_cost_usd=idle,
        idle_gpu_hours=math.fsum(idle_by_kind.values()),
        idle_gpu_hours_by_kind=idle_by_kind,
        idle_reserved_gpu_hours=None,
        lent_gpu_hours=math.fsum(lent_by_kind.values()),
        lent_gpu_hours_by_kind=lent_by_kind,
        lent_value_usd=priced(lent_by_kind, table),
        fragmentation=r.fragmentation.get(()),
        notes=notes,
    )


def _whole(x: float | None) -> int | None:
    """A counter's increase as a whole count (Prometheus extrapolates increase() to fractions)."""
    return None if x is None else max(0, round(x))
