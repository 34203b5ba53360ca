"""The Prometheus history adapter against a REAL Prometheus (Debian's binary), history backfilled with promtool.

Backfilled: four hours of ``slotwise_requests_total{model=...}`` every 15 s, ending at the last whole minute:
``a`` at 4 req/s, ``b`` at 2 req/s with a 20-minute hole (no samples), ``c`` at 1 req/s then 3 req/s for the
last 90 minutes. Counters are exact, so ``rate(...[1m])`` reads the rates back exactly.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime

import numpy as np
import pytest
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

from autoscaler.estimation.forecast import FleetForecaster
from autoscaler.live.prometheus.history import (
    MAX_POINTS,
    PrometheusHistoryError,
    grid,
    load_history,
    warm_start_from_prometheus,
)

# the real-Prometheus fixture; its helpers are imported inside functions, after pytest has loaded the plugin
# (a top-level import would come first and keep pytest from assert-rewriting the plugin module)
pytest_plugins = ("realparts.prometheus",)

QUERY = "sum by (model) (rate(slotwise_requests_total[1m]))"
SCRAPE_S = 15
HOURS = 4
END = math.floor(time.time() / 60) * 60  # the newest backfilled sample
START = END - HOURS * 3600
GAP = (END - 2 * 3600, END - 2 * 3600 + 20 * 60)  # b has no samples strictly inside
CHANGE = END - 90 * 60  # c's rate changes from 1 to 3 here


def _rate(model: str, t: float) -> float:
    if model == "a":
        return 4.0
    if model == "b":
        return 2.0
    return 1.0 if t <= CHANGE else 3.0


def _history() -> dict[str, list[tuple[float, float]]]:
    series: dict[str, list[tuple[float, float]]] = {}
    for model in ("a", "b", "c"):
        value = 1000.0  # not near zero: rate()'s extrapolation stops at a counter's zero
        samples = []
        for t in range(START, END + 1, SCRAPE_S):
            if t > START:
                value += _rate(model, t) * SCRAPE_S
            if model == "b" and GAP[0] < t < GAP[1]:
                continue
            samples.append((float(t), value))
        series[model] = samples
    return series


@pytest.fixture(scope="module")
def prom(prometheus_factory):
    from realparts.prometheus import openmetrics_counter

    return prometheus_factory(openmetrics_counter("slotwise_requests_total", _history()))


@pytest.fixture(scope="module")
def client(prom) -> PrometheusConnect:
    return PrometheusConnect(url=prom.url)


def test_rates_match_the_backfill(client) -> None:
    start = START + 3600
    hist = load_history(client, QUERY, "model", start, END, 60.0)
    t = grid(start, END, 60.0)
    assert set(hist) == {"a", "b", "c"}
    assert all(v.shape == t.shape for v in hist.values())
    np.testing.assert_allclose(hist["a"], 4.0, rtol=1e-6)
    before, after = t <= CHANGE, t >= CHANGE + 60
    np.testing.assert_allclose(hist["c"][before], 1.0, rtol=1e-6)
    np.testing.assert_allclose(hist["c"][after], 3.0, rtol=1e-6)
    outside = (t <= GAP[0]) | (t >= GAP[1] + 60)
    np.testing.assert_allclose(hist["b"][outside], 2.0, rtol=1e-6)


def test_the_gap_stays_a_gap(client) -> None:
    start = START + 3600
    hist = load_history(client, QUERY, "model", start, END, 60.0)
    t = grid(start, END, 60.0)
    # rate() needs two samples in its 1m window: NaN exactly where the backfill leaves fewer
    stamps = np.array([ts for ts, _ in _history()["b"]])
    inside = np.array([((stamps >= x - 60) & (stamps <= x)).sum() < 2 for x in t])
    assert inside.sum() == 20  # GAP[0] + 1 min .. GAP[1], on the minute grid
    assert np.isnan(hist["b"][inside]).all()
    # nothing else is missing, nothing is interpolated
    assert np.isfinite(hist["b"][~inside]).all()
    assert np.isnan(hist["b"]).sum() == inside.sum()


def test_chunks_concatenate_to_the_single_query(client) -> None:
    start = START + 3600
    whole = load_history(client, QUERY, "model", start, END, 60.0)
    for max_points in (1, 7, 50):
        chunked = load_history(client, QUERY, "model", start, END, 60.0, max_points=max_points)
        assert set(chunked) == set(whole)
        for name in whole:
            np.testing.assert_array_equal(chunked[name], whole[name])
    # the grid's last point is end when on the grid, the first is start; a non-integral step works too
    h = load_history(client, QUERY, "model", start + 0.25, END, 7.5, max_points=100)
    assert h["a"].size == len(grid(start + 0.25, END, 7.5))
    np.testing.assert_allclose(h["a"], 4.0, rtol=1e-6)


def test_ranges_beyond_prometheus_point_limit_are_split(client) -> None:
    start = END - 12_000  # 12,001 points at a 1 s step: one query is refused by Prometheus itself
    with pytest.raises(PrometheusApiClientException, match="11,000"):
        client.custom_query_range(QUERY, datetime.fromtimestamp(start, UTC), datetime.fromtimestamp(END, UTC), step="1")
    hist = load_history(client, QUERY, "model", start, END, 1.0)
    assert hist["a"].size == 12_001 > MAX_POINTS
    np.testing.assert_allclose(hist["a"], 4.0, rtol=1e-6)


def test_models_argument(client) -> None:
    start = END - 1800
    only = load_history(client, QUERY, "model", start, END, 60.0, models=["a", "nope"])
    assert list(only) == ["a", "nope"]  # exactly the models asked for, in order; others dropped
    assert np.isnan(only["nope"]).all() and only["nope"].shape == only["a"].shape
    assert np.isfinite(only["a"]).all()
    everything = load_history(client, QUERY, "model", start, END, 60.0)
    assert "nope" not in everything  # without `models`, absent models are simply absent
    empty = load_history(
        client, 'sum by (model) (rate(slotwise_requests_total{model="zz"}[1m]))', "model", start, END, 60.0
    )
    assert empty == {}


def test_history_before_the_data_is_nan(client) -> None:
    hist = load_history(client, QUERY, "model", START - 3600, START + 600, 60.0)
    t = grid(START - 3600, START + 600, 60.0)
    assert np.isnan(hist["a"][t < START]).all()
    np.testing.assert_allclose(hist["a"][t >= START + 60], 4.0, rtol=1e-6)


def test_a_bad_query_raises_a_clear_error(client, prom) -> None:
    bad = "sum by (model) (rate(slotwise_requests_total[1m])"
    with pytest.raises(PrometheusHistoryError) as err:
        load_history(client, bad, "model", END - 600, END, 60.0)
    msg = str(err.value)
    assert prom.url in msg and bad in msg and "HTTP 400" in msg and "parse error" in msg
    assert err.value.url == prom.url and err.value.query == bad


def test_a_query_without_the_model_label_raises(client) -> None:
    q = "sum(rate(slotwise_requests_total[1m]))"
    with pytest.raises(PrometheusHistoryError, match=r"no label 'model'"):
        load_history(client, q, "model", END - 600, END, 60.0)
    q = "rate(slotwise_requests_total[1m]) or label_replace(rate(slotwise_requests_total[1m]), 'x', '1', '', '')"
    with pytest.raises(PrometheusHistoryError, match=r"more than one series has model="):
        load_history(client, q, "model", END - 600, END, 60.0)


def test_a_dead_url_raises_a_clear_error() -> None:
    from realparts.prometheus import free_port

    url = f"http://127.0.0.1:{free_port()}"
    # no retries: the default client retries a refused connection 3 times (~6 s) before the same error
    dead = PrometheusConnect(url=url, retry=Retry(total=0))
    with pytest.raises(PrometheusHistoryError, match="cannot connect") as err:
        load_history(dead, QUERY, "model", END - 600, END, 60.0)
    assert url in str(err.value) and QUERY in str(err.value)


def test_the_warm_started_forecaster_forecasts_the_known_level(client) -> None:
    ff = FleetForecaster(step_s=60.0)
    hist = warm_start_from_prometheus(ff, client, QUERY, "model", now=END, hours=3, step_s=15.0)
    assert set(hist) == {"a", "b", "c"}
    ff.sync(["a", "b", "c"], {})
    for name, level in (("a", 4.0), ("b", 2.0), ("c", 3.0)):
        q = ff.quantiles(name, END, 60.0)
        assert q is not None
        median = float(np.interp(0.5, ff.levels, q))
        assert abs(median - level) <= 0.15 * level, (name, median)


def test_non_finite_values_read_as_missing_and_sub_second_steps_map_back(client) -> None:
    nan = load_history(
        client, "(sum by (model) (rate(slotwise_requests_total[1m]))) * 0 / 0", "model", END - 600, END, 60.0
    )
    assert set(nan) == {"a", "b", "c"} and all(np.isnan(v).all() for v in nan.values())
    fine = load_history(client, QUERY, "model", END - 300, END, 0.5, max_points=100)
    assert fine["a"].size == 601
    np.testing.assert_allclose(fine["a"], 4.0, rtol=1e-6)
