"""Per-model request-rate history from Prometheus: what the live controller warm-starts its forecaster from.

One range query (``/api/v1/query_range`` through ``prometheus-api-client``'s ``custom_query_range``) for a
per-model rate expression, e.g. ``sum by (model) (rate(slotwise_requests_total[1m]))``. The expression and
the label naming the model are configuration. The result is, per model, a float array on the regular grid
``start, start + step_s, …, end`` (oldest first), NaN where Prometheus returned no sample: gaps stay gaps
(no interpolation), and non-finite values (``NaN``/``±Inf`` from PromQL) read as missing too.

Prometheus refuses a range query of more than 11,000 points per series, so a long range is split into
chunks of at most ``max_points`` grid points and the pieces are concatenated. ``prometheus-api-client`` sends
whole-second bounds, so each chunk is evaluated at its first grid time rounded to the second plus multiples
of ``step_s`` (a sub-second offset, irrelevant to a rate over a minute).

Errors are not swallowed: a connection failure, an HTTP/PromQL error or an unusable answer (a series
without the model label, two series for one model) raise :class:`PrometheusHistoryError`, which names the
URL and the query. The controller catches it, starts without history and says so.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import requests
from prometheus_api_client import PrometheusApiClientException

if TYPE_CHECKING:
    from prometheus_api_client import PrometheusConnect

    from autoscaler.estimation.forecast import FleetForecaster

# Prometheus' limit on points per series in one range query (promql: "exceeded maximum resolution of 11,000
# points per timeseries").
MAX_POINTS = 11_000

_ERROR_FIELD = re.compile(r'"error"\s*:\s*"((?:[^"\\]|\\.)*)"')


class PrometheusHistoryError(RuntimeError):
    """A history query failed; ``url`` and ``query`` say which, the message says why."""

    def __init__(self, url: str, query: str, reason: str) -> None:
        super().__init__(f"Prometheus history query failed (url={url}, query={query!r}): {reason}")
        self.url = url
        self.query = query
        self.reason = reason


def _reason(exc: BaseException) -> str:
    """A short reason: Prometheus' own ``error`` field when the answer carries one."""
    text = str(exc)
    if isinstance(exc, PrometheusApiClientException):
        status = re.match(r"HTTP Status Code (\d+)", text)
        m = _ERROR_FIELD.search(text)
        if m:
            msg = m.group(1).replace('\\"', '"').replace("\\\\", "\\")
            return f"HTTP {status.group(1)}: {msg}" if status else msg
    if isinstance(exc, requests.ConnectionError):
        return f"cannot connect ({type(exc).__name__}: {text})"
    return f"{type(exc).__name__}: {text}"


def grid(start: float, end: float, step_s: float) -> np.ndarray:
    """The times the history is returned at: ``start`` to ``end`` (inclusive when on the grid) every ``step_s``."""
    if not step_s > 0:
        raise ValueError("step_s must be > 0")
    if end < start:
        raise ValueError("end must not be before start")
    n = math.floor((end - start) / step_s + 1e-9) + 1
    return start + step_s * np.arange(n)


