"""The report's numbers from Prometheus history: what the live controller exported over the last ``hours``.

Instant queries at ``end`` over the range ``[end - hours, end]`` (prometheus-api-client's ``custom_query``):

- GPU-equivalent hours per (team, namespace, model, gpu_model): ``increase(slotwise_gpu_slot_seconds_total)``;
- cost per (team, namespace, model): ``increase(slotwise_gpu_cost_dollars_total)`` -- priced as the controller
  priced it at the time, so a price change during the range is honoured. With ``--price`` overrides the
  report re-prices the GPU-hours instead (every kind, with the overrides over the exported prices);
- idle reserved GPU-hours per kind: ``increase(slotwise_gpu_idle_seconds_total)``, priced with the exported
  ``slotwise_gpu_price_dollars_per_hour`` (last value; the catalog's default where absent);
- requests and late requests per model: ``increase(slotwise_requests_total)`` and
  ``increase(slotwise_requests_late_total)``; the SLO objective ``slotwise_slo_objective_ratio`` (last value);
- fragmentation: the mean of ``slotwise_fragmentation_ratio``; lent GPU-hours: the mean of
  ``slotwise_gpu_slots{state="lent"}`` times the hours. Gauges are read from the LEADER only
  (``and on(instance, job) slotwise_is_leader == 1``): a standby replica keeps the last values it had as
  leader, and those must not count. Without ``slotwise_is_leader`` series, all replicas count (max).

Counters are summed over replicas: only the leader ticks, so a standby's counters stay flat and add nothing.
"""

from __future__ import annotations

import math
import time
from typing import Any

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

from autoscaler.report.cost import price_table
from autoscaler.report.data import LENT_NOTE, ModelRow, Section, override_prices
from sharing.catalog import load_catalog

LEADER = "and on(instance, job) (slotwise_is_leader == 1)"
SUBQUERY_STEP = "60s"  # resolution of the gauge averages


