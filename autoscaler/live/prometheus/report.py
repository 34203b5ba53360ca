"""``slotwise report --prometheus``: read what the controller exported, through the one Prometheus client.

The instant queries of :func:`~autoscaler.live.prometheus.promql.report_queries`, asked concurrently at the
range's end, become :class:`~autoscaler.report.prometheus.PrometheusReadings`; the report layer turns those
into its numbers (:func:`~autoscaler.report.prometheus.section_from_prometheus`). A gauge read from the leader
that answers nothing is asked again over all replicas (no ``slotwise_is_leader`` series).
"""

from __future__ import annotations

import asyncio
import math

from autoscaler.live.prometheus import promql
from autoscaler.live.prometheus.client import PrometheusAuth, PrometheusClient, PrometheusError
from autoscaler.report.prometheus import PrometheusReadings, Values


def _values(result: list[dict], labels: tuple[str, ...], client: PrometheusClient, query: str) -> Values:
    """An instant answer as label values (in ``labels``' order) -> number, non-finite values left out."""
    out: Values = {}
    for item in result:
        try:
            v = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            raise PrometheusError(f"{client.url}: unexpected answer to {query!r}", url=client.url,
                                  query=query) from None
        if math.isfinite(v):
            metric = item.get("metric", {})
            out[tuple(str(metric.get(label, "")) for label in labels)] = v
    return out


async def _read(client: PrometheusClient, q: promql.ReportQuery, at: float) -> Values:
    got = _values(await client.query(q.promql, at), q.labels, client, q.promql)
    if not got and q.fallback is not None:
        got = _values(await client.query(q.fallback, at), q.labels, client, q.fallback)
    return got


async def read_report(url: str, hours: float, end: float, *, timeout_s: float = 30.0,
                      auth: PrometheusAuth | None = None) -> PrometheusReadings:
    """Everything the report needs from Prometheus ``url`` over ``hours`` up to ``end`` (Unix seconds), with
    ``auth``'s TLS verification and credentials (default: verify, none).
    Raises :class:`~autoscaler.live.prometheus.client.PrometheusError` (unreachable, refused, not Prometheus)."""
    queries = promql.report_queries(hours)
    async with PrometheusClient(url, timeout_s=timeout_s, auth=auth) as client:
        answers = await asyncio.gather(*(_read(client, q, end) for q in queries.values()))
    return PrometheusReadings(url=url, hours=hours, end=end, **dict(zip(queries, answers, strict=True)))