def load_history(
    client: PrometheusConnect,
    query: str,
    label: str,
    start: float,
    end: float,
    step_s: float,
    models: Iterable[str] | None = None,
    *,
    max_points: int = MAX_POINTS,
    timeout_s: float | None = None,
) -> dict[str, np.ndarray]:
    """Per model (the value of ``label``), the query's values on the grid ``start..end`` every ``step_s``.

    Parameters
    ----------
    client: a ``PrometheusConnect``.
    query: a PromQL expression giving one series per model, e.g. ``sum by (model) (rate(x_total[1m]))``.
    label: the label naming the model in the query's result.
    start, end: Unix times in seconds (the grid starts at ``start``; ``end`` is its last point when on the grid).
    step_s: grid step in seconds.
    models: None: every model the query returns, and no others. Given: exactly these keys -- a model
        Prometheus has no series for is an all-NaN array, and series of other models are dropped.
    max_points: grid points per range query (Prometheus' limit is 11,000); longer ranges are chunked.
    timeout_s: HTTP timeout per request (None: the client's).

    Returns a dict model -> float array of length ``len(grid(start, end, step_s))``, oldest first, NaN
    where Prometheus has no (finite) sample.

    Raises :class:`PrometheusHistoryError` (naming the URL and query) on a connection failure, a Prometheus
    error, or a result the model cannot be read from.
    """
    times = grid(start, end, step_s)
    n = times.size
    # The client rounds both bounds to whole seconds. The end is sent half a second late so that rounding never
    # drops the chunk's last point; for sub-second steps that can add points past it (dropped below), so
    # such chunks are shortened to stay under Prometheus' limit.
    per = max(1, int(max_points) - (math.ceil(1.0 / step_s) if step_s < 1 else 0))
    url = str(getattr(client, "url", "?"))
    wanted = None if models is None else list(dict.fromkeys(models))
    wanted_set = None if wanted is None else set(wanted)
    out: dict[str, np.ndarray] = {}
    for c0 in range(0, n, per):
        c1 = min(c0 + per, n) - 1
        s0 = round(float(times[c0]))  # what the client sends; the answer is mapped back from it
        e0 = s0 + (c1 - c0) * step_s + 0.5
        try:
            result = client.custom_query_range(
                query,
                start_time=datetime.fromtimestamp(s0, tz=UTC),
                end_time=datetime.fromtimestamp(e0, tz=UTC),
                step=repr(float(step_s)),
                timeout=timeout_s,
            )
        except (requests.RequestException, PrometheusApiClientException, ValueError, KeyError, TypeError) as exc:
            raise PrometheusHistoryError(url, query, _reason(exc)) from exc
        seen: set[str] = set()
        for series in result or ():
            name = _model_of(series, label, url, query)
            if name in seen:
                raise PrometheusHistoryError(
                    url, query, f"more than one series has {label}={name!r}; aggregate by ({label}) in the query"
                )
            seen.add(name)
            if wanted_set is not None and name not in wanted_set:
                continue
            arr = out.get(name)
            if arr is None:
                arr = out[name] = np.full(n, np.nan)
            _fill(arr, series.get("values") or (), s0, step_s, c0, c1)
    if wanted is not None:
        return {name: out.get(name, np.full(n, np.nan)) for name in wanted}
    return out


def _model_of(series: Any, label: str, url: str, query: str) -> str:
    metric = series.get("metric") if isinstance(series, dict) else None
    if not isinstance(metric, dict) or label not in metric:
        raise PrometheusHistoryError(
            url,
            query,
            f"a series has no label {label!r} (labels: {metric!r}); the query must keep it, "
            f"e.g. sum by ({label}) (...)",
        )
    return str(metric[label])


def _fill(arr: np.ndarray, values: Sequence[Any], s0: float, step_s: float, c0: int, c1: int) -> None:
    """Write one chunk's ``[[ts, "value"], ...]`` into ``arr[c0..c1]``; non-finite values stay missing."""
    if not len(values):
        return
    pairs = np.asarray(values, dtype=object).reshape(-1, 2)
    ts = pairs[:, 0].astype(float)
    v = pairs[:, 1].astype(str).astype(float)  # Prometheus sends values as strings ("4", "NaN", "+Inf")
    j = np.rint((ts - s0) / step_s).astype(np.int64)
    keep = (j >= 0) & (j <= c1 - c0) & np.isfinite(v)
    arr[c0 + j[keep]] = v[keep]


def warm_start_from_prometheus(
    forecaster: FleetForecaster,
    client: PrometheusConnect,
    query: str,
    label: str,
    now: float,
    hours: float,
    step_s: float,
    models: Iterable[str] | None = None,
) -> dict[str, np.ndarray]:
    """Load the last ``hours`` of per-model rates (ending at ``now``) and hand them to
    ``forecaster.warm_start``; the models pick them up when they join (``FleetForecaster.sync``).

    Returns the history loaded (for the caller's log line). Raises :class:`PrometheusHistoryError` like
    :func:`load_history`; the forecaster is untouched then.
    """
    history = load_history(client, query, label, now - hours * 3600.0, now, step_s, models)
    forecaster.warm_start(history, step_s)
    return history