class Prom:
    """A thin client: instant queries at one time, errors turned into one clear line (OSError: unreachable;
    ValueError: not a Prometheus answer or a query Prometheus refused)."""

    def __init__(self, url: str, at: float, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.at = at
        # one quick retry: a report is interactive, a dead URL should fail in seconds, not minutes
        self.client = PrometheusConnect(url=self.url, disable_ssl=True, retry=Retry(total=1, backoff_factor=0.2),
                                        timeout=timeout_s)

    def query(self, q: str) -> list[dict[str, Any]]:
        try:
            return self.client.custom_query(q, params={"time": f"{self.at:.3f}"})
        except requests.RequestException as e:
            raise OSError(f"cannot reach Prometheus at {self.url}: {type(e).__name__}") from None
        except PrometheusApiClientException as e:
            raise ValueError(f"Prometheus at {self.url} refused {q!r}: {str(e)[:300]}") from None
        except (ValueError, KeyError, TypeError) as e:  # 200 but not Prometheus' JSON (another server)
            raise ValueError(f"{self.url} did not answer like Prometheus ({type(e).__name__})") from None

    def values(self, q: str, *labels: str) -> dict[tuple[str, ...], float]:
        """Label values -> number, non-finite values left out."""
        out: dict[tuple[str, ...], float] = {}
        for item in self.query(q):
            try:
                v = float(item["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                raise ValueError(f"{self.url}: unexpected answer to {q!r}") from None
            if math.isfinite(v):
                metric = item.get("metric", {})
                out[tuple(str(metric.get(label, "")) for label in labels)] = v
        return out

    def leader_values(self, inner: str, by: str, *labels: str) -> dict[tuple[str, ...], float]:
        """``inner`` (a template with ``{sel}``: the gauge selector) from the leader; all replicas if no
        leader series exist."""
        got = self.values(inner.format(sel=f"({by} {LEADER})"), *labels)
        return got if got else self.values(inner.format(sel=by), *labels)


def section_from_prometheus(
    url: str, hours: float, end: float | None = None, prices: dict[str, float] | None = None
) -> Section:
    if not (math.isfinite(hours) and hours > 0):
        raise ValueError(f"--hours must be positive, got {hours}")
    at = time.time() if end is None else float(end)
    prom = Prom(url, at)
    rng = f"[{max(1, round(hours * 3600))}s]"
    over = override_prices(prices)

    slot = prom.values(
        f"sum by (team, namespace, model, gpu_model) (increase(slotwise_gpu_slot_seconds_total{rng}))",
        "team", "namespace", "model", "gpu_model",
    )
    dollars = prom.values(
        f"sum by (team, namespace, model) (increase(slotwise_gpu_cost_dollars_total{rng}))", "team", "namespace",
        "model",
    )
    idle_s = prom.values(f"sum by (gpu_model) (increase(slotwise_gpu_idle_seconds_total{rng}))", "gpu_model")
    exported = prom.values(
        f"max by (gpu_model) (last_over_time(slotwise_gpu_price_dollars_per_hour{rng}))", "gpu_model"
    )
    reqs = prom.values(f"sum by (model) (increase(slotwise_requests_total{rng}))", "model")
    late = prom.values(f"sum by (model) (increase(slotwise_requests_late_total{rng}))", "model")
    objective = prom.values(f"max by (model) (last_over_time(slotwise_slo_objective_ratio{rng}))", "model")
    frag = prom.leader_values(
        f"avg_over_time(max({{sel}})[{rng[1:-1]}:{SUBQUERY_STEP}])", "slotwise_fragmentation_ratio"
    )
    lent = prom.leader_values(
        f"avg_over_time((max by (gpu_model) ({{sel}}))[{rng[1:-1]}:{SUBQUERY_STEP}])",
        'slotwise_gpu_slots{state="lent"}', "gpu_model",
    )

    if not (slot or dollars or reqs):
        raise ValueError(
            f"Prometheus at {url} has no slotwise cost or request series in the last {hours:g} h "
            "(is the controller scraped? slotwise_gpu_slot_seconds_total, slotwise_requests_total)"
        )

    # prices: the catalog's defaults, then what the controller exported, then --price
    table = price_table(load_catalog())
    table |= {k[0]: v for k, v in exported.items()}
    table |= over

    rows: dict[str, dict[str, Any]] = {}
    for (team, ns, model, kind), secs in slot.items():
        r = rows.setdefault(model, {"team": team, "namespace": ns, "by_kind": {}, "usd": 0.0})
        r["by_kind"][kind] = r["by_kind"].get(kind, 0.0) + secs / 3600.0
    for (team, ns, model), usd in dollars.items():
        r = rows.setdefault(model, {"team": team, "namespace": ns, "by_kind": {}, "usd": 0.0})
        r["usd"] += usd
    for (model,) in set(reqs) | set(late):
        rows.setdefault(model, {"team": "unknown", "namespace": model.split("/", 1)[0] if "/" in model else "",
                                "by_kind": {}, "usd": 0.0})

    models = []
    for model, r in rows.items():
        by_kind = r["by_kind"]
        cost = sum(h * table.get(k, 0.0) for k, h in by_kind.items()) if over else r["usd"]
        n = reqs.get((model,))
        models.append(
            ModelRow(
                model=model,
                team=r["team"],
                namespace=r["namespace"],
                gpu_hours=sum(by_kind.values()),
                gpu_hours_by_kind=by_kind,
                cost_usd=cost,
                requests=n,
                late_requests=late.get((model,), 0.0) if n is not None else None,
                slo_objective=objective.get((model,)),
            )
        )
    notes = [
        "waiting: the share of requests settled beyond the SLO latency (slotwise_requests_late_total); "
        "latency percentiles are the model servers' own histograms",
    ]
    if not lent:
        notes.insert(0, LENT_NOTE)
    if over:
        notes.append("re-priced with --price: " + ", ".join(f"{k} ${v:g}/h" for k, v in sorted(over.items())))
    end_txt = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at))
    return Section(
        title=f"Prometheus {url}: {hours:g} h to {end_txt}",
        source="prometheus",
        hours=hours,
        prices={k: table[k] for k in sorted({k[0] for k in idle_s} | {k for r in rows.values() for k in r["by_kind"]}
                                            | {k[0] for k in lent} | {k[0] for k in exported}) if k in table},
        models=models,
        idle_gpu_hours_by_kind={k[0]: v / 3600.0 for k, v in idle_s.items()},
        fragmentation=frag.get(()),
        lent_gpu_hours_by_kind={k[0]: v * hours for k, v in lent.items()},
        notes=notes,
    )
