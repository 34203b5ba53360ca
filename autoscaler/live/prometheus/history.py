"""Per-model request-rate history from Prometheus: what the live controller warm-starts its forecaster from.

Request rate is read exactly as the live metrics window reads it (:mod:`~autoscaler.live.prometheus.metrics`),
so the forecaster is fed one notion of load: one range query of
:func:`~autoscaler.live.prometheus.promql.step_increments` on the model server's request counter
(``MetricNames.requests``, with its matchers) -- per raw series, the reset-aware difference of the counter
between consecutive grid points, summed per model -- divided by the step. Series are keyed like the window's
(``MetricNames.key``: ``"<namespace>/<model>"``), and mapped onto the grid by the same function. With the
same step and grid the two give identical numbers (tests/live/test_prometheus_history.py checks it, across
a counter reset); at the warm start's coarser step (60 s) each step's count is exactly the sum of the live
window's 15 s counts inside it (the differences telescope).

The result is, per model, a float array on the regular grid ``start, start + step_s, ..., end`` (oldest
first), NaN where Prometheus returned no value (no sample within its lookback at either end of the step):
gaps stay gaps (no interpolation), and non-finite values read as missing too. A long range is chunked by the
client (Prometheus refuses more than 11,000 points per series in one query).

Errors are not swallowed: any failure raises :class:`~autoscaler.live.prometheus.client.PrometheusError`
(naming the URL, and the query when Prometheus refused it). ``slotwise run`` catches it, starts the
forecaster cold and says so.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from autoscaler.live.prometheus import promql
from autoscaler.live.prometheus.client import MAX_POINTS, PrometheusClient, PrometheusError, on_grid
from autoscaler.live.prometheus.metrics import MetricNames

if TYPE_CHECKING:
    from autoscaler.estimation.forecast import FleetForecaster


def grid(start: float, end: float, step_s: float) -> np.ndarray:
    """The times the history is returned at: ``start`` to ``end`` (inclusive when on the grid) every ``step_s``."""
    if not step_s > 0:
        raise ValueError("step_s must be > 0")
    if end < start:
        raise ValueError("end must not be before start")
    n = math.floor((end - start) / step_s + 1e-9) + 1
    return start + step_s * np.arange(n)


async def load_history(
    client: PrometheusClient,
    names: MetricNames,
    start: float,
    end: float,
    step_s: float,
    models: Iterable[str] | None = None,
    *,
    max_points: int = MAX_POINTS,
) -> dict[str, np.ndarray]:
    """Per model key, the request rate (finished requests per second) of each step of the grid
    ``start..end`` every ``step_s``: the step's reset-aware counter difference / ``step_s``.

    ``models``: None: every model Prometheus has the counter for, and no others. Given: exactly these keys --
    a model Prometheus has no series for is an all-NaN array, and series of other models are dropped.
    ``max_points``: grid points per range query (Prometheus' limit is 11,000); longer ranges are chunked.

    Returns a dict key -> float array of length ``len(grid(start, end, step_s))``, oldest first, NaN where
    Prometheus has no (finite) value. Raises :class:`~autoscaler.live.prometheus.client.PrometheusError`.
    """
    times = grid(start, end, step_s)
    query = promql.step_increments(names.requests, names.key_labels, step_s, names.matchers)
    result = await client.query_range(query, float(times[0]), float(times[-1]), step_s, max_points=max_points)
    out: dict[str, np.ndarray] = {}
    for series in result:
        try:
            counts = on_grid(series.get("values") or (), float(times[0]), step_s, times.size)
            key = names.key(series.get("metric") or {})
        except (AttributeError, TypeError, ValueError, IndexError) as e:
            # A malformed answer is the source's failure, not ours: the caller starts cold instead of aborting.
            raise PrometheusError(f"malformed range-query series {str(series)[:120]}: {e}", url=client.url,
                                  query=query) from None
        rate = counts / step_s
        rate[~np.isfinite(rate)] = np.nan
        out[key] = rate
    if models is None:
        return out
    return {key: out.get(key, np.full(times.size, np.nan)) for key in dict.fromkeys(models)}


async def warm_start_from_prometheus(
    forecaster: FleetForecaster,
    client: PrometheusClient,
    names: MetricNames,
    now: float,
    hours: float,
    step_s: float,
    models: Iterable[str] | None = None,
) -> dict[str, np.ndarray]:
    """Load the request rates of the last ``hours`` (the grid ends at ``now`` rounded down to the step, as
    the live window's does) and hand them to ``forecaster.warm_start``; the models pick them up when they join
    (``FleetForecaster.sync``).

    Returns the history loaded (for the caller's log line). Raises like :func:`load_history`; the forecaster
    is untouched then.
    """
    end = math.floor(now / step_s + 1e-9) * step_s
    history = await load_history(client, names, end - hours * 3600.0, end, step_s, models)
    forecaster.warm_start(history, step_s)
    return history
